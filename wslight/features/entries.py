"""A sweep's `maps` entries: a registered name, a dotted import path or a `{class_path, init_args}` dict.

`resolve_map` turns one into a `MapEntry` (its record name, class and init_args) before any work, with an error naming
the key, the entry and why; `MapEntry.build` makes the map of a cell.
"""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from ..base import validate
from .base import CELL_ARGS, MAPS, FeatureMap, make_map, map_class


@dataclass(frozen=True)
class MapEntry:
    """One entry of a sweep's `maps`, resolved by `resolve_map`.

    Attributes:
        name: the name its records carry (`map`): the registered name of the class when it has one, else the dotted
            path as written.
        cls: the map class.
        init_args: further constructor arguments (the `init_args` of a `{class_path, init_args}` entry).
    """

    name: str
    cls: type[nn.Module]
    init_args: dict[str, Any] = field(default_factory=dict)

    @property
    def by_name(self) -> bool:
        """A registered map without init_args: `FreshMaps` draws it by name (RF and DeepRF from their law)."""
        return MAPS.get(self.name) is self.cls and not self.init_args

    @property
    def record_fields(self) -> dict[str, Any]:
        """Extra results fields: `map_args` (the init_args) for an entry with init_args, else none."""
        return {"map_args": dict(self.init_args)} if self.init_args else {}

    def takes(self, arg: str) -> bool:
        """Whether the constructor takes `arg` (e.g. "depth": the sweep crosses its `depths`)."""
        return arg in inspect.signature(self.cls.__init__).parameters

    def build(self, n: int, d: int, seed: int = 0, **kwargs: Any) -> nn.Module:
        """The map for n tokens of dimension d (`make_map` with the entry's init_args)."""
        return make_map(self.cls, n, d, seed, **kwargs, **self.init_args)


def resolve_map(entry: Any, key: str = "maps", place: str | None = None) -> MapEntry:
    """A sweep's map entry: a registered name, a dotted import path or a `{class_path, init_args}` dict.

    A dotted path `module.Class` is imported as LightningCLI imports a `class_path`; importing the module also runs its
    `@register_map` decorators. The class must be a `FeatureMap` subclass or an `nn.Module` whose required constructor
    arguments make_map gives (n, d, seed, depth, dtype) or init_args does. Records carry the class's registered name
    when it has one (`wslight.features.RandomAttentionFeatures` is "raf"), else the path as written.

    Args:
        entry: the entry as written in the config.
        key: the config key, named in errors.
        place: the entry's own key path (`maps[1]`), named in errors about its init_args' values; default `key`.

    Raises:
        ValueError: `<key>: <entry>: <why>` for a name that is not registered, a module that does not import, a
            missing attribute, something that is not a map class, or init_args its constructor does not take;
            `<place>.init_args.<arg> ...` for a value the constructor would refuse (a Literal's other value, or the
            class's `check_init_args`).
    """
    init_args: dict[str, Any] = {}
    if isinstance(entry, dict):
        extra = sorted(set(entry) - {"class_path", "init_args"})
        path, init_args = entry.get("class_path"), entry.get("init_args") or {}
        if extra or not isinstance(path, str) or not isinstance(init_args, dict):
            raise ValueError(
                f"{key}: {entry!r}: a dict entry takes class_path (a dotted path or a registered name) and optionally "
                f"init_args (a dict){f', got {extra[0]!r}' if extra else ''}"
            )
    elif isinstance(entry, str):
        path = entry
    else:
        raise ValueError(f"{key}: {entry!r}: expected a map name, a dotted path module.Class or a class_path dict")
    cls = map_class(path, entry, key)
    _check_init_args(cls, init_args, entry, key)
    try:  # the values, before any cell is built (a run would otherwise stop at the first cell of this map)
        _check_literal_args(cls, init_args)
        if issubclass(cls, FeatureMap):
            cls.check_init_args(init_args)
    except ValueError as err:
        raise ValueError(f"{place or key}.init_args.{err}") from None
    name = getattr(cls, "map_name", "")
    return MapEntry(name if name and MAPS.get(name) is cls else path, cls, dict(init_args))


def resolve_maps(entries: Any, key: str = "maps") -> list[MapEntry]:
    """Every entry of a non-empty list resolved (`resolve_map`), in order.

    Two different maps under one record name are refused (the records could not tell them apart).
    """
    if isinstance(entries, (str, dict)) or not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError(f"{key} must be a non-empty list of values in {sorted(MAPS)} or dotted paths, got {entries!r}")
    out = [resolve_map(entry, key, _entry_place(key, i)) for i, entry in enumerate(entries)]
    named: dict[str, MapEntry] = {}
    for entry, resolved in zip(entries, out):
        if named.setdefault(resolved.name, resolved) != resolved:
            raise ValueError(
                f"{key}: {entry!r}: another entry also records as map {resolved.name!r}; sweep it in a separate run"
            )
    return out


def _entry_place(key: str, i: int) -> str:
    """The key path of entry i of a list: `maps[1]` for key `maps`, `cases[1].map` for key `cases.map`."""
    head, dot, rest = key.partition(".")
    return f"{head}[{i}]{dot}{rest}"


def _check_literal_args(cls: type, init_args: dict[str, Any]) -> None:
    """Refuse an init_args value outside the choices the constructor's annotation lists (a Literal)."""
    try:
        hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]  # the class's own constructor
    except Exception:  # an annotation that does not resolve here: the constructor checks its value
        return
    for name, value in init_args.items():
        allowed = _literal_values(hints.get(name))
        if allowed is not None:
            validate.choice(name, value, allowed)


def _literal_values(hint: Any) -> list[Any] | None:
    """The values a `Literal[...]` (or `Literal[...] | None`) annotation allows; None for any other annotation."""
    if typing.get_origin(hint) is Literal:
        return list(typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        parts = typing.get_args(hint)
        if all(p is type(None) or typing.get_origin(p) is Literal for p in parts):
            return [v for p in parts for v in (typing.get_args(p) if p is not type(None) else (None,))]
    return None


def _check_init_args(cls: type, init_args: dict[str, Any], entry: Any, key: str) -> None:
    """Refuse init_args the constructor does not take or the sweep sets, and required arguments nobody gives."""
    params = inspect.signature(cls).parameters  # the constructor's, without self
    kinds = {p.kind for p in params.values()}
    swept = sorted(set(init_args) & {*CELL_ARGS, "width_ratio", "device"})
    if swept:
        raise ValueError(f"{key}: {entry!r}: init_args {swept[0]!r} is set by the sweep")
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        unknown = [k for k in init_args if k not in params]
        if unknown:
            raise ValueError(f"{key}: {entry!r}: {cls.__qualname__}() takes no argument {unknown[0]!r}")
    # FeatureMap's default for_cell (and any plain module) passes only CELL_ARGS; a map's own for_cell fills the rest
    if next((c for c in cls.__mro__ if "for_cell" in vars(c)), FeatureMap) is FeatureMap:
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        needed = [
            k
            for k, p in params.items()
            if p.kind in named and p.default is p.empty and k not in (*CELL_ARGS, *init_args)
        ]
        if needed:
            raise ValueError(
                f"{key}: {entry!r}: {cls.__qualname__}() needs {needed[0]!r}, which the sweep does not give (it gives "
                f"{', '.join(CELL_ARGS)}); give it a default or set it in init_args"
            )
