"""Which real word flips a text classifier: every replaceable word of every review over a candidate set, exactly.

`python evaluate.py --config configs/words/classifier.yaml --model.init_args.model <HF folder | hub id | train.py run>`
(docs/tasks/classifier.md). A position is certified when no candidate flips the argmax label there (over the whole
candidate set: a certificate for that set), flipped when one does; a review is robust (correct and no position
flips), attacked (correct and some position flips) or wrong (misclassified before any substitution).
"""

from __future__ import annotations

import time
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch

from ..base import validate
from ..base.paths import user_path
from ..data.review_texts import TextSplit, read_labelled_texts
from ..data.word_positions import TokenisedText, retokenised, tokenise, word_vocabulary
from ..features.classifiers import PromptClassifier, SequenceClassifier, TextClassifier, float64_copy, model_folder
from ..records.classifier_words import CLASSIFIER_WORDS_REQUIRED, write_classifier_summary
from ..records.summary import trusted
from ..search.candidates import (
    CANDIDATE_SETS,
    NeighbourIndex,
    file_substitutes,
    first_order_ranking,
    read_substitutes,
)
from ..search.classifier_words import PositionWords, margin_gradients, review_verdicts
from .evaluation import Evaluation

# The split a model without one of its own is judged on: configs/finetune/imdb.yaml's (seed 0, 2,500 held out).
DEFAULT_SPLIT = TextSplit()


