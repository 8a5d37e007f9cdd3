"""Progress lines and Ctrl-C for the benchmarks that run each side in a subprocess of its own (ws, attack).

The driver says on stderr which row and side it starts, with the seconds since its start, so a run of minutes shows
where it is. SIGINT (Ctrl-C) or SIGTERM stops it within a second: the running part is killed (it may be deep in one
long torch or numpy call, which only returns at its end), one line says what stopped, and the driver exits 128 + the
signal (130, 143), with no traceback and no page written. A part ends at once and quietly on either signal, and when
its driver is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_name = "benchmark"
_start = time.monotonic()
_running: list[subprocess.Popen] = []  # the parts started and not yet waited for


def _write(line: str) -> None:
    try:
        os.write(sys.stderr.fileno(), (line + "\n").encode())
    except (OSError, ValueError):  # stderr closed
        pass


def _stop_driver(signum: int, frame: Any) -> None:
    for proc in _running:
        try:
            proc.kill()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        sys.stdout.flush()  # the tables printed so far
    except (OSError, ValueError, RuntimeError):  # closed, a reader gone, or a print it interrupted
        pass
    seconds = time.monotonic() - _start
    _write(f"{_name}: interrupted ({signal.Signals(signum).name}) after {seconds:.0f} s; no results page written")
    os._exit(128 + signum)


def _stop_part(signum: int, frame: Any) -> None:
    os._exit(128 + signum)  # its driver says what stopped


def start(name: str) -> None:
    """In a benchmark's driver: SIGINT/SIGTERM stop it as the module says; stdout shows each line as it is printed."""
    global _name, _start
    _name, _start = name, time.monotonic()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_driver)
    try:
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    except (AttributeError, ValueError):  # not a text stream of its own
        pass


def start_part() -> None:
    """In a part's process: SIGINT/SIGTERM end it at once and quietly, and so does the end of its driver (Linux)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_part)
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def say(what: str) -> None:
    """One progress line on stderr: the seconds since the start and what starts now."""
    _write(f"[{time.monotonic() - _start:6.0f} s] {what}")


def run_part(command: list[str], env: dict[str, str] | None = None, cwd: Path | str | None = None) -> tuple[int, Any]:
    """Run a part's command; its exit code (-N when a signal N ended it) and its resource usage (os.wait4's)."""
    proc = subprocess.Popen(command, env=env, cwd=cwd)
    _running.append(proc)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        _running.remove(proc)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage
