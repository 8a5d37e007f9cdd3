"""The base of every evaluation run by `evaluate.py`: trials sharded over devices, gathered, written as they finish.

A subclass lists its trials (`trial_specs`, deterministic, each with a unique `trial_key`) and computes the records of
a batch of them (`run_trials`). Lightning's test loop shards the trials over the devices (its distributed sampler pads
with duplicates); each step gathers the records of every rank and rank 0 appends the new ones to results.jsonl, so an
interruption loses at most the trials in flight. Trials already in the file for the same run key are skipped, so
re-running a command resumes it. At the end every rank reads the whole file and `summarize` logs scalars and figures.

A run may also be split into independent jobs (`shard`, `--shard i/N` on the command line: `wslight.records.shards`):
shard i runs every N-th step, appends to a results file of its own in the same run folder, and summarizes the records
of every shard on disk, naming the shards still missing; a later run without a shard computes what is missing and
writes the whole run into results.jsonl.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from ..base import validate
from ..base.paths import user_path
from ..records.results import RESULTS_NAME, ResultsFile, RunFolderBusy, RunLock, unwritable_reason
from ..records.shards import (
    RunResults,
    Shard,
    keep_results,
    note_missing_shards,
    shard_files,
    summary_lock,
    take_run_lock,
)
from .figures import save_figure
from .steps import TrialFailed, failure_site, gather_step, one_cpu_thread


def _first(batch: list) -> list:
    return batch[0]


class Evaluation(pl.LightningModule):
    """Base LightningModule of an evaluation sweep (no trainable parameters).

    Args:
        trials_per_step: trials computed together in one test step (they are batched in one tensor program).
        output_dir: where results.jsonl and figures go; None means the logger's log directory (or
            trainer.default_root_dir without a logger). A leading `~` is the home folder (`wslight.base.paths`).

    Attributes:
        shard: None (the whole run), or the Shard this process runs (set by the command line's `--shard i/N`; not
            an argument: a shard is the same run, with the same run key and folder).
    """

    # The config key of the maps a trial's `map` comes from, named when a trial fails
    maps_key = "model.init_args.maps"

    def __init__(self, trials_per_step: int = 1, output_dir: str | None = None) -> None:
        super().__init__()
        self.trials_per_step = validate.positive_int("trials_per_step", trials_per_step)
        self.output_dir = user_path(output_dir)  # `~/runs` is the home folder's runs, as in a shell
        self.run_key = "default"  # set by the CLI to a hash of the resolved config
        self._results: ResultsFile | None = None
        self._lock: RunLock | None = None
        self.shard: Shard | None = None

    # --- to implement -------------------------------------------------------------------------------------------
    def trial_specs(self) -> list[dict]:
        """Every trial of the sweep, in a fixed order; each a JSON-serialisable dict with a unique `trial_key`."""
        raise NotImplementedError

    def run_trials(self, specs: list[dict]) -> list[dict]:
        """Compute the records (results.jsonl lines) of a batch of trials; the same on every device.

        Every record carries its trial's `trial_key`; a trial with several records gives each a distinct `record_key`.
        """
        raise NotImplementedError

    def batch_key(self, spec: dict) -> Any:
        """Trials with equal keys may share a step (e.g. one cell's trials, batched in one program); default: any."""
        return None

    def summarize(self, records: list[dict], out_dir: Path) -> None:
        """Log end-of-evaluation scalars (every rank) and write figures/tables (rank 0 only: check is_global_zero)."""

    def open_inputs(self) -> None:
        """Open what every step reads (e.g. the embedding store) on first use, before `run_trials`; default: nothing.

        Called at the start of every step and a no-op once open, so a step's `seconds` (timed by `run_trials`) are its
        trials' own work and a run with nothing left to compute opens nothing.
        """

    # --- machinery ----------------------------------------------------------------------------------------------
    @property
    def out_dir(self) -> Path:
        """Where the evaluation writes: `output_dir` when given, else the trainer's log folder (`out_dir_of`)."""
        if self.output_dir is not None:  # also before a trainer runs it (the command line's checks)
            return Path(self.output_dir)
        return self.out_dir_of(self.trainer)

    def out_dir_of(self, trainer: pl.Trainer) -> Path:
        """Where this evaluation writes when run by `trainer` (also before the trainer runs it)."""
        if self.output_dir is not None:
            return Path(self.output_dir)
        log_dir = getattr(trainer.logger, "log_dir", None)  # None without a logger
        if log_dir:
            return Path(log_dir)
        return Path(trainer.default_root_dir)

    def claim_before_launch(self, trainer: pl.Trainer) -> None:
        """On the process that starts the run (rank 0), before any other process starts: claim the run folder.

        Take the run folder's lock and check its results file (whole, and of this run only), so that a busy folder or an
        unusable file is one message from one process, not one per process after they have all started.

        Raises:
            RunFolderBusy: another process writes the folder.
            ResultsFileError: a corrupt results file, or one holding another run's records.
        """
        out_dir = self.out_dir_of(trainer)
        if unwritable_reason(out_dir.absolute()) is not None:
            return  # the checks of check_logger_dirs / check_output_dir name the folder
        self._lock = take_run_lock(out_dir, self.shard)
        RunResults(out_dir, self.run_key, out_dir / self.results_name).check_single_run()

    @property
    def results_name(self) -> str:
        """The name of the results file this process appends to: results.jsonl, or its shard's own."""
        return RESULTS_NAME if self.shard is None else self.shard.results_name

    @property
    def results(self) -> ResultsFile:
        """The results file this process appends to in `out_dir` (`results_name`)."""
        if self._results is None:
            self._results = ResultsFile(self.out_dir / self.results_name, self.run_key)
        return self._results

    @property
    def run_results(self) -> RunResults:
        """Every results file of the run folder (results.jsonl and the shards'), read as one."""
        return RunResults(self.out_dir, self.run_key, self.results.path)

    def merged_records(self) -> list[dict]:
        """The run's records: those of its results file, merged with the shards' when any is on disk.

        Merged, they are in the order of the trials (`trial_specs`), each finished trial once.
        """
        if self.shard is None and not shard_files(self.out_dir):
            return self.results.records()
        return self.run_results.records(order=[s["trial_key"] for s in self.trial_specs()])

    @property
    def results_path(self) -> Path | None:
        """The path of the results file (`results`) once a trainer runs the evaluation, else None."""
        return self.results.path if self._trainer is not None else None

    def output_dir_problem(self) -> str | None:
        """Why results.jsonl cannot be written in `out_dir` (`wslight.records.results.unwritable_reason`), or None."""
        out = self.out_dir.absolute()
        return unwritable_reason(out, out / self.results_name)

    def check_output_dir(self) -> None:
        """Fail before any trial runs when results.jsonl cannot be written in `out_dir`.

        The checks of `wslight.records.results.unwritable_reason`; nothing is left behind.

        Raises:
            PermissionError: naming output_dir, the path and the reason.
        """
        reason = self.output_dir_problem()
        if reason is not None:
            hint = "set output_dir (or the logger's save_dir) to a writable folder"
            raise PermissionError(f"output_dir: {reason}; {hint}")

    def remaining_specs(self) -> list[dict]:
        """The trials not yet in the results files, in order; ValueError when two trials share a `trial_key`.

        A shard's: those of its share (`shard_steps`). Trials finished in any results file of the folder count.
        """
        specs = self.trial_specs()
        keys = [s["trial_key"] for s in specs]
        if len(set(keys)) != len(keys):
            raise ValueError("trial_specs: trial_key values must be unique")
        if self.shard is None and not shard_files(self.out_dir):  # a run of the whole, alone in its folder
            self.results.check_single_run()
            done = self.results.finished_keys()
        else:
            self.run_results.check_single_run()
            done = self.run_results.finished_keys()
            specs = [s for step in self.shard_steps(specs) for s in step]
        return [s for s in specs if s["trial_key"] not in done]

    def shard_steps(self, specs: list[dict]) -> list[list[dict]]:
        """The steps of the whole run (`step_batches` of every trial) that this process runs: all without a shard.

        Shard i of N takes every N-th step from the i-th: the split is the same on every machine, spreads each
        shard over the whole grid, and computes each trial in the batch a run of the whole computes it in.
        """
        steps = self.step_batches(specs)
        return steps if self.shard is None else self.shard.take(steps)

    def claim_run_folder(self) -> None:
        """Take the results file's lock on rank 0 (one writer per results file) before its finished trials are read.

        Unless `claim_before_launch` has.

        A collective under DDP: every rank learns whether rank 0 got it.

        Raises:
            RunFolderBusy: another process is running the same evaluation in the same folder (on every rank).
        """
        busy = None
        if self.trainer.is_global_zero and self._lock is None:
            try:
                self._lock = take_run_lock(self.out_dir, self.shard)
            except RunFolderBusy as err:
                busy = str(err)
        busy = self.trainer.strategy.broadcast(busy)
        if busy is not None:
            raise RunFolderBusy(busy)

    def teardown(self, stage: str) -> None:
        """Release the run folder's lock, also after a failure or an interruption."""
        if self._lock is not None:  # also after a failure or an interruption
            self._lock.release()
            self._lock = None

    def test_dataloader(self) -> DataLoader:
        """The steps of the trials still to run, after the checks of the output folder and the results file.

        Rank 0 prints how many trials are already in the results file; with no step left in a folder that shards
        write, it ends the run's results there (`keep_results`), as no hook of Lightning runs after this one.
        """
        self.check_output_dir()  # before any trial: a run that cannot save its results fails now, not after the work
        self.claim_run_folder()
        remaining = self.remaining_specs()
        # a list of steps is a map-style dataset (__getitem__, __len__), which DataLoader's annotation does not admit
        if self.shard is None:
            steps = self.step_batches(remaining)
        else:  # the shard's own steps, as the whole run forms them, less their finished trials
            left = {s["trial_key"] for s in remaining}
            steps = [
                kept
                for step in self.shard_steps(self.trial_specs())
                if (kept := [s for s in step if s["trial_key"] in left])
            ]
        if self.trainer.is_global_zero:
            total = sum(map(len, self.shard_steps(self.trial_specs())))
            name = type(self).__name__ if self.shard is None else f"{type(self).__name__} shard {self.shard}"
            files = self.run_results.files()
            where: Path | str = self.results.path
            if files and files != [self.results.path]:
                where = f"{self.out_dir} ({', '.join(p.name for p in files)})"
            line = f"{name}: {total - len(remaining)} of {total} trials already in {where}"
            world = self.trainer.world_size
            if world > 1 and steps:  # the progress bar counts this process's steps only
                line += f"; {len(steps)} steps over {world} processes (the progress bar counts rank 0's share)"
            print(line)
            if not steps and (self.shard is not None or shard_files(self.out_dir)):
                keep_results(self.out_dir, self.shard, self.merged_records())
        return DataLoader(steps, batch_size=1, collate_fn=_first, shuffle=False)  # type: ignore[arg-type]

    def step_batches(self, specs: list[dict]) -> list[list[dict]]:
        """The trials of each step: runs of equal `batch_key`, at most `trials_per_step` each.

        Steps are formed before Lightning shards them over the devices, so a trial is computed in the same batch on
        one device or several, and its numbers do not depend on the device count.
        """
        batches: list[list[dict]] = []
        for spec in specs:
            last = batches[-1] if batches else None
            if last and len(last) < self.trials_per_step and self.batch_key(last[0]) == self.batch_key(spec):
                last.append(spec)
            else:
                batches.append([spec])
        return batches

    def test_step(self, batch: list[dict], batch_idx: int) -> None:
        """Run a step's trials, gather their records on every rank, and append them to results.jsonl on rank 0.

        A failing trial stops every rank with one message.
        """
        failed: Exception | None = None
        records: list[dict] = []
        # the searches need input gradients; one thread: the same numbers on 1 device or several
        with torch.inference_mode(False), torch.enable_grad(), one_cpu_thread(self.device):
            try:
                self.open_inputs()  # once a run, off the trials' clock (in the step: a failure stops every rank)
                records = self.run_trials(batch)
            except Exception as err:  # a map or setting that fails: every rank stops with one message (below)
                failed = err
        precision = str(self.trainer.precision)
        if precision != "32-true":  # how the records were computed, when it is not the default
            records = [{**r, "precision": precision} for r in records]
        failure = None if failed is None else self.failure_text(batch, failed)
        # padding duplicates: dropped when appended
        records, failures = gather_step(records, failure, self.trainer.world_size)
        if self.trainer.is_global_zero:
            self.results.append(records)
        if failures:
            self._stop(failures, failed)

    def failure_text(self, specs: list[dict], err: Exception) -> str:
        """What failed, where and on which trials.

        For example `model.init_args.grid.maps: my_map failed in forward (my_maps.py:12) at n = 10, d = 192:
        RuntimeError: ...` (`maps_key`: the evaluation's key of its maps).
        """
        spec = specs[0]
        cell = ", ".join(f"{k} = {spec[k]}" for k in ("n", "d", "N", "L") if k in spec)
        what = f"{self.maps_key}: {spec['map']}" if "map" in spec else f"{type(self).__name__}"
        site = failure_site(err)
        message = " ".join(str(err).split()) or "(no message)"
        where = "".join(f" {part}" for part in (site, f"at {cell}" if cell else "") if part)
        return f"{what} failed{where}: {type(err).__name__}: {message}"

    def _stop(self, failures: list[tuple[int, str]], own: Exception | None) -> None:
        """Raise TrialFailed on every rank: rank 0's failure first, naming the rank when several processes run."""
        if isinstance(own, ValueError) and not failure_site(own):
            raise own  # the package's own check of a setting: the command line names its key (exit status 2)
        rank, text = failures[0]
        if self.trainer.world_size > 1:
            text = f"{text} (on rank {rank})"
        kept = len(self.results.finished_keys())
        hint = f"{kept} finished trials are kept in {self.results.path}; fix it, then run the same command to resume"
        err = TrialFailed(f"{text}\n{hint}")
        if own is not None:
            err.__cause__ = own  # the traceback of WSLIGHT_DEBUG=1
            err.details = "".join(traceback.format_exception(own))
        raise err

    def on_test_epoch_end(self) -> None:
        """Summarize the records (scalars, figures and tables) at the end of the run."""
        self._finish()

    def on_test_end(self) -> None:
        """Summarize without logging when nothing was left to run (Lightning skipped the epoch hooks)."""
        if not getattr(self, "_finished", False):  # nothing left to run: the epoch hooks were skipped
            self._finish(log=False)

    def _finish(self, log: bool = True) -> None:
        self._finished = True
        if self.trainer.world_size > 1 and dist.is_initialized():
            dist.barrier()  # rank 0 has written every gathered record
        sharded = self.shard is not None or bool(shard_files(self.out_dir))
        if self.trainer.is_global_zero:
            os.makedirs(self.out_dir, exist_ok=True)
        # shards ending together write their summaries in turn (rank 0 writes; the others only log)
        with summary_lock(self.out_dir) if sharded and self.trainer.is_global_zero else contextlib.nullcontext():
            records = self.merged_records()
            self._log_enabled = log
            self.summarize(records, self.out_dir)
            if sharded and self.trainer.is_global_zero:
                steps = self.step_batches(self.trial_specs())
                note_missing_shards(self.out_dir, self.shard, steps, records, type(self).__name__)
                keep_results(self.out_dir, self.shard, records)  # results.jsonl: the whole run; a shard's: its own
        if self.trainer.world_size > 1 and dist.is_initialized():
            # every rank waits for rank 0's figures: a rank that exits first tears down its connections, and its
            # peers' process group fails (seen under torchrun as an abort of the idle rank)
            dist.barrier()

    def log_scalar(self, name: str, value: float) -> None:
        """Log an end-of-evaluation scalar (computed identically on every rank from the results file)."""
        if getattr(self, "_log_enabled", True):
            # Every rank computes the same value from the same results file: there is nothing to reduce. Lightning
            # still warns at the epoch's end ("It is recommended to use `self.log(..., sync_dist=True)`") for every
            # tensor logged under a process group with sync_dist off, whatever rank_zero_only says (it checks
            # sync_dist alone). sync_dist=True marks the value as agreed, and with rank_zero_only=True Lightning's
            # sync is a no-op: no collective runs (none to hang on) and the value is logged as computed.
            self.log(name, float(value), rank_zero_only=True, sync_dist=True)
        elif self.trainer.is_global_zero and self.logger is not None:
            self.logger.log_metrics({name: float(value)})

    def log_curve(self, tag: str, step: int, value: float) -> None:
        """One point of a curve (e.g. S against n: step = n), written by rank 0 through the logger."""
        if self.trainer.is_global_zero and self.logger is not None:
            self.logger.log_metrics({tag: float(value)}, step=int(step))

    def add_figure(self, tag: str, fig: Any, stem: str) -> None:
        """Save a figure as PNG and PDF next to results.jsonl and in TensorBoard (rank 0), then close it."""
        if self.trainer.is_global_zero:
            save_figure(fig, self.out_dir, stem, logger=self.logger, tag=tag)
        else:
            import matplotlib.pyplot as plt

            plt.close(fig)

    def configure_optimizers(self) -> None:
        """No optimiser: an evaluation trains nothing."""
        return None
