"""The grid of the word-sensitivity sweeps, written, checked and documented once: maps x d x n (x depth L), trials.

`GridSettings` travels whole from a sweep's YAML (`model.init_args.grid: {maps: [...], d_values: [...], ...}`) or a
notebook call (`WordSensitivitySweep(grid=GridSettings(maps=["raf"], d_values=[64], n_values=[10, 20]))`) to the
evaluation, which walks its cells (`MapGridEvaluation`). The embeddings the cells read are no part of it: every
evaluation that reads token embeddings takes them as its own `embeddings:` block, grid or not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from ..base import validate
from ..data.encoders import HubUnreachableError
from ..features import FeatureMap, MapEntry, resolve_maps

# The depth L of the maps that have one when the grid names none (the paper's DeepRF)
DEFAULT_DEPTH = 2


@dataclass(frozen=True)
class GridSettings:
    """Which cells a sweep runs: every map x d x n (x depth L of the maps that have one), `trials` trials a cell.

    A given value is checked here, once, with a ValueError naming the field; so is a width d a map cannot take
    (before any cell runs). A trial of a cell is keyed `<map>/d<d>/n<n>/L<L>/t<trial>` in results.jsonl.

    Args:
        maps: which maps to sweep: registered names ("rf", "deep_rf", "raf", "relu_raf", or any map added with
            `wslight.features.register_map`), dotted import paths of map classes (`mymap.MyMap`) or
            `{class_path: mymap.MyMap, init_args: {...}}` (init_args: further constructor arguments, recorded as
            `map_args`). Records carry the registered name of the class when it has one, else the path as written;
            an entry given twice is swept once.
        d_values: embedding dimensions (the first d coordinates of each token), each once.
        n_values: context lengths (the first n tokens), each once.
        depths: depths L of the maps that have one ("deep_rf"), each once; other maps record L = 1 (None: [2]).
        trials: independent trials per cell (>= 1).
        rf_width_ratio: RF neurons k = ratio * n d (the paper: 1, i.e. k = D; > 0); DeepRF widths likewise.
    """

    maps: list[str | dict[str, Any]]
    d_values: list[int]
    n_values: list[int]
    depths: list[int] | None = None
    trials: int = 10
    rf_width_ratio: float = 1.0

    def __post_init__(self) -> None:
        self.map_entries  # noqa: B018  (resolved now: a bad entry is refused before any cell runs)
        object.__setattr__(self, "d_values", validate.int_list("d_values", self.d_values))
        self._check_widths()
        object.__setattr__(self, "n_values", validate.int_list("n_values", self.n_values))
        if self.depths is not None:
            object.__setattr__(self, "depths", validate.int_list("depths", self.depths))
        object.__setattr__(self, "trials", validate.positive_int("trials", self.trials))
        ratio = validate.number("rf_width_ratio", self.rf_width_ratio, low=0, strict=True)
        object.__setattr__(self, "rf_width_ratio", ratio)

    @cached_property
    def map_entries(self) -> dict[str, MapEntry]:
        """Record name -> the map's class and init_args (`wslight.features.MapEntry`), repeats dropped, order kept."""
        return {e.name: e for e in resolve_maps(self.maps, "maps")}

    def _check_widths(self) -> None:
        """Refuse a width d a map cannot take now, not at its first cell."""
        for entry in self.map_entries.values():
            if not issubclass(entry.cls, FeatureMap):
                continue
            for d in self.d_values:
                try:
                    entry.cls.check_width(entry.init_args, d)
                except ValueError as err:
                    raise ValueError(f"d_values: {err} (map {entry.name})") from None
                except HubUnreachableError as err:  # the map's own encoder, not the embeddings'
                    raise HubUnreachableError(f"maps: {entry.name}: {err}") from None

    def takes_depth(self, m: str) -> bool:
        """True when map `m` has a depth (its constructor takes `depth`): the grid crosses `depths`."""
        entry = self.map_entries.get(m)
        return entry is not None and entry.takes("depth")

    def depths_of(self, m: str) -> list[int]:
        """The depths L map `m` runs at: `depths` (None: [2]) for a map with a depth, else [1]."""
        if not self.takes_depth(m):
            return [1]
        return [DEFAULT_DEPTH] if self.depths is None else self.depths

    def cells(self) -> list[tuple[str, int, int, int]]:
        """(map, d, n, L) for every cell, in sweep order: by map, then depth, d and n."""
        out = []
        for m in self.map_entries:
            for L in self.depths_of(m):
                out += [(m, d, n, L) for d in self.d_values for n in self.n_values]
        return out

    def replace(self, **changes: Any) -> GridSettings:
        """This grid with some fields changed (an unknown name is refused, naming the closest field)."""
        validate.known_names("a grid setting", changes, [f.name for f in fields(self)])
        return dataclasses.replace(self, **changes)

    def given(self) -> dict[str, Any]:
        """The fields that differ from their defaults (the required ones always): what a config states."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default
        }
