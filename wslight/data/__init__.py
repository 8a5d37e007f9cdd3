"""Token embeddings of IMDb reviews (or synthetic tokens) and the DataModule that serves them.

Modules, one job each:
- `sources`: the text sources and the seeded, balanced selection of short reviews;
- `synthetic`: Gaussian tokens with labels from a planted direction, generated on demand;
- `spec`: `EmbeddingSpec` (what to embed, nested as `embeddings:` in every config) and its validation;
- `cache`: the on-disk entry format (safetensors written in a stream, memory-mapped, JSON manifest);
- `build`: the cache key, the build and `load_token_embeddings`;
- `store`: `TokenEmbeddings` (reading an entry) and `preprocess`;
- `datamodule`: `EmbeddingDataModule` for training, imported lazily so the pure data functions do not import Lightning.
The encoder itself is described once, in `wslight.data.encoders` (`EncoderInfo`, `encoder_info`, `load_encoder`).
"""

from wslight.data.build import cache_paths, load_token_embeddings
from wslight.data.cache import CacheRebuildWarning, cache_root
from wslight.data.sources import SOURCES, load_texts
from wslight.data.spec import EmbeddingSpec, hidden_size_of, validate_spec
from wslight.data.store import TokenEmbeddings, preprocess

__all__ = [
    "SOURCES",
    "CacheRebuildWarning",
    "EmbeddingDataModule",
    "EmbeddingDataset",
    "EmbeddingSpec",
    "TokenEmbeddings",
    "cache_paths",
    "cache_root",
    "hidden_size_of",
    "load_texts",
    "load_token_embeddings",
    "preprocess",
    "split_indices",
    "validate_spec",
]


def __getattr__(name: str):
    if name in ("EmbeddingDataModule", "EmbeddingDataset", "split_indices"):
        from wslight.data import datamodule

        return getattr(datamodule, name)
    raise AttributeError(f"module 'wslight.data' has no attribute {name!r}")
