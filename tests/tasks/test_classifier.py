"""FeatureMapClassifier: gradient descent reaches the closed-form min-norm head, and more.

Checkpoints, size checks, bad arguments, and the training CLI run on the tiny test settings of the shipped configs
(tests/conf/, overlays of them).
"""

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

from wslight.app.cli import main
from wslight.data import EmbeddingSpec
from wslight.features import RandomAttentionFeatures, RandomFeatures
from wslight.tasks import EmbeddingDataModule
from wslight.tasks.classifier import FeatureMapClassifier

ROOT = Path(__file__).resolve().parents[2]
MAPS = ["rf", "deep_rf", "raf", "relu_raf"]


def synthetic_dm(tmp_path, n=6, d=8, num_samples=40, **kw):
    return EmbeddingDataModule(
        EmbeddingSpec(source="synthetic", synthetic_dim=d, num_samples=num_samples, cache_dir=str(tmp_path)),
        n=n,
        d=d,
        val_fraction=0.1,
        test_fraction=0.2,
        batch_size=8,
        progress=False,
        **kw,
    )


def trainer(tmp_path, **kw):
    opts = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    return pl.Trainer(**{**opts, **kw})


def test_gradient_descent_converges_to_the_closed_form_head(tmp_path):
    n, d = 6, 8
    rf = lambda: RandomFeatures(n, d, k=2000, seed=1, dtype="float64")  # noqa: E731  N << k: a well-posed Gram
    closed = FeatureMapClassifier(rf(), fit_mode="closed_form")
    trainer(tmp_path, max_epochs=1).fit(closed, datamodule=synthetic_dm(tmp_path, n, d))
    dm = synthetic_dm(tmp_path, n, d)
    dm.batch_size = 1000  # full-batch gradient descent
    dm.setup()
    X, _ = dm.embeddings.samples(dm.train_indices, n, d)
    Phi = closed.features(X)
    # step below 2 / smoothness of the loss mean((Phi theta - y)^2), smoothness = 2 lambda_max(Phi Phi^T) / N
    lr = 0.9 * len(Phi) / torch.linalg.eigvalsh(Phi @ Phi.T)[-1].item()
    gd = FeatureMapClassifier(rf(), fit_mode="gradient", lr=lr)
    trainer(tmp_path, max_epochs=400, num_sanity_val_steps=0, limit_val_batches=0).fit(gd, datamodule=dm)
    # plain GD from zero stays in the row span of Phi, so it converges to theta* = Phi^+ Y
    rel = (gd.theta - closed.theta).norm() / closed.theta.norm()
    assert rel < 1e-2, rel


def test_closed_form_head_interpolates_the_training_set(tmp_path):
    n, d = 6, 8
    dm = synthetic_dm(tmp_path, n, d)
    model = FeatureMapClassifier(RandomFeatures(n, d, seed=0, dtype="float64"), fit_mode="closed_form")
    trainer(tmp_path, max_epochs=1).fit(model, datamodule=dm)
    X, y = dm.embeddings.samples(dm.train_indices, n, d)
    assert torch.allclose(model(X.double()), y.double(), atol=1e-6)


def test_closed_form_ridge_head_and_bias_solve_the_penalised_least_squares_of_the_training_set(tmp_path):
    """With ridge and bias, the closed-form fit is the minimiser of ||Phi theta + b - y||^2 + ridge ||theta||^2."""
    n, d, ridge = 6, 8, 0.5
    dm = synthetic_dm(tmp_path, n, d)
    model = FeatureMapClassifier(
        RandomFeatures(n, d, seed=0, dtype="float64"), fit_mode="closed_form", bias=True, ridge=ridge
    )
    trainer(tmp_path, max_epochs=1).fit(model, datamodule=dm)
    X, y = dm.embeddings.samples(dm.train_indices, n, d)
    Phi, y = model.features(X.double()), y.double()
    theta, b = model.theta.detach(), model.bias.detach()
    # the stationarity conditions: the residual sums to zero (b unpenalised) and Phi^T r = ridge theta
    r = Phi @ theta + b - y
    assert abs(float(r.sum())) < 1e-8 * len(y)
    assert torch.allclose(Phi.T @ r, -ridge * theta, atol=1e-8)
    assert float(b) != 0.0 and torch.allclose(model(X.double()), Phi @ theta + b)


