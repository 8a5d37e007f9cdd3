"""Which real words flip a head trained with train.py, where, and how often (docs/theory/words.md §13.4).

The exact one-word substitution (`wslight.search.word_substitution`) asked of the model a user trained, not of heads
the sweep fits itself: the run's map rebuilt, its fitted head with its bias, its own held-out reviews.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import torch

from ..base import validate
from ..base.paths import user_path
from ..chains.settings import DEFAULT_CHUNK_ELEMENTS
from ..records.summary import trusted, write_summary
from ..search.screening import SCREEN_CENTROIDS
from .embeddings_evaluation import EmbeddingsEvaluation
from .review_words import review_word_records
from .trained_run import TrainedRun

HEAD_WORDS_REQUIRED = ("ws_words", "margin")  # the values every summarised record needs


class TrainedHeadWords(EmbeddingsEvaluation):
    """The words that flip a trained head: every admissible word at every position of the run's held-out reviews.

    For each test review of a `train.py fit` run (its checkpoint and config.yaml: the same map, the fitted theta and
    bias, the same test split) and each position, exactly over the encoder's admissible vocabulary (the rows a word
    has at that position): how many words flip the sign of the head's output f(X) = phi(X)^T theta + b, the flipping
    word with the largest opposite output and that output, the discrete word sensitivity S_words and its best word,
    and the clean margin y f(X). One trial = one review (all its positions in one step).

    Args:
        run: the train.py run's log folder (it prints `logs: <folder>`; config.yaml and checkpoints/ inside), or a
            checkpoint file inside it.
        checkpoint: the file under `<run>/checkpoints/` when `run` is a folder ("last.ckpt": the end of the fit).
        reviews: test reviews evaluated, the first ones of the run's test split (None: all of them).
        positions: the tokens substituted: "all" (every word of the review within its first n tokens; [CLS], [SEP]
            and padding are no words) or a list of indices (a review is evaluated at those of them that are words).
        chunk_elements: working elements one chunk of words may hold (bounds the memory of the substitution).
        screen: None (every admissible word checked, exact) or K: per position only the K words a first-order score
            ranks most likely to flip the head, each checked exactly (docs/theory/words.md §13.5): for maps whose
            forward is costly (a whole pre-trained encoder on a CPU). Every flip reported is real; some may be missed.
        screen_centroids: with `screen`, the k-means centroids of the words' rows at which the screen expands the
            head too, besides the clean review (each costs a forward and a backward; 0: the clean expansion alone).
        recall_reviews: with `screen`, the first this many reviews are also checked over the whole admissible
            vocabulary, and summary.md gives the screen's recall on their positions.
        trials_per_step: reviews per test step (sharded over devices by Lightning).
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    def __init__(
        self,
        run: str,
        checkpoint: str = "last.ckpt",
        reviews: int | None = 20,
        positions: Literal["all"] | list[int] = "all",
        chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
        screen: int | None = None,
        screen_centroids: int = SCREEN_CENTROIDS,
        recall_reviews: int = 0,
        trials_per_step: int = 1,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(trials_per_step, output_dir)
        self.trained = TrainedRun.load(user_path(run), checkpoint)
        self.run = str(self.trained.folder)
        self.set_embeddings(self.trained.embeddings, "run", self.trained.d, "run", self.trained.n)
        if self.embeddings.source == "synthetic":
            raise ValueError(
                "run: its reviews are synthetic tokens; the substitution needs real reviews and their words"
            )
        if self.embeddings.layer != 0:
            raise ValueError(
                f"run: a substitution changes one row of layer 0, the run reads layer {self.embeddings.layer}"
            )
        total = len(self.trained.test_indices)
        self.reviews = (
            total if reviews is None else validate.integer("reviews", reviews, 1, total, why="the test split")
        )
        if positions != "all":
            given = positions
            positions = validate.positions("positions", positions, self.trained.n)
            validate.note_repeats("positions", given)
        self.positions = positions
        self.chunk_elements = validate.positive_int("chunk_elements", chunk_elements)
        self.screen = validate.integer("screen", screen, low=1, allow_none=True)
        self.screen_centroids = validate.integer("screen_centroids", screen_centroids, low=0)
        self.recall_reviews = validate.integer("recall_reviews", recall_reviews, 0, self.reviews, why="reviews")
        if self.recall_reviews and self.screen is None:
            raise ValueError(f"recall_reviews: {recall_reviews} measures a screen's recall; set screen too")
        self._words: Any = None

    @property
    def words(self) -> Any:
        """The encoder's vocabulary (`EncoderWords`), loaded on first use."""
        if self._words is None:
            from ..data.vocabulary import EncoderWords

            self._words = EncoderWords(self.embeddings.encoder)
        return self._words

    def trial_specs(self) -> list[dict]:
        """One trial per test review, in the split's order."""
        return [{"trial_key": f"r{k}", "trial": k} for k in range(self.reviews)]

    def run_trials(self, specs: list[dict]) -> list[dict]:
        """Every position of the step's reviews over the whole admissible vocabulary."""
        records = []
        for spec in specs:
            index = int(self.trained.test_indices[spec["trial"]])
            found = review_word_records(
                self.trained.model,
                self.store,
                self.words,
                index,
                self.trained.n,
                self.trained.d,
                self.positions,
                self.chunk_elements,
                self.device,
                normalize=self.trained.normalize,
                screen=self.screen,
                screen_centroids=self.screen_centroids,
                check_exact=spec["trial"] < self.recall_reviews,
            )
            for r in found:
                r |= {"trial_key": spec["trial_key"], "record_key": f"{spec['trial_key']}/p{r['position']}"}
                records.append(
                    r | {"trial": spec["trial"], "run": self.run, "checkpoint": self.trained.checkpoint.name}
                )
        return records

    def summarize(self, records: list[dict], out_dir: Path) -> None:
        """Log the flip rates; on rank 0 write summary.md (the table and the words that flip the head)."""
        records = trusted(records, "trained head's words", HEAD_WORDS_REQUIRED)
        if not records:
            return
        table = head_words_table(records)
        self.log_scalar("head_words/flip_rate", table["flip_rate"])
        self.log_scalar("head_words/review_flip_rate", table["review_flip_rate"])
        if not self.trainer.is_global_zero:
            return
        flippers = Counter(r["flip_word"] for r in records if r["flipped"])
        words = ", ".join(f"`{w}` ({c})" for w, c in flippers.most_common(20)) or "none"
        if self.screen is not None:
            words += "\n\n" + screen_note(records, self.screen, self.screen_centroids)
        recall = screen_recall(records)
        if recall is not None:
            words += " " + recall_note(recall, self.recall_reviews) + "\n"
        from ..plots.words import plot_head_word_flips

        self.add_figure("head_words/flips_vs_margin", plot_head_word_flips(records), "head_words_flips")
        write_summary(
            out_dir,
            [table],
            caption=f"The words that flip the head of {self.run}: flip_rate, the share of (review, position) where "
            "some admissible word flips the head's sign; review_flip_rate, the share of reviews with such a position; "
            "flips, the mean number of flipping words per position; ws_words, the mean exact word sensitivity; "
            "accuracy and median_margin, of the clean reviews.\n\n",
            after=f"\nThe most frequent flipping words (positions where each is the strongest): {words}\n",
        )


def checked_words(record: dict) -> int:
    """The words a record checked exactly: `checked`, else (a record written before that field) `admissible`."""
    return int(record.get("checked", record["admissible"]))


def screen_note(records: list[dict], screen: int, centroids: int) -> str:
    """What a screened run checked, for summary.md: how many words per position, and whether that was all of them.

    A position has min(screen, admissible) words checked. Where that is every admissible word at every position, the
    counts are exact (the screen only ordered the words); else flip_rate, flips and ws_words are lower bounds.
    """
    checked = [checked_words(r) for r in records]
    admissible = [int(r["admissible"]) for r in records]
    whole = sum(c >= a for c, a in zip(checked, admissible))
    ranking = (
        f"the first of a first-order ranking, expanded at the clean review and {centroids} centroids of the words' rows"
    )
    if whole == len(records):
        low, high = min(checked), max(checked)
        span = f"{low}" if low == high else f"{low} to {high}"
        return (
            f"Screened with screen: {screen}, which covers every admissible word: {span} words checked per position "
            f"(all the admissible ones), each exactly. The check is exhaustive: flip_rate, flips and ws_words are "
            "exact, not lower bounds."
        )
    covered = f"; at {whole} of {len(records)} positions the screen covered every admissible word" if whole else ""
    return (
        f"Screened: up to {screen} words checked per position ({ranking}), each exactly: "
        f"{sum(checked)} of {sum(admissible)} admissible (position, word) pairs checked{covered}. Every flip is "
        "real; flip_rate, flips and ws_words count the checked words (lower bounds)."
    )


def screen_recall(records: list[dict]) -> dict | None:
    """The screen's recall on the records checked both ways (None where there are none).

    position_recall: the share of positions some admissible word flips (exact) where the screen found a flip too;
    word_recall: the share of the flipping words the screen checked (every screened flip is one of them). Each is NaN
    where there is nothing to recall (no position flipped, no flipping word, over the whole vocabulary).
    """
    both = [r for r in records if "exact_flipped" in r]
    if not both:
        return None
    flipped = [r for r in both if r["exact_flipped"]]
    exact_words = sum(r["exact_flips"] for r in both)
    return {
        "positions": len(both),
        "flipped": len(flipped),
        "found": sum(r["flipped"] for r in flipped),
        "position_recall": sum(r["flipped"] for r in flipped) / len(flipped) if flipped else float("nan"),
        "exact_words": exact_words,
        "words": sum(r["flips"] for r in both),
        "word_recall": sum(r["flips"] for r in both) / exact_words if exact_words else float("nan"),
    }


def recall_text(rate: float) -> str:
    """A recall of `screen_recall` as text: "0.875", or "nothing to recall" for 0 of 0 (NaN), never a number."""
    return "nothing to recall" if math.isnan(rate) else f"{rate:.3f}"


def recall_note(recall: dict, reviews: int) -> str:
    """`screen_recall` as a sentence of summary.md; a recall of 0 of 0 reads "nothing to recall", not a number."""

    def share(rate: float) -> str:
        return "nothing to recall" if math.isnan(rate) else f"recall {recall_text(rate)}"

    return (
        f"Against the whole admissible vocabulary on {recall['positions']} positions of the first {reviews} reviews: "
        f"{recall['found']} of {recall['flipped']} flipped positions found "
        f"({share(recall['position_recall'])}), {recall['words']} of "
        f"{recall['exact_words']} flipping words "
        f"({share(recall['word_recall'])})."
    )


def head_words_table(records: list[dict]) -> dict:
    """One row summarising the records of a `TrainedHeadWords` run."""
    by_review: dict[int, bool] = {}
    for r in records:
        by_review[r["trial"]] = by_review.get(r["trial"], False) or bool(r["flipped"])
    margins = torch.tensor([r["margin"] for r in records], dtype=torch.float64)
    return {
        "map": records[0]["map"],
        "n": records[0]["n"],
        "d": records[0]["d"],
        "reviews": len(by_review),
        "positions": len(records),
        "flip_rate": sum(r["flipped"] for r in records) / len(records),
        "review_flip_rate": sum(by_review.values()) / len(by_review),
        "flips": sum(r["flips"] for r in records) / len(records),
        "ws_words": sum(r["ws_words"] for r in records) / len(records),
        "accuracy": sum(r["correct"] for r in records) / len(records),
        "median_margin": float(margins.median()),
    }
