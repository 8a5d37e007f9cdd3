"""evaluate.py machinery: results path printed last, resume without recomputation, run keys, interruption."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wslight.app.cli import main

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


SQUARES = """
seed_everything: 0
model:
  class_path: dummy_evaluation.SquaresEvaluation
  init_args: {{trials: {trials}, sleep: {sleep}}}
"""


@pytest.fixture(scope="module")
def write_config(cpu_trainer):
    """A function of (tmp_path, trials=5, sleep=0.0) writing the squares evaluation with the CPU trainer.

    It returns the config's path.
    """

    def write(tmp_path, trials=5, sleep=0.0):
        cfg = tmp_path / "squares.yaml"
        cfg.write_text(SQUARES.format(trials=trials, sleep=sleep) + cpu_trainer.yaml(f"{tmp_path}/logs", "squares"))
        return cfg

    return write


def evaluate(cfg, *extra):
    return main(["test", "--config", str(cfg), *extra], evaluate=True)


def test_results_written_and_resumed_without_recomputation(tmp_path, capsys, write_config):
    cfg = write_config(tmp_path)
    cli = evaluate(cfg)
    path = Path(cli.model.results_path)
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"results: {path}"
    assert path.parent.name == f"run-{cli.run_key}"
    first = path.read_text()
    assert [json.loads(x)["value"] for x in first.splitlines()] == [0, 1, 4, 9, 16]
    cli2 = evaluate(cfg)
    assert cli2.model.results_path == path
    assert path.read_text() == first  # nothing recomputed, nothing appended


def test_changed_config_gets_a_new_run_key(tmp_path, write_config):
    cfg = write_config(tmp_path)
    a = evaluate(cfg)
    b = evaluate(cfg, "--model.init_args.trials", "3")
    assert a.run_key != b.run_key and a.model.results_path != b.model.results_path


def test_device_settings_do_not_change_the_run_key(tmp_path, write_config):
    cfg = write_config(tmp_path)
    a = evaluate(cfg)
    b = evaluate(cfg, "--trainer.enable_progress_bar", "true", "--trainer.logger.init_args.name", "squares")
    assert a.run_key == b.run_key


def _run(cfg, tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}"}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "evaluate.py"), "--config", str(cfg)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # a subprocess killed mid-sweep: seconds of wall time
def test_sigterm_mid_sweep_then_resume_equals_uninterrupted(tmp_path, write_config):
    cfg = write_config(tmp_path, trials=8, sleep=0.4)
    proc = _run(cfg, tmp_path)
    results = None
    deadline = time.time() + 120
    while time.time() < deadline:
        found = list((tmp_path / "logs").rglob("results.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 2:
            results = found[0]
            break
        time.sleep(0.1)
    assert results is not None, "the sweep never wrote results"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "run the same command again to resume" in err
    partial = results.read_text().splitlines()
    assert 2 <= len(partial) < 8
    proc = _run(cfg, tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == f"results: {results}"
    lines = results.read_text().splitlines()
    assert lines[: len(partial)] == partial  # finished trials kept, not recomputed
    assert sorted(json.loads(x)["trial"] for x in lines) == list(range(8))
    assert all(json.loads(x)["value"] == json.loads(x)["trial"] ** 2 for x in lines)


@pytest.mark.slow  # evaluate.py in a subprocess of two DDP processes (gloo, CPU)
def test_two_process_ddp_gives_the_same_records(tmp_path, write_config):
    cfg = write_config(tmp_path, trials=7)
    one = Path(evaluate(cfg).model.results_path)
    recs1 = sorted(one.read_text().splitlines())
    one.unlink()
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}"}
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "evaluate.py"),
            "--config",
            str(cfg),
            "--trainer.devices",
            "2",
            "--trainer.strategy",
            "ddp",
        ],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert sorted(one.read_text().splitlines()) == recs1
