"""Evaluation sweeps run by `evaluate.py`: word sensitivity over map x d x n x L x trials (Figures 2-3)."""

from __future__ import annotations

import math
import statistics
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from .data import EmbeddingSpec, load_token_embeddings
from .data.embeddings import hidden_size_of, validate_spec
from .evaluation import Evaluation
from .features import MAPS, DeepRandomFeatures, RandomAttentionFeatures, RandomFeatures, ReLUAttentionFeatures
from .seeding import derive_seed, generator
from .sensitivity import word_sensitivity, ws_bound_rf

MapName = Literal["rf", "deep_rf", "raf", "relu_raf"]


def _positive_list(key: str, values: list[int]) -> list[int]:
    if not values:
        raise ValueError(f"{key} must list at least one value, got an empty grid")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
    if bad:
        raise ValueError(f"{key} must hold positive integers, got {bad}")
    return list(values)


def nonfinite(record: dict, keys: tuple[str, ...] | None = None) -> bool:
    """True when a float field of a record (all of them, or `keys`) is NaN or infinite: a number not to trust."""
    keys = tuple(record) if keys is None else keys
    return any(isinstance(record.get(k), float) and not math.isfinite(record[k]) for k in keys)


def trusted(records: list[dict], label: str, required: tuple[str, ...]) -> list[dict]:
    """The records without the `nonfinite` flag and with every `required` value present (not null in the file).

    Warns with the count of the records left out of a summary.
    """
    good = [r for r in records if not r.get("nonfinite") and all(r.get(k) is not None for k in required)]
    if len(good) < len(records):
        warnings.warn(
            f"{label}: {len(records) - len(good)} of {len(records)} record(s) have nonfinite=true (a NaN or infinite "
            "value, e.g. phi(X) = 0) and are left out of the summary and figures; they stay in results.jsonl",
            RuntimeWarning,
            stacklevel=2,
        )
    return good


def build_map(m: str, d: int, n: int, L: int, width_ratio: float, seed: int, dtype: str = "float32"):
    """A fresh map of a sweep cell: RF with k = ratio * n d neurons, DeepRF (depth L, that width), RAF or ReLU-RAF."""
    width = max(1, round(width_ratio * n * d))
    if m == "rf":
        return RandomFeatures(n, d, k=width, seed=seed, dtype=dtype)
    if m == "deep_rf":
        return DeepRandomFeatures(n, d, depth=L, width=width, seed=seed, dtype=dtype)
    return (RandomAttentionFeatures if m == "raf" else ReLUAttentionFeatures)(d, seed=seed, dtype=dtype)


def cell_table(records: list[dict], keys: tuple[str, ...], value: str) -> list[dict]:
    """Mean, sd (n-1) and count of `value` per cell of `keys`, sorted by the keys."""
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        if r.get(value) is not None:
            cells[tuple(r[k] for k in keys)].append(float(r[value]))
    rows = []
    for cell in sorted(cells):
        vals = cells[cell]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        rows.append({**dict(zip(keys, cell)), "mean": statistics.fmean(vals), "sd": sd, "count": len(vals)})
    return rows


def markdown_table(rows: list[dict], digits: int = 4) -> str:
    """A markdown table of a list of flat dicts (same keys)."""
    if not rows:
        return "(no rows)\n"
    keys = list(rows[0])
    fmt = lambda v: f"{v:.{digits}g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


class _EmbeddingsEvaluation(Evaluation):
    """An evaluation that draws its samples from `self.embeddings` (an EmbeddingSpec), opened once on first use."""

    embeddings: EmbeddingSpec
    _store = None

    @property
    def store(self):
        if self._store is None:
            self._store = load_token_embeddings(self.embeddings, progress=self.trainer.is_global_zero)
        return self._store


