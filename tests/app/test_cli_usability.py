"""What a Lightning user expects of the command line beyond error blocks.

No abbreviated keys, messages for an unwritable log folder and a misspelled encoder, and TensorBoard runs with hparams
and the config as text.

Runs go through `main([...])` on the tiny test settings of tests/conf (synthetic tokens, seconds each).
"""

from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2

from wslight.app.cli import main
from wslight.app.run_summary import log_run_hparams

pytestmark = pytest.mark.usefixtures("one_thread")

CONF = Path(__file__).resolve().parents[1] / "conf"
TRAIN = str(CONF / "raf.yaml")
WS = str(CONF / "ws" / "raf.yaml")


# ----------------------------------------------------------------------------------------------------- messages
def test_an_abbreviated_key_is_an_error_with_the_full_key_suggested(cli_fails):
    err = cli_fails(["fit", "--config", TRAIN, "--trainer.max_epoch", "3"])
    assert "unknown argument(s): --trainer.max_epoch 3; did you mean --trainer.max_epochs?" in err


@pytest.mark.parametrize("evaluate", [False, True], ids=["train", "evaluate"])
def test_a_log_folder_under_a_file_names_the_key_and_the_path(cli_fails, tmp_path, evaluate):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = ["test" if evaluate else "fit", "--config", WS if evaluate else TRAIN]
    err = cli_fails([*args, "--trainer.logger.init_args.save_dir", str(blocker / "logs")], evaluate)
    assert f"trainer.logger.init_args.save_dir={blocker / 'logs'}: cannot create" in err
    assert f"{blocker} is not a directory" in err


def test_a_read_only_log_folder_names_the_key_and_the_path(cli_fails, tmp_path, monkeypatch):
    """A folder where no file can be created (simulated: the tests may run as root, who writes anywhere)."""
    import wslight.records.results

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(wslight.records.results.tempfile, "TemporaryFile", refuse)
    err = cli_fails(["fit", "--config", TRAIN, "--trainer.logger.init_args.save_dir", str(tmp_path / "ro")])
    assert f"trainer.logger.init_args.save_dir={tmp_path / 'ro'}: cannot write" in err
    assert "Permission denied" in err and "OSError" not in err


def test_a_misspelled_encoder_names_the_bundled_one_not_the_hub(cli_fails):
    args = ["fit", "--config", TRAIN, "--data.init_args.embeddings.source", "imdb_offline"]
    err = cli_fails([*args, "--data.init_args.embeddings.encoder", "bundled-minlm"])
    assert "data.init_args.embeddings.encoder 'bundled-minlm' is not a known encoder" in err
    assert "did you mean 'bundled-minilm'" in err and "unreachable" not in err


def test_a_hub_encoder_offline_still_says_the_hub_is_unreachable(cli_fails, monkeypatch):
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache("bert-base-uncased", "config.json"), str):
        pytest.skip("bert-base-uncased is in the local Hugging Face cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["fit", "--config", TRAIN, "--data.init_args.embeddings.source", "imdb_offline"]
    err = cli_fails([*args, "--data.init_args.embeddings.encoder", "bert-base-uncased"])
    assert "data.init_args.embeddings.encoder 'bert-base-uncased'" in err
    assert "needs the Hugging Face hub, which is unreachable" in err and "bundled-minilm" in err


# -------------------------------------------------------------------------------------------------- TensorBoard
def hparams_tab(log_dir: Path) -> tuple[set[str], set[str]]:
    """(hparam names, metric tags) of the HPARAMS tab of `tensorboard --logdir log_dir`.

    As TensorBoard's own hparams backend computes them (the handler of its GetExperiment request).
    """
    from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.context import RequestContext
    from tensorboard.plugins.base_plugin import TBContext
    from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment

    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(log_dir))
    mux.Reload()
    tb = TBContext(logdir=str(log_dir), multiplexer=mux, data_provider=MultiplexerDataProvider(mux, str(log_dir)))
    request = api_pb2.GetExperimentRequest()
    experiment = get_experiment.Handler(RequestContext(), backend_context.Context(tb), "", request).run()
    return {h.name for h in experiment.hparam_infos}, {m.name.tag for m in experiment.metric_infos}


