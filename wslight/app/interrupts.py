"""How SIGINT and SIGTERM stop a command at any moment: 128 + the signal, one message, no process left running.

A module with no heavy imports: the verb table installs the handlers on its first line, before torch and Lightning are
imported (seconds on a busy machine), so a Ctrl-C during the start-up of a command, or of one of the processes
Lightning starts for a DDP run, stops it like one in the middle of a step: `KeyboardInterrupt`, then exit 130 for
SIGINT and 143 for SIGTERM (wslight.app.errors), the command's message printed once, by rank 0. A process that
Lightning's launcher started ends when the launcher does (`end_with_launcher`). Where no process of the run is the
parent of the others (torchrun, srun, several nodes), a signal that reached one process stops every one through the
process group's store (`StopRelay`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
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
    """The SIGINT/SIGTERM handler: note the signal (the first one) and stop with KeyboardInterrupt.

    In a run whose other processes are no children of this one, the others have been told first (`StopRelay`).
    """
    global received
    if received is None:
        received = signum
    relay = _relay
    if relay is not None:
        relay.signalled()
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_signals(message: str | None = None) -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt from now on; `message` is what rank 0 says when one stops the command.

    Main thread only. Resets what a previous command in this process noted (`main` called twice from Python).
    """
    global received, _message, _said
    received, _message, _said = None, message, False
    for sig in STOP_SIGNALS:
        signal.signal(sig, raise_interrupt)
    if sys.unraisablehook is not _deliver_again:
        _replaced[:] = [sys.unraisablehook]
        sys.unraisablehook = _deliver_again


_replaced: list[Any] = []  # the unraisable hook `stop_on_signals` replaced last


def _deliver_again(unraisable: Any) -> None:
    """A stop raised where Python cannot propagate it (a callback, e.g. importlib's module-lock one): send it again.

    Python would print the KeyboardInterrupt as an ignored exception (a traceback) and go on; the signal sent to this
    process once more stops it from the main thread's next step instead, with the same status.
    """
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and received is not None:
        # from another thread: sent from here, the handler would run inside this hook and be swallowed again
        threading.Thread(target=os.kill, args=(os.getpid(), received), daemon=True).start()
        return
    (_replaced[0] if _replaced else sys.__unraisablehook__)(unraisable)


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


def keep_own_signal_handlers(trainer: pl.Trainer, checkpoint_on_requeue: bool = True) -> None:
    """Leave SIGTERM to `main`'s handler, which stops the run at once like Ctrl-C; relay a stop to the other processes.

    Lightning's own SIGTERM handler only notes the signal (the run goes on to the end of its step) and, under DDP,
    broadcasts it from inside the handler: a SIGTERM that reached one process alone (or a second one: the group's and
    the launcher's forwarded one) leaves a process waiting in that broadcast for good. On SLURM with auto-requeue,
    SIGUSR1 (`#SBATCH --signal`) requeues the job: with Lightning's handler, which also writes a checkpoint
    (`checkpoint_on_requeue`: a fit, which resumes from it), else with `requeue_job` (an evaluation, which resumes
    from its records); SIGTERM still stops the run. Once the process group exists, a run whose processes a launcher
    outside Lightning started (torchrun, srun) or that spans several nodes relays a stop signal to every process
    (`StopRelay`).
    """
    # here: the module imports nothing heavy
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    connector = trainer._signal_connector
    lightning_handlers = connector.register_signal_handlers
    lightning_teardown = connector.teardown
    environment = trainer._accelerator_connector.cluster_environment
    requeue = isinstance(environment, SLURMEnvironment) and environment.auto_requeue
    requeue_signal = (
        environment.requeue_signal if isinstance(environment, SLURMEnvironment) else None
    ) or signal.SIGUSR1

    def register() -> None:  # Lightning calls it once the process group exists
        if requeue:
            own = signal.getsignal(signal.SIGTERM)
            lightning_handlers()
            signal.signal(signal.SIGTERM, own)
            if not checkpoint_on_requeue:
                signal.signal(requeue_signal, requeue_job)
        # torchrun or srun started the processes (Lightning's own launcher, whose children see LOCAL_RANK, is not one:
        # there rank 0 is the others' parent and a signal reaches them all)
        external = isinstance(environment, (TorchElasticEnvironment, SLURMEnvironment))
        if external or trainer.num_nodes > 1:
            start_relay()

    def teardown() -> None:
        stop_relay()
        lightning_teardown()

    connector.register_signal_handlers = register  # type: ignore[method-assign]
    connector.teardown = teardown  # type: ignore[method-assign]


