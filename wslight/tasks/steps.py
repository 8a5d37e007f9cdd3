"""One step of an evaluation across its ranks: one CPU thread a process, records and failures gathered on every rank.

And what a failed step reports: `TrialFailed`, with the innermost frame of the user's code (`failure_site`).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


class TrialFailed(Exception):
    """A step of an evaluation failed (a map that raises, a setting the maths refuses): every rank stops with it.

    Its message is the one block the command line prints: what failed, where, and the finished trials kept.
    `details` holds the failing rank's traceback (printed with WSLIGHT_DEBUG=1).
    """

    details: str = ""


_OWN_CODE = (str(Path(torch.__file__).parent), str(Path(__file__).resolve().parents[1]))


def failure_site(err: BaseException) -> str:
    """The innermost frame of the traceback outside torch and wslight (the user's code).

    For example `in forward (my_maps.py:12)`; "" when the error arose in them.
    """
    site = ""
    for frame in traceback.extract_tb(err.__traceback__):
        if not frame.filename.startswith(_OWN_CODE) and "/lightning/" not in frame.filename:
            site = f"in {frame.name} ({Path(frame.filename).name}:{frame.lineno})"
    return site


@contextmanager
def one_cpu_thread(device: torch.device) -> Iterator[None]:
    """Compute on one CPU thread per process (no effect on a GPU), then restore the thread count.

    On some CPUs a matrix product with a long reduction (the N x N Gram of p features, with p in the tens of
    thousands) sums its terms in a different order with 1 and 2 threads. A 1-device run would then differ in the last
    bits from a 2-device run, where each process has half the threads. One thread per process makes the records
    independent of the number of devices; the searches are many small tensor programs, which one thread runs about
    as fast as two on a 2-core machine.
    """
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def gather_records(records: list[dict], world_size: int) -> list[dict]:
    """The records of every rank, on every rank (rank order); the records themselves when not distributed.

    A collective under DDP: every rank must call it, with the same `world_size`.
    """
    return gather_step(records, None, world_size)[0]


def gather_step(records: list[dict], failure: str | None, world_size: int) -> tuple[list[dict], list[tuple[int, str]]]:
    """The records of every rank and the failures of the ranks whose step failed, as (rank, message), on every rank.

    A collective under DDP: a rank whose step failed still takes part, so that every rank learns of the failure and
    stops with it instead of waiting for the failed rank in the next collective.
    """
    parts: list[Any] = [(records, failure)]
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        parts = [None] * world_size
        dist.all_gather_object(parts, (records, failure))
    gathered = [r for part, _ in parts for r in part]
    return gathered, [(rank, f) for rank, (_, f) in enumerate(parts) if f is not None]
