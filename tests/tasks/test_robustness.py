"""Numerical robustness: huge softmax scores, all-zero ReLU attention rows, float16 caches, collinear training sets.

No result may be NaN or infinite unless the record says so: the attack flags an ill-conditioned Gram
(`gram_ill_conditioned`), and both sweeps flag a value that is not a finite number (`nonfinite`, stored as null) and
leave it out of their summaries.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import wslight.tasks.attack_sweep as attack_mod
import wslight.tasks.sensitivity_sweep as sweeps_mod
from wslight.app.cli import main
from wslight.attack import delta_attack
from wslight.data import EmbeddingSpec, TokenEmbeddings, preprocess
from wslight.features import FreshMaps, RandomAttentionFeatures, RandomFeatures, ReLUAttentionFeatures
from wslight.features.forwards import map_features
from wslight.search.sensitivity import word_sensitivity

n, d = 6, 8


def data(rows, M=12, scale=1.0):
    X = rows(M, n, d, seed=1) * scale
    y = torch.where(torch.arange(M) % 2 == 0, 1.0, -1.0)
    return X, y


def all_finite(out: dict) -> bool:
    return all(bool(torch.isfinite(v.to(torch.float64)).all()) for k, v in out.items() if k != "gram_cond")


def zero_row_input(W: torch.Tensor, B: int = 1) -> torch.Tensor:
    """(B, n, d) with every token equal to x, x^T W x < 0: every ReLU score is negative, every attention row zero."""
    sym = (W + W.T).to(torch.float64) / 2
    x = torch.linalg.eigh(sym).eigenvectors[:, 0]  # the most negative direction of the quadratic form
    x = (x / x.norm() * d**0.5).to(W.dtype)
    return x.expand(B, n, d).clone()


# ------------------------------------------------------------------------------------------- huge softmax scores


def test_raf_map_with_huge_scores_is_finite_and_row_stochastic(rows):
    fm = RandomAttentionFeatures(d, seed=0)
    X = rows(3, n, d) * 1e3  # scores ~ 1e6
    A = fm.attention(fm.scores(X))
    assert torch.isfinite(A).all() and torch.allclose(A.sum(-1), torch.ones(3, n))
    assert torch.isfinite(fm(X)).all()
    assert torch.isfinite(map_features(fm, X, exact=True)).all()  # the float64 reference forward


@pytest.mark.parametrize("cls", [RandomAttentionFeatures, ReLUAttentionFeatures])
def test_ws_with_huge_scores_is_finite(rows, cls):
    fm = cls(d, seed=0)
    X = rows(2, n, d) * 1e3
    for radius in (None, 1e3 * d**0.5):  # the default ball, and one as large as the scaled tokens
        res = word_sensitivity(fm, X, positions="all", radius=radius, chains_per_round=3, max_steps=30)
        assert torch.isfinite(res.ws).all() and (res.ws >= 0).all()
        assert torch.isfinite(res.phi_norm).all() and (res.phi_norm > 0).all()
    # the estimate stays a lower bound of the sup: a ball of radius 0.5 sqrt(d) gives at most the full one's value
    small = word_sensitivity(fm, X, radius=0.5 * d**0.5, chains_per_round=3, max_steps=30).ws
    large = word_sensitivity(fm, X, radius=d**0.5, chains_per_round=3, max_steps=30).ws
    assert (small <= large * (1 + 1e-6) + 1e-12).all()


@pytest.mark.parametrize("training", ["finetune", "retrain"])
def test_attack_with_huge_scores_is_finite(rows, training):
    X, y = data(rows, scale=1e3)
    out = delta_attack(RandomAttentionFeatures(d, seed=0), X[2:], y[2:], X[:2], y[:2], training=training, steps=30)
    assert all_finite(out)
    # the heads interpolate: the fitted head reproduces the context label before the attack
    assert torch.allclose(out["t1"], out["y"], atol=1e-6)


# ------------------------------------------------------------------------------------ all-zero ReLU attention rows


def test_relu_raf_zero_rows_give_zero_features_not_nan():
    fm = ReLUAttentionFeatures(d, seed=0)
    X = zero_row_input(fm.W, 2)
    assert (fm.scores(X) < 0).all()
    assert torch.equal(fm(X), torch.zeros(2, n * d))


def first_map(fmap, X):
    """The first trial's map of a sweep step (the sweeps pass FreshMaps and (T, B, n, d) samples)."""
    return fmap.maps(X.shape[2], X.shape[3])[0] if isinstance(fmap, FreshMaps) else fmap