def tensorboard(log_dir: Path) -> tuple[dict, set[str], dict, str]:
    """(events, HPARAMS metric tags, HPARAMS params, config text) of the event files in a log directory."""
    ea = EventAccumulator(str(log_dir), size_guidance={"tensors": 0, "scalars": 0})
    ea.Reload()
    params: dict = {}
    for content in ea.PluginTagToContent(hparams_metadata.PLUGIN_NAME).values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            params = {k: v.string_value or v.number_value for k, v in data.session_start_info.hparams.items()}
    names, metric_tags = hparams_tab(log_dir)
    assert names == set(params)
    text = ea.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    return ea, metric_tags, params, text


def test_training_and_evaluation_runs_in_one_log_folder_share_the_hparams_tab(tmp_path):
    """TensorBoard shows the one experiment summary it finds in any run (that run's columns only).

    Without one it takes the union of every run's hparams and scalars.
    """
    from types import SimpleNamespace

    from lightning.pytorch.loggers import TensorBoardLogger

    runs = {
        "train": ({"map": "raf", "n": 6, "d": 8}, {"test/acc": 0.9, "train/loss": 0.1}, {}),
        "probe": ({"model/probe": "layerwise", "model/encoder": "bundled-minilm"}, {}, {"results/records": 12.0}),
    }
    for name, (params, metrics, new) in runs.items():
        logger = TensorBoardLogger(str(tmp_path), name=name, default_hp_metric=False)
        logger.log_metrics(metrics, step=0)
        log_run_hparams(SimpleNamespace(is_global_zero=True, loggers=[logger], global_step=0), params, metrics, new)
        logger.finalize("success")
    names, metric_tags = hparams_tab(tmp_path)
    assert names == {"map", "n", "d", "model/probe", "model/encoder"}
    assert {"test/acc", "train/loss", "results/records"} <= metric_tags
    for name in runs:
        ea = EventAccumulator(str(tmp_path / name / "version_0"), size_guidance={"tensors": 0})
        ea.Reload()
        tags = set(ea.PluginTagToContent(hparams_metadata.PLUGIN_NAME))
        assert tags == {hparams_metadata.SESSION_START_INFO_TAG, hparams_metadata.SESSION_END_INFO_TAG}
        assert hparams_metadata.EXPERIMENT_TAG not in ea.Tags()["tensors"]


def test_a_training_run_logs_hparams_and_its_config(tmp_path, capsys):
    main(["fit", "--config", TRAIN, "--trainer.logger.init_args.save_dir", str(tmp_path)])
    log_dir = tmp_path / "train_raf" / "version_0"
    events, metric_tags, params, text = tensorboard(log_dir)
    assert {"test/acc", "val/acc", "train/loss"} <= set(metric_tags)
    assert len(events.Scalars("test/acc")) == 1  # listed in the tab, not logged a second time
    assert params["map"] == "raf" and params["n"] == 5 and params["d"] == 16 and params["N"] == 28
    assert params["seed"] == 0 and params["model/fit_mode"] == "closed_form"
    assert params["feature_dim"] == 5 * 16 and "p" not in params  # p names the attack's penalty weight only
    assert "fit_mode: closed_form" in text and "RandomAttentionFeatures" in text
    saved = yaml.safe_load((log_dir / "hparams.yaml").read_text())
    assert "_instantiator" not in saved and saved["map"] == "raf" and saved["N"] == 28


def test_an_evaluation_run_logs_hparams_and_its_config(tmp_path, capsys):
    main(["test", "--config", WS, "--trainer.logger.init_args.save_dir", str(tmp_path)], evaluate=True)
    (log_dir,) = (tmp_path / "ws_raf").iterdir()
    events, metric_tags, params, text = tensorboard(log_dir)
    assert {"results/records", "ws/slope/raf/d8", "ws/slope/raf/d16"} <= set(metric_tags)
    assert params["map"] == "raf" and params["d"] == "8, 16" and params["n"] == "4, 12" and params["seed"] == 0
    assert "WordSensitivitySweep" in text and "n_values" in text
    assert "ws/raf" in events.Tags()["images"]
    saved = yaml.safe_load((log_dir / "hparams.yaml").read_text())
    assert saved and "_instantiator" not in saved and saved["map"] == "raf"


