"""DeltaAttackCallback: the attack after a fit of a linear head on a frozen map, its records, scalars and figures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_args
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

import wslight.tasks.attack_sweep as attack_sweep
from wslight.attack import AttackSettings
from wslight.data import EmbeddingSpec
from wslight.features import RandomAttentionFeatures, RandomFeatures
from wslight.records import results
from wslight.records.results import read_records
from wslight.tasks import EmbeddingDataModule
from wslight.tasks.attack_callback import DeltaAttackCallback
from wslight.tasks.classifier import FeatureMapClassifier

ROOT = Path(__file__).resolve().parents[2]
ATTACK_FIELDS = results.ATTACK_FIELDS | {"sample_id"}
FAST = {"attack": AttackSettings(steps=40, restarts=2)}


# Tiny tensors, many small steps: one torch thread (the conftest fixture) avoids pool contention.
pytestmark = pytest.mark.usefixtures("one_thread")


def datamodule(path: Path, n: int = 6) -> EmbeddingDataModule:
    return EmbeddingDataModule(
        EmbeddingSpec(source="synthetic", synthetic_dim=16, num_samples=60, cache_dir=str(path / "cache")),
        n=n,
        d=8,
        val_fraction=0.1,
        test_fraction=0.2,
        batch_size=16,
        progress=False,
    )


def fit(path: Path, feature_map, callback: DeltaAttackCallback | None, n: int = 6, progress: bool = False):
    dm = datamodule(path, n)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=TensorBoardLogger(str(path)),
        enable_progress_bar=progress,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[callback] if callback is not None else [],
    )
    model = FeatureMapClassifier(feature_map, n=n, fit_mode="closed_form")
    trainer.fit(model, dm)
    return trainer, model, dm


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    path = tmp_path_factory.mktemp("raf")
    cb = DeltaAttackCallback(trainings=["finetune", "retrain"], losses=["err", "align"], num_contexts=3, **FAST)
    trainer, model, dm = fit(path, RandomAttentionFeatures(8, seed=0), cb)
    return trainer, model, dm, cb


def test_fit_end_writes_records_matching_the_fitted_head(fitted):
    trainer, model, dm, cb = fitted
    out_dir = Path(trainer.log_dir)
    recs = read_records(out_dir / "attack_results.jsonl")
    assert len(recs) == 3 * 2 * 2
    assert {(r["trial"], r["training"], r["loss"]) for r in recs} == {
        (i, t, lo) for i in range(3) for t in ("finetune", "retrain") for lo in ("err", "align")
    }
    for r in recs:
        assert ATTACK_FIELDS <= set(r), ATTACK_FIELDS - set(r)
        assert r["experiment"] == "attack" and r["map"] == "raf"
        assert (r["d"], r["n"], r["N"]) == (8, 6, len(dm.train_indices))
        assert abs(r["t1"] - r["y"]) < 1e-6  # both heads interpolate the context sample
        assert r["delta_norm"] <= 8**0.5 + 1e-9  # Delta stays in the ball of radius sqrt(d)
    ids = dm.embeddings.sample_ids
    test_ids, train_ids = set(ids[dm.test_indices].tolist()), set(ids[dm.train_indices].tolist())
    ctx = {r["sample_id"] for r in recs}
    assert len(ctx) == 3 and ctx <= test_ids and not ctx & train_ids
    # the callback's theta* is the module's own closed-form head: t0 = phi(X)^T theta* = model(X)
    for r in (r for r in recs if r["training"] == "finetune" and r["loss"] == "err"):
        pos = torch.nonzero(ids == r["sample_id"]).flatten()
        X, y = dm.embeddings.samples(pos, 6, 8)
        assert float(y[0]) == r["y"]
        assert abs(float(model(X)[0].detach()) - r["t0"]) < 1e-5 * max(1.0, abs(r["t0"]))
    # a record's gamma is max(|t0|, |D0|) (working definition), and err = (D1 + y)^2
    for r in recs:
        assert r["gamma"] == pytest.approx(max(abs(r["t0"]), abs(r["D0"])), rel=1e-12)
        assert r["err"] == pytest.approx((r["D1"] + r["y"]) ** 2, rel=1e-9, abs=1e-15)


def test_scalars_and_figures(fitted):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, _, _, cb = fitted
    out_dir = Path(trainer.log_dir)
    assert (out_dir / "attack_scatter.png").stat().st_size > 0 and (out_dir / "attack_scatter.pdf").stat().st_size > 0
    ea = EventAccumulator(str(out_dir))
    ea.Reload()
    recs = read_records(out_dir / "attack_results.jsonl")
    for t in ("finetune", "retrain"):
        errs = sorted(r["err"] for r in recs if r["training"] == t)
        flips = [1.0 - r["sign_err"] for r in recs if r["training"] == t]
        (err_ev,) = ea.Scalars(f"attack/err_{t}")
        (flip_ev,) = ea.Scalars(f"attack/flip_rate_{t}")
        assert err_ev.value == pytest.approx((errs[2] + errs[3]) / 2, rel=1e-5)  # median of 6
        assert flip_ev.value == pytest.approx(sum(flips) / len(flips), rel=1e-6)
        assert cb.metrics[f"attack/err_{t}"] == pytest.approx(err_ev.value, rel=1e-5)
    assert "attack/scatter" in ea.Tags()["images"]


def test_rerun_appends_nothing_and_is_deterministic_another_map_appends(fitted):
    trainer, model, _, cb = fitted
    path = Path(trainer.log_dir) / "attack_results.jsonl"
    before = path.read_text()
    again = DeltaAttackCallback(trainings=["finetune", "retrain"], losses=["err", "align"], num_contexts=3, **FAST)
    again.run(trainer, model)
    assert path.read_text() == before  # same settings, same step: the trials are already there
    assert [(r["sample_id"], r["D1"]) for r in again.records] == [(r["sample_id"], r["D1"]) for r in cb.records]
    # another map in the same folder is another attack: its records are appended under another run key
    other = FeatureMapClassifier(RandomAttentionFeatures(8, seed=5), n=6, fit_mode="closed_form")
    again.run(trainer, other)
    recs = read_records(path)
    assert len(recs) == 2 * 12 and len({r["run_key"] for r in recs}) == 2
    assert [r["t0"] for r in recs[12:]] != [r["t0"] for r in recs[:12]]


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"losses": ["err", "bogus"]}, "losses"),
        ({"losses": []}, "losses"),
        ({"trainings": ["finetune", "refit"]}, "trainings"),
        ({"penalties": [-1.0]}, "penalties"),
        ({"penalties": []}, "penalties"),
        ({"num_contexts": 0}, "num_contexts"),
        ({"N": 0}, "N"),
        ({"hook": "val_end"}, "hook"),
    ],
)
def test_bad_arguments_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"^{key} must .*got "):
        DeltaAttackCallback(**kwargs)


@pytest.mark.parametrize(
    "fields, key", [({"steps": 0}, "steps"), ({"faithful": True, "restarts": 3}, "restarts"), ({"lr": 0.0}, "lr")]
)
def test_bad_attack_settings_name_the_field_before_the_callback(fields, key):
    with pytest.raises(ValueError, match=rf"^{key} must .*got "):
        DeltaAttackCallback(attack=AttackSettings(**fields))


def test_bad_sizes_raise_before_any_attack(fitted, monkeypatch, tmp_path):
    trainer, model, dm, _ = fitted

    def no_attack(*args, **kwargs):
        raise AssertionError("delta_attacks ran before the sizes were checked")

    monkeypatch.setattr(attack_sweep, "delta_attacks", no_attack)
    M = len(dm.train_indices)
    with pytest.raises(ValueError, match=rf"^N must be <= {M} .*got 1000"):
        DeltaAttackCallback(N=1000).run(trainer, model)
    with pytest.raises(ValueError, match=rf"^num_contexts must be <= {len(dm.test_indices)} .*got 500"):
        DeltaAttackCallback(num_contexts=500).run(trainer, model)
    with pytest.raises(ValueError, match=r"^position must be .*\[0, 5\].*got 6"):
        DeltaAttackCallback(attack=AttackSettings(position=6)).run(trainer, model)
    # N >= the feature dimension (RF with k = 20 features, 42 training samples): the heads would not interpolate
    with (
        pytest.raises(ValueError, match=r"^N must be < 20 \(the feature dimension.*got 42"),
        pytest.warns(RuntimeWarning, match="ill-conditioned"),  # the fit itself: 42 samples, 20 features
    ):
        fit(tmp_path, RandomFeatures(6, 8, 20, seed=0), DeltaAttackCallback(num_contexts=2, **FAST))
    assert not list(tmp_path.rglob("attack_results.jsonl"))


def test_subset_N_and_test_end_hook(tmp_path):
    cb = DeltaAttackCallback(trainings=["retrain"], num_contexts=2, N=20, hook="test_end", **FAST)
    trainer, model, dm = fit(tmp_path, RandomAttentionFeatures(8, seed=1), cb)
    assert cb.records == []  # nothing at fit end
    trainer.test(model, dm, verbose=False)
    assert len(cb.records) == 2 and all(r["N"] == 20 and r["training"] == "retrain" for r in cb.records)
    assert all(abs(r["t1"] - r["y"]) < 1e-6 for r in cb.records)
    # a subset of 20 of the 42 training samples gives another theta* than the module's head
    ids = dm.embeddings.sample_ids
    pos = torch.cat([torch.nonzero(ids == r["sample_id"]).flatten() for r in cb.records])
    X, _ = dm.embeddings.samples(pos, 6, 8)
    assert max(abs(float(a) - r["t0"]) for a, r in zip(model(X).detach(), cb.records, strict=True)) > 1e-3


@pytest.mark.parametrize("progress", [True, False], ids=["bar", "no_bar"])
def test_the_attack_shows_progress_per_context_unless_the_trainer_shows_none(tmp_path, capsys, progress):
    cb = DeltaAttackCallback(trainings=["retrain"], num_contexts=2, **FAST)
    fit(tmp_path, RandomAttentionFeatures(8, seed=1), cb, progress=progress)
    err = capsys.readouterr().err
    if progress:  # one update per attacked context
        assert "Delta attack contexts" in err and "1/2" in err and "2/2" in err, err
    else:
        assert "DeltaAttackCallback" not in err
    assert len(cb.records) == 2


def test_rf_keeps_its_sign(tmp_path):
    """Paper (docs/theory/attack.md §6): RF has low word sensitivity.

    So one token (of n = 24) cannot flip its heads' decisions.
    """
    rf = DeltaAttackCallback(num_contexts=4, **FAST)
    fit(tmp_path, RandomFeatures(24, 8, 400, seed=0), rf, n=24)
    yD1 = [r["y"] * r["D1"] for r in rf.records]
    assert len(yD1) == 8 and sum(yD1) / len(yD1) > 0
    assert rf.metrics["attack/flip_rate_finetune"] == rf.metrics["attack/flip_rate_retrain"] == 0.0
    assert max(yD1) < 1.0  # the attack did move the output away from y (t1 = y)


def test_config_parses():
    from wslight.app.cli import WSLightCLI
    from wslight.app.config_files import resolve_config_args

    config = resolve_config_args(["--config", str(ROOT / "configs/attack/callback_raf.yaml")])  # raf.yaml, the overlay
    with pytest.raises(SystemExit) as info:
        WSLightCLI(args=["fit", *config, "--print_config"], run=True)
    assert info.value.code in (0, None)


# The subprocess runs below use tests/conf/attack/callback_raf.yaml (conftest.tiny_args), the tiny test setting of
# configs/attack/callback_raf.yaml (an overlay of it): synthetic tokens, n = 6, d = 8, 5 held-out contexts, losses
# err and align_proj.


@pytest.mark.slow  # a fit and its attack in subprocesses, one and two DDP processes (gloo, CPU)
def test_ddp_two_processes_give_the_records_of_one(tmp_path):
    script = tmp_path / "run.py"
    lines = ["import sys, torch", "torch.set_num_threads(1)", "from wslight.app.cli import main", "main(sys.argv[1:])"]
    script.write_text("\n".join(lines) + "\n")
    results = {}
    for devices in (1, 2):
        logs = tmp_path / f"logs{devices}"
        args = ["--trainer.devices", str(devices), "--trainer.accelerator", "cpu"]
        args += ["--trainer.strategy", "ddp" if devices == 2 else "auto"]
        proc = subprocess.run(
            [sys.executable, str(script), "fit", *tiny_args(tmp_path / "cache", logs), *args],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        (path,) = logs.rglob("attack_results.jsonl")
        results[devices] = sorted(read_records(path), key=lambda r: (r["sample_id"], r["training"], r["loss"]))
    one, two = results[1], results[2]
    assert len(one) == len(two) == 5 * 2 * 2
    assert len({(r["sample_id"], r["training"], r["loss"]) for r in two}) == len(two)
    assert {r["rank"] for r in one} == {0} and {r["rank"] for r in two} == {0, 1}  # contexts 0, 2, 4 / 1, 3
    assert sorted(r["trial"] for r in two if r["rank"] == 1) == [1] * 4 + [3] * 4
    for a, b in zip(one, two, strict=True):
        keys = ("sample_id", "training", "loss", "trial")
        assert [a[k] for k in keys] == [b[k] for k in keys]
        for k in ("y", "t0", "t1", "D0", "D1", "err", "gamma", "proj_ratio", "objective"):
            assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-6), (k, a, b)
    print(json.dumps({"records": len(two)}))
