"""How the command line reads a command before Lightning does, and turns a mistake into one short block.

`main` (wslight.app.cli) checks the command against the entry point (a training config given to evaluate.py, a linked
key given a value), reads every `--config` file strictly (a YAML syntax error with its line and column, a key written
twice, an empty file), checks `seed_everything` and a checkpoint to resume from (`ckpt_path`), and prints a mistake
with `fail`. The errors of jsonargparse and of the package's own checks become one line naming the config key path,
the allowed range and the value, with the closest key for an unknown one, in `wslight.app.error_lines`.

Only what must come before jsonargparse parses is read here, each file on its own (no merging: jsonargparse merges the
files of an overlay and the overrides, and `main` names keys from that parsed config): the strict reading of a file
(jsonargparse would keep the last of two equal keys without a word), a misspelt top-level key and the entry point
(jsonargparse would report the blocks they leave missing instead), a value on a linked key (jsonargparse replaces it
by the link without a word), `seed_everything` (Lightning seeds with it right after parsing, before any hook) and
`ckpt_path` (Lightning reads the checkpoint only after the data is prepared).
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

from ..base import validate
from .checkpoints import CKPT_NAMES, check_checkpoint
from .config_files import base_of, config_paths, load_yaml, read_config
from .error_lines import (  # noqa: F401  (closest, did_you_mean, parse_error_message, value_error_message: re-exported)
    LINKS,
    TOP_KEYS,
    closest,
    did_you_mean,
    parse_error_message,
    top_key_hint,
    value_error_message,
)
from .errors import UsageError
from .renames import check_moved_attack_keys, check_moved_class_paths, check_moved_sweep_keys

DEBUG_ENV = "WSLIGHT_DEBUG"


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
            raise UsageError(f"{path}: unknown key {key}{top_key_hint(str(key), list(TOP_KEYS))}")


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


def fail(message: str, prog: str, code: int = 2) -> None:
    """Print `message` and the hint to the full traceback on stderr and exit with `code`."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    print(f"(the full traceback: {DEBUG_ENV}=1 or --debug; every option: {prog} --help)", file=sys.stderr)
    raise SystemExit(code)
