"""Names that moved, so that a config saved before the move gets one block saying exactly what to write instead.

Every LightningModule, callback, evaluation and the DataModule now live in `wslight.tasks` (the Lightning floor); a
config that names their old modules (`wslight.evaluations.WordSensitivitySweep`, `wslight.models.FeatureMapClassifier`,
`wslight.callbacks.DeltaAttack`, `wslight.data.EmbeddingDataModule`) or a module of wslight.tasks that was renamed
(`wslight.tasks.ws_sweep.WordSensitivitySweep`), or a class renamed (the callback `DeltaAttack`, now
`DeltaAttackCallback` beside the function `delta_attack`) is refused before anything runs. So is a
word-sensitivity sweep's search setting written at its old place (`model.init_args.restarts`): the settings are one
`search:` block now, and `restarts` is `chains_per_round`; so is its grid (`model.init_args.d_values`), one `grid:`
block now (`model.init_args.grid.d_values`). So is an attack setting of the Delta-attack sweep or callback
at its old place (`model.init_args.steps`, `trainer.callbacks.<i>.init_args.restarts`): they are one `attack:` block,
and the callback's `penalty` is `penalties`.
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
    # the sweep modules named after what they do (their classes are imported from wslight.tasks, as before)
    "wslight.tasks.ws_sweep": "wslight.tasks",
    "wslight.tasks.words_sweep": "wslight.tasks",
    "wslight.tasks.head_words_callback": "wslight.tasks",
    "wslight.tasks.head_words": "wslight.tasks",
}
MOVED_CLASSES = {
    "wslight.data.EmbeddingDataModule": "wslight.tasks.EmbeddingDataModule",
    # the callback, named apart from the function `wslight.attack.delta_attack` it runs
    "wslight.tasks.DeltaAttack": "wslight.tasks.DeltaAttackCallback",
    "wslight.tasks.attack_callback.DeltaAttack": "wslight.tasks.DeltaAttackCallback",
    "DeltaAttack": "wslight.tasks.DeltaAttackCallback",
}


def moved_class_path(class_path: str) -> str | None:
    """The class path to write instead of `class_path`, or None when it has not moved."""
    if class_path in MOVED_CLASSES:
        return MOVED_CLASSES[class_path]
    for old, new in MOVED_MODULES.items():
        if class_path.startswith(old + "."):
            moved = f"{new}.{class_path.rpartition('.')[2]}"
            return MOVED_CLASSES.get(moved, moved)  # a class renamed since its module moved
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
            f"{lines} (the LightningModules, callbacks, evaluations and the DataModule are imported from wslight.tasks)"
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


def _model_keys(trees: list[tuple[str, Any]], args: list[str], keys: Any) -> list[tuple[str, str]]:
    """(where, key) of each of `keys` given under model.init_args, in a config file or on the command line."""
    given: list[tuple[str, str]] = []
    for where, tree in trees:
        init = ((tree or {}).get("model") or {}).get("init_args") or {} if isinstance(tree, dict) else {}
        given += [(where, k) for k in init if k in keys]
    for a in args:
        key = a.partition("=")[0].removeprefix("--model.").removeprefix("init_args.")
        if a.startswith("--model.") and key in keys:
            given.append(("the command line", key))
    return given


# The grid the two word-sensitivity sweeps took one by one -> its field of `grid:` (GridSettings)
MOVED_GRID_KEYS = {key: f"grid.{key}" for key in ("maps", "d_values", "n_values", "depths", "trials", "rf_width_ratio")}
# Every setting of those sweeps at its old place -> its key under model.init_args now
MOVED_SWEEP_KEYS = {**{k: f"search.{v}" for k, v in MOVED_SEARCH_KEYS.items()}, **MOVED_GRID_KEYS}


def check_moved_sweep_keys(trees: list[tuple[str, Any]], args: list[str]) -> None:
    """Refuse a search or grid setting of a word-sensitivity sweep at its old place (config file or command line).

    The search's settings are one `search:` block (`restarts` is `chains_per_round`), and the grid (maps, d_values,
    n_values, depths, trials, rf_width_ratio) one `grid:` block: both named in one block.

    Raises:
        UsageError: one block naming each old key, where it is given and the key to write instead.
    """
    if _model_class(trees, args) not in SEARCH_SWEEPS:
        return  # another evaluation's `restarts` or `trials` (the attack's: `check_moved_attack_keys`)
    given = _model_keys(trees, args, MOVED_SWEEP_KEYS)
    if not given:
        return
    lines = "; ".join(
        f"{where}: model.init_args.{key}: write model.init_args.{MOVED_SWEEP_KEYS[key]}" for where, key in given
    )
    blocks = []
    if any(key in MOVED_SEARCH_KEYS for _, key in given):
        blocks.append(
            "the search's settings are one block, `search: {chains_per_round: ..., max_chains: ...}`, and `restarts` "
            "is `chains_per_round`"
        )
    if any(key in MOVED_GRID_KEYS for _, key in given):
        blocks.append("the grid is one block, `grid: {maps: [...], d_values: [...], n_values: [...], trials: ...}`")
    raise UsageError(f"{lines} ({'; '.join(blocks)}; see `wslight evaluate --config ws/raf --help`)")


# The attack settings the Delta-attack sweep and callback took one by one -> their field of `attack:`
MOVED_ATTACK_KEYS = {key: f"attack.{key}" for key in ("steps", "restarts", "faithful", "position")}
# ... and the callback's one penalty weight -> the list of the sweep's name
MOVED_CALLBACK_KEYS = {**MOVED_ATTACK_KEYS, "penalty": "penalties"}


def _model_class(trees: list[tuple[str, Any]], args: list[str]) -> str:
    """The short name of the model class the command line runs ("" when none is named)."""
    classes = [v for _, tree in trees for k, v in _class_paths(tree) if k == "model.class_path"]
    classes += [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--model", "--model.class_path")]
    return classes[-1].rpartition(".")[2] if classes else ""


def _sweep_attack_keys(trees: list[tuple[str, Any]], args: list[str]) -> list[tuple[str, str, str]]:
    """(where, old key, new key) of the Delta-attack sweep's attack settings at their old place."""
    given = _model_keys(trees, args, MOVED_ATTACK_KEYS)
    return [(where, f"model.init_args.{k}", f"model.init_args.{MOVED_ATTACK_KEYS[k]}") for where, k in given]


