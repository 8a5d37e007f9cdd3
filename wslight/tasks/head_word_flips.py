"""`HeadWordFlips`: after a fit (or a test), the words that flip the fitted head: the `DeltaAttackCallback`'s twin.

The records are those of `wslight.tasks.TrainedHeadWords` (`review_word_records`), computed on the model in memory
instead of a run read back from its files (docs/theory/words.md §13.4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer

from ..base import validate
from ..chains.settings import DEFAULT_CHUNK_ELEMENTS
from ..records.results import ResultsFile, config_key
from ..records.summary import trusted
from .after_fit import AfterFitOrTest
from .classifier import FeatureMapClassifier
from .review_words import review_word_records
from .steps import gather_records, one_cpu_thread
from .trained_head_words import HEAD_WORDS_REQUIRED, head_words_table

HEAD_WORDS_RESULTS_NAME = "head_words.jsonl"


class HeadWordFlips(AfterFitOrTest):
    """Count the real words that flip the fitted head at every word position of held-out reviews, and log the rates.

    At the chosen hook, the first `reviews` reviews of the datamodule's test split (an EmbeddingDataModule of real
    reviews, layer 0) are read at every word position within their first n tokens: exactly over the encoder's
    admissible vocabulary, how many words flip the sign of f(X) = phi(X)^T theta + b, the strongest one and the output
    it gives, S_words and its best word (`wslight.tasks.review_words.review_word_records`). Under DDP rank r takes
    reviews r::world_size; the records are gathered on every rank, and rank 0 appends them to
    `<log dir>/head_words.jsonl` and logs `head_words/flip_rate` (the share of positions some word flips) and
    `head_words/review_flip_rate` (the share of reviews with such a position).

    Args:
        reviews: test reviews read (the first ones of the split, in its order).
        positions: "all" (every word of a review within its first n tokens) or a list of token indices.
        chunk_elements: working elements one chunk of words may hold (bounds the memory of the substitution).
        hook: "fit_end" (after `trainer.fit`) or "test_end" (after `trainer.test`).
    """

    def __init__(
        self,
        reviews: int = 20,
        positions: Literal["all"] | list[int] = "all",
        chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
        hook: Literal["fit_end", "test_end"] = "fit_end",
    ) -> None:
        self.reviews = validate.positive_int("reviews", reviews)
        if positions != "all" and (
            not isinstance(positions, list) or not all(isinstance(i, int) and i >= 1 for i in positions)
        ):
            raise ValueError(f'positions: expected "all" or a list of token indices >= 1, got {positions!r}')
        if positions != "all":
            validate.note_repeats("positions", positions)
            positions = list(dict.fromkeys(positions))
        self.positions = positions
        self.chunk_elements = validate.positive_int("chunk_elements", chunk_elements)
        self.set_hook(hook)
        self.records: list[dict] = []
        self.metrics: dict[str, float] = {}
        self.results_path: Path | None = None

    def run(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """This rank's reviews, gathered on every rank; rank 0 writes and logs (one CPU thread per process)."""
        with torch.no_grad(), one_cpu_thread(trainer.strategy.root_device):
            self._run(trainer, pl_module)

    def _inputs(self, trainer: Trainer, pl_module: LightningModule) -> tuple[FeatureMapClassifier, Any, Any]:
        """The model, the datamodule and the encoder's words, checked before any work."""
        if not isinstance(pl_module, FeatureMapClassifier):
            raise ValueError(f"HeadWordFlips: expected a FeatureMapClassifier, got {type(pl_module).__name__}")
        dm = trainer.datamodule  # type: ignore[attr-defined]
        spec = getattr(dm, "spec", None)  # an EmbeddingDataModule's EmbeddingSpec
        if spec is None or spec.source == "synthetic" or spec.layer != 0:
            raise ValueError(
                f"HeadWordFlips: the datamodule must serve real reviews at layer 0 (their words' rows), got {spec!r}"
            )
        if len(dm.test_indices) < self.reviews:
            raise ValueError(f"reviews: the test split holds {len(dm.test_indices)} reviews, fewer than {self.reviews}")
        from ..data.vocabulary import EncoderWords

        return pl_module, dm, EncoderWords(spec.encoder)

    def _run(self, trainer: Trainer, pl_module: LightningModule) -> None:
        out_dir = Path(trainer.log_dir or trainer.default_root_dir)  # log_dir is a collective: every rank calls it
        model, dm, words = self._inputs(trainer, pl_module)
        distributed = trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
        world_size, rank = (trainer.world_size, trainer.global_rank) if distributed else (1, 0)
        mine = []
        for k in range(rank, self.reviews, world_size):
            for r in review_word_records(
                model,
                dm.embeddings,
                words,
                int(dm.test_indices[k]),
                dm.n,
                dm.d,
                self.positions,
                self.chunk_elements,
                trainer.strategy.root_device,
                normalize=bool(getattr(dm, "normalize", True)),
            ):
                mine.append(r | {"trial": k, "trial_key": f"r{k}", "record_key": f"r{k}/p{r['position']}"})
        records = gather_records(mine, world_size)
        self.records = sorted(records, key=lambda r: (r["trial"], r["position"]))
        trusted_records = trusted(self.records, "trained head's words", HEAD_WORDS_REQUIRED)
        if trusted_records:
            table = head_words_table(trusted_records)
            self.metrics = {f"head_words/{k}": float(table[k]) for k in ("flip_rate", "review_flip_rate", "flips")}
        if trainer.is_global_zero:
            self.results_path = out_dir / HEAD_WORDS_RESULTS_NAME
            identity = {"reviews": self.reviews, "positions": self.positions, "step": trainer.global_step}
            ResultsFile(self.results_path, "callback-" + config_key(identity)).append(self.records)
            for logger in trainer.loggers:
                logger.log_metrics(self.metrics, step=trainer.global_step)
                logger.save()