def test_ws_on_zero_features_is_not_finite_and_the_sweep_flags_it(tmp_path, monkeypatch, config_args):
    fm = ReLUAttentionFeatures(d, seed=0)
    res = word_sensitivity(fm, zero_row_input(fm.W), chains_per_round=2, max_steps=20)
    # phi(X) = 0: S = ||phi(X^i(Delta))|| / 0 is undefined (NaN, or inf once phi moves); the sweep must flag it
    assert res.phi_norm.item() == 0.0 and not math.isfinite(res.ws.item())

    real = sweeps_mod.word_sensitivity

    def degenerate_first_trial(fmap, X, *args, **kw):  # trial 0 sees an input with all-zero attention rows
        if not getattr(degenerate_first_trial, "done", False):
            degenerate_first_trial.done = True
            X = X.clone()
            X[0] = zero_row_input(first_map(fmap, X).W, X.shape[1])
        return real(fmap, X, *args, **kw)

    monkeypatch.setattr(sweeps_mod, "word_sensitivity", degenerate_first_trial)
    with pytest.warns(RuntimeWarning, match=r"1 of 3 record\(s\) have nonfinite=true"):  # said, not hidden
        cli = main(["test", *config_args(WS)], evaluate=True)
    recs = [json.loads(x) for x in Path(cli.model.results_path).read_text().splitlines()]
    flagged = [r for r in recs if r["nonfinite"]]
    assert [r["trial"] for r in flagged] == [0]
    assert flagged[0]["ws"] is None and flagged[0]["ws_sqrt_n"] is None and flagged[0]["phi_norm"] == 0.0
    assert all(math.isfinite(r["ws"]) for r in recs if not r["nonfinite"])
    summary = (Path(cli.model.results_path).parent / "summary.md").read_text()
    assert "| relu_raf | 8 | 6 | 1 |" in summary and summary.rstrip().endswith("| 2 |")  # 2 of 3 trials counted


def test_attack_on_zero_context_features_is_flagged(rows, tmp_path, monkeypatch, config_args):
    fm = ReLUAttentionFeatures(d, seed=0)
    X, y = data(rows)
    out = delta_attack(fm, X[2:], y[2:], zero_row_input(fm.W, 2), y[:2], steps=20)
    assert not all_finite(out)  # phi = 0: the rank-one updates divide by ||phi||^2 = 0
    assert torch.isfinite(out["t0"]).all() and torch.isfinite(out["D0"]).all()  # theta* itself is fine

    # a zero row among the training samples: a singular Gram, flagged and jittered, every output finite
    Xt = torch.cat([zero_row_input(fm.W), X[3:]])
    with pytest.warns(RuntimeWarning, match="ill-conditioned"):
        out = delta_attack(fm, Xt, y[2:], X[:2], y[:2], steps=20)
    assert all_finite(out) and bool(out["gram_ill_conditioned"].all())

    real = attack_mod.delta_attacks

    def degenerate_contexts(fmap, X_train, Y, X_ctx, y_ctx, objectives, **kw):
        if not getattr(degenerate_contexts, "done", False):
            degenerate_contexts.done = True
            X_ctx = X_ctx.clone()
            X_ctx[0] = zero_row_input(first_map(fmap, X_ctx).W, X_ctx.shape[1])
        return real(fmap, X_train, Y, X_ctx, y_ctx, objectives, **kw)

    monkeypatch.setattr(attack_mod, "delta_attacks", degenerate_contexts)
    with pytest.warns(RuntimeWarning, match="1 of 3 record"):
        cli = main(["test", *config_args(ATTACK)], evaluate=True)
    recs = [json.loads(x) for x in Path(cli.model.results_path).read_text().splitlines()]
    flagged = [r for r in recs if r["nonfinite"]]
    assert len(flagged) == 1 and flagged[0]["err"] is None and flagged[0]["D1"] is None
    for r in recs:
        if not r["nonfinite"]:
            assert all(v is not None for k, v in r.items() if k != "gram_cond")
    assert (Path(cli.model.results_path).parent / "summary.md").exists()  # the summary skips the flagged record


# ------------------------------------------------------------------------------------------- float16 embeddings


