"""The Delta-attack sweep run by `evaluate.py` (Figures 4-5), and the attack records it shares with the callback.

`attack_objectives` lists the (training, loss, penalty) of the attacks on one trial, `run_attacks` runs them on one
map and training set and `attack_records` turns one `delta_attack` output into results records: the sweep and the
`DeltaAttackCallback` callback both go through these three, so their records have the same fields and meaning.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch

from ..attack.delta import delta_attacks
from ..attack.inputs import draw_samples
from ..attack.losses import LOSSES
from ..attack.report import output_records
from ..attack.settings import AttackSettings
from ..base import validate
from ..base.names import TRAININGS
from ..base.seeding import derive_seed
from ..data import EmbeddingSpec
from ..features import resolve_maps, trial_maps
from ..records.summary import ATTACK_REQUIRED, attack_scalars, attack_table, trusted, write_summary
from .embeddings_evaluation import EmbeddingsEvaluation
from .figures import attack_figures


def attack_objectives(
    trainings: Sequence[str], losses: Sequence[str], penalties: Sequence[float]
) -> list[tuple[str, str, float]]:
    """(training, loss, penalty) of every attack on a trial; only the "penalized" loss takes the penalties."""
    return [
        (training, loss, penalty)
        for training in trainings
        for loss in losses
        for penalty in (penalties if loss == "penalized" else [0.0])
    ]


def checked_penalties(penalties: Sequence[float] | None) -> list[float]:
    """The penalty weights of the "penalized" loss: at least one, each >= 0, none twice (None: [0.0])."""
    checked = list(penalties if penalties is not None else [0.0])
    if not checked:
        raise ValueError(f"penalties must list at least one weight, got {penalties!r}")
    for value in checked:
        validate.number("penalties", value, low=0)
    return validate.distinct("penalties", checked)


def attack_records(
    trial: dict[str, Any], training: str, loss: str, penalty: float, out: dict, sample_ids: list[int]
) -> list[dict]:
    """The results records of one `delta_attack` output: one per context sample.

    Args:
        trial: the trial's identity: `trial_key`, `map` and any further fields to record (d, n, N, L, trial, seeds...).
        training: "finetune" or "retrain".
        loss: the Delta objective.
        penalty: the penalty weight (recorded as the stable field `p`).
        out: the output of `delta_attack` for B context samples.
        sample_ids: the B context samples' ids.
    """
    records = []
    for b, rec in enumerate(output_records(out)):
        records.append(
            {
                "experiment": "attack",
                "trial_key": trial["trial_key"],
                "record_key": f"{trial['trial_key']}/{training}/{loss}/p{penalty}/c{b}",
                "map": trial["map"],
                "training": training,
                "loss": loss,
                "p": penalty,
                **{k: v for k, v in trial.items() if k not in ("trial_key", "map")},
                "context": b,
                "sample_id": int(sample_ids[b]),
                **rec,
            }
        )
    return records


def run_attacks(
    fmap: Any,
    X_train: torch.Tensor,
    Y: torch.Tensor,
    X_ctx: torch.Tensor,
    y_ctx: torch.Tensor,
    trial: dict[str, Any] | list[dict[str, Any]],
    objectives: list[tuple[str, str, float]],
    sample_ids: list[int] | list[list[int]],
    **options: Any,
) -> list[dict]:
    """All objectives attacked in one `delta_attacks` search, as records.

    Either one trial: a map, (N, n, d) training and (B, n, d) context samples, one trial dict and B context ids; or
    T trials batched in one program: T maps (a list or `FreshMaps`), (T, N, n, d) and (T, B, n, d) samples, T trial
    dicts and T lists of context ids. `options` go to `delta_attacks` (settings, seed, train_ids, ctx_ids).
    """
    batched = X_train.dim() == 4
    # T trial dicts and T lists of ids when batched, else one of each
    trials = cast(list[dict[str, Any]], trial) if batched else [cast(dict[str, Any], trial)]
    ids = cast(list[list[int]], sample_ids) if batched else [cast(list[int], sample_ids)]
    records = []
    outs = delta_attacks(fmap, X_train, Y, X_ctx, y_ctx, objectives, **options)  # every objective in one search
    for (training, loss, penalty), out in zip(objectives, outs):
        for t, trial_t in enumerate(trials):
            out_t = {k: v[t] for k, v in out.items()} if batched else out
            records += attack_records(trial_t, training, loss, penalty, out_t, ids[t])
    return records


@dataclass(frozen=True)
class AttackCase:
    """One (map, n) panel of the attack figures.

    Args:
        map: a registered map ("rf", "deep_rf", "raf", "relu_raf", ...), a dotted import path of a map class
            (`mymap.MyMap`) or `{class_path: mymap.MyMap, init_args: {...}}`, as the word-sensitivity sweep's `maps`.
        n: context length (the first n tokens).
        depth: depth L of the maps that have one ("deep_rf").
    """

    map: str | dict[str, Any]
    n: int
    depth: int = 2


class DeltaAttackSweep(EmbeddingsEvaluation):
    """The single-token Delta attack on fine-tuned and re-trained heads (docs/theory/attack.md §6, Figures 4-5).

    One trial = a case (map, n), a training-set size N and a trial index: N + `contexts` distinct reviews drawn at
    random from the embeddings (the first `contexts` are the context samples, never in the training set), a fresh random
    map, the closed-form heads, then one attack per (training, loss, penalty). Each record has the results.jsonl stable
    fields (README, "Evaluations": experiment="attack", map, training, loss, p (the penalty), d, n, N, trial, y, t0, t1,
    D0, D1, err, sign_err, gamma, proj_ratio, seed: the sweep's seed) plus trial_seed, map_seed, attack_seed, abs_t0,
    abs_D0, delta_norm, steps, gram_cond, gram_ill_conditioned (a flag: do not trust that trial's heads) and nonfinite
    (a flag: a NaN or infinite value, stored as null; left out of the summary).

    Args:
        cases: the (map, n) panels.
        d: embedding dimension (the first d coordinates).
        N_values: training-set sizes.
        trainings: "finetune" (theta_f) and/or "retrain" (theta_r).
        losses: Delta objectives: "err" (16), "align" (24a), "align_proj" (24b), "penalized" (err + penalty
            (phi^T theta*)^2).
        penalties: penalty weights of "penalized" (each >= 0); other losses use 0.
        trials: independent trials per (case, N).
        contexts: context samples attacked per trial (batched; the paper: 1).
        embeddings: where the token embeddings come from.
        attack: the optimiser's settings (`AttackSettings`: steps, lr, restarts, faithful, position, radius, dtype);
            a field left at None takes its default (`wslight.attack.AttackSettings`). None: every field at its default.
        rf_width_ratio: RF neurons k = ratio * n d (the paper: 1).
        seed: the sweep's seed (samples, maps, restarts).
        trials_per_step: trials per test step (sharded over devices by Lightning).
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    maps_key = "model.init_args.cases"

    def __init__(
        self,
        cases: list[AttackCase],
        d: int,
        N_values: list[int],
        trainings: list[Literal["finetune", "retrain"]] | None = None,
        losses: list[Literal["err", "align", "align_proj", "penalized"]] | None = None,
        penalties: list[float] | None = None,
        trials: int = 5,
        contexts: int = 1,
        embeddings: EmbeddingSpec | None = None,
        attack: AttackSettings | None = None,
        rf_width_ratio: float = 1.0,
        seed: int = 0,
        trials_per_step: int = 1,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(trials_per_step, output_dir)
        self.cases = [c if isinstance(c, AttackCase) else AttackCase(**c) for c in cases]
        if not self.cases:
            raise ValueError("cases must list at least one (map, n), got an empty grid")
        entries = resolve_maps([c.map for c in self.cases], "cases.map")
        self.case_maps = [e.name for e in entries]  # the name each case's records carry
        self.map_entries = {e.name: e for e in entries}  # record name -> class and init_args
        validate.int_list("cases.n", [c.n for c in self.cases], repeats=True)
        validate.int_list("cases.depth", [c.depth for c in self.cases], repeats=True)
        validate.distinct("cases", [f"{m}/n{c.n}/L{c.depth}" for c, m in zip(self.cases, self.case_maps)])
        self.d = validate.positive_int("d", d)
        self.N_values = validate.int_list("N_values", N_values)
        self.trainings = validate.choices("trainings", list(TRAININGS) if trainings is None else trainings, TRAININGS)
        self.losses = validate.choices("losses", ["err"] if losses is None else losses, LOSSES)
        self.penalties = checked_penalties(penalties)
        self.trials = validate.positive_int("trials", trials)
        self.contexts = validate.positive_int("contexts", contexts)
        self.set_embeddings(embeddings, "d", self.d, "cases.n", max(c.n for c in self.cases))
        self.attack = attack if attack is not None else AttackSettings()  # checked when it was made
        self.attack.check_position(min(c.n for c in self.cases))
        need = max(self.N_values) + self.contexts
        if need > self.embeddings.num_samples:
            raise ValueError(
                f"N_values: N + contexts = {need} exceeds embeddings.num_samples = {self.embeddings.num_samples}"
            )
        self.rf_width_ratio = validate.number("rf_width_ratio", rf_width_ratio, low=0, strict=True)
        self.seed = validate.integer("seed", seed, low=0)

    def trial_specs(self) -> list[dict]:
        """Every trial of the sweep, case by case and N by N, keyed `<map>/n<n>/L<L>/N<N>/t<trial>`."""
        return [
            {
                "trial_key": f"{m}/n{c.n}/L{c.depth}/N{N}/t{t}",
                "map": m,
                "n": c.n,
                "L": c.depth,
                "N": N,
                "trial": t,
            }
            for c, m in zip(self.cases, self.case_maps)
            for N in self.N_values
            for t in range(self.trials)
        ]

    def objectives(self) -> list[tuple[str, str, float]]:
        """(training, loss, penalty) of every attack run on a trial."""
        return attack_objectives(self.trainings, self.losses, self.penalties)

    def batch_key(self, spec: dict) -> tuple:
        """A step batches trials of one (case, N): their maps and training sets differ, their sizes do not."""
        return spec["map"], spec["n"], spec["L"], spec["N"]

    def run_trials(self, specs: list[dict]) -> list[dict]:
        """The step's trials in one program: each its own training set, context samples and fresh map."""
        start = time.perf_counter()
        m, n, L, N = self.batch_key(specs[0])
        c = self.contexts
        trials, Xs, ys, id_rows = [], [], [], []
        for s in specs:
            trial_seed = derive_seed(self.seed, "attack", m, n, L, N, s["trial"])
            # distinct reviews: a review the source holds twice would make the Gram singular
            # (docs/theory/checks.md §8.8)
            every = torch.arange(len(self.store))
            index = draw_samples(every, N + c, trial_seed, "attack.samples", keep=self.store.first_copies())
            if len(index) < N + c:
                raise ValueError(
                    f"N_values: N + contexts = {N + c} exceeds the {len(index)} distinct samples of the embeddings; "
                    "raise embeddings.num_samples"
                )
            X, y = self.store.samples(index, n, self.d)  # (N + c, n, d), (N + c,)
            Xs.append(X)
            ys.append(y)
            id_rows.append(self.store.sample_ids[index])  # (N + c,)
            trials.append(
                {
                    **s,
                    "d": self.d,
                    "seed": self.seed,
                    "trial_seed": trial_seed,
                    "map_seed": trial_seed,  # the trial's map is drawn from the trial's seed
                    "attack_seed": derive_seed(trial_seed, "attack.restarts"),
                    **self.map_entries[m].record_fields,  # map_args of a {class_path, init_args} entry
                }
            )
        X, y, ids = torch.stack(Xs).to(self.device), torch.stack(ys).to(self.device), torch.stack(id_rows)
        seeds = [t["map_seed"] for t in trials]
        maps = trial_maps(
            self.map_entries[m], seeds, n, self.d, depth=L, width_ratio=self.rf_width_ratio, device=self.device
        )
        records = run_attacks(
            maps,
            X[:, c:],
            y[:, c:],
            X[:, :c],
            y[:, :c],
            trials,
            self.objectives(),
            ids[:, :c].tolist(),
            settings=self.attack,
            seed=[t["attack_seed"] for t in trials],
            train_ids=ids[:, c:],
            ctx_ids=ids[:, :c],
        )
        seconds = (time.perf_counter() - start) / len(specs)
        return [{**r, "seconds": seconds} for r in records]

    def summarize(self, records: list[dict], out_dir: Path) -> None:
        """Log the attack's scalars; on rank 0 write summary.md (one row per cell) and the figures."""
        records = trusted(records, "attack", ATTACK_REQUIRED)
        for name, value in attack_scalars(records, self.trainings).items():
            self.log_scalar(name, value)
        if not self.trainer.is_global_zero or not records:
            return
        table = attack_table(records)  # with the confirmed share of each cell's objective when recorded
        write_summary(out_dir, table)
        for tag, fig, stem in attack_figures(records):
            self.add_figure(tag, fig, stem)
