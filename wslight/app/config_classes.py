"""The classes a config's `model.class_path` may name: the evaluations and the training modules.

A config or the command line names one by its short name (`WordSensitivitySweep`) or by a dotted import path
(`wslight.tasks.WordSensitivitySweep`, as the shipped configs write it).
"""

from __future__ import annotations

import importlib
import inspect

import lightning.pytorch as pl

from ..tasks import Evaluation
from ..tasks import classifier as models
from .errors import UsageError


def evaluation_classes() -> list[type]:
    """The evaluations run by `evaluate`: the Evaluation subclasses of `wslight.tasks` that no class there extends.

    The bases EmbeddingsEvaluation, MapGridEvaluation and the probes' base are left out.
    """

    def subclasses(cls: type) -> list[type]:
        found: list[type] = []
        direct: list[type] = cls.__subclasses__()
        for sub in direct:
            found += [sub, *subclasses(sub)]
        return found

    ours = [c for c in subclasses(Evaluation) if c.__module__.startswith("wslight.tasks")]
    leaves = {c for c in ours if not c.__name__.startswith("_") and not any(c in o.__bases__ for o in ours)}
    return sorted(leaves, key=lambda c: (c.__module__, c.__name__))


def training_classes() -> list[type]:
    """The LightningModules of `wslight.tasks.classifier` (the heads `fit` trains)."""
    found = [c for _, c in inspect.getmembers(models, inspect.isclass) if c.__module__ == models.__name__]
    return [c for c in found if issubclass(c, pl.LightningModule)]


def dotted_path(cls: type) -> str:
    """The package's public path of a class where it exports the class, else the defining module's.

    For example `wslight.tasks.WordSensitivitySweep`, as the shipped configs write it.
    """
    package = cls.__module__.rpartition(".")[0]
    if package and getattr(importlib.import_module(package), cls.__name__, None) is cls:
        return f"{package}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__name__}"


def model_classes() -> dict[str, type]:
    """Short name -> class of every module a config's `model.class_path` may name by its short name."""
    return {c.__name__: c for c in (*evaluation_classes(), *training_classes())}


def short_class(name: str, key: str) -> type:
    """The class of `model_classes` named `name` (the value of `key`).

    Raises:
        UsageError: no such class; one line that lists the known short names.
    """
    classes = model_classes()
    if name not in classes:
        raise UsageError(f"{key} {name}: no class of that name; known: {', '.join(classes)} (or a dotted import path)")
    return classes[name]


def import_class(class_path: str) -> type:
    """The class a `class_path` names: a short name of `model_classes`, or a dotted import path.

    Raises:
        UsageError: an unknown short name (the message lists the known ones), or a path that does not import.
    """
    if "." not in class_path:
        return short_class(class_path, "model.class_path")
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise UsageError(f"model.class_path {class_path}: cannot import it ({err})") from err
    if not inspect.isclass(cls):
        raise UsageError(f"model.class_path {class_path}: not a class")
    return cls
