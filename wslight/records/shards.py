"""Shards of one evaluation run: independent jobs (`--shard i/N`) writing into one run folder.

Shard i of N runs every N-th step of the run's trials (steps formed as the whole run forms them, so a trial is
computed in the same batch as in one job) and appends to a results file of its own, `results.shard-<i>-of-<N>.jsonl`,
under a lock of its own: shards running at the same time never write the same file. Whoever reads the run (the end of
every shard, a later run without `--shard`) merges every results file of the folder, `results.jsonl` first, keeps one
copy of each finished trial and names the shards whose trials are not all on disk yet. A run without `--shard` ends by
writing that merge into results.jsonl (`write_whole`), so the file it names holds the whole run; a reader of a run's
records reads them with `run_records`, which merges the shards' files too. Plain Python: no torch, no Lightning.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .results import LOCK_NAME, RESULTS_NAME, ResultsFile, RunFolderBusy, RunLock, deferred_signals, read_records
from .summary import SUMMARY_NAME

T = TypeVar("T")
SHARD_FILES = "results.shard-*-of-*.jsonl"  # glob of the shards' results files in a run folder
_SHARD_FILE = re.compile(r"results\.shard-(\d+)-of-(\d+)\.jsonl")
SUMMARY_LOCK_NAME = "summary.lock"  # one summary writer at a time in a folder that shards write
MISSING_HEADING = "## Shards missing"  # the section of summary.md that names them


@dataclass(frozen=True, order=True)
class Shard:
    """Shard `index` of `count` (0 <= index < count): written `index/count`, as the command line takes it."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def results_name(self) -> str:
        """The name of this shard's results file in the run folder."""
        return f"results.shard-{self.index}-of-{self.count}.jsonl"

    @property
    def lock_name(self) -> str:
        """The name of this shard's lock file in the run folder (`RunLock`)."""
        return f"results.shard-{self.index}-of-{self.count}.lock"

    def take(self, items: Sequence[T]) -> list[T]:
        """This shard's share of `items`: every `count`-th from `index` (the same split on every machine)."""
        return list(items[self.index :: self.count])

    def siblings(self) -> list[Shard]:
        """Every shard of the same split, this one included."""
        return [Shard(i, self.count) for i in range(self.count)]


def parse_shard(text: str, key: str = "shard") -> Shard:
    """The Shard written `i/N` (whole numbers, 0 <= i < N).

    Raises:
        ValueError: naming `key` and the value, e.g. `shard: 3/3: i must be below N`.
    """
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if match is None:
        raise ValueError(f"{key}: {text}: give i/N, shard i of N with whole numbers 0 <= i < N (e.g. 0/3, 1/3, 2/3)")
    index, count = int(match[1]), int(match[2])
    if count < 1:
        raise ValueError(f"{key}: {text}: N must be at least 1")
    if index >= count:
        raise ValueError(
            f"{key}: {text}: i must be below N (the shards of {count} are 0/{count} to {count - 1}/{count})"
        )
    return Shard(index, count)


def shard_of_file(path: str | os.PathLike) -> Shard | None:
    """The shard whose results file `path` is (by its name), or None (results.jsonl, another file)."""
    match = _SHARD_FILE.fullmatch(Path(path).name)
    if match is None or int(match[1]) >= int(match[2]):
        return None
    return Shard(int(match[1]), int(match[2]))


def shard_files(folder: str | os.PathLike) -> list[Path]:
    """The shards' results files in `folder`, by split then shard (none when the folder does not exist)."""
    found = [(shard_of_file(p), p) for p in Path(folder).glob(SHARD_FILES)]
    return [
        p for s, p in sorted(((s, p) for s, p in found if s is not None), key=lambda sp: (sp[0].count, sp[0].index))
    ]


def results_files(folder: str | os.PathLike) -> list[Path]:
    """Every results file of a run folder that exists: results.jsonl first, then the shards' (`shard_files`)."""
    whole = Path(folder) / RESULTS_NAME
    return ([whole] if whole.exists() else []) + shard_files(folder)


