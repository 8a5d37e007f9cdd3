"""An interrupt at any moment of a run: its status within seconds, one message, no process left running.

SIGINT (Ctrl-C: the terminal sends it to the whole process group) and SIGTERM while a two-process evaluation starts:
rank 0 importing, the other process importing while rank 0 waits for it in the process group's start, both in that
start. A process count the cores cannot start is refused before any process starts. A benchmark stops on Ctrl-C with
one line.
"""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import start_in_own_group

from wslight.app import cli
from wslight.app.cli import main
from wslight.records.results import LOCK_NAME

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
HINT = "run the same command again to resume"


def _group(pgid: int) -> list[int]:
    """The processes of a process group (from /proc: Linux)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except OSError:  # ended meanwhile
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def _gone(pgid: int, timeout: float = 10) -> bool:
    deadline = time.time() + timeout
    while _group(pgid) and time.time() < deadline:
        time.sleep(0.1)
    return not _group(pgid)


class _Run:
    """A command in a process group of its own, its stderr collected line by line."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        self.proc = start_in_own_group(command, cwd)
        self.err: list[str] = []
        self.out: list[str] = []
        self._readers = [
            threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True),  # type: ignore[arg-type]
            threading.Thread(target=lambda: self.out.extend(self.proc.stdout), daemon=True),  # type: ignore[arg-type]
        ]
        for reader in self._readers:
            reader.start()

    def wait_until(self, ready, what: str, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while not ready():
            assert self.proc.poll() is None, f"the run ended before {what}: {''.join(self.err)[-3000:]}"
            assert time.time() < deadline, f"no {what} within {timeout} s"
            time.sleep(0.05)

    def stop(self, sig: int, timeout: float = 60) -> float:
        """Send `sig` to the group; the seconds until the command ended."""
        start = time.time()
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        took = time.time() - start
        for reader in self._readers:
            reader.join(5)
        return took

    def stderr(self) -> str:
        return "".join(self.err)


MOMENTS = {
    # rank 0 imports torch and Lightning (seconds): the handlers come first
    "rank 0 starting": lambda run: time.sleep(0.3),
    # the other process imports while rank 0 waits for it in C++ in the process group's start
    "the other process starting": lambda run: (
        run.wait_until(lambda: len(_group(run.proc.pid)) > 1, "rank 1"),
        time.sleep(1),
    ),
    # both in the process group's start
    "the process group starting": lambda run: run.wait_until(
        lambda: any("GLOBAL_RANK: 1" in x for x in run.err), "rank 1 initializing"
    ),
}


@pytest.mark.slow  # evaluate.py on two processes stopped while they start, one start each
@pytest.mark.parametrize(
    "moment, sig",
    [
        ("rank 0 starting", signal.SIGINT),
        ("the other process starting", signal.SIGINT),
        ("the other process starting", signal.SIGTERM),
        ("the process group starting", signal.SIGINT),
    ],
)
def test_a_signal_while_two_processes_start_stops_the_run_with_its_status(tmp_path, squares, moment, sig):
    cfg = squares(trials=4, sleep=300, compute=True)
    run = _Run([sys.executable, str(ROOT / "evaluate.py"), "--config", str(cfg), *TWO_PROCESSES], tmp_path)
    MOMENTS[moment](run)
    took = run.stop(sig)
    err = run.stderr()
    assert run.proc.returncode == 128 + sig, err[-3000:]  # not 137 (Lightning's SIGKILL of every process)
    assert took < 10, f"stopped {took:.0f} s after the signal"
    assert err.count(HINT) == 1 and "Traceback" not in err and "Forcefully terminating" not in err, err[-3000:]
    assert _gone(run.proc.pid), "a process of the run is still running"
    assert not list(tmp_path.rglob(LOCK_NAME))


TWO_PROCESSES = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu"]


# ------------------------------------------------------------------------------------------- processes for the cores


def test_more_processes_than_the_cores_can_start_are_refused_before_any_starts(squares, monkeypatch, capsys):
    monkeypatch.setattr(cli, "available_cores", lambda: 2)
    args = ["--config", str(squares()), *TWO_PROCESSES[2:]]  # parsed and built, not run
    main([*args, "--trainer.devices", "8"], evaluate=True, run=False)  # 4 per core: shared, with a note
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("note: trainer.devices=8 starts 8 processes on 2 available cores")
    with pytest.raises(SystemExit) as exc:
        main([*args, "--trainer.devices", "64"], evaluate=True, run=False)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len([x for x in err.splitlines() if "error:" in x]) == 1, err
    assert (
        "error: trainer.devices=64 would start 64 processes on 2 available cores: more than 4 per core do not start "
        "in reasonable time; give --trainer.devices 2 (one process per core, the same records)"
    ) in err


# ------------------------------------------------------------------------------------------- benchmarks

BENCHMARKS = {  # a small run of each benchmark of `make bench`, synthetic rows (no embeddings to build)
    "benchmarks.ws": ["--threads", "1", "--skip", "rf", "step", "--trials", "2", "--data", "synthetic"],
    "benchmarks.attack": ["--threads", "1", "--trials", "2", "--data", "synthetic"],
}


@pytest.mark.slow  # a benchmark in a subprocess, stopped by Ctrl-C while its first part computes
@pytest.mark.parametrize("module", sorted(BENCHMARKS))
def test_ctrl_c_stops_a_benchmark_within_seconds_with_one_line(tmp_path, module):
    pages = tmp_path / "pages"
    command = [sys.executable, "-m", module, *BENCHMARKS[module], "--pages", str(pages)]
    run = _Run(command, tmp_path)
    run.wait_until(lambda: any(" s] " in x for x in run.err), "a progress line")  # "[     5 s] RAF cell ...: ..."
    time.sleep(1)  # its part imports torch, then computes
    took = run.stop(signal.SIGINT)
    err = run.stderr()
    assert run.proc.returncode == 130, err[-3000:]
    assert took < 5, f"stopped {took:.1f} s after the signal"
    assert "Traceback" not in err, err[-3000:]
    assert err.splitlines()[-1].startswith(f"{module}: interrupted (SIGINT) after "), err[-3000:]
    assert err.count("interrupted") == 1
    assert _gone(run.proc.pid), "a part of the benchmark is still running"
    assert not pages.exists()
