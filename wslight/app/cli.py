"""Command line: WSLightCLI (LightningCLI) behind `train.py`, `evaluate.py` and the `wslight` console script.

Training: `python train.py fit --config configs/raf.yaml`. Evaluation: `python evaluate.py --config
configs/ws/raf.yaml` (evaluate.py supplies the `test` subcommand). An evaluation module writes `results.jsonl` in a log
directory named after a hash of its resolved config, so re-running the same command resumes it.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from ..records.results import RunLock
from ..records.shards import Shard
from . import interrupts, run_watch
from .config_files import resolve_config_args
from .errors import ParseError, UsageError
from .failures import failure_message
from .lightning_noise import ignore_known_warnings, quiet_tips
from .messages import DEBUG_ENV, args_tree, check_command, fail
from .placement import available_cores, every_core, on_cpu
from .run_summary import final_metrics, log_config_text, log_run_hparams, record_metrics, run_hparams
from .runs import (
    check_evaluation_precision,
    check_logger_dirs,
    check_output_dir,
    fit_report,
    last_checkpoint,
    remove_empty_run_dir,
    run_key,
)
from .shard_option import take_shard


def _to_plain(value: Any) -> Any:
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    return value


class WSLightArgumentParser(LightningArgumentParser):
    """Raises parse errors to `main`, which prints them as one short block naming the key (exit status 2).

    Abbreviations are refused: argparse would otherwise take `--trainer.max_epoch 3` for `--trainer.max_epochs`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        """Raise a ParseError carrying the parser's keys instead of exiting (lenient checks keep theirs)."""
        if not self.exit_on_error:  # jsonargparse's own lenient checks catch the ArgumentError
            return super().error(message, ex)
        err = ParseError(message)
        # the parser's keys, for the message; ParseError does not declare the attribute
        err.keys = [a.dest for a in self._actions if isinstance(getattr(a, "dest", None), str)]  # type: ignore[attr-defined]
        raise err from ex


quiet_tips()


