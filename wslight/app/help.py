"""The help of the command line: an evaluation's own options first, Lightning's whole help one flag away.

    wslight evaluate --help                       the evaluations, their configs, how to see each one's options
    wslight evaluate --config ws/raf --help       the options of the class the config names (name, type, default,
                                                  the value this command line gives, the first sentence of its doc)
    wslight evaluate --help-all                   LightningCLI's whole `test` help (trainer, ckpt_path, ...)
    wslight evaluate --model.help WordSensitivitySweep   LightningCLI's help of one class, by its short name

LightningCLI's own `--help` of an evaluation is some 500 lines of Lightning's `test` options, none of the
evaluation's; its `--model.help` takes only a dotted import path. This module answers the first and maps a short
class name to its dotted path for the second, before LightningCLI sees the command line.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
import typing
from pathlib import Path
from typing import Any

import yaml

from ..tasks import Evaluation
from .config_classes import (  # noqa: F401  (model_classes, training_classes: re-exported)
    dotted_path,
    evaluation_classes,
    import_class,
    model_classes,
    short_class,
    training_classes,
)
from .config_files import base_of, load_yaml, overlay_chain, resolve_config_args, shipped_names
from .config_files import configs_dir as shipped_dir
from .docstrings import arg_docs, class_arg_docs, first_sentence, summary_line  # noqa: F401  (arg_docs: re-exported)
from .errors import UsageError

HELP_FLAGS = ("-h", "--help")
HELP_ALL = "--help-all"  # LightningCLI's whole help, which `--help` of an evaluation replaces
MODEL_HELP = "--model.help"
WIDTH = 100


# --- the arguments handed to LightningCLI ------------------------------------------------------------------------
def asks_for_help(args: list[str]) -> bool:
    """Whether a command line asks for `--help` (or `-h`); `--help-all` is LightningCLI's own help."""
    return any(a in HELP_FLAGS for a in args) and HELP_ALL not in args


def lightning_args(args: list[str]) -> list[str]:
    """`args` as LightningCLI takes them: `--help-all` -> `--help`, `--model.help <short name>` -> its dotted path.

    Raises:
        UsageError: `--model.help` names no known class (the message lists the known short names).
    """
    out = ["--help" if a == HELP_ALL else a for a in args]
    for i, a in enumerate(out):
        if a == MODEL_HELP and i + 1 < len(out):
            out[i + 1] = _model_help_path(out[i + 1])
        elif a.startswith(f"{MODEL_HELP}="):
            out[i] = f"{MODEL_HELP}={_model_help_path(a.partition('=')[2])}"
    return out


def _model_help_path(name: str) -> str:
    if "." in name:  # a dotted path: LightningCLI checks it
        return name
    return dotted_path(short_class(name, MODEL_HELP))


# --- which class and which values a command line gives -----------------------------------------------------------
def _yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _config_model(value: str) -> dict:
    """The `model:` block of one `--config` value (a file, or YAML given inline) as {class_path, init_args}."""
    path = Path(value)
    tree = load_yaml(path) if path.is_file() else _yaml_value(value)
    model = tree.get("model") if isinstance(tree, dict) else None
    if isinstance(model, str):
        return {"class_path": model}
    return model if isinstance(model, dict) else {}


def _option(arg: str, following: str | None) -> tuple[str, str | None]:
    """(`--key`, its value) of `--key value` or `--key=value`."""
    if arg.startswith("--") and "=" in arg:
        key, _, value = arg.partition("=")
        return key, value
    return arg, following


def command_model(args: list[str]) -> tuple[str | None, dict[str, Any]]:
    """The `model.class_path` a command line runs and the init_args it gives.

    Its configs in order (an overlay after its base, as LightningCLI reads them), then `--model X` and `--model.<key>
    value` on the command line; the last value of a key wins.

    Raises:
        UsageError: a `--config` value that is no file and no shipped name.
    """
    class_path: str | None = None
    init_args: dict[str, Any] = {}
    resolved = resolve_config_args(args)
    for i, arg in enumerate(resolved):
        key, value = _option(arg, resolved[i + 1] if i + 1 < len(resolved) else None)
        if value is None:
            continue
        if key in ("--config", "-c"):
            model = _config_model(value)
        elif key in ("--model", "--model.class_path"):
            given = _yaml_value(value)
            model = given if isinstance(given, dict) else {"class_path": value}
        elif key.startswith("--model.") and key != MODEL_HELP:
            tree: Any = _yaml_value(value)
            for name in reversed(key.removeprefix("--model.").removeprefix("init_args.").split(".")):
                tree = {name: tree}  # `--model.embeddings.seed 3` -> {embeddings: {seed: 3}}
            model = {"init_args": tree}
        else:
            continue
        class_path = model.get("class_path") or class_path
        init_args = _merge(init_args, model.get("init_args") or {})
    return class_path, init_args


