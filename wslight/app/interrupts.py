"""How SIGINT and SIGTERM stop a command at any moment: 128 + the signal, one message, no process left running.

A module with no heavy imports: the verb table installs the handlers on its first line, before torch and Lightning are
imported (seconds on a busy machine), so a Ctrl-C during the start-up of a command, or of one of the processes
Lightning starts for a DDP run, stops it like one in the middle of a step: `KeyboardInterrupt`, then exit 130 for
SIGINT and 143 for SIGTERM (wslight.app.errors), the command's message printed once, by rank 0. A process that
Lightning's launcher started ends when the launcher does (`end_with_launcher`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from .errors import EXIT_SIGNAL_BASE

if TYPE_CHECKING:  # the module imports nothing heavy at run time
    import lightning.pytorch as pl

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RESUME_HINT = "interrupted: finished trials are saved in results.jsonl; run the same command again to resume"

received: int | None = None  # the first SIGINT/SIGTERM this process's handler ran for
_message: str | None = None  # what rank 0 prints when a signal stops the command (None: nothing)
_said = False
_say_lock = threading.Lock()


def raise_interrupt(signum: int, frame: Any) -> None:
    """The SIGINT/SIGTERM handler: note the signal (the first one) and stop with KeyboardInterrupt."""
    global received
    if received is None:
        received = signum
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_signals(message: str | None = None) -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt from now on; `message` is what rank 0 says when one stops the command.

    Main thread only. Resets what a previous command in this process noted (`main` called twice from Python).
    """
    global received, _message, _said
    received, _message, _said = None, message, False
    for sig in STOP_SIGNALS:
        signal.signal(sig, raise_interrupt)


def exit_on_signals() -> None:
    """For the rest of the process (its interpreter's exit): a SIGINT/SIGTERM ends it at once, with its status.

    After the command: a signal during the interpreter's own exit would otherwise raise KeyboardInterrupt in an atexit
    callback (a traceback, and the command's status instead of the signal's).
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, _exit_now)


def _exit_now(signum: int, frame: Any) -> None:
    global received
    received = received or signum
    say_once()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):  # closed, a reader gone, or a write it interrupted
            pass
    os._exit(EXIT_SIGNAL_BASE + signum)


def status() -> int:
    """The exit status of a command a signal stopped: 130 for SIGINT (also when none was noted), 143 for SIGTERM."""
    return EXIT_SIGNAL_BASE + (received or signal.SIGINT)


def rank_from_env() -> int:
    """This process's rank as the launchers set it (torchrun, SLURM, Lightning's), 0 when none does.

    The variables Lightning reads for its rank before a run sets it (lightning.fabric.utilities.rank_zero).
    """
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        value = os.environ.get(key)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


def say_once(rank_zero: bool | None = None) -> None:
    """Print the command's interrupt message on stderr, once per command, on rank 0 only (from any thread)."""
    global _said
    if rank_zero is None:
        rank_zero = rank_from_env() == 0
    with _say_lock:
        if _said or _message is None or not rank_zero:
            return
        _said = True
        print(_message, file=sys.stderr, flush=True)


def stop_status_of(returncode: int | None) -> int | None:
    """The signal a return code says stopped a process: 130/143 (its handler ran), -2/-15 (before it), else None."""
    if returncode is None:
        return None
    for sig in STOP_SIGNALS:
        if returncode in (EXIT_SIGNAL_BASE + sig, -sig):
            return int(sig)
    return None


def end_with_launcher() -> None:
    """In a process that Lightning's launcher started (LOCAL_RANK > 0): be killed when the launcher process ends.

    Such a process waits in the process group's start for every other one; when the launcher is gone (a Ctrl-C while
    the processes start, a failure, SIGKILL) nothing else would end it. Linux only (prctl PR_SET_PDEATHSIG).
    """
    if os.environ.get("LOCAL_RANK", "0") in ("", "0") or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no prctl
        return


def keep_own_signal_handlers(trainer: pl.Trainer) -> None:
    """Leave SIGTERM to `main`'s handler, which stops the run at once like Ctrl-C.

    Lightning's own SIGTERM handler only notes the signal (the run goes on to the end of its step) and, under DDP,
    broadcasts it from inside the handler: a second SIGTERM (the group's and the launcher's forwarded one) leaves a
    process waiting in that broadcast for good. On SLURM with auto-requeue Lightning's handlers are kept: they
    requeue the job.
    """
    from lightning.fabric.plugins.environments import SLURMEnvironment  # here: the module imports nothing heavy

    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return
    trainer._signal_connector.register_signal_handlers = lambda: None  # type: ignore[method-assign]
