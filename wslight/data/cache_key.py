"""Which cache entry answers an embedding spec: the request its manifest must match, its file stem and paths.

An entry is keyed by (source, encoder, layer, max_length, max_tokens, num_samples, seed, selection, storage dtype) and
the fingerprints of the source and the encoder; `cache_dir` and `batch_size` do not change the numbers and are not part
of the key.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from wslight.data import cache as _cache
from wslight.data import encoders
from wslight.data.sources import source_fingerprint
from wslight.data.spec import EmbeddingSpec, validate_spec

FORMAT_VERSION = 1


def cache_request(spec: EmbeddingSpec, info: encoders.EncoderInfo | None) -> dict:
    """The fields a cache entry must match (its manifest's `request`), JSON-serialisable."""
    req: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "source": spec.source,
        "source_fingerprint": source_fingerprint(spec.source),
        "max_length": spec.max_length,
        "num_samples": spec.num_samples,
        "seed": spec.seed,
    }
    if spec.source == "synthetic":
        req.update(synthetic_dim=spec.synthetic_dim, synthetic_unit_rows=spec.synthetic_unit_rows)
        return req
    assert info is not None
    req.update(
        encoder=spec.encoder,
        encoder_revision=info.revision,
        encoder_fingerprint=info.fingerprint,
        layer=spec.layer,
        max_tokens=spec.max_tokens,
        selection=spec.selection,
        storage_dtype=spec.storage_dtype,
        tokenization="padding=max_length,truncation=True",
    )
    return req


def cache_stem(spec: EmbeddingSpec, request: dict) -> str:
    """File stem of a cache entry: readable settings plus a hash of the full request."""
    key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:16]
    enc = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(spec.encoder).name or spec.encoder)[:40]
    # "-L<max_length>" is kept in the stem so that entries built before stay hits.
    return f"{spec.source}-{enc}-layer{spec.layer}-L{spec.max_length}-M{spec.num_samples}-seed{spec.seed}-{key}"


def entry_paths(spec: EmbeddingSpec, request: dict) -> tuple[Path, Path, Path]:
    """(safetensors file, manifest, lock file) of the entry answering `request`."""
    root = _cache.cache_root(spec.cache_dir)
    stem = cache_stem(spec, request)
    return root / f"{stem}.safetensors", root / f"{stem}.json", root / f"{stem}.lock"


def cache_paths(spec: EmbeddingSpec) -> tuple[Path, Path]:
    """(safetensors file, manifest) of the cache entry a text spec maps to (validates the spec)."""
    info = validate_spec(spec)
    if info is None:
        raise ValueError("embeddings.source 'synthetic' is generated on demand and has no cache entry")
    data, manifest, _ = entry_paths(spec, cache_request(spec, info))
    return data, manifest
