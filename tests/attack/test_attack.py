"""Single-token Delta attack: structure, records, RF vs RAF, bad input, plots.

See docs/theory/attack.md §6 and docs/theory/checks.md §8.9-8.11.
"""

import matplotlib.pyplot as plt
import pytest
import torch

from wslight.attack import delta_attack, delta_attacks
from wslight.attack.heads import fit_heads
from wslight.base.seeding import generator
from wslight.features import FreshMaps, RandomAttentionFeatures, RandomFeatures, ReLUAttentionFeatures
from wslight.plots.attack import plot_attack_scatter, plot_penalized

# Thousands of tiny steps: one torch thread (the conftest fixture) avoids contention on a shared 2-core machine.
pytestmark = pytest.mark.usefixtures("one_thread")


def aniso(B, n, d, seed, u):
    """The "aniso" rows of docs/theory/checks.md §11: 0.7 u + sqrt(0.51) g / sqrt(d), renormalised to sqrt(d).

    (B, n, d) float64.
    """
    g = torch.randn(B, n, d, generator=generator(seed, "test.aniso"), dtype=torch.float64)
    X = 0.7 * u + 0.51**0.5 * g / d**0.5
    return X / X.norm(dim=-1, keepdim=True) * d**0.5


def problem(n, d, N, T, B, seed=0):
    """T trials, each with N training and B context samples (aniso rows, random +-1 labels)."""
    u = torch.randn(d, generator=generator(seed, "test.u"), dtype=torch.float64)
    u = u / u.norm()
    X_tr = aniso(T * N, n, d, seed + 1, u).reshape(T, N, n, d)
    X_cx = aniso(T * B, n, d, seed + 2, u).reshape(T, B, n, d)
    Y = torch.randint(0, 2, (T, N), generator=generator(seed, "test.Y")).double() * 2 - 1
    y = torch.randint(0, 2, (T, B), generator=generator(seed, "test.y")).double() * 2 - 1
    return X_tr, Y, X_cx, y


def replace_token(X, position, delta):
    Xp = X.clone()
    Xp[..., position, :] += delta
    return Xp


# ---- structure ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("training", ["finetune", "retrain"])
@pytest.mark.parametrize("position", [0, 5])
def test_records_match_closed_forms_on_the_perturbed_sample(training, position):
    n, d, N, B = 8, 8, 12, 3
    X_tr, Y, X_cx, y = problem(n, d, N, 1, B)
    m = RandomAttentionFeatures(d, seed=3, dtype="float64")
    r = delta_attack(
        m, X_tr[0], Y[0], X_cx[0], y[0], training=training, loss="err", position=position, steps=60, return_delta=True
    )
    h = fit_heads(m(X_tr[0]), Y[0], m(X_cx[0]), y[0])
    phi_p = m(replace_token(X_cx[0], position, r["delta"]))  # (B, p): phi(X^i(Delta)) from the full forward
    D0, D1 = h.outputs(phi_p, training)
    assert torch.allclose(r["D0"], D0, atol=1e-8) and torch.allclose(r["D1"], D1, atol=1e-8)
    assert torch.allclose(r["t1"], y[0], atol=1e-6)  # the updated head interpolates the context sample
    assert torch.allclose(r["t0"], h.t0, atol=1e-10)
    assert torch.allclose(r["err"], (r["D1"] + y[0]) ** 2)
    assert torch.equal(r["sign_err"], (torch.sign(r["D1"]) != -y[0]).double())
    assert torch.allclose(r["gamma"], torch.maximum(r["t0"].abs(), r["D0"].abs()))
    assert torch.allclose(r["proj_ratio"], h.proj_ratio)
    assert torch.allclose(r["delta_norm"], r["delta"].norm(dim=-1))
    assert bool((r["delta_norm"] <= d**0.5 * (1 + 1e-9)).all())
    assert set(r) >= {"abs_t0", "abs_D0", "steps", "gram_ill_conditioned"} and r["y"].shape == (B,)
    # the attack lowered the objective below its value at Delta = 0 (the first restart's start)
    D1_clean = h.outputs(m(X_cx[0]), training)[1]
    assert bool((r["err"] <= (D1_clean + y[0]) ** 2 + 1e-9).all())


def test_trials_batched_equal_one_by_one():
    n, d, N, T, B = 6, 8, 10, 2, 2
    X_tr, Y, X_cx, y = problem(n, d, N, T, B)
    maps = [ReLUAttentionFeatures(d, seed=s, dtype="float64") for s in range(T)]
    kw = dict(training="retrain", loss="penalized", penalty=0.5, steps=40, restarts=1)
    rb = delta_attack(maps, X_tr, Y, X_cx, y, **kw)
    assert rb["D1"].shape == (T, B)
    for t in range(T):
        rt = delta_attack(maps[t], X_tr[t], Y[t], X_cx[t], y[t], **kw)
        for key in ("D0", "D1", "t0", "gamma", "proj_ratio"):
            assert torch.allclose(rb[key][t], rt[key], atol=1e-8), key