def test_checkpoint_restores_predictions_with_map_in_checkpoint_or_rebuilt_from_seed(tmp_path):
    n, d = 6, 8
    dm = synthetic_dm(tmp_path, n, d)
    model = FeatureMapClassifier(RandomFeatures(n, d, seed=3), fit_mode="closed_form")
    t = trainer(tmp_path, max_epochs=1)
    t.fit(model, datamodule=dm)
    ckpt = tmp_path / "head.ckpt"
    t.save_checkpoint(ckpt)
    X, _ = dm.embeddings.samples(dm.test_indices, n, d)
    expected = model(X)
    state = torch.load(ckpt, weights_only=False)["state_dict"]
    # (1) the random map travels in the checkpoint: a map with another seed is overwritten by the saved buffers
    other = FeatureMapClassifier(RandomFeatures(n, d, seed=99), fit_mode="closed_form")
    other.load_state_dict(state)
    assert torch.equal(other(X), expected)
    # (2) the map rebuilt from its seed, only the head loaded
    rebuilt = FeatureMapClassifier(RandomFeatures(n, d, seed=3), fit_mode="closed_form")
    rebuilt.theta.data.copy_(state["theta"])
    assert torch.equal(rebuilt(X), expected)


def test_map_built_for_other_sizes_than_the_data_is_rejected_before_training(tmp_path):
    dm = synthetic_dm(tmp_path, n=6, d=8)
    model = FeatureMapClassifier(RandomFeatures(5, 8, seed=0), fit_mode="closed_form")
    with pytest.raises(ValueError, match="n: the feature map was built for n=5 but the data serves n=6"):
        trainer(tmp_path, max_epochs=1).fit(model, datamodule=dm)
    model = FeatureMapClassifier(RandomAttentionFeatures(16, seed=0), n=6, fit_mode="closed_form")
    with pytest.raises(ValueError, match="d: the feature map was built for d=16 but the data serves d=8"):
        trainer(tmp_path, max_epochs=1).fit(model, datamodule=dm)


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(fit_mode="adam"), r"fit_mode must be one of \['gradient', 'closed_form'\], got 'adam'"),
        (dict(n=0), r"n must be a positive integer or None, got 0"),
        (dict(lr=0.0), r"lr must be a finite number > 0, got 0.0"),
        (dict(fit_mode="closed_form", ridge=-1.0), r"ridge must be a finite number >= 0(\.0)?, got -1.0"),
        (dict(ridge=1.0), r"ridge: 1.0 applies to fit_mode closed_form; a gradient fit uses weight_decay"),
    ],
)
def test_bad_arguments_name_the_key_the_range_and_the_value(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        FeatureMapClassifier(RandomFeatures(6, 8, seed=0), **kw)
    with pytest.raises(ValueError, match="n: the number of tokens is needed to size the head of an attention map"):
        FeatureMapClassifier(RandomAttentionFeatures(8, seed=0))


@pytest.mark.parametrize("name", MAPS)
def test_tiny_setting_stays_tiny(tmp_path, name):
    """tests/conf/<map>.yaml is read on top of configs/<map>.yaml and stays tiny.

    Synthetic tokens, a CPU, nothing written but the logs; the model is the shipped config's.
    """
    args = ["--config", str(ROOT / "tests" / "conf" / f"{name}.yaml")]
    config = main([*args, "--trainer.logger.init_args.save_dir", str(tmp_path)], run=False).config
    shipped = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    assert config.model.init_args.feature_map.class_path == shipped["model"]["init_args"]["feature_map"]["class_path"]
    emb = config.data.init_args.embeddings
    assert emb.source == "synthetic" and emb.num_samples <= 64 and emb.synthetic_dim <= 32
    assert config.trainer.accelerator == "cpu" and config.trainer.callbacks == []


def fit_tiny(tmp_path, name="raf", *extra):
    args = ["fit", "--config", str(ROOT / "tests" / "conf" / f"{name}.yaml")]
    return main([*args, "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"), *extra])


@pytest.mark.parametrize("name", MAPS)
def test_train_cli_links_sizes_and_logs_scalars(tmp_path, name):
    cli = fit_tiny(tmp_path, name)
    fm = cli.model.feature_map
    assert (fm.d, cli.model.n) == (16, 5)
    assert getattr(fm, "n", 5) == 5
    assert cli.datamodule.spec == EmbeddingSpec(source="synthetic", num_samples=40, synthetic_dim=16)
    log_dir = Path(cli.trainer.logger.log_dir)
    saved = yaml.safe_load((log_dir / "config.yaml").read_text())
    assert saved["data"]["init_args"]["embeddings"]["source"] == "synthetic"  # the substitution is recorded
    assert list(log_dir.glob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir)).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/acc", "val/acc", "test/acc", "test/mse"} <= tags
    assert events.Scalars("train/acc")[-1].value == 1.0  # the min-norm head interpolates its training set


def test_train_cli_sizes_come_from_the_data_only(tmp_path):
    """The sizes n and d are written once, under data: the link sets them on the map and the head."""
    cli = fit_tiny(tmp_path, "raf", "--data.init_args.d", "12", "--data.init_args.n", "7")
    assert (cli.model.feature_map.d, cli.model.n, cli.model.p) == (12, 7, 7 * 12)


