"""Names that moved, so that a config saved before the move gets one block saying exactly what to write instead.

Every LightningModule, callback, evaluation and the DataModule now live in `wslight.tasks` (the Lightning floor); a
config that names their old modules (`wslight.evaluations.WordSensitivitySweep`, `wslight.models.FeatureMapClassifier`,
`wslight.callbacks.DeltaAttack`, `wslight.data.EmbeddingDataModule`) is refused before anything runs.
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