class WordSensitivitySweep(_EmbeddingsEvaluation):
    """Word sensitivity of random feature maps on token embeddings, over a grid (paper.md §3, Figures 2-3).

    One trial = one sample drawn at random from the embeddings (seeded by `seed` and the trial index, so trial t uses
    the same review in every cell) and, by default, a fresh random map (seeded by `seed`, the cell and the trial):
    the paper's "independent trials". Each trial records the results.jsonl fields of design.md (experiment="ws", map,
    d, n, L, trial, sample_id, position, ws, delta_norm, phi_norm, steps, seed) plus `bound` (RF: the operator-norm
    bound of paper.md §12.3 at the realised ||Delta||), `ws_sqrt_n` and `nonfinite` (a flag: S is not a finite number,
    e.g. phi(X) = 0 for a ReLU-RAF sample whose scores are all <= 0; such records are left out of the summary).

    Args:
        maps: which maps to sweep ("rf", "deep_rf", "raf", "relu_raf").
        d_values: embedding dimensions (the first d coordinates of each token).
        n_values: context lengths (the first n tokens).
        depths: depths L of "deep_rf" (other maps record L = 1).
        trials: independent trials per cell.
        embeddings: where the token embeddings come from (source, encoder, layer, number of reviews, seed).
        positions: "first" (token 0, the paper's figures), "all" (the true sup over i) or a list of token indices.
        radius_scale: the ball radius is radius_scale * sqrt(d) (the paper: 1). Must be > 0.
        restarts: ascent chains per sample and position (batched).
        max_steps: most ascent steps per chain.
        tol: convergence tolerance of the estimator (relative change of S over its window).
        rf_width_ratio: RF neurons k = ratio * n d (the paper: 1, i.e. k = D); DeepRF widths likewise.
        shared_weights: False (the paper): a fresh map per trial; True: one map per cell shared by its trials, which
            batches the trials of a cell in one search.
        dtype: working dtype of the maps and the search.
        seed: the sweep's seed (samples, maps, restarts).
        trials_per_step: trials per test step (sharded over devices by Lightning).
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    def __init__(
        self,
        maps: list[MapName],
        d_values: list[int],
        n_values: list[int],
        depths: list[int] | None = None,
        trials: int = 10,
        embeddings: EmbeddingSpec | None = None,
        positions: Literal["first", "all"] | list[int] = "first",
        radius_scale: float = 1.0,
        restarts: int = 4,
        max_steps: int = 500,
        tol: float = 1e-4,
        rf_width_ratio: float = 1.0,
        shared_weights: bool = False,
        dtype: Literal["float32", "float64"] = "float32",
        seed: int = 0,
        trials_per_step: int = 1,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(trials_per_step, output_dir)
        unknown = [m for m in maps if m not in MAPS]
        if not maps or unknown:
            raise ValueError(f"maps must be a non-empty subset of {sorted(MAPS)}, got {maps}")
        self.maps = list(maps)
        self.d_values = _positive_list("d_values", d_values)
        self.n_values = _positive_list("n_values", n_values)
        self.depths = _positive_list("depths", depths if depths is not None else [2])
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            raise ValueError(f"trials must be a positive integer, got {trials!r}")
        if not radius_scale > 0:
            raise ValueError(f"radius_scale must be > 0, got {radius_scale}")
        if not rf_width_ratio > 0:
            raise ValueError(f"rf_width_ratio must be > 0, got {rf_width_ratio}")
        self.embeddings = embeddings if embeddings is not None else EmbeddingSpec()
        validate_spec(self.embeddings)  # bad data keys (layer, num_samples, source...) before any trial runs
        hidden = hidden_size_of(self.embeddings)
        if max(self.d_values) > hidden:
            raise ValueError(f"d_values: d must be <= {hidden} (the embeddings' hidden size), got {max(self.d_values)}")
        if max(self.n_values) > self.embeddings.max_length:
            raise ValueError(
                f"n_values: n must be <= {self.embeddings.max_length} (embeddings.max_length), got {max(self.n_values)}"
            )
        if not isinstance(positions, str):  # "first" / "all" are checked by the type; indices against the smallest n
            n_min = min(self.n_values)
            bad = [p for p in positions if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < n_min]
            if not positions or bad:
                raise ValueError(
                    f"positions: every token index must be an integer in [0, {n_min - 1}] (the smallest n in "
                    f"n_values), got {list(positions)}"
                )
        self.trials, self.positions, self.radius_scale = trials, positions, radius_scale
        self.restarts, self.max_steps, self.tol = restarts, max_steps, tol
        self.rf_width_ratio, self.shared_weights, self.seed = rf_width_ratio, shared_weights, seed
        self.map_dtype = dtype
        self._last_map: tuple[int | None, object] = (None, None)

    # --- the grid ---------------------------------------------------------------------------------------------------
    def cells(self) -> list[tuple[str, int, int, int]]:
        """(map, d, n, L) for every cell, in sweep order."""
        out = []
        for m in self.maps:
            for L in self.depths if m == "deep_rf" else [1]:
                out += [(m, d, n, L) for d in self.d_values for n in self.n_values]
        return out

    def trial_specs(self) -> list[dict]:
        return [
            {"trial_key": f"{m}/d{d}/n{n}/L{L}/t{t}", "map": m, "d": d, "n": n, "L": L, "trial": t}
            for (m, d, n, L) in self.cells()
            for t in range(self.trials)
        ]

    def sample_index(self, trial: int) -> int:
        """Which embedded review trial `trial` uses (the same in every cell)."""
        return int(torch.randint(len(self.store), (1,), generator=generator(self.seed, "ws.sample", trial)))

    # --- the work ---------------------------------------------------------------------------------------------------
    def run_trials(self, specs: list[dict]) -> list[dict]:
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for s in specs:
            cell = (s["map"], s["d"], s["n"], s["L"])
            groups[cell + (None if self.shared_weights else s["trial"],)].append(s)
        records = []
        for (m, d, n, L, t), group in groups.items():
            map_seed = derive_seed(self.seed, "ws.map", m, d, n, L, -1 if t is None else t)
            if self._last_map[0] != map_seed:  # shared weights: the cell's map is reused by its next trials
                fmap = build_map(m, d, n, L, self.rf_width_ratio, map_seed, self.map_dtype)
                self._last_map = (map_seed, fmap.to(self.device))
            fmap = self._last_map[1]
            index = [self.sample_index(s["trial"]) for s in group]
            X, _ = self.store.samples(index, n, d)
            X = X.to(self.device)
            res = word_sensitivity(
                fmap,
                X,
                positions=self.positions,
                radius=self.radius_scale * d**0.5,
                restarts=self.restarts,
                max_steps=self.max_steps,
                tol=self.tol,
                seed=derive_seed(map_seed, "ws.restarts"),
                dtype=self.map_dtype,
            )
            bound = ws_bound_rf(fmap, X, res.position, res.delta_norm, res.phi_norm) if m == "rf" else None
            for b, (s, rec) in enumerate(zip(group, res.records())):
                record = {
                    "experiment": "ws",
                    "trial_key": s["trial_key"],
                    "map": m,
                    "d": d,
                    "n": n,
                    "L": L,
                    "trial": s["trial"],
                    "sample_id": int(self.store.sample_ids[index[b]]),
                    **rec,
                    "seed": map_seed,
                    "radius": self.radius_scale * d**0.5,
                    "ws_sqrt_n": rec["ws"] * math.sqrt(n),
                    "bound": None if bound is None else float(bound[b]),
                }
                record["nonfinite"] = nonfinite(record)  # e.g. S = inf when phi(X) = 0: null in the file, flagged
                records.append(record)
        return records

    # --- the summary ------------------------------------------------------------------------------------------------
    def summarize(self, records: list[dict], out_dir: Path) -> None:
        from .plots.ws import plot_ws_curves

        records = trusted(records, "word sensitivity", ("ws",))
        table = cell_table(records, ("map", "d", "n", "L"), "ws")
        for row in table:
            group = f"L{row['L']}" if row["map"] == "deep_rf" else f"d{row['d']}"
            self.log_scalar(f"ws/{row['map']}/{group}/n{row['n']}", row["mean"])
        if not self.trainer.is_global_zero or not records:
            return
        (out_dir / "summary.md").write_text(markdown_table(table))
        for m in sorted({r["map"] for r in records}):
            recs = [r for r in records if r["map"] == m]
            group = "L" if m == "deep_rf" else "d"
            self.add_figure(f"ws/{m}", plot_ws_curves(recs, m, group=group), f"ws_{m}")
            if m in ("rf", "deep_rf"):
                self.add_figure(f"ws/{m}_sqrt_n", plot_ws_curves(recs, m, group=group, scaled=True), f"ws_{m}_sqrt_n")


@dataclass(frozen=True)
class AttackCase:
    """One (map, n) panel of the attack figures.

    Args:
        map: "rf", "deep_rf", "raf" or "relu_raf".
        n: context length (the first n tokens).
        depth: depth L for "deep_rf".
    """

    map: MapName
    n: int
    depth: int = 2


class DeltaAttackSweep(_EmbeddingsEvaluation):
    """The single-token Delta attack on fine-tuned and re-trained heads (paper.md §6, Figures 4-5).

    One trial = a case (map, n), a training-set size N and a trial index: N + `contexts` distinct reviews drawn at
    random from the embeddings (the first `contexts` are the context samples, never in the training set), a fresh
    random map, the closed-form heads, then one attack per (training, loss, p). Each record has the results.jsonl fields
    of design.md (experiment="attack", map, training, loss, p, d, n, N, trial, y, t0, t1, D0, D1, err, sign_err, gamma,
    proj_ratio, seed) plus abs_t0, abs_D0, delta_norm, steps, gram_cond, gram_ill_conditioned (a flag: do not
    trust that trial's heads) and nonfinite (a flag: a NaN or infinite value, stored as null; left out of the summary).

    Args:
        cases: the (map, n) panels.
        d: embedding dimension (the first d coordinates).
        N_values: training-set sizes.
        trainings: "finetune" (theta_f) and/or "retrain" (theta_r).
        losses: Delta objectives: "err" (16), "align" (24a), "align_proj" (24b), "penalized" (err + p (phi^T theta*)^2).
        p_values: penalty weights for "penalized" (each >= 0); other losses use p = 0.
        trials: independent trials per (case, N).
        contexts: context samples attacked per trial (batched; the paper: 1).
        embeddings: where the token embeddings come from.
        position: index of the perturbed token (0 = [CLS], as the paper).
        steps: most optimiser steps (None: the attack's default; with faithful, the authors' counts).
        restarts: restarts per context sample (None: the attack's default).
        faithful: the authors' fixed-step projected descent instead of the improved optimiser.
        rf_width_ratio: RF neurons k = ratio * n d (the paper: 1).
        seed: the sweep's seed (samples, maps, restarts).
        trials_per_step: trials per test step (sharded over devices by Lightning).
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    def __init__(
        self,
        cases: list[AttackCase],
        d: int,
        N_values: list[int],
        trainings: list[Literal["finetune", "retrain"]] | None = None,
        losses: list[Literal["err", "align", "align_proj", "penalized"]] | None = None,
        p_values: list[float] | None = None,
        trials: int = 5,
        contexts: int = 1,
        embeddings: EmbeddingSpec | None = None,
        position: int = 0,
        steps: int | None = None,
        restarts: int | None = None,
        faithful: bool = False,
        rf_width_ratio: float = 1.0,
        seed: int = 0,
        trials_per_step: int = 1,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(trials_per_step, output_dir)
        from .attack import LOSSES

        self.cases = [c if isinstance(c, AttackCase) else AttackCase(**c) for c in cases]
        if not self.cases:
            raise ValueError("cases must list at least one (map, n), got an empty grid")
        for c in self.cases:
            if c.map not in MAPS:
                raise ValueError(f"cases: map must be one of {sorted(MAPS)}, got {c.map!r}")
        _positive_list("cases.n", [c.n for c in self.cases])
        self.d = _positive_list("d", [d])[0]
        self.N_values = _positive_list("N_values", N_values)
        self.trainings = list(trainings or ["finetune", "retrain"])
        bad = [t for t in self.trainings if t not in ("finetune", "retrain")]
        if bad or not self.trainings:
            raise ValueError(f"trainings must be a non-empty subset of ['finetune', 'retrain'], got {self.trainings}")
        self.losses = list(losses or ["err"])
        bad = [x for x in self.losses if x not in LOSSES]
        if bad or not self.losses:
            raise ValueError(f"losses must be a non-empty subset of {list(LOSSES)}, got {self.losses}")
        self.p_values = list(p_values if p_values is not None else [0.0])
        if any(not p >= 0 for p in self.p_values) or not self.p_values:
            raise ValueError(f"p_values must be non-empty and every p >= 0, got {self.p_values}")
        self.trials = _positive_list("trials", [trials])[0]
        self.contexts = _positive_list("contexts", [contexts])[0]
        self.embeddings = embeddings if embeddings is not None else EmbeddingSpec()
        hidden = hidden_size_of(self.embeddings)
        if self.d > hidden:
            raise ValueError(f"d must be <= {hidden} (the embeddings' hidden size), got {self.d}")
        max_n = max(c.n for c in self.cases)
        if max_n > self.embeddings.max_length:
            raise ValueError(f"cases.n: n must be <= {self.embeddings.max_length} (embeddings.max_length), got {max_n}")
        if not 0 <= position < min(c.n for c in self.cases):
            raise ValueError(f"position must be in [0, {min(c.n for c in self.cases) - 1}], got {position}")
        need = max(self.N_values) + self.contexts
        if need > self.embeddings.num_samples:
            raise ValueError(
                f"N_values: N + contexts = {need} exceeds embeddings.num_samples = {self.embeddings.num_samples}"
            )
        self.position, self.steps, self.restarts, self.faithful = position, steps, restarts, faithful
        self.rf_width_ratio, self.seed = rf_width_ratio, seed

    def trial_specs(self) -> list[dict]:
        return [
            {
                "trial_key": f"{c.map}/n{c.n}/L{c.depth}/N{N}/t{t}",
                "map": c.map,
                "n": c.n,
                "L": c.depth,
                "N": N,
                "trial": t,
            }
            for c in self.cases
            for N in self.N_values
            for t in range(self.trials)
        ]

    def objectives(self) -> list[tuple[str, str, float]]:
        """(training, loss, p) of every attack run on a trial."""
        return [
            (t, loss, p)
            for t in self.trainings
            for loss in self.losses
            for p in (self.p_values if loss == "penalized" else [0.0])
        ]

    def run_trials(self, specs: list[dict]) -> list[dict]:
        from .attack import delta_attack, output_records

        records = []
        for s in specs:
            m, n, L, N, t = s["map"], s["n"], s["L"], s["N"], s["trial"]
            trial_seed = derive_seed(self.seed, "attack", m, n, L, N, t)
            g = generator(trial_seed, "attack.samples")
            index = torch.randperm(len(self.store), generator=g)[: N + self.contexts]
            X, y = self.store.samples(index, n, self.d)
            ids = self.store.sample_ids[index]
            c = self.contexts
            fmap = build_map(m, self.d, n, L, self.rf_width_ratio, trial_seed).to(self.device)
            X = X.to(self.device)
            for training, loss, p in self.objectives():
                out = delta_attack(
                    fmap,
                    X[c:],
                    y[c:],
                    X[:c],
                    y[:c],
                    training=training,
                    loss=loss,
                    p=p,
                    position=self.position,
                    steps=self.steps,
                    restarts=self.restarts,
                    seed=derive_seed(trial_seed, "attack.restarts"),
                    faithful=self.faithful,
                    train_ids=ids[c:],
                    ctx_ids=ids[:c],
                )
                for b, rec in enumerate(output_records(out)):
                    records.append(
                        {
                            "experiment": "attack",
                            "trial_key": s["trial_key"],
                            "record_key": f"{s['trial_key']}/{training}/{loss}/p{p}/c{b}",
                            "map": m,
                            "training": training,
                            "loss": loss,
                            "p": p,
                            "d": self.d,
                            "n": n,
                            "N": N,
                            "L": L,
                            "trial": t,
                            "context": b,
                            "sample_id": int(ids[b]),
                            **rec,
                            "seed": trial_seed,
                        }
                    )
        return records

    def summarize(self, records: list[dict], out_dir: Path) -> None:
        from .plots.attack import plot_attack_scatter, plot_penalized

        records = trusted(records, "attack", ("y", "D1", "err", "sign_err", "gamma"))
        for training in self.trainings:
            errs = [r["err"] for r in records if r["training"] == training and r["err"] is not None]
            if errs:
                self.log_scalar(f"attack/err_{training}", statistics.median(errs))
                flips = [1.0 - r["sign_err"] for r in records if r["training"] == training]
                self.log_scalar(f"attack/flip_rate_{training}", statistics.fmean(flips))
        if not self.trainer.is_global_zero or not records:
            return
        for r in records:
            r["y_D1"] = r["y"] * r["D1"]
            r["flip"] = 1.0 - r["sign_err"]
        keys = ("map", "n", "N", "training", "loss", "p")
        table = []
        for row in cell_table(records, keys, "err"):
            cell = [r for r in records if all(r[k] == row[k] for k in keys)]
            table.append(
                {
                    **{k: row[k] for k in keys},
                    "count": row["count"],
                    "median_err": statistics.median(r["err"] for r in cell),
                    "flip_rate": statistics.fmean(r["flip"] for r in cell),
                    "mean_yD1": statistics.fmean(r["y_D1"] for r in cell),
                    "median_gamma": statistics.median(r["gamma"] for r in cell),
                }
            )
        (out_dir / "summary.md").write_text(markdown_table(table))
        plain = [r for r in records if r["loss"] != "penalized"]
        if plain:
            self.add_figure("attack/scatter", plot_attack_scatter(plain), "attack_scatter")
        penalized = [r for r in records if r["loss"] == "penalized"]
        if penalized:
            self.add_figure("attack/penalized", plot_penalized(penalized), "attack_penalized")
