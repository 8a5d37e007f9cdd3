"""Token embeddings of IMDb reviews (or synthetic tokens): sources, spec, cache and store.

Modules, one job each:
- `sources`: the text sources and the seeded, balanced selection of short reviews;
- `synthetic`: Gaussian tokens with labels from a planted direction, generated on demand;
- `spec`: `EmbeddingSpec` (what to embed, nested as `embeddings:` in every config) and its validation;
- `cache`: the on-disk entry format (safetensors written in a stream, memory-mapped, JSON manifest);
- `cache_key`: which entry answers a spec (the request it must match, its file stem and paths);
- `build`: the build of an entry and `load_token_embeddings`;
- `store`: `TokenEmbeddings` (reading an entry) and `preprocess`;
The DataModule that serves them for training is `wslight.tasks.EmbeddingDataModule` (the Lightning floor).
The encoder itself is described once, in `wslight.data.encoders` (`EncoderInfo`, `encoder_info`, `load_encoder`).
"""

from wslight.data.build import load_token_embeddings
from wslight.data.cache import CacheRebuildWarning, cache_root
from wslight.data.cache_key import cache_paths
from wslight.data.sources import SOURCES, load_texts
from wslight.data.spec import EmbeddingSpec, hidden_size_of, validate_spec
from wslight.data.store import TokenEmbeddings, preprocess

__all__ = [
    "SOURCES",
    "CacheRebuildWarning",
    "EmbeddingSpec",
    "TokenEmbeddings",
    "cache_paths",
    "cache_root",
    "hidden_size_of",
    "load_texts",
    "load_token_embeddings",
    "preprocess",
    "validate_spec",
]
