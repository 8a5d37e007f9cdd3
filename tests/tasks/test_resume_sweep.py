"""A real word-sensitivity sweep stopped by SIGTERM, then by SIGINT, then resumed equals an uninterrupted run.

`evaluate.py` runs in a subprocess on a tiny synthetic config; once a few trials are in results.jsonl it gets the
signal, must exit non-zero with the resume hint, and leave only complete lines. Re-running the same command must keep
those lines, compute only the missing trials and end with a file byte-identical to an uninterrupted run's (same trials,
same floats: every per-trial random draw is seeded from the config, and the run key ignores the trainer section).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wslight.app.cli import main
from wslight.records.results import without_timing

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 16  # 2 maps x 2 n x 4 trials


# The tiny test setting of configs/ws/raf.yaml (tests/conf/ws/raf.yaml) with two maps, one d and four trials a cell.
WS = {
    "grid.maps": ["rf", "raf"],
    "grid.d_values": [8],
    "grid.n_values": [4, 8],
    "grid.trials": 4,
    "search.chains_per_round": 4,
    "search.max_steps": 40,
    "seed": 5,
    "embeddings.max_length": 16,
}

# Subprocesses that are sent signals: under the `slow` marker (make test-slow), out of the fast suite.
pytestmark = pytest.mark.slow  # evaluate.py in subprocesses, stopped by signals, then resumed


@pytest.fixture(scope="module")
def command(cpu_trainer, tiny):
    """A function of save_dir giving evaluate.py's arguments: the sweep on the CPU trainer, logging under save_dir."""

    def args(save_dir: Path) -> list[str]:
        logs = ["--trainer.logger.init_args.save_dir", str(save_dir), "--trainer.logger.init_args.name", "ws"]
        return [*tiny("ws/raf", WS), *cpu_trainer.args, *logs]

    return args


@pytest.fixture(scope="module")
def reference(tmp_path_factory, command):
    """results.jsonl of an uninterrupted run (in-process, as evaluate.py does)."""
    tmp = tmp_path_factory.mktemp("reference")
    cli = main(["test", *command(tmp / "logs")], evaluate=True)
    return Path(cli.model.results_path)


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "evaluate.py"), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_lines(root: Path, count: int, proc: subprocess.Popen, timeout: float = 180) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = list(root.rglob("results.jsonl"))
        if found and found[0].read_bytes().count(b"\n") >= count:
            return found[0]
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before it could be interrupted: {proc.communicate()[1][-2000:]}")
        time.sleep(0.02)
    proc.kill()
    pytest.fail("the sweep wrote no results in time")


def interrupt(args: list[str], cwd: Path, sig: int, at_least: int) -> tuple[Path, bytes]:
    """Start the sweep, send `sig` once `at_least` lines are in results.jsonl; check the exit and the file."""
    proc = start(args, cwd)
    results = wait_for_lines(cwd / "logs", at_least, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, f"{signal.Signals(sig).name}: exit status 0"
    assert "interrupted" in err and "run the same command again to resume" in err
    partial = results.read_bytes()
    assert partial.endswith(b"\n")  # no torn line: the write was not cut
    lines = partial.decode().splitlines()
    assert at_least <= len(lines) < TRIALS, "the signal arrived after the sweep had finished"
    assert all(json.loads(x)["experiment"] == "ws" for x in lines)
    return results, partial


def test_sigterm_then_sigint_then_resume_gives_the_uninterrupted_file(tmp_path, command, reference):
    args = command(tmp_path / "logs")
    results, first = interrupt(args, tmp_path, signal.SIGTERM, 2)
    assert results.parent.name == reference.parent.name  # same run key as the reference
    done = first.count(b"\n")
    # the resumed run is interrupted again, by SIGINT (Ctrl-C), after at least two more trials
    _, second = interrupt(args, tmp_path, signal.SIGINT, done + 2)
    assert second.startswith(first)

    proc = start(args, tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == f"results: {results}"
    kept = len(second.splitlines())
    assert f"{kept} of {TRIALS} trials already in" in out  # resumed, not restarted
    final = results.read_bytes()
    assert final.startswith(second)  # finished trials kept, not recomputed
    got = [without_timing(json.loads(x)) for x in final.decode().splitlines()]
    want = [without_timing(json.loads(x)) for x in reference.read_text().splitlines()]
    assert len(got) == TRIALS and len({r["trial_key"] for r in got}) == TRIALS
    assert got == want  # the same trials with the same values in the same order, floats compared exactly
