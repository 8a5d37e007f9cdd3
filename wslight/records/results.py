"""results.jsonl: one JSON object per finished trial, appended atomically, resumable, never torn.

Every record carries `run_key` (a hash of the resolved evaluation config) and `trial_key` (the trial's identity within
the run). A re-run of the same config reads the file, skips the trials already there and appends only the missing
ones; a changed config has another key, so results never mix. A torn last line (a crash in the middle of a write) is
detected, reported with a warning and cut off before anything is appended.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import signal
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

RESULTS_NAME = "results.jsonl"
LOCK_NAME = "results.lock"
PROBE_BYTES = 64 * 1024  # what the writability probe writes (and removes) before a run: a few records' worth
# Fields that say how long a record took to make, not what it is: records are compared without them.
TIMING_FIELDS = frozenset({"seconds"})
# The stable fields (README, "Evaluations") that every record of an experiment carries (extra fields are welcome).
WS_FIELDS = frozenset("experiment map d n L trial sample_id position ws delta_norm phi_norm steps seed".split())
WORDS_FIELDS = frozenset(
    "experiment map d n L trial sample_id position token ws_words word distance ws phi_norm admissible seed".split()
)
ATTACK_FIELDS = frozenset(
    "experiment map training loss p d n N trial y t0 t1 D0 D1 err sign_err gamma proj_ratio seed".split()
)


def unwritable_reason(folder: str | os.PathLike, target: Path | None = None) -> str | None:
    """Why `folder` cannot receive files (None when it can): probes its nearest existing ancestor, leaving nothing.

    The folder (or, when it does not exist yet, its nearest existing parent, where it would be created) must be a
    directory in which a file can be created; an existing `target` must open for appending.
    """
    out = Path(folder).absolute()
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"cannot create {out}: {probe} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=probe) as f:  # anonymous: nothing left behind
            f.write(bytes(PROBE_BYTES))  # a full disk takes an empty file, not a block of data
            f.flush()
            os.fsync(f.fileno())
        if target is not None and target.exists():
            with open(target, "ab"):
                pass
    except OSError as e:
        return f"cannot write {target or out} ({e.strerror or e} in {probe})"
    return None


def without_timing(record: dict) -> dict:
    """The record without its TIMING_FIELDS: what must be identical between runs, devices and resumed runs."""
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}


def config_key(config: Any, length: int = 12) -> str:
    """A short stable hash of a JSON-serialisable config (keys sorted)."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _clean(value: Any) -> Any:
    """JSON-safe value: tensors and numpy scalars to Python, NaN/Inf to None (strict JSON has neither)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, so a write is never cut in half (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, Any]] = []
    # keyed by int: the handlers are looked up by the signal numbers delivered
    old: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {
        s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)
    }
    for s in old:
        signal.signal(s, lambda signum, frame: pending.append((signum, frame)))
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for signum, frame in pending:
            handler = old[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


class ResultsFileError(Exception):
    """A results file this run cannot use as it is; `exit_status` is the command line's (wslight.app.failures)."""

    exit_status = 1


class CorruptResults(ResultsFileError):
    """A line before the last one of a results file is not a JSON record: the file was edited or damaged."""


class ForeignResults(ResultsFileError):
    """A run folder's results file holds records of another run (another config wrote to the same folder)."""

    exit_status = 2