class RunResults:
    """The records of a run folder, merged over its results files (results.jsonl and the shards').

    Args:
        folder: the run folder.
        run_key: the run's key; only records with it count.
        own: the file this process appends to (read as written; the others may be in the middle of a write, so an
            incomplete last line of theirs is skipped without a warning); None: a reader, which writes none of them.
    """

    def __init__(self, folder: str | os.PathLike, run_key: str, own: str | os.PathLike | None = None) -> None:
        self.folder = Path(folder)
        self.run_key = run_key
        self.own = None if own is None else Path(own)

    def files(self) -> list[Path]:
        """The results files on disk, in merge order (`results_files`)."""
        return results_files(self.folder)

    def _file(self, path: Path) -> ResultsFile:
        return ResultsFile(path, self.run_key, shared=self.own is None or path.absolute() != self.own.absolute())

    def records(self, order: Sequence[str] | None = None) -> list[dict]:
        """Every finished trial's records once: from the first file (`files`) that holds the whole trial.

        With `order` (the run's trial keys), in that order (a trial's records as written, trials not in it last);
        else in the order of the files.
        """
        taken: dict[str, list[dict]] = {}
        for path in self.files():
            trials: dict[str, list[dict]] = {}
            for r in self._file(path).records():
                trials.setdefault(str(r["trial_key"]), []).append(r)
            for key, recs in trials.items():
                taken.setdefault(key, recs)
        keys = list(taken)
        if order is not None:
            rank = {key: i for i, key in enumerate(order)}
            keys.sort(key=lambda k: rank.get(k, len(rank)))
        return [r for key in keys for r in taken[key]]

    def finished_keys(self) -> set[str]:
        """The `trial_key`s of the trials finished in any of the files."""
        return {str(r["trial_key"]) for path in self.files() for r in self._file(path).records()}

    def check_single_run(self) -> None:
        """Refuse a folder whose results files (any of them) hold records of another run (`ForeignResults`)."""
        for path in self.files():
            self._file(path).check_single_run()


def run_records(path: str | os.PathLike) -> list[dict]:
    """The records of a run, given its folder or one of its results files: what every reader of a finished run reads.

    Without shards' files in the folder, those of its results.jsonl (or of the file given) as written (`read_records`);
    with them, every finished trial of the run once over all its results files (`RunResults`: results.jsonl first, then
    the shards' by split and shard), of the run key the files' first record carries.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if not shard_files(folder):
        return read_records(folder / RESULTS_NAME if path.is_dir() else path)
    first = next((r for p in results_files(folder) for r in read_records(p, quiet_tail=True)[:1]), None)
    return [] if first is None else RunResults(folder, str(first.get("run_key"))).records()


def write_whole(folder: str | os.PathLike, records: list[dict]) -> bool:
    """Make the folder's results.jsonl hold `records`, the run's merge: every finished trial once, in the trials' order.

    For the run without `--shard` only, which holds results.lock (no shard writes meanwhile: `take_run_lock`). The
    records are those read from the files, so each line is the one a shard wrote (JSON reads and writes a float back to
    the same text): no number changes. Atomic: a temporary file beside it, renamed over it once on disk, so a reader
    sees the old file or the new one. Returns False (nothing written) when the file holds them already.
    """
    path = Path(folder) / RESULTS_NAME
    data = "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")
    if path.exists() and path.read_bytes() == data:
        return False
    tmp = path.with_name(f".{RESULTS_NAME}.{os.getpid()}.tmp")  # not a results file: no reader takes it for one
    with deferred_signals():
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return True


def keep_results(folder: str | os.PathLike, shard: Shard | None, records: list[dict]) -> None:
    """End a run in a folder that shards write: the results file the run names (`results: <path>`) is on disk.

    Without `--shard`, results.jsonl holds the whole run, `records` (`write_whole`); a shard's own file exists even
    when its share had no trial left to run (then empty).
    """
    if shard is None:
        write_whole(folder, records)
    else:
        own = Path(folder) / shard.results_name
        if not own.exists():
            own.touch()


def missing_shards(shares: dict[Shard, list[str]], finished: set[str]) -> dict[Shard, tuple[int, int]]:
    """{shard: (its trials not finished, its trials)} for each shard of `shares` with trials not finished."""
    out = {}
    for shard, keys in shares.items():
        left = sum(key not in finished for key in keys)
        if left:
            out[shard] = (left, len(keys))
    return out


def missing_text(missing: dict[Shard, tuple[int, int]], folder: Path) -> str:
    """One paragraph naming the shards whose trials are not all on disk, and how to complete the run."""
    named = ", ".join(f"{s} ({left} of {total} trials)" for s, (left, total) in sorted(missing.items()))
    first = min(missing)
    return (
        f"shards missing from the records in {folder}: {named}; this summary covers the other shards only. Run each "
        f"missing one (e.g. --shard {first}), or the same command without --shard, which computes every missing "
        "trial: the last run to finish writes the whole summary"
    )


def note_missing(summary: Path, missing: dict[Shard, tuple[int, int]], folder: Path) -> None:
    """Put the section naming the missing shards at the end of summary.md, replacing an earlier one.

    With nothing missing, an earlier section is removed (a summary.md holding nothing else is removed too).
    """
    text = summary.read_text() if summary.exists() else ""
    cut = text.find(f"\n{MISSING_HEADING}\n") if not text.startswith(MISSING_HEADING) else 0
    kept = text if cut < 0 else text[:cut]
    if missing:
        kept += ("\n" if kept else "") + f"{MISSING_HEADING}\n\n{missing_text(missing, folder)}.\n"
    if kept == text:
        return
    if kept:
        summary.write_text(kept)
    else:
        summary.unlink()


@contextlib.contextmanager
def summary_lock(folder: str | os.PathLike) -> Iterator[None]:
    """Wait for, then hold, the folder's summary lock: two shards ending together write their figures in turn.

    A blocking `flock` on `<folder>/summary.lock`, which its holder removes before it lets go (as `RunLock` does): a
    waiter that then holds the removed file sees that the path is no longer that file and locks the path anew, so the
    folder keeps no lock file once the last writer is done. No lock where the platform has no `fcntl`.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = Path(folder) / SUMMARY_LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        f = open(path, "a")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except BaseException:  # e.g. Ctrl-C while waiting
            f.close()
            raise
        if _is_file_at(f, path):
            break
        f.close()  # its holder removed it before letting go: lock the file at the path now
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # while still held: a waiter on this file sees it removed and locks the path anew
        f.close()  # closing the file releases the lock


