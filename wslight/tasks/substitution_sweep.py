"""The one-word substitution sweep run by `evaluate.py` (docs/theory/words.md §13).

The exact best real word against the continuous Delta, and the heads it flips, over map x d x n.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Literal, cast

import torch

from ..attack.heads import fit_heads
from ..base import validate
from ..base.names import TRAININGS
from ..base.seeding import derive_seed, generator
from ..chains.settings import DEFAULT_CHUNK_ELEMENTS, SearchSettings
from ..data import EmbeddingSpec
from ..features.forwards import trial_features
from ..records.summary import markdown_table, nonfinite, trusted, write_summary
from ..search.result import WSResult
from ..search.sensitivity import word_sensitivity
from ..search.substitution import word_substitution
from .grid import MapGridEvaluation
from .grid_settings import GridSettings

WORDS_REQUIRED = ("ws_words",)  # the value every summarised record needs (ws is absent with continuous: false)
# The heads a sweep can flip: theta* = Phi^+ Y (min_norm: the head `train.py` fits with fit_mode closed_form) and the
# attack's fine-tuned and re-trained heads (docs/theory/attack.md §5.2)
HEADS = ("min_norm", *TRAININGS)


class WordSubstitutionSweep(MapGridEvaluation):
    """The exact one-word substitution on real reviews, next to the continuous word sensitivity.

    See docs/theory/words.md §13.

    One trial = one review (trial t uses the same review in every cell: the t-th review, in a seeded order, whose token
    at `position` is a word) and a fresh random map (seeded by `seed`, the cell and the trial). For that review and
    map a trial records:
    - the discrete word sensitivity `ws_words`: the exact maximum over the admissible vocabulary words w of
      ||phi(X with x_i = h_w) - phi(X)|| / ||phi(X)|| (`wslight.search.substitution.word_substitution`), the best word
      (`word`, `word_id`) and its realised distance ||h_w - x_i|| / sqrt(d) (`distance`);
    - the continuous S at the same position and radius (`ws`, with the search's `chains` and `near_best`) and the
      ratio `ws_ratio` = ws_words / ws;
    - with N > 0, for each head of `trainings`: theta* on N other reviews (`min_norm`, what `train.py` fits) and the
      attack's heads (docs/theory/attack.md §5.2) on them plus this one, how many admissible words flip the head's sign
      on this review (`flips_<training>`),
      whether any does (`flipped_<training>`) and the flipping word that pushes the output furthest
      (`flip_word_<training>`);
    - `admissible` (words evaluated) and `round_trip_rejected` (words that pass the vocabulary rules but whose edited
      review the tokenizer does not give back: left out; `wslight.data.vocabulary.EncoderWords.admissible`).

    A substitution changes row i of the layer-0 embeddings only, so the sweep needs `embeddings.layer: 0` and a text
    source. Records also carry experiment="words", map, d, n, L, trial, sample_id, position, token (the original),
    phi_norm, N, y, gram_ill_conditioned, seed, map_seed, seconds and nonfinite.

    Args:
        grid: the cells and their trials (`GridSettings`: maps, d_values, n_values, depths, trials: reviews per cell,
            each with its own fresh map; rf_width_ratio). The words' rows take the first d coordinates as the tokens'.
        embeddings: the reviews' token embeddings (layer 0 of a text source).
        position: the token substituted (>= 1: [CLS] is no word); a review is used only when it holds a word there.
        N: training reviews of the heads (0: no heads, no flips).
        trainings: the heads to flip: "min_norm" (theta* = Phi^+ Y on the N reviews: the head `train.py` fits with
            fit_mode closed_form, which need not be right on the trial's review), "finetune" (theta_f) and/or
            "retrain" (theta_r).
        search: the continuous search's settings (`wslight.search.SearchSettings`, as `WordSensitivitySweep.search`;
            unset fields: each map's family defaults).
        continuous: False leaves the continuous search out (`ws`, `ws_ratio`, `chains` and `near_best` are null):
            for a map whose search a CPU cannot afford (the whole pre-trained encoder), S_words alone.
        chunk_elements: working elements one chunk of words may hold (bounds the memory of the substitution).
        seed: the sweep's seed (reviews, maps, the searches' random starts, training sets).
        trials_per_step: trials per test step (sharded over devices by Lightning).
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    def __init__(
        self,
        grid: GridSettings,
        embeddings: EmbeddingSpec | None = None,
        position: int = 1,
        N: int = 200,
        trainings: list[Literal["min_norm", "finetune", "retrain"]] | None = None,
        search: SearchSettings | None = None,
        continuous: bool = True,
        chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
        seed: int = 0,
        trials_per_step: int = 1,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(trials_per_step, output_dir)
        self.set_grid(grid)
        self.set_search(search)
        self.continuous = validate.boolean("continuous", continuous)
        self.position = validate.integer("position", position, low=1, high=min(self.grid.n_values) - 1)
        self.N = validate.integer("N", N, low=0)
        self.trainings = validate.choices("trainings", list(HEADS) if trainings is None else trainings, HEADS)
        self.chunk_elements = validate.positive_int("chunk_elements", chunk_elements)
        self.seed = validate.integer("seed", seed, low=0)
        self.set_embeddings(
            embeddings, "grid.d_values", max(self.grid.d_values), "grid.n_values", max(self.grid.n_values)
        )
        if self.embeddings.source == "synthetic":
            raise ValueError("embeddings.source: the substitution needs real reviews and their words, got 'synthetic'")
        if self.embeddings.layer != 0:
            raise ValueError(
                f"embeddings.layer: a substitution changes one row of layer 0 only, so it must be 0, got "
                f"{self.embeddings.layer}"
            )
        if self.N + self.grid.trials > self.embeddings.num_samples:
            raise ValueError(
                f"N: N + grid.trials = {self.N + self.grid.trials} exceeds embeddings.num_samples = "
                f"{self.embeddings.num_samples}"
            )
        self._words: Any = None
        self._admissible: dict[int, tuple[torch.Tensor, int]] = {}
        self._reviews: list[int] | None = None

    # --- the reviews and their words (the grid: MapGridEvaluation) --------------------------------------------------
    @property
    def words(self) -> Any:
        """The encoder's vocabulary (`EncoderWords`), loaded on first use."""
        if self._words is None:
            from ..data.vocabulary import EncoderWords

            self._words = EncoderWords(self.embeddings.encoder)
        return self._words

    def review_index(self, trial: int) -> int:
        """The review of trial `trial` (the same in every cell).

        The trial-th distinct review, in a seeded order, whose token at `position` is a word (not [SEP] or padding).
        """
        if self._reviews is None:
            order = torch.randperm(len(self.store), generator=generator(self.seed, "words.reviews")).tolist()
            first = self.store.first_copies()
            ids = self.store.input_ids(order)  # (M, S)
            sep = self.words.tokenizer.sep_token_id
            lengths = [int((row == sep).nonzero()[0, 0]) if (row == sep).any() else row.shape[0] for row in ids]
            self._reviews = [i for i, ln in zip(order, lengths) if first[i] and self.position < ln]
            if len(self._reviews) < self.grid.trials:
                raise ValueError(
                    f"embeddings.num_samples: {len(self._reviews)} reviews have a word at position {self.position}, "
                    f"fewer than grid.trials = {self.grid.trials}"
                )
        return self._reviews[trial]

    def training_index(self, trial_seed: int, context: int, n: int) -> list[int]:
        """N reviews drawn by the trial's seed (the heads' training set), distinct in their first n tokens.

        Their first n tokens differ from each other's and from the trial's own review: two equal samples would make the
        Gram singular (docs/theory/checks.md §8.8), and at small n distinct reviews often share their first tokens ("i
        saw this movie ...").
        """
        order = torch.randperm(len(self.store), generator=generator(trial_seed, "words.train")).tolist()
        prefixes = self.store.input_ids(order)[:, :n]
        seen = {tuple(self.store.input_ids([context])[0, :n].tolist())}
        chosen = []
        for i, prefix in zip(order, prefixes.tolist()):
            if tuple(prefix) not in seen:
                seen.add(tuple(prefix))
                chosen.append(i)
                if len(chosen) == self.N:
                    return chosen
        raise ValueError(
            f"N: only {len(chosen)} reviews differ in their first {n} tokens from each other and the trial's review, "
            f"fewer than N = {self.N}; lower N or raise embeddings.num_samples"
        )

    def admissible(self, index: int) -> tuple[torch.Tensor, int]:
        """The admissible words at `position` of review `index`, and how many failed the round trip (cached)."""
        if index not in self._admissible:
            self._admissible[index] = self.words.admissible(self.store.input_ids([index])[0], self.position)
        return self._admissible[index]

    # --- the work ---------------------------------------------------------------------------------------------------
    def run_trials(self, specs: list[dict]) -> list[dict]:
        """The step's trials (one cell): the continuous search, the heads and the whole admissible vocabulary."""
        start = time.perf_counter()
        m, d, n, L = self.batch_key(specs[0])
        entry = self.grid.map_entries[m]
        index = [self.review_index(s["trial"]) for s in specs]
        X, y = self.store.samples(index, n, d)  # (T, n, d), (T,)
        X = X[:, None].to(self.device)  # (T, 1, n, d): one review per trial
        map_seeds = [derive_seed(self.seed, "words.map", m, d, n, L, s["trial"]) for s in specs]
        maps = [
            entry.build(n, d, ms, depth=L, width_ratio=self.grid.rf_width_ratio, dtype="float32").to(self.device)
            for ms in map_seeds
        ]
        continuous = self.continuous_search(maps, X, map_seeds, m, d)
        heads, ill = self.trial_heads(maps, X, y, map_seeds, index, n, d)
        masks = [self.admissible(i) for i in index]
        allowed = torch.stack([mk for mk, _ in masks])[:, None, None]  # (T, 1, 1, V)
        rows = self.words.rows(self.position, d)
        sub = word_substitution(
            maps, X, [self.position], rows, allowed, heads=heads, chunk_elements=self.chunk_elements
        )
        seconds = (time.perf_counter() - start) / len(specs)
        ids = self.store.input_ids(index)[:, self.position].tolist()
        records = []
        for t, s in enumerate(specs):
            ws_words = float(sub.ws[t, 0, 0])
            ws = None if continuous is None else float(continuous.ws[t, 0])
            word_id = int(sub.word[t, 0, 0])
            record = {
                "experiment": "words",
                "trial_key": s["trial_key"],
                "map": m,
                "d": d,
                "n": n,
                "L": L,
                "trial": s["trial"],
                "sample_id": int(self.store.sample_ids[index[t]]),
                "position": self.position,
                "token": self.words.text(ids[t]),
                "ws_words": ws_words,
                "word": self.words.text(word_id),
                "word_id": word_id,
                "distance": float(sub.distance[t, 0, 0]),
                "ws": ws,
                "ws_ratio": None if ws is None else ws_words / ws if ws > 0 else math.nan,
                "chains": None if continuous is None else int(continuous.chains[t, 0]),
                "near_best": None if continuous is None else int(continuous.near_best[t, 0]),
                "phi_norm": float(sub.phi_norm[t, 0]),
                "admissible": int(sub.admissible[t, 0, 0]),
                "round_trip_rejected": masks[t][1],
                "N": self.N,
                "y": float(y[t]),
                "gram_ill_conditioned": bool(ill[t]),
            }
            if sub.flips is not None and sub.flip_word is not None:
                for c, training in enumerate(self.trainings):
                    flips, flip_id = int(sub.flips[t, 0, 0, c]), int(sub.flip_word[t, 0, 0, c])
                    record[f"flips_{training}"] = flips
                    record[f"flipped_{training}"] = flips > 0
                    record[f"flip_word_{training}"] = self.words.text(flip_id)
            record |= {
                "seed": self.seed,
                "map_seed": map_seeds[t],
                "seconds": seconds,
                **entry.record_fields,
            }
            record["nonfinite"] = nonfinite(record)
            records.append(record)
        return records

    def continuous_search(
        self, maps: list[torch.nn.Module], X: torch.Tensor, map_seeds: list[int], m: str, d: int
    ) -> WSResult | None:
        """The continuous S at `position` of each trial's review X (T, 1, n, d), on its map (None: continuous false)."""
        restart_seeds = [derive_seed(ms, "words.restarts") for ms in map_seeds]
        if not self.continuous:
            return None
        return word_sensitivity(
            maps, X, positions=[self.position], search=self.search, seed=restart_seeds, radius=self.radius(m, d)
        )

    def trial_heads(
        self,
        maps: list[torch.nn.Module],
        X: torch.Tensor,
        y: torch.Tensor,
        map_seeds: list[int],
        index: list[int],
        n: int,
        d: int,
    ) -> tuple[torch.Tensor | None, list[bool]]:
        """The heads of `trainings` of each trial, (T, p, C), and whether each trial's Gram is ill-conditioned.

        Fitted on N training reviews drawn by the trial's map seed (`training_index`), the attack's heads also on the
        trial's own review X (T, 1, n, d) with its label y (T,). None and no flag when N is 0.
        """
        if not self.N:
            return None, [False] * len(maps)
        train = [self.training_index(derive_seed(ms, "words.train"), i, n) for ms, i in zip(map_seeds, index)]
        drawn = [self.store.samples(t, n, d) for t in train]
        X_train = torch.stack([x for x, _ in drawn]).to(self.device)  # (T, N, n, d)
        Y = torch.stack([labels for _, labels in drawn]).to(self.device)  # (T, N)
        fitted = fit_heads(trial_features(maps, X_train), Y, trial_features(maps, X), y[:, None].to(self.device))
        theta = lambda h: fitted.theta_star if h == "min_norm" else fitted.theta(cast(Any, h))[:, 0]  # noqa: E731
        thetas = [theta(h) for h in self.trainings]
        return torch.stack(thetas, dim=-1), fitted.ill_conditioned.tolist()  # (T, p, C), T flags

    # --- the summary ------------------------------------------------------------------------------------------------
    def summarize(self, records: list[dict], out_dir: Path) -> None:
        """Log S_words, S and flip rates against n; on rank 0 write summary.md and the figures.

        summary.md holds the table, the slopes and the words.
        """
        from ..plots.words import plot_flip_rates, plot_words_vs_n
        from ..records.words import top_words_markdown, words_slopes, words_table

        records = trusted(records, "one-word substitution", WORDS_REQUIRED)
        table = words_table(records, self.trainings)
        for row in table:  # curves against n, step = n
            tag = f"words/{row['map']}/d{row['d']}" + (f"/L{row['L']}" if row["L"] != 1 else "")
            self.log_curve(f"{tag}/ws_words", row["n"], row["ws_words"])
            if row["ws"] is not None:
                self.log_curve(f"{tag}/ws", row["n"], row["ws"])
            for training in self.trainings:
                if row.get(f"flip_rate_{training}") is not None:
                    self.log_curve(f"{tag}/flip_rate_{training}", row["n"], row[f"flip_rate_{training}"])
        if not self.trainer.is_global_zero or not records:
            return
        slopes = words_slopes(records)
        write_summary(
            out_dir,
            table,
            caption="One real word against the continuous Delta, per cell: ws_words, the exact best admissible word's "
            "relative change of phi(X) (mean); ws, the continuous S at the same token (-: not searched, continuous: "
            "false); ratio, the mean of ws_words / ws; distance, the best word's ||h_w - x_i|| / sqrt(d); "
            "flip_rate_<training>, the share of reviews where some admissible word flips that head.\n\n",
            after=(
                "\nSlope of log S and log S_words against log n (95% interval):\n\n" + markdown_table(slopes)
                if slopes
                else ""
            )
            + "\n"
            + top_words_markdown(records, self.trainings),
        )
        self.add_figure("words/vs_n", plot_words_vs_n(records), "words_vs_n")
        if any(f"flipped_{t}" in r for r in records for t in self.trainings):
            self.add_figure("words/flip_rates", plot_flip_rates(records, self.trainings), "words_flip_rates")