def test_train_cli_nested_embeddings_override(tmp_path):
    """One config shape: the spec's keys are set as data.init_args.embeddings.<key>, like the evaluations'."""
    emb = "--data.init_args.embeddings"
    cli = fit_tiny(tmp_path, "rf", f"{emb}.num_samples", "30", f"{emb}.seed", "2")
    dm = cli.datamodule
    assert dm.spec.num_samples == 30 and dm.spec.seed == 2 and dm.seed == 2  # the split follows embeddings.seed
    assert len(dm.train_indices) + len(dm.val_indices) + len(dm.test_indices) == 30


def test_checkpoint_with_the_datamodule_loads_weights_only(tmp_path):
    """The spec is saved as plain values, so a checkpoint (and `--ckpt_path` resume) loads with weights_only=True."""
    dm = synthetic_dm(tmp_path)
    t = trainer(tmp_path, max_epochs=1)
    t.fit(FeatureMapClassifier(RandomFeatures(6, 8, seed=0), fit_mode="closed_form"), datamodule=dm)
    t.save_checkpoint(tmp_path / "c.ckpt")
    ckpt = torch.load(tmp_path / "c.ckpt", weights_only=True)
    saved = ckpt["datamodule_hyper_parameters"]
    assert saved["embeddings"]["synthetic_dim"] == 8 and saved["n"] == 6
    again = EmbeddingDataModule(**saved)
    assert again.spec == dm.spec and (again.n, again.d, again.seed) == (dm.n, dm.d, dm.seed)


@pytest.mark.slow  # a fit in a subprocess of two DDP processes (gloo, CPU)
def test_ddp_two_processes_gives_the_same_closed_form_head(tmp_path):
    import subprocess
    import sys

    cfg = ROOT / "tests" / "conf" / "raf.yaml"
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "logs")]
    one = main(["fit", "--config", str(cfg), *logs]).model.theta.detach().clone()
    out = tmp_path / "ddp.pt"
    script = tmp_path / "fit_ddp.py"  # DDP re-launches the script for rank 1, so it must be a file
    script.write_text(
        "import torch\nfrom wslight.app.cli import main\n"
        f"cli = main(['fit', '--config', r'{cfg}', '--trainer.devices', '2', '--trainer.strategy', 'ddp', "
        f"'--trainer.logger.init_args.save_dir', r'{tmp_path / 'logs'}'])\n"
        f"if cli.trainer.is_global_zero:\n    torch.save(cli.model.theta.detach(), r'{out}')\n"
    )
    subprocess.run([sys.executable, str(script)], check=True, cwd=ROOT, timeout=600, capture_output=True)
    assert torch.allclose(torch.load(out), one, atol=1e-6)


def test_held_out_metrics_count_each_sample_once(tmp_path):
    """Repeated samples in a held-out loader (what DDP padding produces) are counted once, by sample id."""
    from torch.utils.data import DataLoader

    dm = synthetic_dm(tmp_path)
    model = FeatureMapClassifier(RandomFeatures(6, 8, seed=0), fit_mode="closed_form")
    t = trainer(tmp_path, max_epochs=1)
    t.fit(model, datamodule=dm)
    ids = dm.test_indices
    once = t.test(model, dataloaders=DataLoader(dm.dataset(ids), batch_size=3), verbose=False)[0]
    padded = torch.cat([ids, ids[:1], ids[:1], ids[:1]])  # one sample four times
    twice = t.test(model, dataloaders=DataLoader(dm.dataset(padded), batch_size=3), verbose=False)[0]
    # the same 8 samples, their last two predicted in a batch of 3 instead of 2: float32 to rounding
    assert twice == pytest.approx(once, rel=1e-6, abs=1e-7)
    X, y = dm.embeddings.samples(ids, 6, 8)
    pred = model(X)
    assert once["test/acc"] == pytest.approx(((pred > 0) == (y > 0)).float().mean().item())
    assert once["test/mse"] == pytest.approx(torch.mean((pred - y) ** 2).item(), rel=1e-5)


def test_diverging_gradient_fit_stops_saying_what_to_change(tmp_path, capsys):
    from wslight.tasks.classifier import TrainingDiverged

    dm = synthetic_dm(tmp_path)
    model = FeatureMapClassifier(RandomFeatures(6, 8, seed=0), fit_mode="gradient", lr=1e3)
    with pytest.raises(TrainingDiverged, match=r"diverged: train/loss = .*lower it \(model.init_args.lr.*max_epochs"):
        trainer(tmp_path, max_epochs=5).fit(model, datamodule=dm)
    # through the CLI: one block on stderr, exit status 1, no traceback
    with pytest.raises(SystemExit) as exc:
        fit_tiny(
            tmp_path,
            "rf",
            "--model.init_args.fit_mode",
            "gradient",
            "--model.init_args.lr",
            "1000",
            "--trainer.max_epochs",
            "5",
        )
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "error: fit_mode gradient diverged" in err and "Traceback" not in err