def _merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` over `old` key by key, as jsonargparse reads a second config: blocks merge, lists are replaced whole."""
    out = dict(old)
    for key, value in new.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def config_names(args: list[str]) -> list[str]:
    """The `--config` values of a command line, as typed."""
    names = []
    for i, arg in enumerate(args):
        key, value = _option(arg, args[i + 1] if i + 1 < len(args) else None)
        if key in ("--config", "-c") and value is not None:
            names.append(value)
    return names


# --- the text --------------------------------------------------------------------------------------------------------
def _show(value: Any) -> str:
    """A value as written in a config (YAML flow style), cut to one short line."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
    return text if len(text) <= 60 else text[:57] + "..."


def _wrap(text: str, indent: int) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=" " * indent, subsequent_indent=" " * indent)


def option_lines(cls: type, given: dict[str, Any], prefix: str = "--model.") -> list[str]:
    """Two or more lines per constructor argument.

    `--model.<name>  <type>, default <value>[; given: <value>]`, then the first sentence of its docstring; an
    argument that is a settings dataclass (`search: SearchSettings`) is followed by one such entry per field.
    """
    docs = class_arg_docs(cls)
    hints = _type_hints(cls)
    lines: list[str] = []
    for p in inspect.signature(cls).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kind = p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)
        head = f"  {prefix}{p.name}  {kind}, " if p.annotation is not p.empty else f"  {prefix}{p.name}  "
        head += "required" if p.default is p.empty else f"default {_show(p.default)}"
        if p.name in given:
            head += f"; given: {_show(given[p.name])}"
        lines += [head, *_wrap(first_sentence(docs.get(p.name, "(no docstring)")), 6)]
        settings = _dataclass_of(hints.get(p.name))
        if settings is not None:
            value = given.get(p.name)
            lines += option_lines(settings, value if isinstance(value, dict) else {}, f"{prefix}{p.name}.")
    return lines


def _type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a class's constructor ({} where they cannot be resolved)."""
    try:
        return typing.get_type_hints(getattr(cls, "__init__"))  # noqa: B009  (mypy refuses the attribute on a type)
    except Exception:  # an annotation naming something not importable here: shown as written, not expanded
        return {}


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a type hint names (`SearchSettings | None` -> SearchSettings), or None."""
    for t in (hint, *typing.get_args(hint)):
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    return None


def _usage(prog: str, config: str) -> str:
    return f"usage: {prog} --config {config} [--model.<option> VALUE ...] [--trainer.<option> VALUE ...]"


def class_help(cls: type, given: dict[str, Any], prog: str, configs: list[str]) -> str:
    """The help of one evaluation: what it is and its options, then where the whole text and Lightning's are."""
    named = " ".join(f"--config {c}" for c in configs)
    lines = [_usage(prog, " --config ".join(configs) or "<config>"), ""]
    lines.append(f"{named or 'The command line'} runs {cls.__name__} ({dotted_path(cls)}):")
    lines += _wrap(summary_line(cls), 2)
    if not issubclass(cls, Evaluation):
        lines.append(f"  (a training module: run it with `wslight fit {named}`)")
    lines += ["", "Its options (--model.<option> VALUE on the command line, model.init_args.<option> in a config):"]
    lines += option_lines(cls, given)
    lines += [
        "",
        f"The whole text of each option: {prog} --model.help {cls.__name__}",
        "Every option of Lightning's `test` (trainer, seed_everything, ckpt_path, ...): "
        + " ".join(filter(None, (prog, named, HELP_ALL))),
    ]
    return "\n".join(lines)


def configs_by_class() -> dict[str, list[str]]:
    """Short class name -> the shipped configs that run it (an overlay runs its base's class)."""
    out: dict[str, list[str]] = {}
    root = shipped_dir()
    for name in shipped_names():
        path = root / f"{name}.yaml"
        try:
            chain = overlay_chain(path) if base_of(path) else [path]
        except UsageError:
            continue  # a broken overlay: its run reports it
        class_path = None
        for part in chain:
            class_path = _config_model(str(part)).get("class_path") or class_path
        if isinstance(class_path, str):
            out.setdefault(class_path.rpartition(".")[2], []).append(name)
    return out


def _configs_text(names: list[str]) -> str:
    """`configs: ws/raf, ws/rf (+ 6 overlays under paper/, reproduce/)`: the whole configs by name, overlays counted."""
    overlays = [n for n in names if base_of(shipped_dir() / f"{n}.yaml")]
    whole = [n for n in names if n not in overlays]
    folders = ", ".join(sorted({f"{n.split('/')[0]}/" for n in overlays}))
    more = f" (+ {len(overlays)} overlay{'s' * (len(overlays) != 1)} under {folders})" if overlays else ""
    return f"configs: {', '.join(whole) or '-'}{more}"


def evaluations_help(prog: str) -> str:
    """The evaluations (one line each, with the shipped configs that run them) and how to see each one's options."""
    configs = configs_by_class()
    # the most shipped configs first: the paper's main sweep leads
    classes = sorted(evaluation_classes(), key=lambda c: -len(configs.get(c.__name__, [])))
    width = max(len(c.__name__) for c in classes) + 4
    lines = [
        _usage(prog, "<config>"),
        "",
        "Runs the evaluation a config names (its model.class_path) and prints `results: <path to results.jsonl>` last.",
        "A config is a file or a shipped name (ws/raf: configs/ws/raf.yaml).",
        "--shard i/N runs shard i of N independent jobs of one run, in the same run folder (docs/tasks/gpus.md).",
        "",
        "evaluations:",
    ]
    for cls in classes:
        text = textwrap.wrap(summary_line(cls), WIDTH - width)
        text += textwrap.wrap(_configs_text(configs.get(cls.__name__, [])), WIDTH - width)
        lines.append(f"  {cls.__name__:<{width - 2}}{text[0]}")
        lines += [" " * width + t for t in text[1:]]
    example = next((c for c in classes if configs.get(c.__name__)), classes[0])
    whole = [n for n in configs.get(example.__name__, []) if not base_of(shipped_dir() / f"{n}.yaml")]
    config = min(whole, key=len, default="<config>")  # the plainest: ws/rf rather than ws/deep_rf
    lines += [
        "",
        f"The options of one evaluation: {prog} --config {config} --help (with the values that config gives),",
        f"or by class: {prog} --model.help {example.__name__}",
        f"Every option of Lightning's `test` (trainer, seed_everything, ckpt_path, ...): {prog} {HELP_ALL}",
    ]
    return "\n".join(lines)


def evaluate_help(args: list[str], prog: str) -> str:
    """What `<prog> [--config X ...] --help` prints.

    The options of the class the command line runs, or, with no class named, the list of the evaluations.

    Raises:
        UsageError: a `--config` that names nothing, or a class_path that does not import.
    """
    class_path, given = command_model([a for a in args if a not in HELP_FLAGS])
    if class_path is None:
        return evaluations_help(prog)
    return class_help(import_class(class_path), given, prog, config_names(args))