# ---- docs/theory/checks.md §8.9-8.11 at small sizes (levels of docs/theory/checks.md §11)
# ------------------------------------------

N_SIM, n_SIM, T_SIM, B_SIM = 50, 40, 3, 2


@pytest.fixture(scope="module")
def sim_data():
    return problem(n_SIM, 32, N_SIM, T_SIM, B_SIM, seed=10), problem(n_SIM, 16, N_SIM, T_SIM, B_SIM, seed=20)


def test_rf_cannot_flip(sim_data):
    """Check 9: RF keeps the prediction on the side of y for every loss and both heads (n large, N << p)."""
    X_tr, Y, X_cx, y = sim_data[1]
    maps = [RandomFeatures(n_SIM, 16, seed=s) for s in range(T_SIM)]
    for training in ("finetune", "retrain"):
        for loss in ("err", "align", "align_proj", "penalized"):
            r = delta_attack(maps, X_tr, Y, X_cx, y, training=training, loss=loss, penalty=1.0)
            assert float((r["y"] * r["D1"]).mean()) > 0.3, (training, loss)
            assert float(r["sign_err"].mean()) == 1.0, (training, loss)
            assert float(r["err"].mean()) > 1.5, (training, loss)


def test_raf_flips_relu_raf_in_between(sim_data):
    """Checks 10-11: loss err flips RAF in most trials; ReLU-RAF is no better than RAF and far better than RF."""
    X_tr, Y, X_cx, y = sim_data[0]
    errs = {}
    for name, make in (
        ("raf", lambda s: RandomAttentionFeatures(32, seed=s)),
        ("relu_raf", lambda s: ReLUAttentionFeatures(32, seed=s)),
        ("rf", lambda s: RandomFeatures(n_SIM, 32, seed=s)),
    ):
        maps = [make(s) for s in range(T_SIM)]
        for training in ("finetune", "retrain"):
            r = delta_attack(maps, X_tr, Y, X_cx, y, training=training, loss="err")
            errs[name, training] = float(r["err"].mean())
            if name == "raf":
                assert errs[name, training] < 0.5 and float(r["sign_err"].mean()) <= 0.3
                assert float((r["y"] * r["D1"]).mean()) < -0.5
        assert not bool(r["gram_ill_conditioned"].any())
    for training in ("finetune", "retrain"):
        assert errs["raf", training] <= errs["relu_raf", training] + 1e-3 < errs["rf", training]


def test_penalty_keeps_pretrained_output_small(sim_data):
    """The penalized loss keeps |D0| = |phi(X')^T theta*| small.

    Plain err does not for RAF (docs/theory/checks.md §11).
    """
    X_tr, Y, X_cx, y = sim_data[0]
    maps = [RandomAttentionFeatures(32, seed=s) for s in range(T_SIM)]
    r0 = delta_attack(maps, X_tr, Y, X_cx, y, training="retrain", loss="err")
    r1 = delta_attack(maps, X_tr, Y, X_cx, y, training="retrain", loss="penalized", penalty=10.0)
    assert float(r1["abs_D0"].mean()) < 0.5 * float(r0["abs_D0"].mean())
    assert float(r1["gamma"].mean()) < float(r0["gamma"].mean())


def test_faithful_schedule_and_improved_optimiser_not_worse(sim_data):
    X_tr, Y, X_cx, y = sim_data[0]
    maps = [RandomAttentionFeatures(32, seed=s) for s in range(T_SIM)]
    rf = delta_attack(maps, X_tr, Y, X_cx, y, training="retrain", loss="err", faithful=True)
    assert bool((rf["steps"] == 50 * n_SIM).all()) and bool((rf["restart"] == 0).all())
    ours = delta_attack(maps, X_tr, Y, X_cx, y, training="retrain", loss="err")
    assert float(ours["err"].mean()) <= float(rf["err"].mean()) + 1e-6
    assert float(ours["steps"].float().mean()) < 50 * n_SIM / 2  # early stop
    rfm = RandomFeatures(n_SIM, 32, seed=0)
    r = delta_attack(rfm, X_tr[0], Y[0], X_cx[0], y[0], training="finetune", loss="err", faithful=True)
    assert bool((r["steps"] == 300).all())