def _is_file_at(f: Any, path: Path) -> bool:
    """Whether the open file `f` is the file at `path` now (not one removed, or replaced by another)."""
    try:
        here, there = os.fstat(f.fileno()), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def take_run_lock(out_dir: Path, shard: Shard | None) -> RunLock:
    """Lock the results file of this writer (the whole run's, or its shard's); refuse while one of the other kind runs.

    A shard beside a run of the whole (or the whole beside a shard) would compute the same trials twice.

    Raises:
        RunFolderBusy: naming the holder.
    """
    lock = RunLock(out_dir, LOCK_NAME if shard is None else shard.lock_name)
    lock.acquire()
    others = [p.with_suffix(".lock") for p in shard_files(out_dir)] if shard is None else [out_dir / LOCK_NAME]
    for path in others:
        holder = RunLock.holder(path)
        if holder is not None:
            lock.release()
            other = shard_of_file(path.with_suffix(".jsonl"))
            what = f"shard {other} of this run" if other is not None else "this run without --shard"
            raise RunFolderBusy(
                f"{out_dir} is being written by {holder} ({what}): this run would compute the same trials "
                "again; wait for it to finish (or stop it), then run the same command to resume"
            )
    return lock


def note_missing_shards(
    out_dir: Path, shard: Shard | None, steps: Sequence[Sequence[dict]], records: list[dict], who: str
) -> None:
    """Name the shards whose trials are not all on disk: on stderr (as `who`) and at the end of summary.md.

    The shards of this process's split, or, in a run of the whole, of every split with a results file on disk; `steps`
    are the whole run's steps (each shard takes its share of them).
    """
    if shard is not None:
        splits = {shard.count}
    else:
        splits = {s.count for p in shard_files(out_dir) if (s := shard_of_file(p)) is not None}
    shares = {
        Shard(i, count): [s["trial_key"] for step in Shard(i, count).take(list(steps)) for s in step]
        for count in sorted(splits)
        for i in range(count)
    }
    missing = missing_shards(shares, {str(r["trial_key"]) for r in records})
    note_missing(out_dir / SUMMARY_NAME, missing, out_dir)
    if missing:
        print(f"{who}: {missing_text(missing, out_dir)}", file=sys.stderr)
