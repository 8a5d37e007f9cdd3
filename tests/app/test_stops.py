"""How a run stops.

The exit status of every way it ends, each message printed once by one process, a failing map or an unusable results
file as one block, and the run folder checked before any worker process starts.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import start_in_own_group, subprocess_env

from wslight.app import cli
from wslight.app.cli import main
from wslight.app.errors import UsageError
from wslight.app.failures import EXIT_BUSY
from wslight.records.results import LOCK_NAME, RunLock

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]

BOOM = '''
import torch
from torch import nn


class Boom(nn.Module):
    """mean-pooled tanh features that fail from n = 8 on: (B, n, d) -> (B, 3)."""

    def __init__(self, n: int, d: int, seed: int = 0) -> None:
        super().__init__()
        self.n, self.d = n, d
        self.register_buffer("U", torch.ones(3, d))

    def forward(self, X):
        if X.shape[1] >= 8:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied\\n(3x8 and 4x8)")
        return torch.tanh(X.mean(dim=1).to(self.U.dtype) @ self.U.T)  # (B, d) @ (d, 3) -> (B, 3)
'''


def evaluate(cfg: Path, *extra: str) -> cli.WSLightCLI:
    return main(["test", "--config", str(cfg), *extra], evaluate=True)


def fails(code: int, capsys, *args: str) -> str:
    """Run an evaluation that must end with `code` and one block on stderr; returns the block's error line."""
    with pytest.raises(SystemExit) as exc:
        evaluate(*args)  # type: ignore[arg-type]
    assert exc.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if "error:" in x]
    return err


def records(tmp_path: Path) -> tuple[Path, list[dict]]:
    (path,) = (tmp_path / "logs").rglob("results.jsonl")
    return path, [json.loads(x) for x in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------- a step that fails


def test_a_failing_step_is_one_block_with_the_finished_trials_kept(tmp_path, squares, capsys):
    cfg = squares(trials=5, fail_trial=3)
    err = fails(1, capsys, cfg)
    path, recs = records(tmp_path)
    assert [r["trial"] for r in recs] == [0, 1, 2]
    line = next(x for x in err.splitlines() if "error:" in x)
    assert "SquaresEvaluation failed in run_trials (dummy_evaluation.py:" in line
    assert line.endswith("RuntimeError: trial 3 cannot be computed: a made-up failure")  # one line, not two
    assert f"3 finished trials are kept in {path}" in err
    with pytest.raises(SystemExit):  # the same command again resumes at the failed trial
        evaluate(cfg)
    assert f"3 of 5 trials already in {path}" in capsys.readouterr().out
    assert records(tmp_path)[1] == recs


def test_debug_prints_the_failure_with_its_cause_then_the_block(squares, monkeypatch, capsys):
    monkeypatch.setenv("WSLIGHT_DEBUG", "1")
    with pytest.raises(SystemExit) as exc:
        evaluate(squares(trials=2, fail_trial=0))
    assert exc.value.code == 1  # the same status as without it
    err = capsys.readouterr().err
    assert err.index("Traceback") < err.index("RuntimeError: trial 0 cannot be computed") < err.index("TrialFailed")
    assert err.splitlines()[-1].startswith("(the full traceback")  # then the same block


def test_a_user_map_that_raises_in_forward_names_the_map_the_cell_and_the_line(tmp_path, monkeypatch, tiny, capsys):
    (tmp_path / "boom_maps.py").write_text(BOOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "logs")]
    args = tiny(
        "ws/raf",
        {"grid.maps": ["raf", "boom_maps.Boom"], "grid.d_values": [8], "grid.n_values": [4, 8], "search.max_steps": 10},
    )
    with pytest.raises(SystemExit) as exc:
        main(["test", *args, *logs], evaluate=True)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = next(x for x in err.splitlines() if "error:" in x)
    raise_line = next(i for i, x in enumerate(BOOM.splitlines(), 1) if "raise RuntimeError" in x)
    want = f"model.init_args.grid.maps: boom_maps.Boom failed in forward (boom_maps.py:{raise_line}) at n = 8, d = 8,"
    want += " L = 1:"
    assert want in line and line.endswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied (3x8 and 4x8)")
    path, recs = records(tmp_path)
    assert f"{len(recs)} finished trials are kept in {path}" in err
    assert {(r["map"], r["n"]) for r in recs} >= {("raf", 4), ("raf", 8), ("boom_maps.Boom", 4)}


