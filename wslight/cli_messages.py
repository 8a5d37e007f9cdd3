"""How the command line reads a command before Lightning does, and turns a mistake into one short block.

`main` (wslight.cli) checks the command against the entry point (a training config given to evaluate.py, a linked key
given a value), and formats the errors of jsonargparse and of the package's own checks as one line naming the config
key path, the allowed range and the value, with the closest key for an unknown one.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import yaml

# Training sizes are written once, under data, and linked to the map and the head (target -> source).
LINKS = {
    "model.init_args.feature_map.init_args.n": "data.init_args.n",
    "model.init_args.feature_map.init_args.d": "data.init_args.d",
    "model.init_args.n": "data.init_args.n",
}
DEBUG_ENV = "WSLIGHT_DEBUG"


class UsageError(Exception):
    """A mistake in the command or its config: printed as one short block on stderr, exit status 2."""


class ParseError(Exception):
    """jsonargparse's parse error, raised instead of printing usage and exiting (main() formats it)."""


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


def args_tree(args: list[str]) -> dict:
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


def check_command(args: list[str], evaluate: bool) -> list[str]:
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
        given = args_tree(args)
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
    """The innermost ValueError (or wslight error, e.g. HubUnreachableError) under jsonargparse's wrappers."""
    inner = exc
    while exc.__cause__ is not None:
        exc = exc.__cause__
        module = type(exc).__module__
        if (isinstance(exc, ValueError) or module.startswith("wslight")) and not module.startswith("jsonargparse"):
            inner = exc
    return inner


def value_error_message(exc: BaseException, tree: dict) -> str:
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
        nested = [p for p in paths if p.startswith(f"{component}.") and p.endswith(f".{key}")]
        if head not in paths and len(nested) == 1:  # a key of a nested block (data.init_args.embeddings.encoder)
            path = nested[0]
        elif head in paths or f"{component}.init_args" in paths:
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


def parse_error_message(exc: BaseException) -> str:
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


def fail(message: str, prog: str, code: int = 2) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)
    print(f"(the full traceback: {DEBUG_ENV}=1 or --debug; every option: {prog} --help)", file=sys.stderr)
    raise SystemExit(code)


