"""The word-sensitivity sweep run by `evaluate.py`: S over map x d x n x L x trials (Figures 2-3)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Literal

import torch

from ..base import validate
from ..base.seeding import derive_seed, generator
from ..chains.settings import SearchSettings
from ..data import EmbeddingSpec
from ..features import trial_maps
from ..records.summary import cell_table, markdown_table, nonfinite, trusted, write_summary
from ..search.sensitivity import word_sensitivity
from .grid import MapGridEvaluation
from .grid_settings import GridSettings

# Maps whose S the paper proves to decay as 1/sqrt(n): their S sqrt(n) figure shows that law as a flat line.
SQRT_N_MAPS = ("rf", "deep_rf")


class WordSensitivitySweep(MapGridEvaluation):
    """Word sensitivity of random feature maps on token embeddings, over a grid (docs/theory/search.md §4, Figures 2-3).

    One trial = one sample drawn at random from the embeddings (seeded by `seed` and the trial index, so trial t uses
    the same review in every cell) and, by default, a fresh random map (seeded by `seed`, the cell and the trial):
    the paper's "independent trials". Each trial records the stable results.jsonl fields (README, "Evaluations":
    experiment="ws", map, d, n, L, trial, sample_id, position, ws, delta_norm, phi_norm, steps, seed: the sweep's
    seed) plus the search's evidence `chains` and `near_best` (docs/theory/search.md §4.3), plus `map_seed` (the
    seed of the trial's map), `radius`, `bound` (RF: the operator-norm bound of docs/theory/checks.md §8.3 at the
    realised ||Delta||), `ws_sqrt_n` and `nonfinite` (a flag: S is not a finite number, e.g. phi(X) = 0 for a ReLU-RAF
    sample whose scores are all <= 0; such records are left out of the summary).

    Args:
        grid: the cells and their trials (`GridSettings`: maps, d_values, n_values, depths, trials, rf_width_ratio).
        embeddings: where the token embeddings come from (source, encoder, layer, number of reviews, seed).
        positions: "first" (token 0, the paper's figures), "all" (the true sup over i) or a list of token indices.
        search: the word-sensitivity search's settings (`wslight.search.SearchSettings`: chains_per_round,
            max_chains, gain_tol, max_steps, tol, window, radius_scale...), taken whole by every trial's search; a
            field left unset takes each map's family default (its class's `search_defaults`, the settings its
            shipped config was measured with), else the generic one (docs/theory/search.md §4.3).
        shared_weights: False (the paper): a fresh map per trial; True: one map per cell shared by its trials, which
            batches the trials of a cell in one search.
        dtype: working dtype of the maps and the search.
        seed: the sweep's seed (samples, maps, the searches' random starts).
        trials_per_step: trials per test step (sharded over devices by Lightning).
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    def __init__(
        self,
        grid: GridSettings,
        embeddings: EmbeddingSpec | None = None,
        positions: Literal["first", "all"] | list[int] = "first",
        search: SearchSettings | None = None,
        shared_weights: bool = False,
        dtype: Literal["float32", "float64"] = "float32",
        seed: int = 0,
        trials_per_step: int = 1,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(trials_per_step, output_dir)
        self.set_grid(grid)
        self.set_search(search)
        validate.dtype("dtype", dtype)
        self.seed = validate.integer("seed", seed, low=0)
        self.set_embeddings(
            embeddings, "grid.d_values", max(self.grid.d_values), "grid.n_values", max(self.grid.n_values)
        )
        validate.positions("positions", positions, min(self.grid.n_values))  # indices against the smallest n
        validate.note_repeats("positions", positions)
        self.positions, self.shared_weights, self.map_dtype = positions, shared_weights, dtype
        self._last_map: tuple[int | None, Any] = (None, None)

    # --- the grid (MapGridEvaluation: cells, trial_specs, batch_key) -----------------------------------------------
    def sample_index(self, trial: int) -> int:
        """Which embedded review trial `trial` uses (the same in every cell)."""
        return int(torch.randint(len(self.store), (1,), generator=generator(self.seed, "ws.sample", trial)))

    # --- the work ---------------------------------------------------------------------------------------------------
    def map_seed(self, m: str, d: int, n: int, L: int, trial: int | None) -> int:
        """The seed of a trial's map (trial None: the cell's shared map)."""
        return derive_seed(self.seed, "ws.map", m, d, n, L, -1 if trial is None else trial)

    def cell_map(self, m: str, d: int, n: int, L: int, map_seed: int) -> torch.nn.Module:
        """The shared map of a cell on this device, reused by the cell's next trials."""
        if self._last_map[0] != map_seed:
            fmap = self.grid.map_entries[m].build(
                n, d, map_seed, depth=L, width_ratio=self.grid.rf_width_ratio, dtype=self.map_dtype
            )
            self._last_map = (map_seed, fmap.to(self.device))
        return self._last_map[1]

    def run_trials(self, specs: list[dict]) -> list[dict]:
        """One search for the step's trials (one cell).

        A fresh map per trial (FreshMaps for a registered map), or the cell's shared map.
        """
        start = time.perf_counter()
        m, d, n, L = self.batch_key(specs[0])
        index = [self.sample_index(s["trial"]) for s in specs]
        X, _ = self.store.samples(index, n, d)  # (T, n, d): one sample per trial
        X = X.to(self.device)
        if self.shared_weights:  # the trials are the B samples of one map
            map_seeds = [self.map_seed(m, d, n, L, None)] * len(specs)
            fmap = self.cell_map(m, d, n, L, map_seeds[0])
            restart_seed = derive_seed(map_seeds[0], "ws.restarts")
            res = word_sensitivity(
                fmap, X, self.positions, self.search, seed=restart_seed, dtype=self.map_dtype, radius=self.radius(m, d)
            )
        else:  # the paper's protocol: trial t has its own map, all trials searched together
            map_seeds = [self.map_seed(m, d, n, L, s["trial"]) for s in specs]
            fresh = trial_maps(
                self.grid.map_entries[m],
                map_seeds,
                n,
                d,
                depth=L,
                width_ratio=self.grid.rf_width_ratio,
                dtype=self.map_dtype,
                device=self.device,
            )
            restart_seeds = [derive_seed(ms, "ws.restarts") for ms in map_seeds]
            res = word_sensitivity(
                fresh, X[:, None], self.positions, self.search, restart_seeds, radius=self.radius(m, d)
            )
        seconds = (time.perf_counter() - start) / len(specs)
        bounds = res.bound.flatten().tolist() if res.bound is not None else [None] * len(specs)
        records = []
        for s, rec, map_seed, bound, sid in zip(specs, res.records(), map_seeds, bounds, index, strict=True):
            record = {
                "experiment": "ws",
                "trial_key": s["trial_key"],
                "map": m,
                "d": d,
                "n": n,
                "L": L,
                "trial": s["trial"],
                "sample_id": int(self.store.sample_ids[sid]),
                **rec,
                "seed": self.seed,
                "map_seed": map_seed,
                "radius": self.radius(m, d),
                "ws_sqrt_n": rec["ws"] * math.sqrt(n),
                "bound": bound,
                "seconds": seconds,
                **self.grid.map_entries[m].record_fields,  # map_args of a {class_path, init_args} entry
            }
            record["nonfinite"] = nonfinite(record)  # e.g. S = inf when phi(X) = 0: null in the file, flagged
            records.append(record)
        return records

    # --- the summary ------------------------------------------------------------------------------------------------
    def summarize(self, records: list[dict], out_dir: Path) -> None:
        """Log S against n per map and d; on rank 0 write summary.md and the figures.

        With two maps or more, also every map on one figure and slopes.md.
        """
        from ..plots.ws import embeddings_label, plot_ws_curves, plot_ws_maps
        from ..records.summary import evidence_note, slope_table

        records = trusted(records, "word sensitivity", ("ws",))
        table = cell_table(records, ("map", "d", "n", "L"), "ws")
        for row in table:  # S against n: one curve per map and d (and depth), step = n
            depth = f"/L{row['L']}" if self.grid.takes_depth(row["map"]) else ""
            self.log_curve(f"ws/{row['map']}/d{row['d']}{depth}", row["n"], row["mean"])
        if not self.trainer.is_global_zero or not records:
            return
        write_summary(out_dir, table)
        label = embeddings_label(self.embeddings)  # the titles name the tokens
        for m in sorted({r["map"] for r in records}):
            recs = [r for r in records if r["map"] == m]
            group: Literal["d", "L"] = "L" if self.grid.takes_depth(m) else "d"
            self.add_figure(f"ws/{m}", plot_ws_curves(recs, m, group=group, encoder=label), f"ws_{m}")
            if m in SQRT_N_MAPS:
                scaled = plot_ws_curves(recs, m, group=group, scaled=True, encoder=label)
                self.add_figure(f"ws/{m}_sqrt_n", scaled, f"ws_{m}_sqrt_n")
        if len({r["map"] for r in records}) >= 2:  # every map on one figure, and the slope of log S against log n
            self.add_figure("ws/maps", plot_ws_maps(records, encoder=label), "ws_maps")
            slopes = slope_table(records)
            (out_dir / "slopes.md").write_text(
                "Slope of log S against log n per map (least squares over every trial, 95% confidence interval; "
                "-0.5 is the 1/sqrt(n) law, 0 order-1 word sensitivity).\n\n"
                + evidence_note(slopes)
                + markdown_table(slopes, digits=3)
            )