def test_ill_conditioned_training_set_is_flagged(rows):
    n, d = 5, 6
    X_tr = rows(8, n, d, seed=1, dtype=torch.float64)
    X_tr = torch.cat([X_tr, X_tr[:1]])  # a duplicated training sample: singular Gram
    Y = torch.tensor([1.0, -1.0] * 4 + [1.0], dtype=torch.float64)
    X_cx = rows(2, n, d, seed=2, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="condition number"):
        r = delta_attack(RandomAttentionFeatures(d, dtype="float64"), X_tr, Y, X_cx, torch.ones(2), steps=5, restarts=1)
    assert bool(r["gram_ill_conditioned"].all())


# ---- bad input ---------------------------------------------------------------------------------------------------


class _Untouchable(RandomAttentionFeatures):
    def forward(self, X):
        raise AssertionError("validation must happen before any feature is computed")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(N=11), r"N must be an integer in \[1, 10\] .*got 11"),
        (dict(loss="hinge"), r"loss must be one of \['err', 'align', 'align_proj', 'penalized'\], got 'hinge'"),
        (dict(training="total"), r"training must be one of \['finetune', 'retrain'\], got 'total'"),
        (dict(loss="penalized", penalty=-0.1), r"penalty must be a finite number >= 0, got -0.1"),
        (dict(position=4), r"position must be an integer in \[0, 3\], got 4"),
        (dict(position=-1), r"position must be an integer >= 0, got -1"),  # the settings, before the sizes
        (dict(train_ids=torch.arange(10), ctx_ids=torch.tensor([20, 3])), r"ctx_ids: .*got shared id\(s\) \[3\]"),
        (dict(faithful=True, restarts=3), r"restarts must be 1 .* got 3"),
    ],
)
def test_bad_input(rows, kwargs, match):
    X_tr, X_cx = rows(10, 4, 6, seed=1), rows(2, 4, 6, seed=2)
    with pytest.raises(ValueError, match=match):
        delta_attack(_Untouchable(6), X_tr, torch.ones(10), X_cx, torch.ones(2), **kwargs)


def test_context_ids_outside_the_first_N_are_allowed(rows):
    X_tr, X_cx = rows(10, 4, 6, seed=1, dtype=torch.float64), rows(1, 4, 6, seed=2, dtype=torch.float64)
    Y = torch.tensor([1.0, -1.0] * 5)
    r = delta_attack(
        RandomAttentionFeatures(6), X_tr, Y, X_cx, torch.ones(1), N=8, train_ids=torch.arange(10),
        ctx_ids=torch.tensor([9]), steps=3, restarts=1,
    )  # fmt: skip
    assert r["err"].shape == (1,)


# ---- plots -------------------------------------------------------------------------------------------------------


def _records():
    g = torch.Generator().manual_seed(0)
    recs = []
    for m, n in (("rf", 40), ("raf", 40), ("raf", 120)):
        for training in ("finetune", "retrain"):
            for N in (100, 700):
                for loss, p in (("err", 0.0), ("align", 0.0), ("penalized", 0.1), ("penalized", 1.0)):
                    gamma, err = torch.rand(2, generator=g).tolist()
                    recs.append(dict(experiment="attack", map=m, training=training, loss=loss, p=p, n=n, N=N,
                                     d=768, gamma=gamma, err=4 * err))  # fmt: skip
    return recs


def test_plot_attack_scatter_layout():
    fig = plot_attack_scatter(_records())
    axes = fig.axes
    assert len(axes) == 6  # 2 rows (fine-tuned, re-trained) x 3 (map, n) panels
    titles = [ax.get_title() for ax in axes]
    assert titles[0].startswith("RF, n = 40") and "fine-tuned" in titles[0] and "re-trained" in titles[3]
    assert titles[2].startswith("RAF, n = 120")
    for ax in axes:
        labels = ax.get_legend_handles_labels()[1]
        # one colour per N, circles for the alignment loss and crosses for err; penalized left out
        assert sorted(labels) == sorted(f"N = {N}, {k}" for N in (100, 700) for k in ("alignment loss", "loss = Err"))
        colours = {tuple(c.get_edgecolor()[0]) for c in ax.collections}
        assert len(colours) == 2
    plt.close(fig)


def test_plot_penalized_one_colour_per_p():
    fig = plot_penalized(_records())
    assert len(fig.axes) == 6
    for ax in fig.axes:
        assert sorted(ax.get_legend_handles_labels()[1]) == ["penalty 0.1", "penalty 1"]
        assert len({tuple(c.get_facecolor()[0]) for c in ax.collections}) == 2
    plt.close(fig)
    with pytest.raises(ValueError, match="penalized"):
        plot_penalized([r for r in _records() if r["loss"] != "penalized"])


