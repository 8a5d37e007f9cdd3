"""The grid both word-sensitivity sweeps walk: maps x d x n (x depth L), `trials` trials a cell.

And the settings of the word-sensitivity search they run in each trial (one `SearchSettings`, taken whole).
"""

from __future__ import annotations

from typing import Any

from ..base import validate
from ..data.encoders import HubUnreachableError
from ..features import FeatureMap, resolve_maps
from ..search.settings import GENERIC_DEFAULTS, SearchSettings, family_defaults
from .evaluation import EmbeddingsEvaluation


class MapGridEvaluation(EmbeddingsEvaluation):
    """An evaluation over the cells (map, d, n, L), each with `trials` trials keyed `<map>/d<d>/n<n>/L<L>/t<trial>`.

    A step batches trials of one cell. Subclasses call `set_grid` and `set_search` from their constructor.
    """

    def set_grid(
        self,
        maps: list[str | dict[str, Any]],
        d_values: list[int],
        n_values: list[int],
        depths: list[int] | None,
        trials: int,
        rf_width_ratio: float,
    ) -> None:
        """Check and keep the grid (each bad value named by its key)."""
        # record name -> class and init_args, repeats dropped (order kept)
        self.map_entries = {e.name: e for e in resolve_maps(maps, "maps")}
        self.maps = list(self.map_entries)
        self.d_values = validate.int_list("d_values", d_values)
        for entry in self.map_entries.values():  # a width a map cannot take: now, not at its first cell
            cls = entry.cls
            if not issubclass(cls, FeatureMap):
                continue
            for d in self.d_values:
                try:
                    cls.check_width(entry.init_args, d)
                except ValueError as err:
                    raise ValueError(f"d_values: {err} (map {entry.name})") from None
                except HubUnreachableError as err:  # the map's own encoder, not the embeddings'
                    raise HubUnreachableError(f"maps: {entry.name}: {err}") from None
        self.n_values = validate.int_list("n_values", n_values)
        self.depths = validate.int_list("depths", depths if depths is not None else [2])
        self.trials = validate.positive_int("trials", trials)
        self.rf_width_ratio = validate.number("rf_width_ratio", rf_width_ratio, low=0, strict=True)

    def set_search(self, search: SearchSettings | None) -> None:
        """Keep the search's settings (None: every map at its family's defaults), checked with each map's defaults.

        A field the config leaves unset takes each map's family default: a setting that contradicts one of them
        (max_chains below a family's chains_per_round) is refused now, naming the map, not when its cell runs.
        """
        self.search = search if search is not None else SearchSettings()
        for entry in self.map_entries.values():
            try:
                self.search.resolved(family_defaults(entry.cls))
            except ValueError as err:
                raise ValueError(f"{err} (map {entry.name})") from None

    def radius(self, d: int) -> float:
        """The search's radius in a cell of dimension d: radius_scale sqrt(d) (the generic scale, 1, when unset)."""
        return (self.search.radius_scale or GENERIC_DEFAULTS["radius_scale"]) * d**0.5

    def takes_depth(self, m: str) -> bool:
        """True when map `m` has a depth (its constructor takes `depth`): the sweep crosses `depths`."""
        entry = self.map_entries.get(m)
        return entry is not None and entry.takes("depth")

    def cells(self) -> list[tuple[str, int, int, int]]:
        """(map, d, n, L) for every cell, in sweep order."""
        out = []
        for m in self.maps:
            for L in self.depths if self.takes_depth(m) else [1]:
                out += [(m, d, n, L) for d in self.d_values for n in self.n_values]
        return out

    def trial_specs(self) -> list[dict]:
        """Every trial of the grid, cell by cell, keyed `<map>/d<d>/n<n>/L<L>/t<trial>`."""
        return [
            {"trial_key": f"{m}/d{d}/n{n}/L{L}/t{t}", "map": m, "d": d, "n": n, "L": L, "trial": t}
            for (m, d, n, L) in self.cells()
            for t in range(self.trials)
        ]

    def batch_key(self, spec: dict) -> tuple:
        """A step batches trials of one cell (map, d, n, L)."""
        return spec["map"], spec["d"], spec["n"], spec["L"]