# ------------------------------------------------------------------------------------------------- checkpoints
def test_a_closed_form_fit_writes_a_checkpoint_that_reloads_the_head(tmp_path, capsys):
    """The solve counts as one optimiser step, so ModelCheckpoint (which saves only when the step moved) saves."""
    import torch

    from wslight.features import RandomAttentionFeatures
    from wslight.tasks.classifier import FeatureMapClassifier

    args = ["fit", "--config", TRAIN, "--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = main([*args, "--trainer.enable_checkpointing", "true"])
    assert cli.trainer.global_step == 1
    best = Path(cli.trainer.checkpoint_callback.best_model_path)
    assert best.is_file() and best.suffix == ".ckpt"
    assert f"checkpoints: best {best}" in capsys.readouterr().out
    loaded = FeatureMapClassifier.load_from_checkpoint(best, feature_map=RandomAttentionFeatures(n=5, d=16, seed=1))
    assert torch.count_nonzero(cli.model.theta) > 0
    torch.testing.assert_close(loaded.theta, cli.model.theta, rtol=0, atol=0)
    # the map's frozen weights come from the checkpoint too (built here with another seed)
    torch.testing.assert_close(loaded.feature_map.W, cli.model.feature_map.W, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ shipped configs
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["ws/raf", "ws/raf.yaml", "configs/ws/raf.yaml"])
def test_a_shipped_config_is_found_by_name_from_any_directory(cli_fails, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    err = cli_fails(["evaluate", "--config", name, "--model.init_args.grid.trials", "0"])
    assert "evaluate.py: error: model.init_args.grid.trials must be a positive integer, got 0" in err
    assert not list(tmp_path.iterdir())


def test_a_training_config_is_found_by_name_for_train_py(cli_fails, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = cli_fails(["fit", "--config", "raf", "--data.init_args.val_fraction", "1.5"])
    assert "data.init_args.val_fraction must be a finite number in [0, 1)" in err


def test_a_file_in_the_working_directory_wins_over_the_shipped_name(cli_fails, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "raf.yaml").write_text(Path(WS).read_text().replace("trials: 2", "trials: -3"))
    err = cli_fails(["evaluate", "--config", "ws/raf.yaml"])
    assert "model.init_args.grid.trials must be a positive integer, got -3" in err


def test_an_unknown_config_name_lists_close_shipped_names(cli_fails, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = cli_fails(["evaluate", "--config", "ws/rff"])
    assert "--config ws/rff: no such file, and no shipped config named 'ws/rff'; did you mean ws/rf" in err
    missing = tmp_path / "no-such.yaml"  # a path, not a name: no list of shipped names
    err = cli_fails(["evaluate", "--config", str(missing)])
    assert f"--config {missing}: no such file\n" in err


def test_the_wheel_carries_every_config(tmp_path):
    """Built offline (no build isolation) from a copy of the package files, so the checkout gets no build/."""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, src / part)
    for part in ("wslight", "configs"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "-w", str(tmp_path / "whl"), "--no-deps"]
    subprocess.run([*cmd, "--no-build-isolation", "-q"], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "whl").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = ROOT / "configs"
    shipped = {f"wslight/configs/{p.relative_to(configs).as_posix()}" for p in configs.rglob("*.yaml")}
    assert shipped and shipped <= names
    package = ROOT / "wslight"
    modules = {f"wslight/{p.relative_to(package).as_posix()}" for p in package.rglob("*.py")}
    assert "wslight/py.typed" in names and modules <= names, sorted(modules - names)  # every subpackage is listed


# ------------------------------------------------------------------------------------------------ feature_map type
def test_model_help_lists_the_maps_not_every_torch_module(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model.help", "wslight.tasks.FeatureMapClassifier"])
    out = capsys.readouterr().out
    for name in ("RandomFeatures", "DeepRandomFeatures", "RandomAttentionFeatures", "ReLUAttentionFeatures"):
        assert f"wslight.features.{name}" in out
    assert "torch.nn.Conv2d" not in out and "torch.nn.Linear" not in out


def test_any_module_with_d_still_works_from_python():
    """Outside the command line the head takes any nn.Module mapping (B, n, d) to (B, p) with an int `d`."""
    import torch
    from torch import nn

    from wslight.tasks.classifier import FeatureMapClassifier

    class MeanReLU(nn.Module):
        d, n = 4, 3

        def out_dim(self, n=None):
            return 6

        def forward(self, X):  # (B, n, d) -> (B, 6)
            return torch.relu(X.mean(1) @ torch.ones(4, 6))

    model = FeatureMapClassifier(MeanReLU(), n=3, fit_mode="closed_form")
    assert model(torch.ones(2, 3, 4)).shape == (2,) and model.p == 6


def test_lightning_tip_lines_are_not_shown(caplog):
    """Lightning's 'Tip: try installing litlogger' lines are dropped; its other information lines stay."""
    import logging

    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    import wslight.app.cli  # noqa: F401 (installs the filter)

    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        rank_zero_info("💡 Tip: For seamless cloud logging, try installing [litlogger]")
        rank_zero_info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]
