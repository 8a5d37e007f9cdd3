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
    err = cli_fails(["test", "--config", WS, "--model.init_args.trials", "0"], evaluate=True)
    assert "evaluate.py: error: model.init_args.trials must be a positive integer, got 0" in err


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
    err = cli_fails(["test", "test", "--config", WS, "--model.init_args.trials", "0"], evaluate=True)
    assert "model.init_args.trials must be a positive integer, got 0" in err


def test_debug_flag_and_env_raise_the_original_error(capsys, monkeypatch):
    args = ["fit", "--config", TRAIN, "--data.init_args.val_fraction", "1.5"]
    with pytest.raises(ValueError, match="val_fraction must be a finite number"):
        main([*args, "--debug"])
    monkeypatch.setenv("WSLIGHT_DEBUG", "1")
    with pytest.raises(ValueError, match="val_fraction must be a finite number"):
        main(args)


def test_console_script_evaluate_is_evaluate_py(cli_fails):
    """`wslight evaluate --config ...` is evaluate.py (the `test` subcommand supplied), training stays `wslight fit`."""
    err = cli_fails(["evaluate", "--config", WS, "--model.init_args.trials", "0"])
    assert "evaluate.py: error: model.init_args.trials must be a positive integer, got 0" in err
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
