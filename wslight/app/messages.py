"""How the command line reads a command before Lightning does, and turns a mistake into one short block.

`main` (wslight.app.cli) checks the command against the entry point (a training config given to evaluate.py, a linked
key given a value), reads every `--config` file strictly (a YAML syntax error with its line and column, a key written
twice, an empty file), checks `seed_everything` and a checkpoint to resume from (`ckpt_path`), and formats the errors of
jsonargparse and of the package's own checks as one line naming the config key path, the allowed range and the value,
with the closest key for an unknown one.

Only what must come before jsonargparse parses is read here, each file on its own (no merging: jsonargparse merges the
files of an overlay and the overrides, and `main` names keys from that parsed config): the strict reading of a file
(jsonargparse would keep the last of two equal keys without a word), a misspelt top-level key and the entry point
(jsonargparse would report the blocks they leave missing instead), a value on a linked key (jsonargparse replaces it
by the link without a word), `seed_everything` (Lightning seeds with it right after parsing, before any hook) and
`ckpt_path` (Lightning reads the checkpoint only after the data is prepared).
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

from ..base import validate
from .checkpoints import CKPT_NAMES, check_checkpoint
from .config_files import base_of, config_paths, load_yaml, read_config
from .errors import UsageError
from .renames import check_moved_attack_keys, check_moved_class_paths, check_moved_sweep_keys

# Training sizes are written once, under data, and linked to the map and the head (target -> source).
LINKS = {
    "model.init_args.feature_map.init_args.n": "data.init_args.n",
    "model.init_args.feature_map.init_args.d": "data.init_args.d",
    "model.init_args.n": "data.init_args.n",
}
DEBUG_ENV = "WSLIGHT_DEBUG"
# The top-level keys of LightningCLI's subcommand parsers (for a misspelt one, which jsonargparse reports without them).
TOP_KEYS = ("model", "data", "trainer", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler")


_MISSING = object()


def _get(tree: Any, path: str) -> Any:
    for k in path.split("."):
        if not isinstance(tree, dict) or k not in tree:
            return _MISSING
        tree = tree[k]
    return tree


def given_values(args: list[str], key: str) -> list[tuple[str, Any]]:
    """Every value given for the dotted `key`, in the order jsonargparse reads them (the last one wins).

    From each `--config` file that holds the key, and from `--key value` / `--key=value`; each with where it was given.
    """
    out: list[tuple[str, Any]] = []
    for i, a in enumerate(args):
        if a in ("--config", "-c") or a.startswith("--config="):
            value = a.partition("=")[2] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            found = _get(load_yaml(Path(value)), key) if value else _MISSING
            if found is not _MISSING:
                out.append((value, found))
        elif a == f"--{key}" and i + 1 < len(args):
            out.append(("the command line", args[i + 1]))
        elif a.startswith(f"--{key}="):
            out.append(("the command line", a.partition("=")[2]))
    return out


def args_tree(args: list[str]) -> dict:
    """The `--a.b value` settings of the command line as a nested dict.

    What `main` names keys from when a run fails before jsonargparse has parsed the config (after that it uses the
    parsed config; the files are not merged here).
    """
    tree: dict = {}
    for i, a in enumerate(args):
        if not a.startswith("--") or a in ("--config", "-c") or a.startswith("--config="):
            continue
        key, eq, value = a[2:].partition("=")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        node = tree
        *parents, last = key.split(".")
        for k in parents:
            node = node.setdefault(k, {}) if isinstance(node.get(k, {}), dict) else {}
        node[last] = value
    return tree


def _entry_point_of(tree: Any) -> str | None:
    """The entry point a config tree is for: "train", "evaluate" or None.

    "train" for a training config (it has a data block), "evaluate" for an evaluation config, else None (also for an
    overlay that names no model class: its base says).
    """
    if not isinstance(tree, dict) or not isinstance(tree.get("model"), dict):
        return None
    if "data" in tree:
        return "train"
    class_path = tree["model"].get("class_path")
    if not isinstance(class_path, str):
        return None
    return "train" if class_path.rpartition(".")[2] == "FeatureMapClassifier" else "evaluate"


def _given_as(files: list[Path], i: int) -> Path:
    """The file the user named for `files[i]`: the overlay that brought it in, else `files[i]` itself.

    `resolve_config_args` puts an overlay's bases right before it, and a shipped base's path ends with its name.
    """
    shown = files[i]
    for later in files[i + 1 :]:
        name = base_of(later)
        if name is None or not shown.as_posix().endswith(f"/{name}.yaml"):
            break
        shown = later
    return shown


def check_command(args: list[str], evaluate: bool) -> list[str]:
    """Mistakes of the command line caught before parsing.

    A config file that is no valid YAML, repeats a key or is empty, the wrong entry point for a config, a
    seed_everything out of range, a value on a linked key, a subcommand given to evaluate.py. Returns the arguments to
    parse (evaluate.py's `test` once).
    """
    if evaluate:
        args = _evaluate_subcommand(args)
    subcommand = next((a for a in args if not a.startswith("-")), None) if args else None
    files = config_paths(args)
    trees = [(str(path), read_config(path)) for path in files]
    check_moved_class_paths(trees, args)
    check_moved_sweep_keys(trees, args)
    check_moved_attack_keys(trees, args)
    for i, (path, tree) in enumerate(trees):
        _check_top_keys(path, tree)
        _check_entry_point(tree, files, i, evaluate, subcommand)
    seeds = given_values(args, "seed_everything")
    if seeds:
        check_seed_everything(seeds[-1][1])  # the value jsonargparse keeps
    if not evaluate:
        _check_linked_keys(args)
        _check_given_checkpoint(args)
    return args


def _evaluate_subcommand(args: list[str]) -> list[str]:
    """evaluate.py's arguments without a `test` given once; any other subcommand is refused."""
    if len(args) > 1 and args[0] == "test" and args[1] in ("fit", "validate", "test", "predict"):
        if args[1] != "test":
            raise UsageError(
                f"evaluate.py runs the `test` subcommand itself and takes no other (got {args[1]!r}); "
                "to train a head: python train.py fit --config configs/<map>.yaml"
            )
        args = args[1:]  # `evaluate.py test --config ...`: the usage line shows `test`, so accept it once
    return args


def _check_top_keys(path: str, tree: Any) -> None:
    """Refuse a misspelt top-level key of a config file, naming the key meant."""
    for key in tree if isinstance(tree, dict) else ():
        # a misspelt top-level key first: jsonargparse would report the block it leaves missing instead
        if key not in TOP_KEYS and difflib.get_close_matches(str(key), TOP_KEYS, n=1, cutoff=0.6):
            raise UsageError(f"{path}: unknown key {key}{_top_key_hint(str(key), list(TOP_KEYS))}")


def _check_entry_point(tree: Any, files: list[Path], i: int, evaluate: bool, subcommand: str | None) -> None:
    """Refuse the config `files[i]` given to the other entry point, naming the command that runs it."""
    kind = _entry_point_of(tree)
    if kind == ("train" if evaluate else "evaluate"):
        named = _given_as(files, i)  # an overlay's base decides; the message names the overlay
        if evaluate:
            raise UsageError(
                f"{named} is a training config (it has a data: block): run it with "
                f"`python train.py fit --config {named}` (or `wslight fit --config {named}`)"
            )
        if subcommand in ("fit", "validate", "test", "predict"):
            raise UsageError(
                f"{named} is an evaluation config ({tree['model'].get('class_path')}): run it with "
                f"`python evaluate.py --config {named}` (or `wslight evaluate --config {named}`)"
            )


def _check_linked_keys(args: list[str]) -> None:
    """Refuse a value given for a key that a training run links from another (LINKS)."""
    for target, source in LINKS.items():
        given = given_values(args, target)  # in any file or on the command line: the link would replace it
        if given:
            raise UsageError(
                f"{target} is linked from {source} (n and d are written once, under data, and set on the map "
                f"and the head); set {source} instead (got {target}={given[-1][1]})"
            )


def _check_given_checkpoint(args: list[str]) -> None:
    """Refuse the `ckpt_path` of the command before any data is prepared (`check_checkpoint`).

    The sizes are the data's n and d as given (the last value wins); a size not given is not compared.
    """
    given = given_values(args, "ckpt_path")
    value = given[-1][1] if given else None
    if not isinstance(value, str) or value in CKPT_NAMES or value.startswith("registry") or "://" in value:
        return
    sizes = {}
    for name in ("n", "d"):
        found = given_values(args, f"data.init_args.{name}")
        if found:
            sizes[name] = (found[-1][1], found[-1][0])
    check_checkpoint(Path(value).expanduser(), sizes, value)  # as Lightning (fsspec) reads `~`


def check_seed_everything(value: Any) -> None:
    """Refuse a `seed_everything` outside the range Lightning seeds numpy with, naming the key.

    Lightning's own message names neither the key nor the entry; true / false / null and non-numbers are left to
    jsonargparse.
    """
    from lightning.fabric.utilities.seed import max_seed_value, min_seed_value

    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return
    if not isinstance(value, int) or isinstance(value, bool):
        return
    try:
        validate.integer("seed_everything", value, min_seed_value, max_seed_value, why="or true: a random seed")
    except ValueError as err:
        raise UsageError(str(err)) from None


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
        return f"unknown key {key}{_top_key_hint(key, list(TOP_KEYS))}"
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
                out += _top_key_hint(key, tops, "--")
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


def _top_key_hint(key: str, top_keys: list[str], prefix: str = "") -> str:
    """`; did you mean model.init_args.x?` for `modle.init_args.x` (a misspelt first part), else ""."""
    top, dot, rest = key.partition(".")
    if top in top_keys:
        return ""
    close = difflib.get_close_matches(top, top_keys, n=1, cutoff=0.6)
    if not close:
        return f"; the top-level keys are {', '.join(top_keys)}"
    return f"; did you mean {prefix}{close[0]}{dot}{rest}?"


def fail(message: str, prog: str, code: int = 2) -> None:
    """Print `message` and the hint to the full traceback on stderr and exit with `code`."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    print(f"(the full traceback: {DEBUG_ENV}=1 or --debug; every option: {prog} --help)", file=sys.stderr)
    raise SystemExit(code)
