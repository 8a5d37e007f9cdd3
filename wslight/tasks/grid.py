"""The evaluation over the grid both word-sensitivity sweeps walk (`GridSettings`: maps x d x n x L, trials a cell).

And the settings of the word-sensitivity search they run in each trial (one `SearchSettings`, taken whole).
"""

from __future__ import annotations

from ..chains.settings import SearchSettings
from ..features import family_defaults
from .embeddings_evaluation import EmbeddingsEvaluation
from .grid_settings import GridSettings


class MapGridEvaluation(EmbeddingsEvaluation):
    """An evaluation over the cells (map, d, n, L), each with `trials` trials keyed `<map>/d<d>/n<n>/L<L>/t<trial>`.

    A step batches trials of one cell. Subclasses call `set_grid` and `set_search` from their constructor; the grid
    stays whole in `self.grid` (its cells, maps and trials are read there).
    """

    maps_key = "model.init_args.grid.maps"

    def set_grid(self, grid: GridSettings) -> None:
        """Keep the grid whole (checked by `GridSettings` itself) as `self.grid`."""
        if not isinstance(grid, GridSettings):
            raise ValueError(f"grid must be a GridSettings (maps, d_values, n_values, ...), got {grid!r}")
        self.grid = grid

    def set_search(self, search: SearchSettings | None) -> None:
        """Keep the search's settings (None: every map at its family's defaults), checked with each map's defaults.

        A field the config leaves unset takes each map's family default: a setting that contradicts one of them
        (max_chains below a family's chains_per_round) is refused now, naming the map, not when its cell runs.
        """
        self.search = search if search is not None else SearchSettings()
        for entry in self.grid.map_entries.values():
            try:
                self.search.resolved(family_defaults(entry.cls))
            except ValueError as err:
                raise ValueError(f"{err} (map {entry.name})") from None

    def radius(self, m: str, d: int) -> float:
        """The search's radius for map `m` in a cell of dimension d.

        The search's one rule (`ResolvedSearch.radius`) with the map family's defaults, as `word_sensitivity` has it.
        """
        return self.search.resolved(family_defaults(self.grid.map_entries[m].cls)).radius(d)

    def trial_specs(self) -> list[dict]:
        """Every trial of the grid, cell by cell, keyed `<map>/d<d>/n<n>/L<L>/t<trial>`."""
        return [
            {"trial_key": f"{m}/d{d}/n{n}/L{L}/t{t}", "map": m, "d": d, "n": n, "L": L, "trial": t}
            for (m, d, n, L) in self.grid.cells()
            for t in range(self.grid.trials)
        ]

    def batch_key(self, spec: dict) -> tuple:
        """A step batches trials of one cell (map, d, n, L)."""
        return spec["map"], spec["d"], spec["n"], spec["L"]
