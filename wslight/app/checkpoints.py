"""The checkpoint a fit resumes from (`ckpt_path`), checked before any data is prepared: one block naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import UsageError

# `ckpt_path` values Lightning resolves itself (`last` is resolved by `wslight.app.runs.last_checkpoint`)
CKPT_NAMES = ("last", "best", "hpc")


def no_checkpoint_message(shown: str) -> str:
    """`ckpt_path=<path>: no such checkpoint file` and what to give instead."""
    return f"ckpt_path={shown}: no such checkpoint file; give the path of a .ckpt file, or leave ckpt_path out"


def check_checkpoint(path: Path, sizes: dict[str, tuple[Any, str]], shown: str) -> None:
    """Refuse a checkpoint to resume from that is missing, unreadable, or was trained on data of other `sizes`.

    `sizes` maps "n" and "d" to (value, where it is given); `shown` is the ckpt_path as the user gave it.

    Raises:
        UsageError: `ckpt_path=<shown>: <what is wrong>; <what to do>`.
    """
    if not path.is_file():
        raise UsageError(no_checkpoint_message(shown))
    from ..tasks.trained_run import CONFIG_NAME, checkpoint_problem

    problem = checkpoint_problem(path, sizes)
    if problem is None:
        return
    run_config = path.parent.parent / CONFIG_NAME  # a run's checkpoints/ sit beside its config.yaml
    if problem.startswith("trained with") and run_config.is_file():
        again = f"resume with the config it was trained with ({run_config})"
    else:
        again = "give another checkpoint"
    raise UsageError(f"ckpt_path={shown}: {problem}; {again}, or leave ckpt_path out for a new fit")
