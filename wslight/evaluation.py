"""The base of every evaluation run by `evaluate.py`: trials sharded over devices, gathered, written as they finish.

A subclass lists its trials (`trial_specs`, deterministic, each with a unique `trial_key`) and computes the records of
a batch of them (`run_trials`). Lightning's test loop shards the trials over the devices (its distributed sampler pads
with duplicates); each step gathers the records of every rank and rank 0 appends the new ones to results.jsonl, so an
interruption loses at most the trials in flight. Trials already in the file for the same run key are skipped, so
re-running a command resumes it. At the end every rank reads the whole file and `summarize` logs scalars and figures.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from .results import RESULTS_NAME, ResultsFile


def _identity(batch: list) -> list:
    return batch


class Evaluation(L.LightningModule):
    """Base LightningModule of an evaluation sweep (no trainable parameters).

    Args:
        trials_per_step: trials computed together in one test step (they are batched in one tensor program).
        output_dir: where results.jsonl and figures go; None means the logger's log directory (or
            trainer.default_root_dir without a logger).
    """

    def __init__(self, trials_per_step: int = 1, output_dir: str | None = None) -> None:
        super().__init__()
        if trials_per_step < 1:
            raise ValueError(f"trials_per_step must be >= 1, got {trials_per_step}")
        self.trials_per_step = trials_per_step
        self.output_dir = output_dir
        self.run_key = "default"  # set by the CLI to a hash of the resolved config
        self._results: ResultsFile | None = None

    # --- to implement -------------------------------------------------------------------------------------------
    def trial_specs(self) -> list[dict]:
        """Every trial of the sweep, in a fixed order; each a JSON-serialisable dict with a unique `trial_key`."""
        raise NotImplementedError

    def run_trials(self, specs: list[dict]) -> list[dict]:
        """Compute the records (results.jsonl lines) of a batch of trials; the same on every device.

        Every record carries its trial's `trial_key`; a trial with several records gives each a distinct `record_key`.
        """
        raise NotImplementedError

    def summarize(self, records: list[dict], out_dir: Path) -> None:
        """Log end-of-evaluation scalars (every rank) and write figures/tables (rank 0 only: check is_global_zero)."""

    # --- machinery ----------------------------------------------------------------------------------------------
    @property
    def out_dir(self) -> Path:
        if self.output_dir is not None:
            return Path(self.output_dir)
        logger = self.logger
        if logger is not None and getattr(logger, "log_dir", None):
            return Path(logger.log_dir)
        return Path(self.trainer.default_root_dir)

    @property
    def results(self) -> ResultsFile:
        if self._results is None:
            self._results = ResultsFile(self.out_dir / RESULTS_NAME, self.run_key)
        return self._results

    @property
    def results_path(self) -> Path | None:
        return self.results.path if self._trainer is not None else None

    def check_output_dir(self) -> None:
        """Fail before any trial runs when results.jsonl cannot be written in `out_dir`.

        The folder (or, when it does not exist yet, its nearest existing parent, where it would be created) must be a
        directory in which a file can be created, and an existing results.jsonl must open for appending. Nothing is
        left behind: the probe file is anonymous.

        Raises:
            PermissionError: naming output_dir, the path and the reason.
        """
        out = self.out_dir.absolute()
        target = out / RESULTS_NAME
        probe = out
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        hint = "set output_dir (or the logger's save_dir) to a writable folder"
        if not probe.is_dir():
            raise PermissionError(f"output_dir: cannot create {out}: {probe} is not a directory; {hint}")
        try:
            with tempfile.TemporaryFile(dir=probe):
                pass
            if target.exists():
                with open(target, "ab"):
                    pass
        except OSError as e:
            raise PermissionError(f"output_dir: cannot write {target} ({e.strerror or e} in {probe}); {hint}") from e

    def remaining_specs(self) -> list[dict]:
        specs = self.trial_specs()
        keys = [s["trial_key"] for s in specs]
        if len(set(keys)) != len(keys):
            raise ValueError("trial_specs: trial_key values must be unique")
        done = self.results.finished_keys()
        return [s for s in specs if s["trial_key"] not in done]

    def test_dataloader(self) -> DataLoader:
        self.check_output_dir()  # before any trial: a run that cannot save its results fails now, not after the work
        remaining = self.remaining_specs()
        if self.trainer.is_global_zero:
            total = len(self.trial_specs())
            print(f"{type(self).__name__}: {total - len(remaining)} of {total} trials already in {self.results.path}")
        return DataLoader(remaining, batch_size=self.trials_per_step, collate_fn=_identity, shuffle=False)

    def gather_records(self, records: list[dict]) -> list[dict]:
        """The records of every rank (on every rank); padding duplicates are dropped when appending."""
        if self.trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            parts: list[Any] = [None] * self.trainer.world_size
            dist.all_gather_object(parts, records)
            records = [r for part in parts for r in part]
        return records

    def test_step(self, batch: list[dict], batch_idx: int) -> None:
        with torch.inference_mode(False), torch.enable_grad():  # the searches need input gradients
            records = self.run_trials(batch)
        records = self.gather_records(records)
        if self.trainer.is_global_zero:
            self.results.append(records)

    def on_test_epoch_end(self) -> None:
        self._finish()

    def on_test_end(self) -> None:
        if not getattr(self, "_finished", False):  # nothing left to run: the epoch hooks were skipped
            self._finish(log=False)

    def _finish(self, log: bool = True) -> None:
        self._finished = True
        if self.trainer.world_size > 1 and dist.is_initialized():
            dist.barrier()  # rank 0 has written every gathered record
        records = self.results.records()
        if self.trainer.is_global_zero:
            os.makedirs(self.out_dir, exist_ok=True)
        self._log_enabled = log
        self.summarize(records, self.out_dir)

    def log_scalar(self, name: str, value: float) -> None:
        """Log an end-of-evaluation scalar (computed identically on every rank from the results file)."""
        if getattr(self, "_log_enabled", True):
            self.log(name, float(value), rank_zero_only=True)
        elif self.trainer.is_global_zero and self.logger is not None:
            self.logger.log_metrics({name: float(value)})

    def add_figure(self, tag: str, fig: Any, stem: str) -> None:
        """Save a figure as PNG and PDF next to results.jsonl and in TensorBoard (rank 0), then close it."""
        import matplotlib.pyplot as plt
        from lightning.pytorch.loggers import TensorBoardLogger

        if self.trainer.is_global_zero:
            fig.savefig(self.out_dir / f"{stem}.png", dpi=120, bbox_inches="tight")
            fig.savefig(self.out_dir / f"{stem}.pdf", bbox_inches="tight")
            if isinstance(self.logger, TensorBoardLogger):
                self.logger.experiment.add_figure(tag, fig)
        plt.close(fig)

    def configure_optimizers(self) -> None:
        return None
