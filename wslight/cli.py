"""Command line: WSLightCLI (LightningCLI) behind `train.py`, `evaluate.py` and the `wslight` console script.

Training: `python train.py fit --config configs/raf.yaml`. Evaluation: `python evaluate.py --config
configs/ws/raf.yaml` (evaluate.py supplies the `test` subcommand). An evaluation module writes `results.jsonl` in a log
directory named after a hash of its resolved config, so re-running the same command resumes it.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from .results import config_key

# Settings that change where or how fast a run happens, not what it computes: left out of the run key, so that the
# same evaluation on 1 or 2 devices (or resumed with another logger) appends to the same results.
_RUN_KEY_IGNORES = ("trainer", "ckpt_path", "config", "verbose")


def _to_plain(value: Any) -> Any:
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    return value


def run_key(config: dict) -> str:
    """Hash of the resolved config without the trainer (devices, logger, progress bar...)."""
    return config_key({k: v for k, v in config.items() if k not in _RUN_KEY_IGNORES})


class WSLightCLI(LightningCLI):
    """LightningCLI of wslight: any LightningModule and LightningDataModule by class_path.

    For training, the sizes n and d come from the data once and are linked to the feature map and the head, so a
    config never writes them twice. Evaluations (`evaluate=True`) have no data block; their TensorBoard log directory
    is named `run-<run key>` (a hash of the resolved config), so a re-run finds its results.jsonl and resumes.
    """

    def __init__(self, *args: Any, evaluate: bool = False, **kwargs: Any) -> None:
        self.evaluate = evaluate
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        super().__init__(L.LightningModule, None if evaluate else L.LightningDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        if self.evaluate:
            return
        for key in ("n", "d"):
            parser.link_arguments(
                f"data.init_args.{key}", f"model.init_args.feature_map.init_args.{key}", apply_on="parse"
            )
        parser.link_arguments("data.init_args.n", "model.init_args.n", apply_on="parse")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        self.run_key = run_key(_to_plain(config))
        logger = config.trainer.get("logger")
        if self.evaluate and "TensorBoardLogger" in str(getattr(logger, "class_path", "")):
            if logger.init_args.get("version") is None:
                logger.init_args["version"] = f"run-{self.run_key}"

    def after_fit(self) -> None:
        """Evaluate the fitted head on the held-out test split, so one `fit` logs train/, val/ and test/ scalars."""
        if self.datamodule is not None and not self.trainer.interrupted:
            self.trainer.test(self.model, datamodule=self.datamodule, verbose=self.trainer.is_global_zero)

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        if hasattr(self.model, "run_key"):
            self.model.run_key = self.run_key


_interrupted = False


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt(f"signal {signum}")


def main(args: list[str] | None = None, run: bool = True, evaluate: bool = False) -> WSLightCLI:
    """Entry point of `wslight` and `train.py`: `main(["fit", "--config", "configs/raf.yaml"])`.

    `evaluate=True` is the entry point of `evaluate.py`:
    `main(["test", "--config", "configs/ws/raf.yaml"], evaluate=True)`.
    """
    global _interrupted
    _interrupted = False
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGTERM stops like Ctrl-C: cleanly, resumable
        signal.signal(sig, _raise_keyboard_interrupt)
    hint = "interrupted: finished trials are saved in results.jsonl; run the same command again to resume"
    try:
        cli = WSLightCLI(args=args, run=run, evaluate=evaluate)
    except (KeyboardInterrupt, SystemExit):
        # Lightning turns SIGINT/SIGTERM into a graceful shutdown and exits non-zero
        if evaluate and _interrupted:
            print(hint, file=sys.stderr)
        raise
    if run and (cli.trainer.interrupted or _interrupted):
        if evaluate:
            print(hint, file=sys.stderr)
        raise SystemExit(130)
    path = getattr(cli.model, "results_path", None)
    if run and path is not None and cli.trainer.is_global_zero:
        print(f"results: {path}")
    return cli