def requeue_job(signum: int, frame: Any) -> None:
    """SIGUSR1 under SLURM with auto-requeue, in a run that resumes from its records: rank 0 requeues the job.

    `scontrol requeue <job>` (`<array job>_<task>` in an array), as Lightning's handler does, without its checkpoint:
    that one is written from inside the handler behind a barrier of every process (which a signal that reached one
    process alone never passes) and an evaluation does not read it. SLURM then stops the job with SIGTERM (the
    finished trials are kept) and starts it again, which resumes from them; the run goes on until then.
    """
    if rank_from_env() != 0:
        return
    import subprocess  # here: a handler that seldom runs

    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID')}" if array else os.environ.get("SLURM_JOB_ID", "")
    try:
        code = subprocess.call(["scontrol", "requeue", job])
    except OSError as err:
        code, job = -1, f"{job} ({err.strerror})"
    said = f"requeued SLURM job {job}" if code == 0 else f"requeuing SLURM job {job} failed (status {code})"
    print(f"{signal.Signals(signum).name}: {said}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- across processes

_STOP_KEY = "wslight/stop/signal"  # the first stop signal of the run, in the process group's store
_SEEN_KEY = "wslight/stop/seen"  # how many processes know of it


class StopRelay(threading.Thread):
    """A stop signal that reached one process of a run stops every process, through the process group's store.

    Under torchrun or srun (and on several nodes) no process of a run is the parent of the others: a signal that
    reached one of them (a Ctrl-C on one node, `kill` of one task) would leave the others to fail in their next
    collective with a traceback, or to compute on until it. The process the signal reached writes it into the store
    and, from its handler, waits up to PEERS_S for every other process to have read it (the store may live in this
    process: rank 0's under srun). Every POLL_S the others look for it; one that finds it notes the signal and sends
    it to itself, so that it stops like the first: `KeyboardInterrupt`, then 128 + the signal and, on rank 0, the
    resume hint. A process still running STOP_S after it knew of the stop (its main thread blocked in C++) is ended
    by this thread: the run's locks released, the message said once, 128 + the signal.
    """

    POLL_S = 0.1
    PEERS_S = 3.0
    STOP_S = 10.0

    def __init__(self, store: Any, world_size: int) -> None:
        super().__init__(name="wslight-stop-relay", daemon=True)
        self._store = store
        self._world_size = world_size
        self._signalled = threading.Event()  # this process's handler ran
        self._relayed = threading.Event()  # the others know of the stop (or PEERS_S has passed, or the store is gone)
        self._done = threading.Event()  # the run has ended
        self._since: float | None = None  # when this process learnt of the stop

    def signalled(self) -> None:
        """From the handler of a stop signal: return once the other processes know of it (PEERS_S at most)."""
        self._signalled.set()
        self._relayed.wait(self.PEERS_S + 1)

    def release_store(self) -> None:
        """Drop this relay's reference to the process group's store (once its thread has ended)."""
        self._store = None

    def stand_down(self) -> None:
        """The run has ended: stop looking for a stop (a stop already known keeps its STOP_S bound)."""
        if self._since is None:
            self._done.set()
        self._relayed.set()

    def run(self) -> None:
        """Until the run ends: exchange stops through the store, then end the process if it outlives STOP_S."""
        store_alive = True
        while not self._done.is_set():
            if self._since is None:
                self._signalled.wait(self.POLL_S)
            else:
                self._done.wait(self.POLL_S)
            if store_alive:
                try:
                    self._exchange()
                except Exception:  # the store is gone (a process that held it has ended): nothing more to learn
                    store_alive = False
                    self._relayed.set()
                    if self._since is None:
                        return
            if self._since is not None and time.monotonic() - self._since > self.STOP_S:
                self._end_process()

    def _exchange(self) -> None:
        """Write this process's stop into the store, or read another's; note when every process knows of it."""
        global received
        if self._since is None and received is not None:
            self._store.set(_STOP_KEY, str(received))
            self._store.add(_SEEN_KEY, 1)
            self._since = time.monotonic()
        elif self._since is None and self._store.check([_STOP_KEY]):
            signum = int(self._store.get(_STOP_KEY))
            self._store.add(_SEEN_KEY, 1)
            received = received or signum
            self._since = time.monotonic()
            self._relayed.set()
            os.kill(os.getpid(), signum)  # the main thread stops as if the signal had come here
        if self._since is not None and not self._relayed.is_set():
            everyone = self._store.add(_SEEN_KEY, 0) >= self._world_size
            if everyone or time.monotonic() - self._since > self.PEERS_S:
                self._relayed.set()

    def _end_process(self) -> None:
        from ..records.results import RunLock  # here: the module imports nothing heavy

        try:
            RunLock.release_all()
            say_once()
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        finally:
            os._exit(status())


_relay: StopRelay | None = None  # the relay of this process's run, while it runs


def start_relay() -> None:
    """Relay stop signals between the processes of the run's process group (when it has more than one)."""
    global _relay
    import torch.distributed as dist  # here: the module imports nothing heavy

    stop_relay()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    from torch.distributed.distributed_c10d import _get_default_store

    _relay = StopRelay(_get_default_store(), dist.get_world_size())
    _relay.start()


def stop_relay() -> None:
    """The run has ended: its relay stands down, and lets go of the store before the process group is destroyed.

    A thread still holding the store at the interpreter's exit would destroy it there, its server thread still
    joinable: the C++ runtime aborts the process ("terminate called without an active exception", status 134).
    """
    global _relay
    if _relay is not None:
        _relay.stand_down()
        _relay.join(timeout=2 * StopRelay.POLL_S + 1.0)
        if not _relay.is_alive():
            _relay.release_store()
        _relay = None
