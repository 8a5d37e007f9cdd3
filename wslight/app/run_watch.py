"""A watch over the processes Lightning's DDP launcher starts, with a SIGINT/SIGTERM stopping the run.

Lightning's own watch kills every process as soon as one has ended with a non-zero status, a Ctrl-C included (exit
137 instead of 130); `RunWatch` takes a process stopped by a signal for an interrupt of the run and ends a run whose
rank 0 cannot stop by itself (waiting in C++ in the process group's start). `watch_workers` puts it in Lightning's
place; `stand_down_watches` ends it when the run has ended.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import sys
import time
from collections.abc import Callable

from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

from ..records.results import RunLock
from . import interrupts


class RunWatch(_ChildProcessObserver):
    """Lightning's watch over the processes its launcher starts (a thread of rank 0), with a signal stopping the run.

    Lightning's watch kills every process with SIGKILL (the run exits 137: "Child process ... terminated with code -2.
    Forcefully terminating all other processes") as soon as one of them has ended with a status other than 0, also
    when a Ctrl-C stopped it (130, or -2 when it came during the process's start) while rank 0 is stopping by itself,
    or waits for it in C++ in the process group's start, where no signal handler runs. This one, every 0.2 s:

    - a SIGINT/SIGTERM that reached rank 0 (seen at once, through the signal wakeup fd) or a process stopped by one
      stops the run; rank 0 gets the signal when only the other process did;
    - then nothing is killed while rank 0 stops by itself. When its handler has not run within STUCK_S (its main
      thread is blocked in C++) or it is still running after STOP_S, this thread ends the run: the other processes
      killed, the run's locks released, the message printed once, exit 128 + the signal;
    - any other status of a process is Lightning's to handle (everything killed) once rank 0 has had FAILED_S to stop
      with the failure's own message (it usually learns of it in the step's next collective).

    It stands down when `main` has ended the run (`stand_down`): a Python caller lives on after it.
    """

    STUCK_S = 2.0
    STOP_S = 10.0
    FAILED_S = 5.0
    POLL_S = 0.2

    def __init__(self, main_pid: int, child_processes: list, cleanup: Callable[[], None] = lambda: None) -> None:
        super().__init__(main_pid=main_pid, child_processes=child_processes)
        self._cleanup = cleanup  # what the run leaves behind when this thread ends it (a new, empty log folder)
        self._wakeup = _signal_wakeup()
        self._came: int | None = None  # the first stop signal the wakeup fd showed
        self._stop: tuple[int, float] | None = None  # the signal stopping the run, since when
        self._failed_since: float | None = None
        self._stood_down = False

    def stand_down(self) -> None:
        """Stop watching: the run has ended in `main` (its process may go on: `main` called from Python).

        Main thread (it gives back the signal wakeup fd).
        """
        self._stood_down = self._finished = True
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)

    def run(self) -> None:
        """Watch until every process has ended with 0, or the run has ended."""
        while not self._finished:
            self._wait()
            self._finished = self._stood_down or self._run()

    def _wait(self) -> None:
        if self._wakeup is None:
            time.sleep(self.POLL_S)
            return
        if select.select([self._wakeup], [], [], self.POLL_S)[0]:
            try:
                data = os.read(self._wakeup, 64)
            except BlockingIOError:
                return
            came = [s for s in data if s in interrupts.STOP_SIGNALS]
            if came and self._came is None:
                self._came = came[0]

    def _run(self) -> bool:
        codes = [proc.poll() for proc in self._child_processes]
        now = time.monotonic()
        if self._stop is None:
            signum = interrupts.received or self._came
            if signum is None:
                signum = next(filter(None, map(interrupts.stop_status_of, codes)), None)
                if signum is not None:  # another process alone got it: the run stops with it
                    os.kill(self._main_pid, signum)
            if signum is not None:
                self._stop = (signum, now)
        if self._stop is not None:
            signum, since = self._stop
            if (interrupts.received is None and now - since > self.STUCK_S) or now - since > self.STOP_S:
                self._end_run(signum)
            return False
        if all(code == 0 for code in codes):
            return True
        if any(codes):
            self._failed_since = self._failed_since or now
            if now - self._failed_since > self.FAILED_S:
                return super()._run()
        return False

    def _end_run(self, signum: int) -> None:
        """End the run from this thread: kill the other processes, release the locks, say the message, exit."""
        if self._stood_down:
            return
        interrupts.received = interrupts.received or signum
        try:
            for proc in self._child_processes:
                if proc.poll() is None:
                    proc.kill()
            RunLock.release_all()
            self._cleanup()
            interrupts.say_once(rank_zero=True)  # the watch is a thread of the launcher: rank 0
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        finally:
            os._exit(interrupts.status())


def _signal_wakeup() -> int | None:
    """A pipe's read end that gets each signal's number at once, also while the main thread waits in C++.

    The interpreter writes into it from its C signal handler (signal.set_wakeup_fd). None where it cannot be set: not
    the main thread, or a wakeup fd set already (left as it was).
    """
    try:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        old = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):
        return None
    if old != -1:
        signal.set_wakeup_fd(old)
        os.close(read)
        os.close(write)
        return None
    return read


_watches: list[RunWatch] = []  # the watches of this process's runs that have not stood down


def _launch_run_watch(child_processes: list, cleanup: Callable[[], None]) -> None:
    watch = RunWatch(main_pid=os.getpid(), child_processes=child_processes, cleanup=cleanup)
    _watches.append(watch)
    watch.start()


def stand_down_watches() -> None:
    """The run has ended in `main`: its watch stops (a process that lives on is never ended by it)."""
    while _watches:
        _watches.pop().stand_down()


def watch_workers(cleanup: Callable[[], None] = lambda: None) -> None:
    """Have Lightning's DDP launcher watch the processes it starts with RunWatch instead of its own watch.

    `cleanup` runs when the watch ends a run itself (after the run's locks are released).
    """
    from lightning.pytorch.strategies.launchers import subprocess_script

    subprocess_script._launch_process_observer = functools.partial(_launch_run_watch, cleanup=cleanup)
