"""How a failed run ends: the exit statuses, and the one-block message of a failure the user can act on."""

from __future__ import annotations

import errno
import inspect
import re

import lightning.pytorch as pl
from lightning.fabric.utilities.exceptions import MisconfigurationException

from ..records.results import ResultsFileError, RunFolderBusy
from ..tasks.classifier import TrainingDiverged
from ..tasks.steps import TrialFailed
from ..tasks.trained_run import state_dict_mismatch
from .checkpoints import no_checkpoint_message
from .error_lines import parse_error_message, value_error_message
from .errors import EXIT_BUSY, EXIT_SIGNAL_BASE, ParseError, UsageError

__all__ = ["EXIT_BUSY", "EXIT_SIGNAL_BASE", "failure_message", "trainer_error_message"]
_WRITE_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.ENOENT,
    errno.EIO,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EEXIST,
}  # a folder that cannot take a run's files


def trainer_error_message(err: Exception) -> str:
    """Lightning's refusal of a trainer setting, with the key it concerns (`trainer.devices`, ...) when found."""
    msg = str(err).strip()
    names = [n for n in inspect.signature(pl.Trainer.__init__).parameters if n != "self"]
    quoted = re.findall(r"Trainer\((\w+)=|`(\w+)`", msg)  # Lightning quotes the setting it refuses
    key = next((n for pair in quoted for n in pair if n in names), None)
    key = key or next((n for n in names if re.search(rf"\b{n}\b", msg)), None)
    if key is None and re.search(r"\b(gpu|cuda|mps|tpu|backend)\b", msg, re.IGNORECASE):
        key = "accelerator"
    return f"trainer.{key}: {msg}" if key else f"trainer: {msg}"


def failure_message(err: Exception, tree: dict) -> tuple[str, int] | None:
    """The one-block message and exit status of a failure the user can act on.

    None for anything else (a bug keeps its traceback).
    """
    message = _own_failure_message(err)
    if message is None:
        message = _os_failure_message(err)
    if message is None:
        message = _checkpoint_failure_message(err, tree)
    if message is None and isinstance(err, ValueError):
        message = value_error_message(err, tree), 2
    return message


def _own_failure_message(err: Exception) -> tuple[str, int] | None:
    """The message and exit status of the errors wslight and Lightning raise for a user's mistake, else None."""
    if isinstance(err, UsageError):
        return str(err), 2
    if isinstance(err, ParseError):
        return parse_error_message(err), 2
    if isinstance(err, TrainingDiverged | TrialFailed):
        return str(err), 1
    if isinstance(err, ResultsFileError):
        return str(err), err.exit_status
    if isinstance(err, RunFolderBusy):
        return str(err), EXIT_BUSY
    if isinstance(err, MisconfigurationException):
        return trainer_error_message(err), 2
    return None


def _checkpoint_failure_message(err: Exception, tree: dict) -> tuple[str, int] | None:
    """A checkpoint to resume from that holds another model than the config builds (another map), else None.

    Its sizes and readability are checked before the run (`wslight.app.checkpoints.check_checkpoint`); torch's report of
    the state dicts' difference is the last word.
    """
    ckpt_path = tree.get("ckpt_path") if isinstance(tree, dict) else None
    mismatch = state_dict_mismatch(err) if isinstance(err, RuntimeError) and ckpt_path else None
    if mismatch is None:
        return None
    return f"ckpt_path={ckpt_path}: {mismatch}; resume with the config it was trained with, or leave ckpt_path out", 2


def _os_failure_message(err: Exception) -> tuple[str, int] | None:
    """The message and exit status of a missing checkpoint file or a folder that cannot be written, else None."""
    if isinstance(err, FileNotFoundError) and str(err).startswith("Checkpoint file not found"):
        return no_checkpoint_message(str(err).rpartition(": ")[2]), 2
    if isinstance(err, OSError) and err.errno in _WRITE_ERRNOS:
        if err.filename is None:  # already a whole sentence (e.g. results.jsonl's append)
            return str(err).removeprefix(f"[Errno {err.errno}] "), 1
        return f"cannot write {err.filename} ({err.strerror}): free space or fix the folder, then run again", 1
    return None
