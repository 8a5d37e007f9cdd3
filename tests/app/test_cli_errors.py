"""Command-line mistakes end in one short block on stderr that names the config key path, and exit status 2.

Every case goes through `main([...])` as train.py, evaluate.py and the `wslight` script do; nothing here trains or
evaluates (each fails at parse or instantiation time, in about a second). `--debug` / `WSLIGHT_DEBUG=1` bring back
the original exception and its traceback.
"""

import re
from pathlib import Path

import pytest

from wslight.app.cli import main
from wslight.app.config_files import find_config, read_config
from wslight.app.messages import check_command

pytestmark = pytest.mark.usefixtures("one_thread")

CONF = Path(__file__).resolve().parents[1] / "conf"
ROOT = Path(__file__).resolve().parents[2]
TRAIN = str(CONF / "raf.yaml")  # the tiny test settings: overlays of the shipped raf and ws/raf
WS = str(CONF / "ws" / "raf.yaml")
# The shipped configs themselves, whole files: the tests that write a broken copy start from them.
TRAIN_FILE, WS_FILE = find_config("raf"), find_config("ws/raf")


@pytest.mark.parametrize(
    "extra, pattern",
    [
        # the package's own check, raised while instantiating: the key becomes its path in the config
        (
            ["--data.init_args.val_fraction", "1.5"],
            r"error: data\.init_args\.val_fraction must be a finite number in \[0, 1\), got 1\.5",
        ),
        (["--model.init_args.lr", "0"], r"error: model\.init_args\.lr must be a finite number > 0, got 0\.0"),
        (
            ["--data.init_args.embeddings.num_samples", "7"],
            r"error: data\.init_args\.embeddings\.num_samples must be even.*got 7",
        ),
        # a value on the data side that fails in the map or the head: the key the user wrote, and the link
        (
            ["--data.init_args.n", "0"],
            r"error: data\.init_args\.n must be a positive integer, got 0 \(linked to model\.init_args\.",
        ),
        # jsonargparse's type checks, reduced to the key path
        (["--data.init_args.n", "abc"], r"error: data\.init_args\.n must be of type int, got abc"),
        (
            ["--model.init_args.fit_mode", "adam"],
            r"error: model\.init_args\.fit_mode must be one of \['gradient', 'closed_form'\], got adam",
        ),
        # unknown keys, with the closest known one
        (["--data.init_args.nn", "3"], r"error: unknown key data\.init_args\.nn; did you mean data\.init_args\.n\?"),
        (
            ["--model.init_args.feature_map.init_args.sed", "3"],
            r"unknown key model\.init_args\.feature_map\.init_args\.sed; did you mean .*feature_map\.init_args\.seed\?",
        ),
        (
            ["--data.init_args.embeddings.layerr", "1"],
            r"unknown key data\.init_args\.embeddings\.layerr; did you mean data\.init_args\.embeddings\.layer\?",
        ),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_training_mistakes_name_the_key_path(cli_fails, tmp_path, extra, pattern):
    err = cli_fails(["fit", "--config", TRAIN, "--trainer.logger.init_args.save_dir", str(tmp_path), *extra])
    assert re.search(pattern, err), err
    assert not list(tmp_path.rglob("*")), "nothing may be written for a bad command"


def test_evaluation_mistake_names_the_key_path(cli_fails):
    err = cli_fails(["test", "--config", WS, "--model.init_args.grid.trials", "0"], evaluate=True)
    assert "evaluate.py: error: model.init_args.grid.trials must be a positive integer, got 0" in err


@pytest.mark.parametrize("key", ["model.init_args.feature_map.init_args.n", "model.init_args.n"])
def test_a_value_on_a_linked_key_is_an_error_naming_the_link(cli_fails, key):
    err = cli_fails(["fit", "--config", TRAIN, f"--{key}", "50"])
    assert f"{key} is linked from data.init_args.n" in err and "set data.init_args.n instead" in err


def test_a_linked_key_in_a_config_file_is_an_error_too(cli_fails, tmp_path):
    cfg = tmp_path / "raf_d.yaml"
    text = TRAIN_FILE.read_text().replace("        seed: 0\n", "        seed: 0\n        d: 12\n", 1)
    assert "d: 12" in text
    cfg.write_text(text)
    err = cli_fails(["fit", "--config", str(cfg)])
    assert "model.init_args.feature_map.init_args.d is linked from data.init_args.d" in err


def test_a_config_given_to_the_other_entry_point_says_which_one_it_belongs_to(cli_fails):
    err = cli_fails(["test", "--config", TRAIN], evaluate=True)
    assert "is a training config" in err and f"python train.py fit --config {TRAIN}" in err
    err = cli_fails(["fit", "--config", WS])
    assert "is an evaluation config (wslight.tasks.WordSensitivitySweep)" in err
    assert f"python evaluate.py --config {WS}" in err
    err = cli_fails(["test", "fit", "--config", WS], evaluate=True)  # `evaluate.py fit ...`
    assert "evaluate.py runs the `test` subcommand itself" in err and "python train.py fit" in err


def test_evaluate_py_test_is_accepted_once(cli_fails):
    """`evaluate.py test --config ...` (the usage line shows `test`) means `evaluate.py --config ...`."""
    err = cli_fails(["test", "test", "--config", WS, "--model.init_args.grid.trials", "0"], evaluate=True)
    assert "model.init_args.grid.trials must be a positive integer, got 0" in err


@pytest.mark.parametrize(
    "extra, block",
    [
        (["--data.init_args.val_fraction", "1.5"], "data.init_args.val_fraction must be a finite number in [0, 1)"),
        (["--data.init_args.nn", "3"], "unknown key data.init_args.nn; did you mean data.init_args.n?"),
    ],
    ids=["value", "unknown-key"],
)
def test_debug_flag_and_env_print_the_traceback_then_the_block(capsys, monkeypatch, extra, block):
    """`--debug` / `WSLIGHT_DEBUG=1`: the original traceback, then the same one-line block, and the same exit status."""
    args = ["fit", "--config", TRAIN, *extra]
    for debug_args, env in (([*args, "--debug"], None), (args, "1")):
        if env:
            monkeypatch.setenv("WSLIGHT_DEBUG", env)
        with pytest.raises(SystemExit) as exc:
            main(debug_args)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err
        assert err.index("Traceback") < err.index(f"train.py fit: error: {block}"), err


def test_console_script_evaluate_is_evaluate_py(cli_fails):
    """`wslight evaluate --config ...` is evaluate.py (the `test` subcommand supplied), training stays `wslight fit`."""
    err = cli_fails(["evaluate", "--config", WS, "--model.init_args.grid.trials", "0"])
    assert "evaluate.py: error: model.init_args.grid.trials must be a positive integer, got 0" in err
    err = cli_fails(["evaluate", "--config", TRAIN])
    assert "is a training config" in err


def test_package_says_where_to_start():
    import wslight

    assert "wslight fit --config" in wslight.__doc__ and "wslight evaluate --config" in wslight.__doc__
    assert (Path(wslight.__file__).parent / "py.typed").is_file()


def test_an_unwritable_output_dir_names_its_key_before_any_trial(cli_fails, tmp_path):
    """An evaluation's explicit output folder under a file: one block naming model.init_args.output_dir, exit 2."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    err = cli_fails(
        [
            "test",
            "--config",
            WS,
            "--trainer.logger.init_args.save_dir",
            str(tmp_path / "logs"),
            "--model.init_args.output_dir",
            str(blocker / "out"),
        ],
        evaluate=True,
    )
    assert f"model.init_args.output_dir={blocker / 'out'}" in err
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").rglob("results.jsonl"))


def test_no_lightning_warning_about_args_on_a_run():
    """The CLI passes the command line to LightningCLI as args; Lightning's warning about that is not shown."""
    import warnings

    from wslight.app.cli import main

    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit):
        warnings.simplefilter("always")
        main(["fit", "--config", TRAIN, "--data.init_args.n", "0"])
    assert not [w for w in caught if "args parameter is intended" in str(w.message)]


# ------------------------------------------------------------------------------------------- config files
def _with(tmp_path, text: str, name: str = "raf.yaml") -> str:
    cfg = tmp_path / name
    cfg.write_text(text)
    return str(cfg)


@pytest.mark.parametrize(
    "edit, place, problem",
    [
        # a tab as indentation
        (("        seed: 0\n", "\t\tseed: 0\n"), r"line 12, column 1", r"found character '\\t'.*indent with spaces"),
        # an unclosed bracket: where the list breaks off, and where its bracket opened
        (
            ("seed_everything: 0\n", "seed_everything: [0\n"),
            r"line 5, column 6",
            r"expected ',' or '\]', but got ':' \(while parsing a flow sequence at line 4, column 18\)",
        ),
    ],
    ids=["tab", "unclosed-bracket"],
)
def test_a_yaml_syntax_error_names_the_file_line_and_column(cli_fails, tmp_path, edit, place, problem):
    text = TRAIN_FILE.read_text()
    assert edit[0] in text
    cfg = _with(tmp_path, text.replace(edit[0], edit[1], 1))
    err = cli_fails(["fit", "--config", cfg])
    assert re.search(rf"error: {re.escape(cfg)}, {place}: invalid YAML: {problem}", err), err


@pytest.mark.parametrize("text", ["", "# only a comment\n\n"], ids=["empty", "comments"])
def test_an_empty_config_file_says_it_is_empty(cli_fails, tmp_path, text):
    cfg = _with(tmp_path, text)
    for args, evaluate in ((["fit", "--config", cfg], False), (["test", "--config", cfg], True)):
        err = cli_fails(args, evaluate)
        assert f"error: {cfg} is empty (no keys): a config needs at least a model: block" in err
        assert "Unexpected config" not in err


def test_a_key_written_twice_in_a_config_file_is_refused(cli_fails, tmp_path):
    """YAML keeps the last of two equal keys without a word; the CLI names the file, the line and the key path."""
    text = TRAIN_FILE.read_text().replace("        seed: 0\n", "        seed: 0\n        seed: 3\n", 1)
    cfg = _with(tmp_path, text)
    err = cli_fails(["fit", "--config", cfg])
    key = "model.init_args.feature_map.init_args.seed"
    assert f"error: {cfg}, line 13: {key} is written twice in the same block (first at line 12)" in err
    merged = tmp_path / "merge.yaml"  # a merge key (<<:) overrides by design: not a repeat
    merged.write_text("base: &b {n: 5, d: 16}\ndata:\n  <<: *b\n  n: 4\n")
    assert read_config(merged)["data"] == {"n": 4, "d": 16}


# ---------------------------------------------------------------------------------------- top-level keys
@pytest.mark.parametrize("evaluate", [False, True], ids=["fit", "evaluate"])
def test_a_misspelt_top_level_key_suggests_the_right_one(cli_fails, tmp_path, evaluate):
    src = WS if evaluate else TRAIN
    text = (WS_FILE if evaluate else TRAIN_FILE).read_text()
    cfg = _with(tmp_path, text.replace("\nmodel:", "\nmodle:", 1))
    sub = "test" if evaluate else "fit"
    err = cli_fails([sub, "--config", cfg], evaluate)
    assert f"error: {cfg}: unknown key modle; did you mean model?" in err  # caught before jsonargparse
    assert "Subcommand" not in err and "required" not in err
    only = _with(tmp_path, "modle:\n  init_args: {}\n")  # no model block at all: still the typo, not "required"
    assert "unknown key modle; did you mean model?" in cli_fails([sub, "--config", only], evaluate)
    err = cli_fails([sub, "--config", src, "--modle.init_args.trials", "1"], evaluate)
    assert "unknown argument(s): --modle.init_args.trials 1; did you mean --model.init_args.trials?" in err


# ------------------------------------------------------------------------------------------------- seeds
def test_seed_everything_out_of_range_names_the_key(cli_fails, tmp_path):
    err = cli_fails(["fit", "--config", TRAIN, "--seed_everything", "-3"])
    assert "error: seed_everything must be an integer in [0, 4294967295] (or true: a random seed), got -3" in err
    cfg = _with(tmp_path, TRAIN_FILE.read_text().replace("seed_everything: 0", "seed_everything: 4294967296", 1))
    err = cli_fails(["fit", "--config", cfg])
    assert "seed_everything must be an integer in [0, 4294967295]" in err and "got 4294967296" in err


@pytest.mark.parametrize("value", ["true", "false", "7"])
def test_seed_everything_true_false_and_a_later_value_pass_the_check(tmp_path, value):
    cfg = _with(tmp_path, TRAIN_FILE.read_text().replace("seed_everything: 0", "seed_everything: -1", 1))
    args = ["fit", "--config", cfg, "--seed_everything", value]  # the command line comes last and wins
    assert check_command(args, evaluate=False) == args


@pytest.mark.parametrize("config", [TRAIN, "raf"], ids=["tiny", "shipped"])
def test_a_negative_map_seed_is_refused_like_the_sweeps_do(cli_fails, config):
    """Training refuses a negative map seed with the sweeps' message (`seed must be an integer >= 0`)."""
    err = cli_fails(["fit", "--config", config, "--model.init_args.feature_map.init_args.seed", "-1"])
    assert "error: model.init_args.feature_map.init_args.seed must be an integer >= 0, got -1" in err


def test_a_saved_config_with_the_old_class_paths_says_what_to_write(tmp_path, cli_fails):
    """A config saved before the Lightning classes moved to wslight.tasks: one block saying what to write.

    The block lists each old path, where it is and what to write instead, before anything runs.
    """
    evaluation = tmp_path / "saved_ws.yaml"
    text = (ROOT / "configs" / "ws" / "raf.yaml").read_text()
    evaluation.write_text(
        text.replace("wslight.tasks.WordSensitivitySweep", "wslight.evaluations.WordSensitivitySweep")
    )
    err = cli_fails(["test", "--config", str(evaluation)], evaluate=True)
    old, new = "wslight.evaluations.WordSensitivitySweep", "wslight.tasks.WordSensitivitySweep"
    assert f"{evaluation}: model.class_path = {old}: write {new}" in err
    training = tmp_path / "saved_fit.yaml"
    text = (ROOT / "configs" / "raf.yaml").read_text()
    old = text.replace("wslight.tasks.FeatureMapClassifier", "wslight.models.FeatureMapClassifier")
    training.write_text(old.replace("wslight.tasks.EmbeddingDataModule", "wslight.data.EmbeddingDataModule"))
    err = cli_fails(["fit", "--config", str(training)])
    assert "model.class_path = wslight.models.FeatureMapClassifier: write wslight.tasks.FeatureMapClassifier" in err
    assert "data.class_path = wslight.data.EmbeddingDataModule: write wslight.tasks.EmbeddingDataModule" in err
    err = cli_fails(
        ["test", "--config", "ws/raf", "--model", "wslight.evaluations.ws_sweep.WordSensitivitySweep"], True
    )
    assert "the command line: --model = wslight.evaluations.ws_sweep.WordSensitivitySweep: write" in err
    # the sweep modules of wslight.tasks renamed after what they do: a path through the old module names the class
    for old, cls in [("ws_sweep", "WordSensitivitySweep"), ("head_words_callback", "HeadWordFlips")]:
        err = cli_fails(["test", "--config", "ws/raf", "--model", f"wslight.tasks.{old}.{cls}"], True)
        assert f"the command line: --model = wslight.tasks.{old}.{cls}: write wslight.tasks.{cls}" in err
    # the callback renamed apart from the function it runs (`delta_attack`), by every path a config could give it
    callback = tmp_path / "saved_callback.yaml"
    text = (ROOT / "configs" / "attack" / "callback_raf.yaml").read_text()
    callback.write_text(text.replace("wslight.tasks.DeltaAttackCallback", "wslight.callbacks.DeltaAttack"))
    err = cli_fails(["fit", "--config", str(callback)])
    assert (
        "trainer.callbacks.1.class_path = wslight.callbacks.DeltaAttack: write wslight.tasks.DeltaAttackCallback" in err
    )
    for old in ("wslight.tasks.DeltaAttack", "DeltaAttack"):
        callback.write_text(text.replace("wslight.tasks.DeltaAttackCallback", old))
        assert f"class_path = {old}: write wslight.tasks.DeltaAttackCallback" in cli_fails(
            ["fit", "--config", str(callback)]
        )


def test_a_search_setting_at_its_old_place_names_the_new_key(tmp_path, cli_fails):
    """A search setting of a word-sensitivity sweep written at its old place is one block naming the new key.

    `restarts` (and the other search settings) moved into one `search:` block, and `restarts` is `chains_per_round`: a
    saved config or an override that writes them the old way is one block.
    """
    saved = tmp_path / "saved_ws.yaml"
    text = (ROOT / "configs" / "ws" / "raf.yaml").read_text()
    saved.write_text(text.replace("    seed: 0\n", "    restarts: 6\n    max_steps: 60\n    seed: 0\n", 1))
    err = cli_fails(["test", "--config", str(saved)], evaluate=True)
    assert f"{saved}: model.init_args.restarts: write model.init_args.search.chains_per_round" in err
    assert f"{saved}: model.init_args.max_steps: write model.init_args.search.max_steps" in err
    err = cli_fails(["test", "--config", "ws/raf", "--model.init_args.restarts", "8"], evaluate=True)
    assert "the command line: model.init_args.restarts: write model.init_args.search.chains_per_round" in err
    # the attack's restarts is its own, in its own block
    err = cli_fails(["test", "--config", "attack/fig4", "--model.init_args.restarts", "0"], evaluate=True)
    assert "the command line: model.init_args.restarts: write model.init_args.attack.restarts" in err


def test_a_grid_setting_at_its_old_place_names_the_new_key(tmp_path, cli_fails):
    """The grid of a word-sensitivity sweep written at its old place is one block naming each key's new path.

    `maps`, `d_values`, `n_values`, `depths`, `trials` and `rf_width_ratio` moved into one `grid:` block: a saved config
    or an override that writes them the old way is one block, before any work; with an old search setting, one block
    names both. The attack sweep's own `trials` is not the grid's.
    """
    saved = tmp_path / "saved_ws.yaml"
    text = (ROOT / "configs" / "ws" / "raf.yaml").read_text()
    grid = text[text.index("    grid:\n") : text.index("    positions:")]
    flat = "".join(line[2:] + "\n" for line in grid.splitlines()[1:])  # the keys one level up, as before the block
    saved.write_text(text.replace(grid, flat + "    rf_width_ratio: 1.0\n"))
    err = cli_fails(["test", "--config", str(saved)], evaluate=True)
    for key in ("maps", "d_values", "n_values", "depths", "trials", "rf_width_ratio"):
        assert f"{saved}: model.init_args.{key}: write model.init_args.grid.{key}" in err
    assert "the grid is one block, `grid: {maps: [...], d_values: [...]" in err and "search's" not in err
    err = cli_fails(["test", "--config", "words/raf", "--model.init_args.n_values", "[4]", "--model.restarts=2"], True)
    assert "the command line: model.init_args.n_values: write model.init_args.grid.n_values" in err
    assert "the command line: model.init_args.restarts: write model.init_args.search.chains_per_round" in err
    assert "the search's settings are one block" in err and "the grid is one block" in err
    err = cli_fails(["test", "--config", "attack/fig4", "--model.init_args.trials", "0"], evaluate=True)
    assert "model.init_args.trials must be a positive integer, got 0" in err and "grid" not in err


def test_an_attack_setting_at_its_old_place_names_the_new_key(tmp_path, cli_fails):
    """The Delta attack's settings written at their old place are one block naming the new key.

    The sweep's and the callback's `steps`, `restarts`, `faithful` and `position` moved into one `attack:` block, and
    the callback's `penalty` is `penalties` (a list, as the sweep's): a saved config or an override that writes them
    the old way is one block, before any work.
    """
    saved = tmp_path / "saved_attack.yaml"
    text = (ROOT / "configs" / "attack" / "fig5.yaml").read_text()
    old = "    position: 0\n    steps: null\n    restarts: 2\n    faithful: false\n    seed: 0\n"
    saved.write_text(text.replace("    seed: 0\n", old, 1))
    err = cli_fails(["test", "--config", str(saved)], evaluate=True)
    for key in ("position", "steps", "restarts", "faithful"):
        assert f"{saved}: model.init_args.{key}: write model.init_args.attack.{key}" in err
    err = cli_fails(["test", "--config", "attack/fig5", "--model.steps=60"], evaluate=True)
    assert "the command line: model.init_args.steps: write model.init_args.attack.steps" in err
    callback = tmp_path / "saved_callback.yaml"
    text = (ROOT / "configs" / "attack" / "callback_raf.yaml").read_text()
    callback.write_text(text.replace("        seed: 0\n", "        steps: 40\n        penalty: 0.5\n        seed: 0\n"))
    err = cli_fails(["fit", "--config", str(callback)])
    place = "trainer.callbacks.1.init_args"
    assert f"{callback}: {place}.steps: write {place}.attack.steps" in err
    assert f"{callback}: {place}.penalty: write {place}.penalties" in err and "`penalties: [...]`" in err
    err = cli_fails(["fit", "--config", "attack/callback_raf", "--trainer.callbacks.init_args.restarts", "2"])
    place = "trainer.callbacks.init_args"
    assert f"the command line: {place}.restarts: write {place}.attack.restarts" in err


# ----------------------------------------------------------------------------------- files that are not UTF-8
@pytest.mark.parametrize("evaluate", [False, True], ids=["fit", "evaluate"])
def test_a_config_file_that_is_not_utf8_names_the_file_line_and_column(cli_fails, tmp_path, evaluate):
    """A config saved as Latin-1: one block naming the file, the line and column of the first such byte, and the fix."""
    text = (WS_FILE if evaluate else TRAIN_FILE).read_text()
    lines = text.splitlines(keepends=True)
    latin1 = "# café: été\n".encode("latin-1")  # line 3, a comment; é is one byte in Latin-1, not UTF-8
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes("".join(lines[:2]).encode() + latin1 + "".join(lines[3:]).encode())
    err = cli_fails(["test" if evaluate else "fit", "--config", str(cfg)], evaluate)
    assert f"error: {cfg}, line 3, column 6: byte 0xe9 is not UTF-8" in err
    assert "save it as UTF-8" in err and "codec can't decode" not in err


# ------------------------------------------------------------------------- a train.py run read back, checkpoints
TRAINED_CONFIG = """model:
  class_path: wslight.tasks.FeatureMapClassifier
  init_args:
    feature_map: {{class_path: wslight.features.RandomAttentionFeatures, init_args: {{seed: 0}}}}
data:
  class_path: wslight.tasks.EmbeddingDataModule
  init_args:
    embeddings: {{source: synthetic, num_samples: 40, synthetic_dim: 16}}
    n: 5
    d: {d}
    test_fraction: {test_fraction}
"""


def _checkpoint(path: Path, n: int = 5, d: int = 16) -> Path:
    """A checkpoint file as Lightning writes one (its state dict, and the data module's sizes it was trained on)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "pytorch-lightning_version": "2.6.0",
            "state_dict": {"theta": torch.zeros(n * d), "feature_map.W": torch.zeros(d, d)},
            "datamodule_hyper_parameters": {"n": n, "d": d, "test_fraction": 0.2},
        },
        path,
    )
    return path


def _trained_run(tmp_path, d: int = 16, test_fraction: float = 0.2, trained_d: int = 16) -> Path:
    """The files of a train.py run: config.yaml, and checkpoints/last.ckpt trained with d = trained_d."""
    folder = tmp_path / "train_raf" / "version_0"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(TRAINED_CONFIG.format(d=d, test_fraction=test_fraction))
    _checkpoint(folder / "checkpoints" / "last.ckpt", d=trained_d)
    return folder


def _head_words(cli_fails, tmp_path, run) -> str:
    """The words evaluation of a trained head (configs/words/trained_head.yaml) on `run`: its one-block failure."""
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "logs")]
    err = cli_fails(["test", "--config", "words/trained_head", "--model.init_args.run", str(run), *logs], True)
    assert not (tmp_path / "logs").exists(), "nothing may be written for a bad run"
    return err


def test_the_words_of_an_evaluation_run_say_it_is_no_train_py_run(cli_fails, tmp_path):
    """An evaluate.py run folder as `run`: what it is (its model, no data block, results.jsonl) and what to give."""
    folder = tmp_path / "ws_raf" / "run-0123"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(WS_FILE.read_text())
    (folder / "results.jsonl").write_text("")
    err = _head_words(cli_fails, tmp_path, folder)
    assert f"error: model.init_args.run={folder}: an evaluate.py run (its model is wslight.tasks." in err
    assert "its config.yaml has no data: block, it holds results.jsonl), not a train.py run" in err
    assert "give the log folder `python train.py fit --config <training config>` printed" in err
    assert "enable_checkpointing" not in err


def test_the_words_of_a_missing_run_folder_say_it_does_not_exist(cli_fails, tmp_path):
    err = _head_words(cli_fails, tmp_path, tmp_path / "nope")
    assert f"error: model.init_args.run={tmp_path / 'nope'}: no such folder; give the log folder train.py fit" in err
    assert "holds no config.yaml" not in err


def test_the_words_of_a_run_without_a_test_split_say_so(cli_fails, tmp_path):
    """A run fitted with test_fraction 0: its test split is empty, named in its config.yaml, before any data is read."""
    folder = _trained_run(tmp_path, test_fraction=0.0)
    err = _head_words(cli_fails, tmp_path, folder)
    assert f"error: model.init_args.run={folder}: the run's test split is empty" in err
    assert f"(data.init_args.test_fraction: 0.0 in {folder / 'config.yaml'})" in err
    assert "train again with a test split (e.g. --data.init_args.test_fraction 0.2)" in err
    assert "[1, 0]" not in err


def test_the_words_of_a_run_with_a_truncated_or_foreign_checkpoint_name_it(cli_fails, tmp_path):
    """A cut-short last.ckpt, or one trained with another d than the run's config.yaml: the checkpoint and the why."""
    folder = _trained_run(tmp_path, d=8, trained_d=16)
    ckpt = folder / "checkpoints" / "last.ckpt"
    err = _head_words(cli_fails, tmp_path, folder)
    assert f"error: model.init_args.checkpoint={ckpt}: trained with data.init_args.d = 16, " in err
    assert f"{folder / 'config.yaml'} says 8; train the run again" in err
    ckpt.write_bytes(ckpt.read_bytes()[:300])
    _checkpoint(folder / "checkpoints" / "epoch=0.ckpt", d=8)
    err = _head_words(cli_fails, tmp_path, folder)
    assert f"error: model.init_args.checkpoint={ckpt}: not a readable checkpoint (truncated?)" in err
    assert "choose another with checkpoint (it has epoch=0.ckpt)" in err and "Union" not in err
    err = _head_words(cli_fails, tmp_path, ckpt)  # the checkpoint file itself as the run
    assert f"error: model.init_args.run={ckpt}: not a readable checkpoint (truncated?)" in err


def test_a_checkpoint_to_resume_from_is_checked_before_any_data(cli_fails, tmp_path):
    """train.py's --ckpt_path: trained with another d, or cut short: one block naming it, before the data is read."""
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "logs")]
    folder = _trained_run(tmp_path)  # trained with d = 16, as its config.yaml says
    ckpt = folder / "checkpoints" / "last.ckpt"
    err = cli_fails(["fit", "--config", TRAIN, *logs, "--data.init_args.d", "8", "--ckpt_path", str(ckpt)])
    assert f"error: ckpt_path={ckpt}: trained with data.init_args.d = 16, the command line says 8" in err
    assert f"resume with the config it was trained with ({folder / 'config.yaml'})" in err
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(ckpt.read_bytes()[:300])
    err = cli_fails(["fit", "--config", TRAIN, *logs, "--ckpt_path", str(cut)])
    assert f"error: ckpt_path={cut}: not a readable checkpoint (truncated?)" in err and "PytorchStreamReader" not in err
    assert not (tmp_path / "logs").exists()