# ------------------------------------------------------------------------------------------- the results file


def test_a_corrupt_line_is_one_block_naming_the_file_and_the_line(tmp_path, squares, capsys):
    cfg = squares(trials=4)
    evaluate(cfg)
    path, _ = records(tmp_path)
    lines = path.read_text().splitlines()
    lines[1] = "garbage{"
    path.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    err = fails(1, capsys, cfg)
    assert f"{path}: line 2 of 4 is not a JSON record (Expecting value: 'garbage{{')" in err
    assert "delete that line (or move the file away to start over)" in err
    assert path.read_text().splitlines() == lines  # left as it was


def test_a_results_file_of_another_run_is_refused_before_any_trial(tmp_path, squares, capsys):
    out = ["--model.init_args.output_dir", str(tmp_path / "shared")]
    first = evaluate(squares(trials=3), *out)
    path = Path(first.model.results_path)
    before = path.read_text()
    capsys.readouterr()
    err = fails(2, capsys, squares(trials=4, name="other"), *out)
    assert f"{path} holds records of another run (3 records of run {first.run_key})" in err
    assert "give this run its own folder" in err and "or move that file away" in err
    assert path.read_text() == before  # never a mixed file


def test_no_lock_file_is_left_after_a_run(tmp_path, squares):
    evaluate(squares(trials=2))
    path, _ = records(tmp_path)
    assert not (path.parent / LOCK_NAME).exists()
    lock = RunLock(path.parent)
    lock.acquire()
    assert "pid" in (path.parent / LOCK_NAME).read_text()
    lock.release()
    assert not (path.parent / LOCK_NAME).exists()


# ------------------------------------------------------------------------------------------- how records are computed


def test_mixed_precision_is_refused_for_an_evaluation(squares, cli_fails):
    err = cli_fails(["test", "--config", str(squares()), "--trainer.precision", "bf16-mixed"], evaluate=True)
    assert "trainer.precision=bf16-mixed: an evaluation computes in the dtype of its config" in err


def test_records_say_a_precision_other_than_the_default(tmp_path, squares):
    evaluate(squares(trials=2))
    assert all("precision" not in r for r in records(tmp_path)[1])
    evaluate(squares(trials=2), "--trainer.precision", "64-true")
    (path,) = [p for p in (tmp_path / "logs").rglob("results.jsonl") if "precision" in p.read_text()]
    assert [json.loads(x)["precision"] for x in path.read_text().splitlines()] == ["64-true"] * 2


def test_more_processes_than_cores_get_a_one_line_note(monkeypatch, capsys):
    monkeypatch.setattr(cli, "available_cores", lambda: 2)
    cli.check_process_count({"devices": 2, "accelerator": "cpu"})
    assert capsys.readouterr().err == ""
    cli.check_process_count({"devices": 3, "accelerator": "cpu"})
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("note: trainer.devices=3 starts 3 processes on 2 available cores")
    with pytest.raises(UsageError, match="trainer.devices=9 would start 9 processes on 2 available cores"):
        cli.check_process_count({"devices": 9, "accelerator": "cpu"})  # more than 4 per core


# ------------------------------------------------------------------------------------------- processes and signals


ENTRY_POINTS = {
    "evaluate.py": [str(ROOT / "evaluate.py")],
    "python -m wslight": ["-m", "wslight", "evaluate"],
}


