"""Command line: WSLightCLI (LightningCLI) behind `train.py`, `evaluate.py` and the `wslight` console script.

Training: `python train.py fit --config configs/raf.yaml`. Evaluation: `python evaluate.py --config
configs/ws/raf.yaml` (evaluate.py supplies the `test` subcommand). An evaluation module writes `results.jsonl` in a log
directory named after a hash of its resolved config, so re-running the same command resumes it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from .models import TrainingDiverged
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


# Training sizes are written once, under data, and linked to the map and the head (target -> source).
LINKS = {
    "model.init_args.feature_map.init_args.n": "data.init_args.n",
    "model.init_args.feature_map.init_args.d": "data.init_args.d",
    "model.init_args.n": "data.init_args.n",
}
DEBUG_ENV = "WSLIGHT_DEBUG"


class UsageError(Exception):
    """A mistake in the command or its config: printed as one short block on stderr, exit status 2."""


class _ParseError(Exception):
    """jsonargparse's parse error, raised instead of printing usage and exiting (main() formats it)."""


class WSLightArgumentParser(LightningArgumentParser):
    """Raises parse errors to `main`, which prints them as one short block naming the key (exit status 2)."""

    def error(self, message: str, ex: Exception | None = None):  # type: ignore[override]
        if not self.exit_on_error:  # jsonargparse's own lenient checks catch the ArgumentError
            return super().error(message, ex)
        err = _ParseError(message)
        err.keys = [a.dest for a in self._actions if isinstance(getattr(a, "dest", None), str)]  # type: ignore
        raise err from ex


def fit_report(trainer: L.Trainer) -> str:
    """Where a fit wrote its logs and checkpoints: `logs: <dir>` and `checkpoints: best <path>, last <path>`."""
    lines = [f"logs: {trainer.log_dir}" if trainer.logger is not None else "logs: none (logger disabled)"]
    ckpt = trainer.checkpoint_callback
    if ckpt is None:
        lines.append("checkpoints: none (trainer.enable_checkpointing false)")
    else:
        best = ckpt.best_model_path or "none"
        last = getattr(ckpt, "last_model_path", "") or "none"
        monitor = f" by {ckpt.monitor}" if getattr(ckpt, "monitor", None) else ""
        lines.append(f"checkpoints: best{monitor} {best}, last {last}")
    return "\n".join(lines)


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
        kwargs.setdefault("parser_class", WSLightArgumentParser)
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
        global _parsed_config
        config = self.config[self.subcommand] if self.subcommand else self.config
        _parsed_config = _to_plain(config)  # for main()'s error messages: which class sits at which key
        self.run_key = run_key(_parsed_config)
        logger = config.trainer.get("logger")
        if self.evaluate and "TensorBoardLogger" in str(getattr(logger, "class_path", "")):
            if logger.init_args.get("version") is None:
                logger.init_args["version"] = f"run-{self.run_key}"

    def after_fit(self) -> None:
        """Evaluate the fitted head on the held-out test split, so one `fit` logs train/, val/ and test/ scalars."""
        if self.datamodule is not None and not self.trainer.interrupted:
            self.trainer.test(self.model, datamodule=self.datamodule, verbose=self.trainer.is_global_zero)
        report = fit_report(self.trainer)  # every rank: trainer.log_dir is a collective under DDP
        if self.trainer.is_global_zero:
            print(report)

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        if hasattr(self.model, "run_key"):
            self.model.run_key = self.run_key


_interrupted = False
_parsed_config: dict | None = None


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt(f"signal {signum}")


# ------------------------------------------------------------------------------------------- error messages


def _config_files(args: list[str]) -> list[Path]:
    out = []
    for i, a in enumerate(args):
        if a in ("--config", "-c") and i + 1 < len(args):
            out.append(Path(args[i + 1]))
        elif a.startswith("--config="):
            out.append(Path(a.split("=", 1)[1]))
    return out


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _merge(base: dict, new: dict) -> dict:
    for k, v in new.items():
        base[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base


def _args_tree(args: list[str]) -> dict:
    """The config files and `--a.b value` overrides as one nested dict (only to name keys in messages)."""
    tree: dict = {}
    for path in _config_files(args):
        loaded = _load_yaml(path)
        if isinstance(loaded, dict):
            _merge(tree, loaded)
    for i, a in enumerate(args):
        if a.startswith("--") and a not in ("--config",) and not a.startswith("--config="):
            key, _, value = a[2:].partition("=")
            if not _ and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
            node = tree
            *parents, last = key.split(".")
            for k in parents:
                node = node.setdefault(k, {}) if isinstance(node.get(k, {}), dict) else {}
            node[last] = value
    return tree


def _entry_point_of(tree: Any) -> str | None:
    """ "train" for a training config (it has a data block), "evaluate" for an evaluation config, else None."""
    if not isinstance(tree, dict) or not isinstance(tree.get("model"), dict):
        return None
    if "data" in tree:
        return "train"
    class_path = str(tree["model"].get("class_path", ""))
    return "train" if class_path.startswith("wslight.models.") else "evaluate"


_MISSING = object()


def _get(tree: Any, path: str) -> Any:
    for k in path.split("."):
        if not isinstance(tree, dict) or k not in tree:
            return _MISSING
        tree = tree[k]
    return tree


def _check_command(args: list[str], evaluate: bool) -> list[str]:
    """Mistakes of the command line caught before parsing: the wrong entry point for a config, a value on a linked
    key, a subcommand given to evaluate.py. Returns the arguments to parse (evaluate.py's `test` once)."""
    if evaluate and len(args) > 1 and args[0] == "test" and args[1] in ("fit", "validate", "test", "predict"):
        if args[1] != "test":
            raise UsageError(
                f"evaluate.py runs the `test` subcommand itself and takes no other (got {args[1]!r}); "
                "to train a head: python train.py fit --config configs/<map>.yaml"
            )
        args = args[1:]  # `evaluate.py test --config ...`: the usage line shows `test`, so accept it once
    subcommand = next((a for a in args if not a.startswith("-")), None) if args else None
    for path in _config_files(args):
        tree = _load_yaml(path)
        kind = _entry_point_of(tree)
        if evaluate and kind == "train":
            raise UsageError(
                f"{path} is a training config (it has a data: block): run it with "
                f"`python train.py fit --config {path}` (or `wslight fit --config {path}`)"
            )
        if not evaluate and kind == "evaluate" and subcommand in ("fit", "validate", "test", "predict"):
            raise UsageError(
                f"{path} is an evaluation config ({tree['model'].get('class_path')}): run it with "
                f"`python evaluate.py --config {path}` (or `wslight evaluate --config {path}`)"
            )
    if not evaluate:
        given = _args_tree(args)
        for target, source in LINKS.items():
            value = _get(given, target)
            if value is not _MISSING:
                raise UsageError(
                    f"{target} is linked from {source} (n and d are written once, under data, and set on the map "
                    f"and the head); set {source} instead (got {target}={value})"
                )
    return args


def _resolve(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:
        return None


def _class_paths(tree: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(key path, class_path) of every class in a config tree, outermost first."""
    out = []
    if isinstance(tree, dict):
        if isinstance(tree.get("class_path"), str):
            out.append((prefix.rstrip("."), tree["class_path"]))
        for k, v in tree.items():
            out += _class_paths(v, f"{prefix}{k}.")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _class_paths(v, f"{prefix}{i}.")
    return out


def _key_paths(tree: Any, prefix: str = "") -> list[str]:
    out = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += [f"{prefix}{k}", *_key_paths(v, f"{prefix}{k}.")]
    return out


def _component(exc: BaseException, tree: dict) -> str | None:
    """Key path of the innermost configured class whose constructor raised `exc` (from its traceback)."""
    classes = [(path, _resolve(cp)) for path, cp in _class_paths(tree)]
    found, tb = None, exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            cls = type(frame.f_locals["self"])
            found = next((path for path, c in classes if c is cls), found)
        tb = tb.tb_next
    return found


def _innermost_value_error(exc: BaseException) -> BaseException:
    inner = exc
    while exc.__cause__ is not None:
        exc = exc.__cause__
        if isinstance(exc, ValueError) and not type(exc).__module__.startswith("jsonargparse"):
            inner = exc
    return inner


def _value_error_message(exc: BaseException, tree: dict) -> str:
    """`data.init_args.n must be a positive integer, got 0`: the package's message with its key made a key path."""
    inner = _innermost_value_error(exc)
    msg = str(inner).strip()
    m = re.match(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", msg)
    key = m.group(0) if m else ""
    component = _component(inner, tree)
    paths = _key_paths(tree)
    path = None
    if key and component:
        head = f"{component}.init_args.{key.split('.')[0]}"
        if head in paths or f"{component}.init_args" in paths:
            path = f"{component}.init_args.{key}"
    if key and path is None:
        matches = [p for p in paths if p == key or p.endswith(f".{key}")]
        if len(matches) == 1:
            path = matches[0]
    if path is None:
        return f"{component}: {msg}" if component else msg
    if path in LINKS:
        return f"{LINKS[path]}{msg[len(key) :]} (linked to {path})"
    return f"{path}{msg[len(key) :]}"


def _tidy(detail: str) -> str:
    detail = re.sub(r"^Expected a typing\.Literal\[(.*)\]", r"must be one of [\1]", detail)
    detail = re.sub(r"^Expected a <class '(\w+)'>", r"must be of type \1", detail)
    return detail.replace(". Got value: ", ", got ")


_NOISE = ("Does not validate", "Subtypes:", "Errors:", "Given value", "Expected a <class 'NoneType'>")


def _parse_error_message(exc: BaseException) -> str:
    """One line from jsonargparse's nested report: the key path, what was wrong, a suggestion for an unknown key."""
    msg = str(exc)
    path: list[str] = []
    cls, unknown, detail = None, None, None
    for raw in msg.splitlines():
        s = raw.strip()
        s = s[2:] if s.startswith("- ") else s
        if not s or s.startswith(_NOISE):
            continue
        m = re.match(r'Parser key "([^"]+)":\s*(.*)', s)
        if m:
            path.append(m.group(1))
            detail = m.group(2) or detail
            continue
        m = re.match(r"Problem with given class_path '([^']+)':\s*(.*)", s)
        if m:
            cls = m.group(1)
            if not dataclasses.is_dataclass(_resolve(cls)):  # a dataclass's fields sit right under its key
                path.append("init_args")
            detail = m.group(2) or detail
            continue
        m = re.match(r"Option '([^']+)' is not accepted", s)
        if m:
            unknown = m.group(1)
            continue
        if detail is None or detail.endswith(":"):
            detail = s
    if unknown is not None:
        where = ".".join(path)
        options = []
        target = _resolve(cls) if cls else None
        if target is not None:
            try:
                options = [
                    p for p in inspect.signature(target.__init__).parameters if p not in ("self", "args", "kwargs")
                ]
            except (TypeError, ValueError):
                options = []
        key = f"{where}.{unknown}" if where else unknown
        close = difflib.get_close_matches(unknown, options, n=1)
        hint = f"; did you mean {where}.{close[0]}?" if close else (f"; {where} takes {options}" if options else "")
        return f"unknown key {key}{hint}"
    m = re.match(r"[Uu]nrecognized arguments: (.*)", msg.splitlines()[0]) if msg else None
    if m:
        given = m.group(1).split()
        keys = getattr(exc, "keys", [])
        out = f"unknown argument(s): {' '.join(given)}"
        for arg in given:
            if arg.startswith("--"):
                close = difflib.get_close_matches(arg[2:].split("=")[0], keys, n=1)
                if close:
                    out += f"; did you mean --{close[0]}?"
        return out
    if path:
        detail = _tidy(detail or msg)
        return f"{'.'.join(path)}{' ' if detail.startswith('must') else ': '}{detail}"
    return msg.splitlines()[0] if msg else "invalid arguments"


def _fail(message: str, prog: str, code: int = 2) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)
    print(f"(the full traceback: {DEBUG_ENV}=1 or --debug; every option: {prog} --help)", file=sys.stderr)
    raise SystemExit(code)


def main(args: list[str] | None = None, run: bool = True, evaluate: bool = False) -> WSLightCLI:
    """Entry point of `wslight` and `train.py`: `main(["fit", "--config", "configs/raf.yaml"])`.

    `evaluate=True` is the entry point of `evaluate.py`:
    `main(["test", "--config", "configs/ws/raf.yaml"], evaluate=True)`. The console script also takes
    `wslight evaluate --config ...` (= evaluate.py) and `wslight reproduce ...` (= `python -m wslight.reproduce`).

    A mistake in the command or config (a value out of range, an unknown key, a config given to the other entry point)
    prints one block on stderr naming the key path, and exits with status 2; `--debug` or `WSLIGHT_DEBUG=1` raises
    the original exception with its traceback instead.
    """
    global _interrupted, _parsed_config
    args = list(sys.argv[1:] if args is None else args)
    if args and args[0] == "reproduce":
        from .reproduce import main as reproduce

        reproduce(args[1:])
        return None  # type: ignore[return-value]
    if args and args[0] == "evaluate":
        args, evaluate = ["test", *args[1:]], True
    debug = "--debug" in args or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    args = [a for a in args if a != "--debug"]
    prog = "evaluate.py" if evaluate else f"train.py {args[0] if args and not args[0].startswith('-') else ''}".strip()
    _interrupted = False
    _parsed_config = None
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGTERM stops like Ctrl-C: cleanly, resumable
        signal.signal(sig, _raise_keyboard_interrupt)
    hint = "interrupted: finished trials are saved in results.jsonl; run the same command again to resume"
    try:
        args = _check_command(args, evaluate)
        cli = WSLightCLI(args=args, run=run, evaluate=evaluate)
    except (KeyboardInterrupt, SystemExit):
        # Lightning turns SIGINT/SIGTERM into a graceful shutdown and exits non-zero
        if evaluate and _interrupted:
            print(hint, file=sys.stderr)
        raise
    except UsageError as err:
        if debug:
            raise
        _fail(str(err), prog)
    except _ParseError as err:
        if debug:
            raise
        _fail(_parse_error_message(err), prog)
    except TrainingDiverged as err:
        if debug:
            raise
        _fail(str(err), prog, code=1)
    except ValueError as err:
        if debug:
            raise
        _fail(_value_error_message(err, _parsed_config or _args_tree(args)), prog)
    if run and (cli.trainer.interrupted or _interrupted):
        if evaluate:
            print(hint, file=sys.stderr)
        raise SystemExit(130)
    path = getattr(cli.model, "results_path", None)
    if run and path is not None and cli.trainer.is_global_zero:
        print(f"results: {path}")
    return cli