def test_the_last_checkpoint_to_resume_from_is_checked_too(cli_fails, tmp_path):
    """`--ckpt_path last` finds the newest last.ckpt of the run name; trained with another d, it is named."""
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path)]
    folder = _trained_run(tmp_path)  # tmp_path/train_raf/version_0, the run name of the tiny raf config
    err = cli_fails(["fit", "--config", TRAIN, *logs, "--data.init_args.d", "8", "--ckpt_path", "last"])
    ckpt = folder / "checkpoints" / "last.ckpt"
    assert f"error: ckpt_path=last ({ckpt}): trained with data.init_args.d = 16, the config says 8" in err
    assert not (tmp_path / "train_raf" / "version_1").exists()


def test_a_checkpoint_of_another_map_names_the_key_the_model_lacks(cli_fails, tmp_path):
    """Sizes that agree but another map's weights: the key torch reports, after Lightning tried to restore it."""
    import torch

    ckpt = _checkpoint(tmp_path / "rf.ckpt")
    data = torch.load(ckpt, weights_only=True)
    data["state_dict"] = {"theta": torch.zeros(80), "feature_map.V": torch.zeros(80, 80)}
    torch.save(data, ckpt)
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "logs")]
    err = cli_fails(["fit", "--config", TRAIN, *logs, "--ckpt_path", str(ckpt)])
    assert f"error: ckpt_path={ckpt}: " in err and '"feature_map.V"' in err and "(another map?)" in err