def test_one_epoch_gradient_fit_warns(tmp_path):
    model = FeatureMapClassifier(RandomFeatures(6, 8, seed=0), fit_mode="gradient", lr=1e-3)
    with pytest.warns(UserWarning, match="max_epochs=1 makes one pass"):
        trainer(tmp_path, max_epochs=1).fit(model, datamodule=synthetic_dm(tmp_path))


@pytest.mark.slow  # a fit in a subprocess of three DDP processes (gloo, CPU)
def test_ddp_three_processes_count_each_held_out_sample_once(tmp_path):
    """3 CPU processes on a test split of 10 samples (padded to 12 by the sampler): the 1-process test metrics."""
    import json
    import subprocess
    import sys

    cfg = ROOT / "tests" / "conf" / "raf.yaml"
    args = ["fit", "--config", str(cfg), "--data.init_args.test_fraction", "0.25"]
    args += ["--trainer.logger.init_args.save_dir", str(tmp_path / "logs")]
    one = main(args).trainer.callback_metrics
    one = {k: float(v) for k, v in one.items() if k.startswith("test/")}
    dm = main(args[1:], run=False).datamodule  # parsed and built, not run
    dm.setup()
    assert len(dm.test_indices) % 3 and len(dm.val_indices) % 3  # uneven: the sampler pads
    out = tmp_path / "ddp.json"
    script = tmp_path / "fit_ddp.py"  # DDP re-launches the script for the other ranks, so it must be a file
    script.write_text(
        "import json\nfrom wslight.app.cli import main\n"
        f"cli = main({args!r} + ['--trainer.devices', '3', '--trainer.strategy', 'ddp'])\n"
        "if cli.trainer.is_global_zero:\n"
        "    m = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith('test/')}\n"
        f"    open(r'{out}', 'w').write(json.dumps(m))\n"
    )
    subprocess.run([sys.executable, str(script)], check=True, cwd=ROOT, timeout=600, capture_output=True)
    three = json.loads(out.read_text())
    assert three.keys() == one.keys() == {"test/acc", "test/mse", "test/loss"}
    for key in one:
        assert three[key] == pytest.approx(one[key], rel=1e-6, abs=1e-7), key


def test_gradient_tiny_setting_learns(tmp_path):
    shipped = yaml.safe_load((ROOT / "configs" / "raf_gradient.yaml").read_text())
    assert {c["class_path"].rsplit(".", 1)[-1] for c in shipped["trainer"]["callbacks"]} == {
        "ModelCheckpoint",
        "EarlyStopping",
    }
    cli = fit_tiny(tmp_path, "raf_gradient")
    assert isinstance(cli.trainer.optimizers[0], torch.optim.Adam)
    assert type(cli.trainer.lr_scheduler_configs[0].scheduler).__name__ == "CosineAnnealingLR"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(cli.trainer.logger.log_dir)).Reload()
    loss = [e.value for e in events.Scalars("train/loss")]
    assert len(loss) == 20 and loss[-1] < 0.5 * loss[0]  # the head trains (first loss: 1, the zero head's)
    assert "val/loss" in events.Tags()["scalars"]


SHIPPED_TRAINING = [*(f"{m}.yaml" for m in MAPS), "raf_gradient.yaml", "attack/callback_raf.yaml"]


@pytest.mark.parametrize("name", SHIPPED_TRAINING)
def test_shipped_training_configs_take_enable_progress_bar_false(tmp_path, name):
    """No hard-coded progress-bar callback: `--trainer.enable_progress_bar false` builds the trainer."""
    args = ["--config", str(ROOT / "configs" / name), "--trainer.enable_progress_bar", "false"]
    cli = main([*args, "--trainer.logger.init_args.save_dir", str(tmp_path)], run=False)
    assert cli.trainer.progress_bar_callback is None


def test_fit_prints_where_logs_and_checkpoints_went(tmp_path, capsys):
    extra = ["--trainer.enable_checkpointing", "true", "--trainer.callbacks+", "ModelCheckpoint"]
    cli = fit_tiny(tmp_path, "raf_gradient", *extra)
    out = capsys.readouterr().out.splitlines()
    ckpt = cli.trainer.checkpoint_callback
    assert out[-2:] == [
        f"logs: {cli.trainer.log_dir}",
        f"checkpoints: best {ckpt.best_model_path}, last {ckpt.last_model_path or 'none'}",
    ]
    assert Path(ckpt.best_model_path).is_file()
