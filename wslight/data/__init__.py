"""IMDb text sources, embedding extraction with an on-disk cache, preprocessing, synthetic data, the DataModule.

`EmbeddingDataModule` is imported lazily so that the pure data functions do not import Lightning.
"""

from wslight.data.cache import CacheRebuildWarning, cache_root
from wslight.data.embeddings import (
    EmbeddingSpec,
    TokenEmbeddings,
    cache_paths,
    encoder_config,
    load_token_embeddings,
    preprocess,
    validate_spec,
)
from wslight.data.sources import SOURCES, load_texts

__all__ = [
    "SOURCES",
    "CacheRebuildWarning",
    "EmbeddingDataModule",
    "EmbeddingDataset",
    "EmbeddingSpec",
    "TokenEmbeddings",
    "cache_paths",
    "cache_root",
    "encoder_config",
    "load_texts",
    "load_token_embeddings",
    "preprocess",
    "validate_spec",
]


def __getattr__(name: str):
    if name in ("EmbeddingDataModule", "EmbeddingDataset", "split_indices"):
        from wslight.data import datamodule

        return getattr(datamodule, name)
    raise AttributeError(f"module 'wslight.data' has no attribute {name!r}")
