"""Names that moved, so that a config saved before the move gets one block saying exactly what to write instead.

Every LightningModule, callback, evaluation and the DataModule now live in `wslight.tasks` (the Lightning floor); a
config that names their old modules (`wslight.evaluations.WordSensitivitySweep`, `wslight.models.FeatureMapClassifier`,
`wslight.callbacks.DeltaAttack`, `wslight.data.EmbeddingDataModule`) is refused before anything runs. So is a
word-sensitivity sweep's search setting written at its old place (`model.init_args.restarts`): the settings are one
`search:` block now, and `restarts` is `chains_per_round`.
"""

from __future__ import annotations

from typing import Any

from .errors import UsageError

# Old module (or package) -> where its classes are imported from now
MOVED_MODULES = {
    "wslight.evaluations": "wslight.tasks",
    "wslight.models": "wslight.tasks",
    "wslight.callbacks": "wslight.tasks",
    "wslight.data.datamodule": "wslight.tasks",
}
MOVED_CLASSES = {"wslight.data.EmbeddingDataModule": "wslight.tasks.EmbeddingDataModule"}


def moved_class_path(class_path: str) -> str | None:
    """The class path to write instead of `class_path`, or None when it has not moved."""
    if class_path in MOVED_CLASSES:
        return MOVED_CLASSES[class_path]
    for old, new in MOVED_MODULES.items():
        if class_path.startswith(old + "."):
            return f"{new}.{class_path.rpartition('.')[2]}"
    return None


def _class_paths(tree: Any, key: str = "") -> list[tuple[str, str]]:
    """(key path, value) of every class_path in a config tree."""
    found: list[tuple[str, str]] = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            path = f"{key}.{k}" if key else str(k)
            if k == "class_path" and isinstance(v, str):
                found.append((path, v))
            else:
                found += _class_paths(v, path)
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            found += _class_paths(v, f"{key}.{i}")
    return found


def check_moved_class_paths(trees: list[tuple[str, Any]], args: list[str]) -> None:
    """Refuse class paths of modules that moved, in config files (`(file, tree)`) and on the command line.

    Raises:
        UsageError: one block listing each old path, where it is given and what to write instead.
    """
    given = [(f"{where}: {key}", value) for where, tree in trees for key, value in _class_paths(tree)]
    for i, a in enumerate(args):  # `--model.class_path X`, `--model X`, `--trainer.callbacks+=X`, `--x=X`
        name, eq, value = a.partition("=")
        if a.startswith("--") and not eq and i + 1 < len(args):
            value = args[i + 1]
        if a.startswith("--") and isinstance(value, str) and value.startswith("wslight."):
            given.append((f"the command line: {name}", value))
    moved = [(where, old, moved_class_path(old)) for where, old in given if moved_class_path(old)]
    if moved:
        lines = "; ".join(f"{where} = {old}: write {new}" for where, old, new in moved)
        raise UsageError(
            f"{lines} (the LightningModules, callbacks, evaluations and the DataModule moved to wslight.tasks; "
            "nothing else in the config changes)"
        )


# The search settings the two word-sensitivity sweeps took one by one -> their field of `search:`
MOVED_SEARCH_KEYS = {
    "restarts": "chains_per_round",
    "max_chains": "max_chains",
    "gain_tol": "gain_tol",
    "max_steps": "max_steps",
    "tol": "tol",
    "window": "window",
    "radius_scale": "radius_scale",
}
SEARCH_SWEEPS = ("WordSensitivitySweep", "WordSubstitutionSweep")


def check_moved_search_keys(trees: list[tuple[str, Any]], args: list[str]) -> None:
    """Refuse a search setting of a word-sensitivity sweep at its old place, in a config file or on the command line.

    Raises:
        UsageError: one block naming each old key, where it is given and the key to write instead.
    """
    classes = [v for _, tree in trees for k, v in _class_paths(tree) if k == "model.class_path"]
    classes += [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--model", "--model.class_path")]
    if not classes or classes[-1].rpartition(".")[2] not in SEARCH_SWEEPS:
        return  # the attack keeps its own `restarts`
    given = []
    for where, tree in trees:
        init = ((tree or {}).get("model") or {}).get("init_args") or {} if isinstance(tree, dict) else {}
        given += [(where, k) for k in init if k in MOVED_SEARCH_KEYS]
    for a in args:
        key = a.partition("=")[0].removeprefix("--model.").removeprefix("init_args.")
        if a.startswith("--model.") and key in MOVED_SEARCH_KEYS:
            given.append(("the command line", key))
    if given:
        lines = "; ".join(
            f"{where}: model.init_args.{key}: write model.init_args.search.{MOVED_SEARCH_KEYS[key]}"
            for where, key in given
        )
        raise UsageError(
            f"{lines} (the search's settings are one block, `search: {{chains_per_round: ..., max_chains: ...}}`, "
            "and `restarts` is `chains_per_round`; see `wslight evaluate --config ws/raf --help`)"
        )
