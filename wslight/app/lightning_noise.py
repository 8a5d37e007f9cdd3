"""What Lightning prints on every run that asks nothing of the user: its tips and its known warnings, left out."""

from __future__ import annotations

import logging
import warnings


class _NoTips(logging.Filter):
    """Drops Lightning's advertising lines at the start of every run, so the run's own lines come first.

    The dropped lines are "💡 Tip: ... try installing litlogger / litmodels"; Lightning's other information lines stay.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def quiet_tips() -> None:
    """Drop Lightning's tips from its rank-zero log (once per process: a second call adds no second filter)."""
    log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoTips) for f in log.filters):
        log.addFilter(_NoTips())


def ignore_known_warnings(rank_zero: bool) -> None:
    """Silence the warnings every run would print that ask nothing of the user (inside `warnings.catch_warnings`).

    Args:
        rank_zero: whether this process is rank 0, which alone reports a torn line of the results file.
    """
    # the command line always reaches LightningCLI as `args` (config names resolved, checked), which Lightning
    # would otherwise warn about on every run
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended", category=UserWarning)
    # a resumed evaluation whose trials are all in results.jsonl has no step left, and says so itself
    warnings.filterwarnings("ignore", message="Total length of `DataLoader` across ranks is zero")
    # several processes: the padding duplicates of the distributed sampler are dropped when the records are
    # appended (wslight.tasks.evaluation), so Lightning's advice to test on one device does not apply
    warnings.filterwarnings("ignore", message="Using `DistributedSampler` with the dataloaders")
    # Lightning's own use of a deprecated torch API, once per process
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # `--ckpt_path last` resumes into a new version folder on purpose (and prints where it resumes from)
    warnings.filterwarnings("ignore", message="The dirpath has changed from")
    if not rank_zero:  # every rank reads the results file: rank 0 reports a torn line
        warnings.filterwarnings("ignore", message=".*dropping a torn last line")
