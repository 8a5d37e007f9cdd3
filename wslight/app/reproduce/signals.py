"""SIGINT and SIGTERM during a reproduction: passed on to a running stage exactly once, or stopping the driver."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

from ..errors import EXIT_SIGNAL_BASE
from ..interrupts import STOP_SIGNALS

__all__ = ["STOP_SIGNALS", "Interrupted", "run_passing_signals", "stop_on_signals"]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached `wslight reproduce` itself (a KeyboardInterrupt: no `except Exception` hides it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum

    @property
    def status(self) -> int:
        """The exit status as the shell reports a process stopped by the signal: 130 SIGINT, 143 SIGTERM."""
        return (
            EXIT_SIGNAL_BASE + self.signum
        )  # as the shell reports a process stopped by the signal: 130 SIGINT, 143 SIGTERM


class _PassOn:
    """A SIGINT/SIGTERM handler that records the signal and sends it on to a stage's process group."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.received: list[int] = []
        self.sent = False

    def __call__(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        if self.proc is not None:
            self.send(signum)

    def send(self, signum: int) -> None:
        assert self.proc is not None
        self.sent = True
        with contextlib.suppress(ProcessLookupError):  # the stage has already ended
            os.killpg(self.proc.pid, signum)


def run_passing_signals(cmd: list[str], env: dict[str, str]) -> tuple[int, int | None]:
    """Run a stage's command in a process group of its own.

    Return its return code and the first SIGINT/SIGTERM this process received meanwhile (None if none).

    Each signal this process receives goes on to the stage's group, once: a Ctrl-C or a scheduler's SIGTERM sent to
    the whole group of `wslight reproduce` reaches this process only, and one sent to this process alone reaches the
    stage too. Either way every process of the stage (its DDP ranks included) gets it exactly once, as when the stage
    runs alone: a second SIGINT would cut the stage's clean stop short.
    """
    pass_on = _PassOn()
    handlers = {s: signal.signal(s, pass_on) for s in STOP_SIGNALS}
    try:
        # no stdin: a process group other than the terminal's would be stopped by reading it
        if sys.version_info >= (3, 11):
            pass_on.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, process_group=0)
        else:  # pragma: no cover - Python 3.10
            pass_on.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        if pass_on.received and not pass_on.sent:  # it came while the stage was starting
            pass_on.send(pass_on.received[0])
        code = pass_on.proc.wait()
    finally:
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)
    return code, (pass_on.received[0] if pass_on.received else None)


def _stop(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM stop the driver with `Interrupted` (outside a stage's command, which passes them on)."""
    handlers = {s: signal.signal(s, _stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)