# The Delta-attack callback's names, its old one included (its settings at their old place are named either way)
CALLBACK_NAMES = ("DeltaAttackCallback", "DeltaAttack")


def _callback_attack_keys(trees: list[tuple[str, Any]], args: list[str]) -> list[tuple[str, str, str]]:
    """(where, old key, new key) of the `DeltaAttackCallback`'s attack settings (and `penalty`) at their old place."""
    found: list[tuple[str, str, str]] = []
    attacked = False
    for where, tree in trees:
        trainer = (tree or {}).get("trainer") or {} if isinstance(tree, dict) else {}
        callbacks = trainer.get("callbacks") if isinstance(trainer, dict) else None
        for i, cb in enumerate(callbacks if isinstance(callbacks, list) else []):
            if not isinstance(cb, dict) or str(cb.get("class_path", "")).rpartition(".")[2] not in CALLBACK_NAMES:
                continue
            attacked = True
            old = [k for k in cb.get("init_args") or {} if k in MOVED_CALLBACK_KEYS]
            place = f"trainer.callbacks.{i}.init_args"
            found += [(where, f"{place}.{k}", f"{place}.{MOVED_CALLBACK_KEYS[k]}") for k in old]
    attacked = attacked or any(
        a.endswith(CALLBACK_NAMES) for a in args
    )  # `--trainer.callbacks+=...DeltaAttackCallback`
    for a in args if attacked else []:
        key = a.partition("=")[0].removeprefix("--trainer.callbacks.").removeprefix("init_args.")
        if a.startswith("--trainer.callbacks.") and key in MOVED_CALLBACK_KEYS:
            place = "trainer.callbacks.init_args"
            found.append(("the command line", f"{place}.{key}", f"{place}.{MOVED_CALLBACK_KEYS[key]}"))
    return found


def check_moved_attack_keys(trees: list[tuple[str, Any]], args: list[str]) -> None:
    """Refuse an attack setting of the Delta-attack sweep or callback at its old place (config or command line).

    The sweep's and the callback's `steps`, `restarts`, `faithful` and `position` are one `attack:` block
    (`AttackSettings`) now, and the callback's `penalty` is `penalties`, a list, as the sweep's.

    Raises:
        UsageError: one block naming each old key, where it is given and the key to write instead.
    """
    found = _sweep_attack_keys(trees, args) if _model_class(trees, args) == "DeltaAttackSweep" else []
    found += _callback_attack_keys(trees, args)
    if found:
        lines = "; ".join(f"{where}: {old}: write {new}" for where, old, new in found)
        penalty = (
            ", and the callback's `penalty` is `penalties: [...]`"
            if any(o.endswith("penalty") for _, o, _ in found)
            else ""
        )
        raise UsageError(
            f"{lines} (the attack's settings are one block, `attack: {{steps: ..., restarts: ..., faithful: ..., "
            f"position: ...}}`{penalty}; see `wslight evaluate --config attack/fig4 --help`)"
        )