def test_cache_shares_heads_across_objectives_and_not_across_samples(rows):
    fm = RandomAttentionFeatures(6, seed=1, dtype="float64")
    X = rows(20, 5, 6, seed=2, dtype=torch.float64)
    y = torch.tensor([1.0, -1.0] * 10, dtype=torch.float64)
    cache = {}
    for training, loss in (("finetune", "err"), ("retrain", "align"), ("retrain", "err")):
        cached = delta_attack(fm, X[2:], y[2:], X[:2], y[:2], training=training, loss=loss, steps=30, cache=cache)
        fresh = delta_attack(fm, X[2:], y[2:], X[:2], y[:2], training=training, loss=loss, steps=30)
        assert all(torch.equal(cached[k], fresh[k]) for k in fresh)
    heads = cache["heads"]
    other = delta_attack(fm, X[4:], y[4:], X[2:4], y[2:4], steps=30, cache=cache)  # other samples: recomputed
    assert cache["heads"] is not heads
    assert torch.equal(other["t0"], delta_attack(fm, X[4:], y[4:], X[2:4], y[2:4], steps=30)["t0"])


@pytest.mark.parametrize("kind", ["rf", "raf"])
def test_objectives_searched_together_equal_each_searched_alone(rows, kind):
    """delta_attacks runs every objective's chains in one loop (one map evaluation per step for all of them).

    Each objective's result is the one it gets alone, on 3 trials with their own fresh maps and training sets.
    """
    X = rows(3 * 14, 5, 6, seed=3, dtype=torch.float64).reshape(3, 14, 5, 6)
    y = torch.tensor([1.0, -1.0] * 7, dtype=torch.float64).repeat(3, 1)
    objectives = [("finetune", "err", 0.0), ("retrain", "align", 0.0), ("retrain", "penalized", 0.5)]
    fm = FreshMaps(kind, [4, 5, 6])
    # float64 chains: the same path bit for bit up to the batch's rounding (float32 paths part at its rounding)
    opts = dict(steps=60, seed=[1, 2, 3], dtype=torch.float64)
    together = delta_attacks(fm, X[:, 2:], y[:, 2:], X[:, :2], y[:, :2], objectives, **opts)
    for (training, loss, penalty), out in zip(objectives, together):
        alone = delta_attack(fm, X[:, 2:], y[:, 2:], X[:, :2], y[:, :2], training, loss, penalty, **opts)
        for k in ("D0", "D1", "err", "loss", "delta_norm"):
            assert torch.allclose(out[k], alone[k], rtol=1e-9, atol=1e-12), (loss, k)
        assert torch.equal(out["steps"], alone["steps"]) and torch.equal(out["restart"], alone["restart"])
    with pytest.raises(ValueError, match="objectives"):
        delta_attacks(fm, X[:, 2:], y[:, 2:], X[:, :2], y[:, :2], [])
    with pytest.raises(ValueError, match="loss must be one of"):
        delta_attacks(fm, X[:, 2:], y[:, 2:], X[:, :2], y[:, :2], [("retrain", "errr", 0.0)])


@pytest.mark.parametrize("kind", ["rf", "raf", "relu_raf"])
def test_float32_chains_report_float64_values_at_their_delta(rows, kind):
    """The chains run in float32 by default; every reported value is the float64 one at the kept Delta.

    The heads' outputs equal the float64 algebra of the same maps (RF: drawn from its law, rebuilt from the same draw)
    read out at the returned Delta, to float64 rounding, the Delta lies in the ball, and the objective is recomputed
    there.
    """
    X = rows(3 * 14, 5, 6, seed=3, dtype=torch.float64).reshape(3, 14, 5, 6)
    y = torch.tensor([1.0, -1.0] * 7, dtype=torch.float64).repeat(3, 1)
    fm = FreshMaps(kind, [4, 5, 6])
    out = delta_attack(fm, X[:, 2:], y[:, 2:], X[:, :2], y[:, :2], "retrain", "err", steps=60, return_delta=True)
    Phi, phi, token64 = fm.attack_inputs(X[:, 2:], X[:, :2], 0, torch.float64)
    heads = fit_heads(Phi, y[:, 2:], phi, y[:, :2])
    feats = token64.features(out["delta"][:, :, None, None])[:, :, 0, 0]  # (T, B, p) float64 at the kept Delta
    D0, D1 = heads.outputs(feats, "retrain")
    # a Delta projected onto the sphere has the radius as its norm to float64 rounding (here and there 1 ulp above)
    assert out["delta"].dtype == torch.float64 and bool((out["delta_norm"] <= 6**0.5 * (1 + 1e-12)).all())
    assert torch.allclose(out["D0"], D0, rtol=1e-12, atol=1e-12) and torch.allclose(
        out["D1"], D1, rtol=1e-12, atol=1e-12
    )
    assert torch.allclose(out["loss"], (D1 + y[:, :2]) ** 2, rtol=1e-12, atol=1e-15)