class WSLightCLI(LightningCLI):
    """LightningCLI of wslight: any LightningModule and LightningDataModule by class_path.

    For training, the sizes n and d come from the data once and are linked to the feature map and the head, so a
    config never writes them twice. Evaluations (`evaluate=True`) have no data block; their TensorBoard log directory
    is named `run-<run key>` (a hash of the resolved config), so a re-run finds its results.jsonl and resumes.
    """

    def __init__(
        self,
        *args: Any,
        evaluate: bool = False,
        prog: str | None = None,
        every_core: bool = False,
        shard: Shard | None = None,
        **kwargs: Any,
    ) -> None:
        self.evaluate = evaluate
        self.prog = prog
        self.every_core = every_core
        self.shard = shard  # `--shard i/N`: outside the config, so the run key and folder are the whole run's
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_class", WSLightArgumentParser)
        super().__init__(pl.LightningModule, None if evaluate else pl.LightningDataModule, *args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """fit, validate and test (a head predicts nothing a user asks for: Lightning's `predict` is left out)."""
        return {k: v for k, v in LightningCLI.subcommands().items() if k != "predict"}

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        super()._add_subcommands(parser, **kwargs)
        if self.prog is not None:  # usage lines name the command as typed: `wslight evaluate`, `train.py fit`
            for name, sub in self._subcommand_parsers.items():
                sub.prog = self.prog if self.prog.endswith(name) or self.evaluate else f"{self.prog} {name}"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the data's n and d to the map's and the model's (training only; an evaluation builds its own maps)."""
        if self.evaluate:
            return
        for key in ("n", "d"):
            parser.link_arguments(
                f"data.init_args.{key}", f"model.init_args.feature_map.init_args.{key}", apply_on="parse"
            )
        parser.link_arguments("data.init_args.n", "model.init_args.n", apply_on="parse")

    def before_instantiate_classes(self) -> None:
        """Check the parsed config and settle where the run writes, before any class is built.

        Records the run key, names an evaluation's log folder after it, gives a run without a log folder one of its own,
        spreads a CPU evaluation over every core, checks an evaluation's precision and resolves `--ckpt_path last`.
        """
        global _parsed_config
        config = self.config[self.subcommand] if self.subcommand else self.config
        _parsed_config = _to_plain(config)  # for main()'s error messages: which class sits at which key
        self.run_key = run_key(_parsed_config)
        logger = config.trainer.get("logger")
        if self.evaluate and "TensorBoardLogger" in str(getattr(logger, "class_path", "")):
            if logger.init_args.get("version") is None:
                logger.init_args["version"] = f"run-{self.run_key}"
        if self.evaluate and (logger in (None, False) or config.trainer.get("fast_dev_run")):
            # no log folder (no logger, or fast_dev_run's stand-in): results, figures and config.yaml go to a folder
            # of their own under default_root_dir, never loose in it where another config would append to them
            root = Path(config.trainer.get("default_root_dir") or os.getcwd())
            config.trainer["default_root_dir"] = str(root / f"run-{self.run_key}")
        if self.evaluate and self.every_core:
            every_core(config.trainer)  # devices: auto on the CPU -> one process per core (wslight.app.placement)
        if self.evaluate:
            check_evaluation_precision(config.trainer.get("precision"))
        check_process_count(config.trainer)
        if not self.evaluate and config.get("ckpt_path") == "last":
            config["ckpt_path"] = str(last_checkpoint(_parsed_config))

    def _resolved_config(self) -> dict:
        return _to_plain(self.config[self.subcommand] if self.subcommand else self.config)

    def _log_config_text(self) -> None:
        """The resolved config in TensorBoard's TEXT tab, before the run (so an interrupted run shows it too)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        log_config_text(self.trainer, self._parser(self.subcommand).dump(config, skip_none=False))

    def before_fit(self) -> None:
        """Log the resolved config before fitting."""
        self._log_config_text()

    def before_validate(self) -> None:
        """Log the resolved config before validating."""
        self._log_config_text()

    def before_test(self) -> None:
        """Log the resolved config before testing."""
        self._log_config_text()

    def _callback_metrics(self) -> dict[str, float]:
        """The scalars of the callbacks that log through the logger directly (e.g. DeltaAttackCallback's attack/...)."""
        callbacks = self.trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning's callback connector
        return final_metrics(*(getattr(cb, "metrics", {}) for cb in callbacks))

    def after_test(self) -> None:
        """An evaluation's HPARAMS row: its sizes and seed against its final scalars and the records it holds."""
        if not self.evaluate:
            return
        metrics = final_metrics(self.trainer.callback_metrics, self._callback_metrics())
        merged = getattr(self.model, "merged_records", None)  # the shards' on disk with this one's
        new = record_metrics(merged()) if merged is not None and self.trainer.is_global_zero else {}
        log_run_hparams(self.trainer, run_hparams(self._resolved_config()), metrics, new)

    def after_fit(self) -> None:
        """Evaluate the fitted head on the held-out test split, so one `fit` logs train/, val/ and test/ scalars.

        Then fill the HPARAMS tab: map, n, d, N, seed against the final train/val/test (and attack) metrics.
        """
        fit_metrics = dict(self.trainer.callback_metrics)  # the test run below resets them
        if self.datamodule is not None and not self.trainer.interrupted:
            self.trainer.test(self.model, datamodule=self.datamodule, verbose=self.trainer.is_global_zero)
        metrics = final_metrics(fit_metrics, self.trainer.callback_metrics, self._callback_metrics())
        log_run_hparams(self.trainer, run_hparams(self._resolved_config(), self.model, self.datamodule), metrics)
        report = fit_report(self.trainer)  # every rank: trainer.log_dir is a collective under DDP
        if self.trainer.is_global_zero:
            print(report)

    def instantiate_classes(self) -> None:
        """Build the classes, then check the output folders and prepare the run.

        Keeps LightningCLI's loader hook out of hparams.yaml, hands the run key to the model, remembers a log folder
        this run creates, keeps the run's own signal handlers, and lets the model claim its folder on rank 0 before
        other processes start.
        """
        super().instantiate_classes()
        check_logger_dirs(self.trainer, (_parsed_config or {}).get("trainer", {}).get("logger"))
        check_output_dir(self.model)
        for part in (self.model, self.datamodule):
            # LightningCLI's loader hook is no hyperparameter: keep it out of hparams.yaml (the checkpoint keeps it)
            getattr(part, "_hparams_initial", {}).pop("_instantiator", None)
        if hasattr(self.model, "run_key"):
            self.model.run_key = self.run_key
        if self.shard is not None:
            if not hasattr(self.model, "shard"):
                raise UsageError(f"--shard {self.shard}: {type(self.model).__name__} is no evaluation with trials")
            self.model.shard = self.shard
        global _new_run_dir
        logger = self.trainer.logger
        log_dir = logger.log_dir if isinstance(logger, TensorBoardLogger) else None  # not created yet
        _new_run_dir = Path(log_dir) if log_dir and not Path(log_dir).exists() else None
        interrupts.keep_own_signal_handlers(self.trainer, checkpoint_on_requeue=self.subcommand == "fit")
        claim = getattr(self.model, "claim_before_launch", None)
        if self.subcommand is not None and claim is not None and is_rank_zero():
            claim(self.trainer)  # a busy folder or an unusable results file: before any other process starts


def is_rank_zero() -> bool:
    """Whether this process is rank 0 (or the only one): the one that prints a run's messages."""
    return getattr(rank_zero_only, "rank", 0) == 0  # from the launcher's environment, then the strategy's rank


# The most processes a CPU run starts for each available core: beyond it the processes take minutes to start (each
# imports torch and Lightning on a share of a core) and a Ctrl-C during their start does not end them within seconds.
MAX_PROCESSES_PER_CORE = 4


def check_process_count(trainer: Any) -> None:
    """Refuse a CPU run of more than MAX_PROCESSES_PER_CORE processes per available core; note more than one.

    Before any process starts. Up to the bound the processes share the cores (the same records, more slowly): one
    line on stderr says so.
    """
    devices = trainer.get("devices")
    if not str(devices).isdigit() or not on_cpu(trainer.get("accelerator")):
        return
    cores = available_cores()
    if int(devices) > MAX_PROCESSES_PER_CORE * cores:
        raise UsageError(
            f"trainer.devices={devices} would start {devices} processes on {cores} available "
            f"core{'s' if cores > 1 else ''}: more than {MAX_PROCESSES_PER_CORE} per core do not start in reasonable "
            f"time; give --trainer.devices {cores} (one process per core, the same records)"
        )
    if int(devices) > cores and is_rank_zero():
        print(
            f"note: trainer.devices={devices} starts {devices} processes on {cores} available cores: they share "
            f"the cores (the same records, more slowly than --trainer.devices {cores})",
            file=sys.stderr,
        )


# A file an evaluation writes its results.jsonl path into when the variable names one (wslight.app.reproduce)
RESULTS_PATH_ENV = "WSLIGHT_RESULTS_PATH_FILE"
_parsed_config: dict | None = None
_new_run_dir: Path | None = None  # the log folder a run is about to create (None: it exists already, or no logger)


def _interrupted_exit() -> SystemExit:
    """SystemExit with 128 + the signal (130 for Ctrl-C), after the command's message (the resume hint; rank 0 only)."""
    interrupts.say_once(is_rank_zero())
    return SystemExit(interrupts.status())


def main(
    args: list[str] | None = None,
    run: bool = True,
    evaluate: bool = False,
    prog: str | None = None,
    every_core: bool = False,
) -> WSLightCLI:
    """The LightningCLI of wslight from Python: `main(["fit", "--config", "raf"])` returns the finished CLI.

    `evaluate=True` runs an evaluation config: `main(["test", "--config", "ws/raf"], evaluate=True)` (a first
    argument `evaluate` does the same). The command line reaches it through the verb table of `wslight.app.verbs`
    (`wslight`, `python -m wslight`, train.py, evaluate.py), which turns a finished run into exit status 0.

    A mistake in the command or config (a value out of range, an unknown key, a config given to the other entry point)
    prints one block on stderr naming the key path, and exits with status 2; `--debug` or `WSLIGHT_DEBUG=1` prints
    the original exception's traceback before it. `prog` names the command in those messages.

    `every_core=True` (the command line's evaluations) runs a CPU evaluation whose `trainer.devices` is auto on one
    process per available core (`wslight.app.placement`); Lightning starts those processes by running the command
    line again, so only a run that is the command line may ask for it.
    """
    global _parsed_config, _new_run_dir
    args, evaluate, debug, prog = _command_line(args, evaluate, prog)
    _parsed_config = None
    _new_run_dir = None
    # SIGTERM stops like Ctrl-C: cleanly, resumable (the command line's verbs installed the same handlers first)
    interrupts.stop_on_signals(interrupts.RESUME_HINT if evaluate else None)
    run_watch.watch_workers(lambda: remove_empty_run_dir(_new_run_dir))
    try:
        args, shard = take_shard(args, evaluate)
        args = check_command(resolve_config_args(args), evaluate)
        with warnings.catch_warnings():
            ignore_known_warnings(is_rank_zero())
            cli = WSLightCLI(args=args, run=run, evaluate=evaluate, prog=prog, every_core=every_core, shard=shard)
    except (KeyboardInterrupt, SystemExit) as stop:
        # Lightning turns SIGINT/SIGTERM into a graceful shutdown and exits with 1: the signal's own status instead
        remove_empty_run_dir(_new_run_dir)
        if interrupts.received is not None or isinstance(stop, KeyboardInterrupt):
            raise _interrupted_exit() from None
        raise
    except Exception as err:
        remove_empty_run_dir(_new_run_dir)
        if interrupts.received is not None:  # e.g. a collective that lost a process the same signal stopped
            raise _interrupted_exit() from None
        failure = failure_message(err, _parsed_config or args_tree(args))
        if failure is None:
            raise
        if debug:  # the traceback, then the same block and exit status as without --debug
            import traceback

            traceback.print_exception(err, file=sys.stderr)
        _exit_with(failure, prog)
    finally:
        RunLock.release_all()  # also after a failure inside Lightning, which skips the modules' teardown
        if run:
            shut_down_distributed()
        run_watch.stand_down_watches()
    if run and (cli.trainer.interrupted or interrupts.received is not None):
        raise _interrupted_exit()
    if run:
        _print_results_path(cli)
    return cli


def _command_line(args: list[str] | None, evaluate: bool, prog: str | None) -> tuple[list[str], bool, bool, str]:
    """The arguments `main` parses, whether they run an evaluation, whether `--debug` is on, and the program name.

    A first argument `evaluate` becomes LightningCLI's `test` on an evaluation config; `--debug` (or `WSLIGHT_DEBUG=1`)
    is taken out of the arguments.
    """
    args = list(sys.argv[1:] if args is None else args)
    if args and args[0] == "evaluate":
        args, evaluate = ["test", *args[1:]], True
    debug = "--debug" in args or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    args = [a for a in args if a != "--debug"]
    if prog is None:
        sub = args[0] if args and not args[0].startswith("-") else ""
        prog = "evaluate.py" if evaluate else f"train.py {sub}".strip()
    return args, evaluate, debug, prog


def _exit_with(failure: tuple[str, int], prog: str) -> None:
    """Exit with a failure's status; rank 0 prints its one-block message first."""
    if not is_rank_zero():  # every rank fails alike (a failed step is shared): rank 0 prints the message
        raise SystemExit(failure[1]) from None
    fail(failure[0], prog, code=failure[1])


def _print_results_path(cli: WSLightCLI) -> None:
    """`results: <path>` on rank 0 after a run that wrote results, and the path in RESULTS_PATH_ENV's file if set."""
    path = getattr(cli.model, "results_path", None)
    if path is not None and cli.trainer.is_global_zero:
        print(f"results: {path}")
        if os.environ.get(RESULTS_PATH_ENV):  # a caller that runs the command and needs the path (make reproduce)
            Path(os.environ[RESULTS_PATH_ENV]).write_text(str(path))


def shut_down_distributed() -> None:
    """End a DDP run's process group before the interpreter exits.

    Lightning leaves it open after the run; its communication threads, still running while the interpreter tears
    down, can abort a finished process (`terminate called without an active exception`, exit -6).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # local: every rank has passed the run's last collective