class ClassifierWords(Evaluation):
    """The words that flip a text classifier, per position, per review and per run.

    Args:
        model: the classifier: a folder written by `save_pretrained`, a train.py run of configs/finetune/imdb.yaml
            (its `huggingface/` export), or a hub id; any `AutoModelForSequenceClassification` (a flip is a change
            of the argmax label). With `prompt_template`, a causal language model instead.
        reviews: "heldout" (the model's own held-out reviews: those its folder records, else the 2,500 held out by
            configs/finetune/imdb.yaml) or a .jsonl/.csv file of texts with labels.
        num_reviews: the first this many reviews (None: all of them).
        max_length: tokens read per review, specials included (None: the length the model was fine-tuned at, else
            the tokenizer's limit).
        candidates: "neighbours" (the k nearest words in the model's input-embedding space), "vocabulary" (every
            one-token word; screened unless `screen` is None) or "file" (`substitutes`).
        k: neighbours per word (candidates "neighbours").
        substitutes: a JSON object {word: [substitutes]} (candidates "file").
        screen: candidates "vocabulary": per position the words a first-order expansion of the margin ranks lowest,
            this many, each checked exactly (None: the whole vocabulary, exact; minutes a position on a CPU).
        recall_reviews: with `screen`, the first this many reviews are also checked over the whole vocabulary, for
            the screen's measured recall.
        positions_per_review: at most this many positions per review, spread evenly over its words (None: every
            word; fewer positions make robustness an upper bound, said in summary.md).
        batch_size: edited reviews per forward.
        recheck: evaluate again in float64 every word whose flip rounding could decide (the model runs in float32).
        prompt_template: a prompt with `{text}` where the review goes: the model is then a causal LM whose decision
            is the next-token logit of each answer (the paper's Figure 1, right).
        answers: the answer of each class, one token each, class 0 first (with `prompt_template`).
        trials_per_step: reviews per test step (sharded over devices by Lightning).
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    def __init__(
        self,
        model: str,
        reviews: str = "heldout",
        num_reviews: int | None = 100,
        max_length: int | None = None,
        candidates: Literal["neighbours", "vocabulary", "file"] = "neighbours",
        k: int = 10,
        substitutes: str | None = None,
        screen: int | None = 32,
        recall_reviews: int = 0,
        positions_per_review: int | None = None,
        batch_size: int = 64,
        recheck: bool = True,
        prompt_template: str | None = None,
        answers: list[str] | None = None,
        trials_per_step: int = 1,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(trials_per_step, output_dir)
        self.model_name = model
        self.candidates = validate.choice("candidates", candidates, CANDIDATE_SETS)
        self.k = validate.positive_int("k", k)
        self.table = None
        if candidates == "file":
            if substitutes is None:
                raise ValueError("substitutes: candidates 'file' needs a JSON file {word: [substitutes]}")
            self.table = read_substitutes(user_path(substitutes) or substitutes)
        self.screen = validate.integer("screen", screen, low=1, allow_none=True)
        self.recall_reviews = validate.integer("recall_reviews", recall_reviews, low=0)
        if self.recall_reviews and (candidates != "vocabulary" or screen is None):
            raise ValueError(
                f"recall_reviews: {recall_reviews} measures the screen's recall; set candidates 'vocabulary' and screen"
            )
        self.positions_per_review = validate.integer("positions_per_review", positions_per_review, 1, allow_none=True)
        self.batch_size = validate.positive_int("batch_size", batch_size)
        self.recheck = validate.boolean("recheck", recheck)
        self.classifier: TextClassifier = self._load(model, prompt_template, answers)
        self.texts, self.labels, self.sample_ids, self.source = self._reviews(reviews, max_length)
        total = len(self.texts)
        n = total if num_reviews is None else validate.integer("num_reviews", num_reviews, 1, total, why="the reviews")
        self.num_reviews = n
        self.max_length = self._max_length if max_length is None else validate.integer("max_length", max_length, 3)

    def _load(self, model: str, template: str | None, answers: list[str] | None) -> TextClassifier:
        if template is None:
            return SequenceClassifier(model)
        return PromptClassifier(model, template, tuple(answers or (" No", " Yes")))

    def _reviews(self, reviews: str, max_length: int | None) -> tuple[list[str], Any, Any, str]:
        folder = Path(model_folder(self.model_name))
        recorded = TextSplit.read(folder) if folder.is_dir() else None
        self._max_length = recorded[1] if recorded and recorded[1] else self.classifier.max_length
        if reviews == "heldout":
            split = recorded[0] if recorded else DEFAULT_SPLIT
            texts, labels, rows = split.texts("test")
            origin = "its own held-out split" if recorded else "the held-out split of configs/finetune/imdb.yaml"
            return texts, labels, rows, f"{split.source} test split ({len(texts)} reviews, {origin})"
        texts, labels = read_labelled_texts(user_path(reviews) or reviews)
        return texts, labels, torch.arange(len(texts)).numpy(), str(reviews)

    @cached_property
    def vocabulary(self) -> tuple[torch.Tensor, tuple[str, ...]]:
        """(W,) ids and words of the tokenizer's one-token words."""
        return word_vocabulary(self.classifier.tokenizer)

    @cached_property
    def word_of(self) -> dict[int, str]:
        """The word of each one-token word's id (built once, read at every position)."""
        ids, words = self.vocabulary
        return dict(zip(ids.tolist(), words, strict=True))

    @cached_property
    def neighbours(self) -> NeighbourIndex:
        """The nearest-word index over the input embeddings."""
        return NeighbourIndex(self.classifier.embeddings(), self.vocabulary[0])

    @cached_property
    def classifier64(self) -> TextClassifier:
        """The classifier in float64 (for the words rounding could decide)."""
        return float64_copy(self.classifier)

    def trial_specs(self) -> list[dict]:
        """One trial per review, in the reviews' order."""
        return [{"trial_key": f"r{k}", "trial": k} for k in range(self.num_reviews)]

    def run_trials(self, specs: list[dict]) -> list[dict]:
        """Every position of the step's reviews over the candidate set (and the whole vocabulary for recall)."""
        records = []
        for spec in specs:
            records += self.review_records(spec["trial"])
        return records

    def review_records(self, k: int) -> list[dict]:
        """The records of review k: one per position, then the review's own."""
        start = time.perf_counter()
        clf = self.classifier
        text, span = clf.render(self.texts[k])
        tokens = tokenise(clf.tokenizer, text, self.max_length, span, clf.add_special_tokens)
        positions = spread(tokens.positions, self.positions_per_review)
        label = int(self.labels[k])
        words = [self.position_words(tokens, p) for p in positions]
        logits64 = self.classifier64.logits if self.recheck else None
        clean, verdicts = review_verdicts(clf.logits, tokens.ids, [w for w, _ in words], self.batch_size, logits64)
        pred = int(clean.argmax())
        exhaustive = k < self.recall_reviews
        full = self.whole_vocabulary(tokens, positions, logits64) if exhaustive else None
        base = {
            "experiment": "classifier_words",
            "model": self.model_name,
            "trial": k,
            "sample_id": int(self.sample_ids[k]),
        }
        base |= {"label": label, "pred": pred, "correct": pred == label, "candidates": self.candidates}
        records = []
        for j, (p, (_, refused), v) in enumerate(zip(positions, words, verdicts, strict=True)):
            r = base | {"kind": "position", "record_key": f"r{k}/t{p.token}", "trial_key": f"r{k}"}
            r |= {"position": p.token, "word": p.word, "checked": v.checked, "not_one_token": refused}
            r |= {
                "flips": v.flips,
                "flipped": v.flipped,
                "best_word": v.best_word,
                "best_margin": v.best_margin if v.checked else None,
            }
            r |= {"flip_word": v.best_word if v.flipped else "", "flip_label": v.flip_label, "rechecked": v.rechecked}
            r |= {"status": status(v, self.screened), "clean_margin": float(margin_of(clean, pred))}
            if full is not None:
                r |= {
                    "exhaustive_flips": full[j].flips,
                    "exhaustive_best_word": full[j].best_word,
                    "exhaustive_checked": full[j].checked,
                }
            records.append(r)
        flipped = sum(v.flipped for v in verdicts)
        review = "wrong" if pred != label else ("attacked" if flipped else "robust")
        records.append(
            base
            | {
                "kind": "review",
                "record_key": f"r{k}",
                "trial_key": f"r{k}",
                "status": review,
                "positions": len(positions),
                "flipped_positions": flipped,
                "forwards": 1 + sum(v.checked for v in verdicts),
                "tokens": len(tokens.ids),
                "skipped": tokens.skipped,
                "clean_margin": float(margin_of(clean, pred)),
                "seconds": time.perf_counter() - start,
            }
        )
        return records

    @property
    def screened(self) -> bool:
        """Whether only a screen of the candidate set is checked (no certificate where nothing flips)."""
        return self.candidates == "vocabulary" and self.screen is not None

    def position_words(self, tokens: TokenisedText, p: Any, whole: bool = False) -> tuple[PositionWords, int]:
        """The candidates of position p that the tokenizer accepts there, and how many it refused."""
        clf = self.classifier
        original = int(tokens.ids[p.token])
        vocab_ids, vocab_words = self.vocabulary
        if self.candidates == "file":
            words = file_substitutes(self.table or {}, p.word)
            ids = torch.tensor([_single_id(clf.tokenizer, w) for w in words], dtype=torch.int64)
        else:
            if self.candidates == "neighbours":
                ids = self.neighbours.nearest(original, self.k)
            elif whole or self.screen is None:
                ids = vocab_ids[vocab_ids != original]
            else:
                ids = self._screened(tokens, p.token, original)
            words = [self.word_of[int(i)] for i in ids]
        keep = (ids >= 0) & retokenised(clf.tokenizer, tokens, p, words, self.max_length, clf.add_special_tokens, ids)
        kept = [w for w, ok in zip(words, keep.tolist(), strict=True) if ok]
        return PositionWords(p.token, ids[keep], kept), int((~keep).sum())

    def _screened(self, tokens: TokenisedText, token: int, original: int) -> torch.Tensor:
        clf = self.classifier
        if getattr(self, "_grad_for", None) is not tokens:  # one backward per review serves all its positions
            self._table = clf.embeddings().detach().cpu()  # (V, H)
            with torch.no_grad():
                label = int(clf.logits(input_ids=tokens.ids[None])[0].argmax())
            logits_of = lambda e: clf.logits(inputs_embeds=e)  # noqa: E731
            _, self._grad = margin_gradients(logits_of, self._table[tokens.ids], label)
            self._grad_for = tokens
        return first_order_ranking(self._table, original, self._grad[token], self.vocabulary[0], self.screen or 1)

    def whole_vocabulary(self, tokens: TokenisedText, positions: list, logits64: Any) -> list:
        """The verdicts over the whole vocabulary at every position (the screen's recall)."""
        words = [self.position_words(tokens, p, whole=True)[0] for p in positions]
        return review_verdicts(self.classifier.logits, tokens.ids, words, self.batch_size, logits64)[1]

    def summarize(self, records: list[dict], out_dir: Path) -> None:
        """Log the run's rates; on rank 0 write summary.md and the figure."""
        records = trusted(records, "classifier's words", CLASSIFIER_WORDS_REQUIRED)
        if not records:
            return
        table = write_classifier_summary(records, out_dir, self.describe(), write=self.trainer.is_global_zero)
        for key in ("clean_accuracy", "robust_accuracy", "attack_success", "flip_rate"):
            self.log_scalar(f"classifier_words/{key}", table[key])
        from ..plots.words import plot_classifier_flips

        self.add_figure("classifier_words/flips_vs_margin", plot_classifier_flips(records), "classifier_flips")

    def describe(self) -> str:
        """What the run evaluated, for summary.md."""
        what = {
            "neighbours": f"the {self.k} nearest words in the input-embedding space (cosine)",
            "vocabulary": "every one-token word of the vocabulary"
            + (
                f", screened: the {self.screen} a first-order expansion ranks first, each checked exactly"
                if self.screened
                else ", each checked exactly"
            ),
            "file": "the substitutes of a user's file",
        }[self.candidates]
        text = (
            f"Model `{self.model_name}`; reviews: {self.source}, the first {self.num_reviews}, {self.max_length} "
            f"tokens; candidates: {what}."
        )
        partial = []
        if self.positions_per_review is not None:
            partial.append(f"at most {self.positions_per_review} positions a review (evenly spread over its words)")
        if self.screened:
            partial.append("a screen of the vocabulary")
        if partial:
            text += (
                f" Checked: {' and '.join(partial)}, so robust_accuracy is an upper bound and attack_success a lower "
                "bound of those over every position and the whole candidate set."
            )
        return text


def status(verdict: Any, screened: bool) -> str:
    """A position's status: flipped, certified, not found or no candidates.

    Certified: no candidate of the whole set flips it; not found: none of the words a screen checked flips it; no
    candidates: the set has no word that is one token there.
    """
    if verdict.flipped:
        return "flipped"
    if not verdict.checked:
        return "no candidates"
    return "not found" if screened else "certified"


def margin_of(logits: torch.Tensor, label: int) -> float:
    """logit[label] minus the largest other logit."""
    others = torch.cat([logits[:label], logits[label + 1 :]])
    return float(logits[label] - others.max())


def spread(positions: list, count: int | None) -> list:
    """At most `count` of the positions, evenly spaced over them (all of them for None)."""
    if count is None or len(positions) <= count:
        return positions
    step = len(positions) / count
    return [positions[int(i * step)] for i in range(count)]


def _single_id(tokenizer: Any, word: str) -> int:
    ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    return int(ids[0]) if len(ids) == 1 else -1
