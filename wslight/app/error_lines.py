"""One line per mistake, naming the config key path: jsonargparse's nested reports and the package's ValueErrors.

`parse_error_message` reads jsonargparse's report (the key path, what was wrong, the key meant for an unknown one);
`value_error_message` turns a constructor's `n must be ...` into `data.init_args.n must be ...`, finding the class
that raised it in the traceback; `did_you_mean` and `closest` name the choice a misspelt name is closest to.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
from typing import Any

# Training sizes are written once, under data, and linked to the map and the head (target -> source).
LINKS = {
    "model.init_args.feature_map.init_args.n": "data.init_args.n",
    "model.init_args.feature_map.init_args.d": "data.init_args.d",
    "model.init_args.n": "data.init_args.n",
}
# The top-level keys of LightningCLI's subcommand parsers (for a misspelt one, which jsonargparse reports without them).
TOP_KEYS = ("model", "data", "trainer", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler")


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
    path, cls, unknown, detail = _read_report(msg)
    if unknown is not None:
        return _unknown_option_message(path, cls, unknown)
    m = re.match(r"Subcommand '[^']+' does not accept option '([^']+)'", msg)
    if m:  # a key of a config file that no block takes: name it, and the top-level key meant when that is misspelt
        key = m.group(1)
        return f"unknown key {key}{top_key_hint(key, list(TOP_KEYS))}"
    m = re.match(r"[Uu]nrecognized arguments: (.*)", msg.splitlines()[0]) if msg else None
    if m:
        return _unrecognized_arguments_message(m.group(1).split(), getattr(exc, "keys", []))
    if path:
        detail = _tidy(detail or msg)
        return f"{'.'.join(path)}{' ' if detail.startswith('must') else ': '}{detail}"
    return msg.splitlines()[0] if msg else "invalid arguments"


def _read_report(msg: str) -> tuple[list[str], str | None, str | None, str | None]:
    """The key path, the class, the unknown option and the detail that jsonargparse's nested report names."""
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
    return path, cls, unknown, detail


def _unknown_option_message(path: list[str], cls: str | None, unknown: str) -> str:
    """`unknown key <path>.<option>` with the option meant, or the options the class takes."""
    where = ".".join(path)
    options = []
    target = _resolve(cls) if cls else None
    if target is not None:
        try:
            options = [p for p in inspect.signature(target.__init__).parameters if p not in ("self", "args", "kwargs")]
        except (TypeError, ValueError):
            options = []
    key = f"{where}.{unknown}" if where else unknown
    close = difflib.get_close_matches(unknown, options, n=1)
    hint = f"; did you mean {where}.{close[0]}?" if close else (f"; {where} takes {options}" if options else "")
    return f"unknown key {key}{hint}"


def _unrecognized_arguments_message(given: list[str], keys: list[str]) -> str:
    """`unknown argument(s): ...` with, for each `--key`, the parser's key meant or the top-level key misspelt."""
    out = f"unknown argument(s): {' '.join(given)}"
    for arg in given:
        if arg.startswith("--"):
            key = arg[2:].split("=")[0]
            hint = did_you_mean(key, keys, prefix="--")
            if hint:
                out += hint
            elif "." in key:
                tops = sorted({k.split(".")[0] for k in keys} & set(TOP_KEYS)) or list(TOP_KEYS)
                out += top_key_hint(key, tops, "--")
    return out


def did_you_mean(name: str, choices: list[str], prefix: str = "", before: str = "; ", after: str = "") -> str:
    """`; did you mean <prefix><the closest of choices>?` for a misspelt `name`, else "".

    `before` and `after` go around the question: `(did you mean ws_rf?)` with " (" and ")".
    """
    close = closest(name, choices)
    return f"{before}did you mean {prefix}{close}?{after}" if close else ""


def closest(name: str, choices: list[str]) -> str | None:
    """The choice `name` most likely misspells (difflib's closest match), else None."""
    close = difflib.get_close_matches(name, choices, n=1)
    return close[0] if close else None


def top_key_hint(key: str, top_keys: list[str], prefix: str = "") -> str:
    """`; did you mean model.init_args.x?` for `modle.init_args.x` (a misspelt first part), else ""."""
    top, dot, rest = key.partition(".")
    if top in top_keys:
        return ""
    close = difflib.get_close_matches(top, top_keys, n=1, cutoff=0.6)
    if not close:
        return f"; the top-level keys are {', '.join(top_keys)}"
    return f"; did you mean {prefix}{close[0]}{dot}{rest}?"