def _command(cfg: Path, devices: int, entry: str = "evaluate.py") -> list[str]:
    ddp = ["--trainer.strategy", "ddp"] if devices > 1 else []
    return [sys.executable, *ENTRY_POINTS[entry], "--config", str(cfg), "--trainer.devices", str(devices), *ddp]


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        if text in line:
            return
        assert time.time() < deadline, f"no line with {text!r} in time"
    pytest.fail(f"the run ended before printing {text!r}: {proc.communicate()[1][-3000:]}")


def _group_gone(pgid: int, timeout: float = 10) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow  # evaluate.py in subprocesses (one and two processes), each stopped in the middle of a long step
@pytest.mark.parametrize(
    "sig, target, devices, entry",
    [
        (signal.SIGINT, "parent", 1, "evaluate.py"),
        (signal.SIGTERM, "parent", 1, "python -m wslight"),
        (signal.SIGTERM, "parent", 2, "evaluate.py"),
        (signal.SIGINT, "group", 2, "evaluate.py"),  # Ctrl-C in a terminal
        (signal.SIGTERM, "group", 2, "python -m wslight"),  # a scheduler's stop before its SIGKILL
    ],
)
def test_a_signal_stops_a_long_step_within_seconds_with_its_status(tmp_path, squares, sig, target, devices, entry):
    cfg = squares(trials=4, sleep=300, compute=True)  # each step computes for five minutes
    proc = start_in_own_group(_command(cfg, devices, entry), tmp_path)
    try:
        _wait_for_line(proc, "trials already in")  # rank 0 starts its first step
        time.sleep(2)
        start = time.time()
        if target == "group":
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        took = time.time() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert took < 15, f"stopped {took:.0f} s after the signal"
    assert err.count("run the same command again to resume") == 1, err[-3000:]
    assert _group_gone(proc.pid), "a worker process is still running"
    assert not list(tmp_path.rglob(LOCK_NAME))


@pytest.mark.slow  # a training run in a subprocess, stopped in its first epochs
def test_ctrl_c_stops_a_fit_with_status_130(tmp_path, tiny):
    command = [sys.executable, str(ROOT / "train.py"), "fit", *tiny("raf", {"max_epochs": 100000}, "trainer.")]
    command += ["--trainer.default_root_dir", str(tmp_path)]
    proc = start_in_own_group(command, tmp_path)
    try:
        deadline = time.time() + 240
        while not list(tmp_path.rglob("events.out.tfevents.*")) and time.time() < deadline:
            time.sleep(0.2)  # the fit has started logging
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130


@pytest.mark.slow(seconds=36)  # evaluate.py on two processes, four times
def test_two_processes_print_each_failure_once(tmp_path, squares):
    def run(cfg: Path, *extra: str) -> tuple[int, str]:
        command = [*_command(cfg, 2), *extra]
        proc = subprocess.run(command, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stderr

    # trial 1 is rank 1's first step: the failure reaches rank 0 through the step's gather
    code, err = run(squares(trials=4, fail_trial=1))
    assert code == 1 and err.count("error:") == 1, err[-3000:]
    assert "RuntimeError: trial 1 cannot be computed: a made-up failure (on rank 1)" in err
    path, _ = records(tmp_path)
    code, err = run(squares(trials=2), "--trainer.logger.init_args.version", path.parent.name)  # the same folder
    assert code == 2 and err.count("error:") == 1 and "holds records of another run" in err, err[-3000:]
    assert "Initializing distributed" not in err  # refused before the second process started

    cfg = squares(trials=3, name="busy")
    code, _ = run(cfg)
    assert code == 0
    (busy_path,) = (tmp_path / "logs" / "busy").rglob("results.jsonl")
    holder = RunLock(busy_path.parent)
    holder.acquire()
    try:
        code, err = run(cfg)
    finally:
        holder.release()
    assert code == EXIT_BUSY and err.count("error:") == 1 and "is being written by pid" in err, err[-3000:]
    assert "Initializing distributed" not in err

    busy_path.write_text("{}\nnot json\n" + busy_path.read_text())
    code, err = run(cfg)
    assert code == 1 and err.count("error:") == 1 and "line 2 of 5 is not a JSON record" in err, err[-3000:]
