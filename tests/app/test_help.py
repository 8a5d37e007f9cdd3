"""`wslight evaluate --help`: the evaluation's own options first.

Lightning's whole help behind `--help-all`, and `--model.help` by short class name.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wslight.app.help import arg_docs, first_sentence
from wslight.app.verbs import main, run_verb

ROOT = Path(__file__).resolve().parents[2]

EVALUATIONS = (
    "WordSensitivitySweep",
    "WordSubstitutionSweep",
    "DeltaAttackSweep",
    "AttentionEditProbe",
    "LayerwiseChangeProbe",
    "AttentionUnderDeltaProbe",
    "TrainedHeadWords",
    "ClassifierWords",
)


def lightning_help(capsys, args: list[str]) -> str:
    """LightningCLI's whole help (`--help-all`): it prints and exits 0."""
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", *args, "--help-all"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_evaluate_help_lists_the_evaluations_their_configs_and_the_way_to_their_options(capsys):
    assert main(["evaluate", "--help"]) == 0
    out = capsys.readouterr().out
    block = out.split("evaluations:\n")[1].split("\n\n")[0].splitlines()
    rows = [line.split()[0] for line in block if not line.startswith("   ")]  # a continuation is indented further
    assert sorted(rows) == sorted(EVALUATIONS)  # the bases (Evaluation, MapGridEvaluation, ...) are no evaluation
    assert "configs: attack/fig4, attack/fig5" in out and "ws/raf" in out
    assert "--config ws/" in out and "--model.help WordSensitivitySweep" in out and "--help-all" in out
    assert "--optimizer" not in out and "--lr_scheduler" not in out
    whole = lightning_help(capsys, [])
    assert "--trainer.max_epochs" in whole and "--ckpt_path" in whole  # Lightning's help is still there
    assert len(out.splitlines()) * 5 < len(whole.splitlines())


def test_evaluate_help_with_a_config_shows_its_class_options_and_values(capsys):
    args = ["--config", "ws/raf", "--model.grid.trials", "3", "--model.search.max_steps", "30", "--help"]
    assert run_verb("evaluate", args, prog="evaluate.py") == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: evaluate.py --config ws/raf ")
    assert "runs WordSensitivitySweep (wslight.tasks.WordSensitivitySweep)" in out
    lines = out.splitlines()
    n_values = lines.index("  --model.grid.n_values  list[int], required; given: [10, 20, 50, 100, 150, 200, 250]")
    assert lines[n_values + 1].strip() == "context lengths (the first n tokens), each once."  # the docstring's line
    assert (
        "  --model.grid.trials  int, default 10; given: 3" in lines
    )  # the command line's value wins over the config's
    # the settings dataclass is shown field by field, with the field's own docstring
    steps = lines.index("  --model.search.max_steps  int | None, default null; given: 30")
    assert lines[steps + 1].strip() == "most ascent steps per chain."
    assert "  --model.search.chains_per_round  int | None, default null" in lines
    assert "  --model.trials_per_step  int, default 1; given: 10" in lines
    assert "--optimizer" not in out and "--ckpt_path" not in out
    assert lines[-1].endswith("evaluate.py --config ws/raf --help-all")
    assert len(lines) * 5 < len(lightning_help(capsys, ["--config", "ws/raf"]).splitlines())


def test_attack_help_shows_the_attack_settings_field_by_field(capsys):
    """`--model.attack.<field>` for every field of AttackSettings, with the first sentence of the field's docstring."""
    from wslight.attack import AttackSettings

    assert main(["evaluate", "--config", "attack/fig5", "--model.attack.restarts", "2", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  --model.attack  AttackSettings | None, default null; given: {restarts: 2}" in lines
    docs = arg_docs(AttackSettings.__doc__)
    for field in dataclasses.fields(AttackSettings):
        head = next(i for i, line in enumerate(lines) if line.startswith(f"  --model.attack.{field.name}  "))
        shown = " ".join(line.strip() for line in lines[head + 1 : head + 4] if line.startswith("      "))
        assert shown.startswith(first_sentence(docs[field.name])[:60]), (field.name, shown)
    restarts = next(line for line in lines if line.startswith("  --model.attack.restarts  "))
    assert restarts == "  --model.attack.restarts  int | None, default null; given: 2"
    assert not any(line.startswith(("  --model.steps ", "  --model.position ")) for line in lines)  # no loose keys


def test_an_overlay_shows_its_base_class_and_the_overlay_values(capsys):
    assert main(["evaluate", "--config", "paper/attack/fig4", "-h"]) == 0
    out = capsys.readouterr().out
    assert "runs DeltaAttackSweep" in out and "  --model.cases  list[AttackCase], required; given: " in out
    assert "  --model.d  int, required; given: 768" in out.splitlines()  # the overlay's value over its base's 384


def test_model_help_takes_a_short_class_name(tmp_path, capsys):
    # a fresh process: jsonargparse finds a short name by itself once its class is imported, as in this test process
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "wslight", "evaluate", "--model.help", "WordSensitivitySweep"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--model.grid.n_values" in proc.stdout and "independent trials per cell" in proc.stdout
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--model.help=FeatureMapClassifier"])
    assert exc.value.code == 0
    assert "--model.fit_mode" in capsys.readouterr().out


def test_an_unknown_short_name_exits_2_with_one_line_of_the_known_names(capsys):
    assert main(["evaluate", "--model.help", "WordSensitivity"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wslight evaluate: error: --model.help WordSensitivity: ")
    for name in (*EVALUATIONS, "FeatureMapClassifier"):
        assert name in lines[0]


def test_help_with_an_unknown_config_exits_2_in_one_line(capsys):
    assert main(["evaluate", "--config", "ws/nope", "--help"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "ws/nope" in err[0] and "did you mean" in err[0]


def test_args_sections_and_first_sentences():
    doc = """Title.

    Args:
        tol, window: a chain stops once S has grown by less
            than 1 + tol (e.g. 1e-4. Or less).
        seed (int): the seed.

    Returns:
        nothing: not an argument.
    """
    docs = arg_docs(doc)
    assert set(docs) == {"tol", "window", "seed"}
    assert docs["window"] == "a chain stops once S has grown by less than 1 + tol (e.g. 1e-4. Or less)."
    assert first_sentence("radius, e.g. 1 (the paper. 1). Must be > 0.") == "radius, e.g. 1 (the paper. 1)."
