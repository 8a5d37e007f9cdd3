"""Where a run writes and what names it.

The run key, the precision an evaluation accepts, the checks of its output folders, the report of a fit's checkpoints,
the last checkpoint `--ckpt_path last` resumes, and the clean-up of a failed run's new folder.
"""

from __future__ import annotations

import glob
import shutil
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from ..records.results import LOCK_NAME, config_key, unwritable_reason
from .checkpoints import check_checkpoint
from .errors import UsageError

# Settings that change where or how fast a run happens, not what it computes: left out of the run key, so that the
# same evaluation on 1 or 2 devices (or resumed with another logger) appends to the same results.
_RUN_KEY_IGNORES = ("trainer", "ckpt_path", "config", "verbose")
# Trainer settings that change the numbers themselves: in the run key whenever they differ from Lightning's default
# (so the keys of default runs stay as they were). Precision: 16-mixed autocasts the maps' products and moves S.
_RUN_KEY_TRAINER = {"precision": "32-true"}
PRECISION_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}
# What a run writes before its first result; a new folder holding nothing else is an empty run in TensorBoard.
_EMPTY_RUN_FILES = ("config.yaml", "hparams.yaml", "events.out.tfevents.*", LOCK_NAME)


def run_key(config: dict) -> str:
    """Hash of the resolved config without the trainer's placement settings (devices, logger, progress bar...).

    A trainer setting of `_RUN_KEY_TRAINER` that differs from its default (e.g. `precision: 16-mixed`) is part of
    the key: a run with other numbers never resumes another's records.
    """
    keyed = {k: v for k, v in config.items() if k not in _RUN_KEY_IGNORES}
    trainer = config.get("trainer") or {}
    for name, default in _RUN_KEY_TRAINER.items():
        value = trainer.get(name)
        value = PRECISION_ALIASES.get(str(value), str(value)) if name == "precision" and value is not None else value
        if value is not None and value != default:
            keyed[f"trainer.{name}"] = value
    return config_key(keyed)


def fit_report(trainer: pl.Trainer) -> str:
    """Where a fit wrote its logs and checkpoints: `logs: <dir>` and `checkpoints: best <path>, last <path>`."""
    lines = [f"logs: {trainer.log_dir}" if trainer.logger is not None else "logs: none (logger disabled)"]
    ckpt = trainer.checkpoint_callback
    if ckpt is None:
        lines.append("checkpoints: none (trainer.enable_checkpointing false)")
    else:
        # ModelCheckpoint's paths and monitor; the Checkpoint base class declares none of them
        best = getattr(ckpt, "best_model_path", "") or "none"
        last = getattr(ckpt, "last_model_path", "") or "none"
        monitored = getattr(ckpt, "monitor", None)
        monitor = f" by {monitored}" if monitored else ""
        lines.append(f"checkpoints: best{monitor} {best}, last {last}")
    return "\n".join(lines)


def check_logger_dirs(trainer: pl.Trainer, configured: Any) -> None:
    """Raise UsageError, naming the config key and the path, when a logger's save_dir cannot receive files.

    Without it the first write fails deep inside fsspec (a raw OSError) after the data has been prepared.
    """
    for i, logger in enumerate(trainer.loggers):
        save_dir = getattr(logger, "save_dir", None)
        if not save_dir or "://" in str(save_dir):  # remote stores are checked by their own client
            continue
        reason = unwritable_reason(save_dir)
        if reason is not None:
            key = f"trainer.logger{f'.{i}' if isinstance(configured, list) else ''}.init_args.save_dir"
            raise UsageError(f"{key}={save_dir}: {reason}; give a writable folder")


def check_output_dir(model: Any) -> None:
    """Raise UsageError naming model.init_args.output_dir when an evaluation's explicit output folder is unusable.

    Unusable means it cannot receive results.jsonl; the default, the logger's folder, is checked by `check_logger_dirs`.
    """
    output_dir = getattr(model, "output_dir", None)
    if output_dir is None:
        return
    reason = model.output_dir_problem()
    if reason is not None:
        raise UsageError(f"model.init_args.output_dir={output_dir}: {reason}; give a writable folder")


def last_checkpoint(config: dict) -> Path:
    """The newest `last.ckpt` of the run a training config names (`--ckpt_path last`).

    Each fit logs into a new `version_N` folder, where Lightning's own `last` would find nothing and silently start
    over; the last checkpoint of the same run name is in an earlier version, or in a ModelCheckpoint's `dirpath`.

    Raises:
        UsageError: no last.ckpt there (naming where it looked), or the newest one cannot be read or was trained on
            data of other sizes (`check_checkpoint`).
    """
    trainer = config.get("trainer") or {}
    folders = []
    for cb in trainer.get("callbacks") or []:
        dirpath = isinstance(cb, dict) and (cb.get("init_args") or {}).get("dirpath")
        if dirpath:
            folders.append(Path(dirpath))
    logger = trainer.get("logger")
    logger = logger[0] if isinstance(logger, list) and logger else logger
    if isinstance(logger, dict):
        init = logger.get("init_args") or {}
        root = Path(init.get("save_dir") or trainer.get("default_root_dir") or ".") / str(init.get("name", ""))
        folders.append(root / "*" / "checkpoints")
    else:
        folders.append(Path(trainer.get("default_root_dir") or ".") / "lightning_logs" / "*" / "checkpoints")
    found = [Path(p) for folder in folders for p in glob.glob(str(folder / "last.ckpt"))]
    if not found:
        where = ", ".join(str(f) for f in folders)
        raise UsageError(
            f"ckpt_path=last: no last.ckpt in {where}; give a checkpoint path, or leave ckpt_path out for a new fit"
        )
    newest = max(found, key=lambda p: p.stat().st_mtime)
    data = (config.get("data") or {}).get("init_args") or {}
    sizes = {name: (data[name], "the config") for name in ("n", "d") if name in data}
    check_checkpoint(newest, sizes, f"last ({newest})")  # before any data is prepared
    print(f"resuming from {newest}", file=sys.stderr)
    return newest


def remove_empty_run_dir(folder: Path | None) -> None:
    """After a failed run: remove the log folder it created when it holds only what a run writes at its start.

    So that TensorBoard lists no empty run. A folder that existed before the run, or holds results or checkpoints,
    stays. Rank 0 only: on several nodes each node has a local rank 0 (the same folder on a shared file system).
    """
    if folder is None or not folder.is_dir() or getattr(rank_zero_only, "rank", 0) != 0:
        return
    entries = list(folder.iterdir())
    if all(p.is_file() and any(p.match(pattern) for pattern in _EMPTY_RUN_FILES) for p in entries):
        shutil.rmtree(folder, ignore_errors=True)


def check_evaluation_precision(precision: Any) -> None:
    """Refuse a mixed or half precision for an evaluation.

    The searches compute in the dtype their config states (model.init_args.dtype) and re-check their values in float64;
    autocast would change S without a trace in the records. `64-true` is accepted (the records say so in their
    `precision` field).
    """
    if precision is None:
        return
    name = PRECISION_ALIASES.get(str(precision), str(precision))
    if name not in ("32-true", "64-true"):
        raise UsageError(
            f"trainer.precision={precision}: an evaluation computes in the dtype of its config "
            "(model.init_args.dtype: float32 or float64) and re-checks its values in float64; mixed or half "
            "precision would autocast the maps' products and change the numbers; leave trainer.precision out "
            "(32-true) or give 64-true"
        )