def test_float16_storage_preprocesses_to_finite_float32():
    H = torch.randn(3, 10, 16, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    H[0, 2] = 6e4  # squares overflow float16 (max 65504) unless upcast first
    H[1, 3] = 0.0  # a zero row (e.g. padding) stays zero, no 0/0
    H[2, 4] = 1e-7  # float16 subnormals
    X = preprocess(H, 8, 12)
    assert X.dtype == torch.float32 and torch.isfinite(X).all()
    norms = X.norm(dim=-1)
    assert torch.allclose(norms[0, 2], torch.tensor(12**0.5), rtol=1e-5)
    assert norms[1, 3] == 0
    keep = torch.ones(3, 8, dtype=torch.bool)
    keep[1, 3] = False
    assert torch.allclose(norms[keep], torch.full_like(norms[keep], 12**0.5), rtol=1e-3)


def test_token_embeddings_float16_cache_gives_float32_samples(tmp_path):
    """A float16 cache read through TokenEmbeddings.samples (the sweeps' path): float32, finite, norm sqrt(d) rows."""
    from wslight.data import cache as cache_mod

    M, L, H = 4, 6, 16
    emb = np.random.default_rng(0).standard_normal((M, L, H)).astype(np.float16) * np.float16(300)
    path = tmp_path / "e.safetensors"
    shapes = {"labels": (np.dtype(np.float32), (M,)), "embeddings": (np.dtype(np.float16), (M, L, H))}
    with cache_mod.SafetensorsStreamWriter(path, shapes, {"format": "test"}) as w:
        w.write("labels", np.array([1, -1, 1, -1], dtype=np.float32))
        w.write("embeddings", emb)
        w.commit()
    store = TokenEmbeddings(torch.tensor([1.0, -1, 1, -1]), torch.arange(M), H, L, {"source": "test"}, path=path)
    assert store.raw([0, 1]).dtype == torch.float16
    X, y = store.samples([0, 1, 2], 5, 12)
    assert X.dtype == torch.float32 and torch.isfinite(X).all()
    assert torch.allclose(X.norm(dim=-1), torch.full((3, 5), 12**0.5), rtol=1e-5)
    assert EmbeddingSpec().storage_dtype == "float16"  # the default the sweeps read


# --------------------------------------------------------------------------------- collinear training features


@pytest.mark.parametrize("make_map", [lambda: RandomFeatures(n, d, seed=0), lambda: RandomAttentionFeatures(d, seed=0)])
def test_duplicated_training_samples_are_flagged_and_finite(rows, make_map):
    X, y = data(rows)
    Xt = torch.cat([X[2:7], X[2:7]])  # every training sample twice: a singular Gram
    yt = torch.cat([y[2:7], y[2:7]])
    with pytest.warns(RuntimeWarning, match="ill-conditioned"):
        out = delta_attack(make_map(), Xt, yt, X[:2], y[:2], steps=30)
    assert all_finite(out)
    assert bool(out["gram_ill_conditioned"].all()) and bool((out["gram_cond"] > 1e10).all())
    # Deviation from the naive expectation "duplicates change nothing": a float32 map computes the two copies in
    # different rows of one GEMM, which rounds them differently (~1e-7), so the Gram is nearly singular rather than
    # exactly, and theta* interpolates that noise. Hence the flag: such a trial's heads are not to be trusted.
    ref = delta_attack(make_map(), X[2:7], y[2:7], X[:2], y[:2], steps=30)
    assert not bool(ref["gram_ill_conditioned"].any()) and bool((ref["gram_cond"] < 1e10).all())


def test_nearly_collinear_training_samples_are_flagged(rows):
    X, y = data(rows)
    Xt = torch.cat([X[2:7], X[2:7] + 1e-9 * rows(5, n, d, seed=3)])  # near duplicates
    with pytest.warns(RuntimeWarning, match="ill-conditioned"):
        out = delta_attack(RandomFeatures(n, d, seed=0), Xt, torch.cat([y[2:7], y[2:7]]), X[:2], y[:2], steps=20)
    assert all_finite(out) and bool(out["gram_ill_conditioned"].all())


# ---------------------------------------------------------------------------------------------------- configs

# The tiny test settings (tests/conf) of the shipped configs with ReLU-RAF on one cell, three trials, one a step.
WS = (
    "ws/relu_raf",
    {
        "grid.d_values": [8],
        "grid.n_values": [6],
        "grid.trials": 3,
        "search.chains_per_round": 2,
        "search.max_steps": 20,
    },
)
ATTACK = (
    "attack/fig4",
    {
        "cases": [{"map": "relu_raf", "n": 6}],
        "N_values": [10],
        "trials": 3,
        "trials_per_step": 1,
        "trainings": ["retrain"],
        "losses": ["err"],
        "attack.steps": 20,
    },
)


@pytest.fixture
def config_args(tmp_path, cpu_trainer, tiny):
    """A function of a setting (name, changes) giving the arguments of that tiny test setting and its changes.

    Texts of 16 tokens, on the CPU trainer with logs under tmp_path.
    """

    def args(setting):
        name, changes = setting
        logs = [
            "--trainer.logger.init_args.save_dir",
            str(tmp_path / "logs"),
            "--trainer.logger.init_args.name",
            "robust",
        ]
        return [*tiny(name, {**changes, "embeddings.max_length": 16}), *cpu_trainer.args, *logs]

    return args