def read_records(path: str | os.PathLike, repair: bool = False, quiet_tail: bool = False) -> list[dict]:
    """All complete records of a results file ([] when it does not exist).

    A last line without its newline or that does not parse is a torn write: it is skipped with a warning and, with
    `repair=True`, cut off the file so that later appends start on a clean line. A bad line elsewhere is corruption and
    raises CorruptResults naming the file and the line. `quiet_tail=True` (a file another process may be appending to
    right now, e.g. another shard's): that last line is skipped without a warning.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records, good_bytes = [], 0
    for lineno, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if lineno == len(lines) and not tail:
                tail = line  # the last complete-looking line is torn (e.g. cut inside a string)
                break
            shown = line[:60].decode("utf-8", "replace") + ("..." if len(line) > 60 else "")
            raise CorruptResults(
                f"{path}: line {lineno} of {len(lines)} is not a JSON record ({e.msg}: {shown!r}); finished trials "
                "are read from this file, so it must be whole: delete that line (or move the file away to start "
                "over), then run the same command again"
            ) from e
        good_bytes += len(line) + 1
    if tail and not quiet_tail:
        warnings.warn(
            f"{path}: dropping a torn last line ({len(tail)} bytes) left by an interrupted write", stacklevel=2
        )
    if tail and repair:
        with open(path, "r+b") as f:
            f.truncate(good_bytes)
            f.flush()
            os.fsync(f.fileno())
    return records


class ResultsFile:
    """The results.jsonl of one evaluation run, keyed by `run_key`.

    A trial may produce several records (e.g. one per loss and training mode); they share its `trial_key`, carry a
    distinct `record_key` (default: the trial_key) and are written together. Each record stores `trial_size`, the
    number of records of its trial, so a trial counts as finished only when all of them are in the file.

    Args:
        path: the file (its folder is created on the first append).
        run_key: identity of the resolved config; only records with this key count.
        shared: another process may be appending to the file (another shard's, `wslight.records.shards`): its
            incomplete last line is that write in progress, skipped without a warning.
    """

    def __init__(self, path: str | os.PathLike, run_key: str, shared: bool = False) -> None:
        self.path = Path(path)
        self.run_key = run_key
        self.shared = shared

    def records(self, repair: bool = False) -> list[dict]:
        """Records of this run's finished trials, one per (trial_key, record_key), in file order."""
        by_trial: dict[str, dict[str, dict]] = {}
        for r in read_records(self.path, repair=repair, quiet_tail=self.shared):
            if r.get("run_key") == self.run_key:
                by_trial.setdefault(str(r["trial_key"]), {}).setdefault(str(r.get("record_key", r["trial_key"])), r)
        out: list[dict] = []
        for recs in by_trial.values():
            size = next(iter(recs.values())).get("trial_size", 1)
            if len(recs) >= size:
                out.extend(recs.values())
        return out

    def check_single_run(self) -> None:
        """Refuse a file that holds records of another run: appending to it would leave a mixed file.

        Raises:
            ForeignResults: naming the file, what it holds and what to do.
        """
        others: dict[str, int] = {}
        for r in read_records(self.path, quiet_tail=self.shared):
            if r.get("run_key") != self.run_key:
                exp = f" ({r['experiment']})" if "experiment" in r else ""
                kind = f"run {r.get('run_key')}{exp}"
                others[kind] = others.get(kind, 0) + 1
        if others:
            held = ", ".join(f"{count} records of {kind}" for kind, count in others.items())
            raise ForeignResults(
                f"{self.path} holds records of another run ({held}), and this run's key is {self.run_key}: appending "
                "would mix two runs in one file; give this run its own folder (model.init_args.output_dir, or the "
                "logger's save_dir/name/version) or move that file away, then run again"
            )

    def finished_keys(self, repair: bool = False) -> set[str]:
        """The `trial_key`s of this run's finished trials (`records`, with the same `repair`)."""
        return {str(r["trial_key"]) for r in self.records(repair=repair)}

    def append(self, records: Iterable[dict]) -> int:
        """Append the records of trials not finished yet, all in one flushed and fsync'd write. Returns the count."""
        done = self.finished_keys(repair=True)
        trials: dict[str, dict[str, dict]] = {}
        for r in records:
            key = str(r["trial_key"])
            if key not in done:  # DDP padding duplicates and already-finished trials
                trials.setdefault(key, {}).setdefault(str(r.get("record_key", key)), r)
        lines = [
            json.dumps(_clean({**r, "trial_size": len(recs), "run_key": self.run_key})) + "\n"
            for recs in trials.values()
            for r in recs.values()
        ]
        if not lines:
            return 0
        data = "".join(lines).encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # unbuffered: nothing is left in a buffer to be flushed (half) at close after a failed write
        with deferred_signals(), open(self.path, "ab", buffering=0) as f:
            start = os.fstat(f.fileno()).st_size
            try:
                view = memoryview(data)
                while view:  # a raw write may be partial
                    view = view[f.write(view) :]
                os.fsync(f.fileno())
            except OSError as e:
                # e.g. ENOSPC after part of the lines went out: cut them off so the file ends on a complete line
                with contextlib.suppress(OSError):
                    os.ftruncate(f.fileno(), start)
                raise OSError(
                    e.errno,
                    f"could not append {len(lines)} record(s) to {self.path} ({e.strerror or e}); the file was cut "
                    "back to its last complete line, so finished trials are kept: free space (or fix the folder) and "
                    "run the same command again to resume",
                ) from e
        return len(lines)


class RunFolderBusy(Exception):
    """Another process holds the run folder's lock: this run would redo its trials and append them twice."""


class RunLock:
    """One writer per results file: an exclusive `flock` on `<folder>/results.lock`, held for the whole run.

    The lock belongs to the open file, so it is released when the holder closes it or dies (a killed run leaves no
    stale lock). The file keeps the holder's pid and host, for the message of a second process. Where the platform
    has no `fcntl` (Windows) runs are not locked. A shard of a run locks a file of its own (`name`), beside it.
    """

    _held: set[RunLock] = set()  # the locks this process holds, for `release_all` at the end of a run

    def __init__(self, folder: str | os.PathLike, name: str = LOCK_NAME) -> None:
        self.path = Path(folder) / name
        self._file: Any = None

    @staticmethod
    def holder(path: str | os.PathLike) -> str | None:
        """Who holds the lock file `path` now (its pid and host), or None: no such file, or no process holds it.

        Takes the lock shared for an instant when it is free; where the platform has no `fcntl`, None.
        """
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return None
        try:
            f = open(path)
        except FileNotFoundError:
            return None
        with f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return f.read().strip() or "another process"
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None

    def acquire(self) -> None:
        """Take the lock, or raise RunFolderBusy naming the holder. Creates the folder if needed."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            f = open(self.path, "a+")
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                f.close()
                raise RunFolderBusy(
                    f"{self.path.parent} is being written by {holder}: this run would compute the same trials "
                    "again; wait for it to finish (or stop it), then run the same command to resume"
                ) from None
            if self._is_current(f):
                break
            f.close()  # locked a file its holder had just removed on release: lock the new one instead
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {platform.node() or 'this host'}\n")
        f.flush()
        self._file = f
        RunLock._held.add(self)

    def _is_current(self, f: Any) -> bool:
        try:
            return os.fstat(f.fileno()).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the lock file and release the lock.

        A second process that opened the file meanwhile holds an unlinked file and retries its own check: `acquire`
        compares the open file with the path.
        """
        if self._file is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()  # while still locked: no other process can hold the lock of this file now
            self._file.close()  # closing the file releases the lock
            self._file = None
        RunLock._held.discard(self)

    @classmethod
    def release_all(cls) -> None:
        """Release every lock of this process: a run that failed inside Lightning skips the modules' teardown."""
        for lock in list(cls._held):
            lock.release()