# ------------------------------------------------------------------------------------------------ reproduce
def _reproduce_fails(argv: list[str], capsys, monkeypatch) -> str:
    """`wslight reproduce <argv>`: exit status 2 and its block, with no stage run."""
    from wslight.app import reproduce
    from wslight.app.reproduce import command

    def no_stage(*a, **k):
        raise AssertionError("no stage may run for a bad command")

    monkeypatch.setattr(command, "run_stages", no_stage)
    with pytest.raises(SystemExit) as exc:
        reproduce.main(argv, prog="wslight reproduce")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_reproduce_reports_under_a_file_is_refused_before_any_stage(tmp_path, capsys, monkeypatch):
    afile = tmp_path / "reports.txt"
    afile.write_text("")
    err = _reproduce_fails(["--reports", str(afile), "--only", "ws_rf"], capsys, monkeypatch)
    assert f"wslight reproduce: error: --reports={afile}: cannot create {afile / 'offline'}: {afile} is not a" in err
    assert "give a folder (it is created when missing)" in err


@pytest.mark.parametrize(
    "only, hint",
    [
        (["ws_rff"], "; did you mean --only ws_rf?"),
        (["ws_rff", "attack_fig44", "ws_raf"], "; did you mean --only ws_rf attack_fig4 ws_raf?"),
        (["ws_rff", "zzz"], "; ws_rff: did you mean ws_rf?"),
    ],
    ids=["one", "several", "one-unknown"],
)
def test_reproduce_only_a_misspelt_stage_says_which_was_meant(tmp_path, capsys, monkeypatch, only, hint):
    err = _reproduce_fails(["--reports", str(tmp_path), "--only", *only], capsys, monkeypatch)
    assert f"got {only[0]!r}" in err and f"{hint} (--list shows the stages)" in err
    assert not (tmp_path / "offline").exists()
