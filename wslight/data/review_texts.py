"""Reviews as text: the seeded train / validation / held-out split a fine-tuned classifier uses, and a user's file.

The words evaluation of a classifier and its fine-tuning read the same split, so a fine-tuned model is always judged
on reviews it never saw (docs/tasks/classifier.md). The split is a seeded permutation of the source's rows: the first
`test_size` rows are held out, the next `val_size` validate, the next `train_size` (or the rest) train.
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..base import validate
from ..base.seeding import generator
from .sources import SOURCE_ROWS, TEXT_SOURCES, load_texts

SPLITS = ("train", "val", "test")
# Where a fine-tuned classifier's Hugging Face folder records the split it was trained on.
SPLIT_FILE = "wslight_split.json"


@dataclass(frozen=True)
class TextSplit:
    """The seeded split of a text source's rows into train, validation and held-out test reviews.

    Args:
        source: 'imdb_offline' (the bundled IMDb train split) or 'imdb_hub'.
        test_size: held-out reviews, never trained or validated on.
        val_size: validation reviews (early stopping, checkpoints).
        train_size: training reviews (None: every row left).
        seed: the permutation's seed.
    """

    source: str = "imdb_offline"
    test_size: int = 2500
    val_size: int = 1000
    train_size: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        validate.choice("source", self.source, TEXT_SOURCES)
        rows = SOURCE_ROWS[self.source]
        validate.integer("test_size", self.test_size, 1, rows - 2, why=f"{self.source} holds {rows} reviews")
        validate.integer("val_size", self.val_size, 1, rows - 1 - self.test_size, why="the rows left after test_size")
        left = rows - self.test_size - self.val_size
        validate.integer("train_size", self.train_size, 1, left, allow_none=True, why="the rows left for training")
        validate.integer("seed", self.seed, low=0)

    def rows(self, split: str) -> np.ndarray:
        """(R,) int64: the source's row ids (`sample_id`) of a split, in the permutation's order."""
        validate.choice("split", split, SPLITS)
        order = torch.randperm(SOURCE_ROWS[self.source], generator=generator(self.seed, "data/text_split")).numpy()
        a = {"test": 0, "val": self.test_size, "train": self.test_size + self.val_size}[split]
        b = {"test": self.test_size, "val": self.test_size + self.val_size}.get(split)
        if b is None:
            b = len(order) if self.train_size is None else a + self.train_size
        return order[a:b].astype(np.int64)

    def texts(self, split: str) -> tuple[list[str], np.ndarray, np.ndarray]:
        """A split's (texts, labels (R,) int64 in {0, 1}, row ids (R,) int64)."""
        corpus = load_texts(self.source)
        rows = self.rows(split)
        return [corpus.texts[i] for i in rows], corpus.labels[rows], rows

    def to_dict(self) -> dict:
        """The split as it is written next to a fine-tuned model (SPLIT_FILE)."""
        return {
            "source": self.source,
            "test_size": self.test_size,
            "val_size": self.val_size,
            "train_size": self.train_size,
            "seed": self.seed,
        }

    @classmethod
    def read(cls, folder: str | Path) -> tuple[TextSplit, int | None] | None:
        """The split a fine-tuned model's folder records and the max_length it was trained at (None: no SPLIT_FILE)."""
        path = Path(folder) / SPLIT_FILE
        if not path.is_file():
            return None
        fields = json.loads(path.read_text())
        max_length = fields.pop("max_length", None)
        return cls(**fields), max_length


def read_labelled_texts(path: str | Path) -> tuple[list[str], np.ndarray]:
    """A user's reviews: a .jsonl file of {"text": ..., "label": int} objects or a .csv with columns text,label.

    Raises:
        ValueError: another suffix, a missing column, a label that is not an integer >= 0, or no rows; naming the line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"reviews: {str(path)!r} is not a file (a .jsonl or .csv of texts with labels)")
    texts: list[str] = []
    labels: list[int] = []
    if path.suffix == ".jsonl":
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or "text" not in row or "label" not in row:
                raise ValueError(f"reviews: {path}:{i} must be an object with keys text and label, got {line[:80]!r}")
            texts.append(str(row["text"]))
            labels.append(_label(row["label"], f"{path}:{i}"))
    elif path.suffix == ".csv":
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if not {"text", "label"} <= set(reader.fieldnames or ()):
                raise ValueError(f"reviews: {path} needs columns text,label, has {reader.fieldnames}")
            for i, row in enumerate(reader, 2):
                texts.append(row["text"])
                labels.append(_label(row["label"], f"{path}:{i}"))
    else:
        raise ValueError(f"reviews: {path} must end in .jsonl or .csv, got {path.suffix!r}")
    if not texts:
        raise ValueError(f"reviews: {path} holds no reviews")
    return texts, np.asarray(labels, dtype=np.int64)


def _label(value: object, where: str) -> int:
    try:
        label = int(str(value))
    except ValueError:
        label = -1
    if label < 0:
        raise ValueError(f"reviews: the label at {where} must be an integer >= 0 (a class index), got {value!r}")
    return label
