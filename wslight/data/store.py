"""Reading token embeddings: `TokenEmbeddings` (a memory-mapped cache entry or synthetic samples) and `preprocess`.

Paper (docs/theory/checks.md §10.1): an experiment sample is X = `X_emb[idx][:n, :d]` with each row rescaled to norm
sqrt(d). Positions past the review are the [SEP] and [PAD] embeddings, as in the authors' setup. Shapes: B samples, S =
max_length stored token positions, H the hidden size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from wslight.base.validate import integer
from wslight.data import cache as _cache
from wslight.data.spec import EmbeddingSpec
from wslight.data.synthetic import synthetic_tokens


def _rescale_rows(X: Tensor, d: int) -> Tensor:
    """Each row of X (..., n, d) rescaled to norm sqrt(d)."""
    norms = X.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)  # (B, n, 1)
    return X / norms * d**0.5  # (B, n, d), rows of norm sqrt(d)


def _as_float(X: Tensor) -> Tensor:
    """float16 / bfloat16 / integer storage upcast to float32; wider floats kept."""
    if not X.is_floating_point() or X.dtype in (torch.float16, torch.bfloat16):
        return X.float()
    return X


def preprocess(H: Tensor, n: int, d: int, normalize: bool = True) -> Tensor:
    """First n token positions, first d coordinates, each row rescaled to norm sqrt(d).

    Paper (docs/theory/checks.md §10.1 step 7): X = `X_emb[idx][:n, :d]`, then each row rescaled to norm sqrt(d).

    Args:
        H: (B, S, H) token embeddings (any leading dims); float16 is upcast to float32.
        n: token positions kept, 1..S.
        d: coordinates kept, 1..H.
        normalize: rescale each row to norm sqrt(d).

    Returns:
        (B, n, d) tensor, float32 or H's dtype if wider.

    Raises:
        ValueError: H is not (..., S, H), n not in 1..S or d not in 1..H.
    """
    if H.dim() < 2:
        raise ValueError(f"H must have shape (..., S, H), got shape {tuple(H.shape)}")
    length, hidden = H.shape[-2:]
    integer(f"n (token positions available, max_length={length})", n, low=1, high=length)
    integer(f"d (the embedding's hidden size is {hidden})", d, low=1, high=hidden)
    X = _as_float(H[..., :n, :d])  # (B, S, H) -> (B, n, d)
    return _rescale_rows(X, d) if normalize else X


class TokenEmbeddings:
    """Token embeddings of M samples: a memory-mapped cache entry, or synthetic samples generated on demand.

    Attributes:
        labels: (M,) float32 in {+1, -1}.
        sample_ids: (M,) int64 stable ids (row index in the source, or the synthetic candidate id).
        hidden_size: H.
        max_length: S, stored token positions per sample.
        manifest: what produced it (the cache's manifest, or the synthetic settings).
        path: the safetensors file (None for synthetic).
        built: True when the call that opened it also built the cache entry (False on a cache hit).

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
        self._first: Tensor | None = None
        self.built = False

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
        """Stored embeddings of `index` (int, slice, sequence or tensor), (B, n, d) in storage dtype (no rescaling).

        Raises:
            ValueError: n not in 1..max_length or d not in 1..hidden_size.
        """
        n = self.max_length if n is None else n
        d = self.hidden_size if d is None else d
        integer(f"n (stored token positions, max_length={self.max_length})", n, low=1, high=self.max_length)
        integer(f"d (the embedding's hidden size is {self.hidden_size})", d, low=1, high=self.hidden_size)
        rows = self._rows(index)
        if self._synthetic is not None:
            s = self._synthetic
            X = synthetic_tokens(s.seed, self.sample_ids[rows], s.max_length, s.synthetic_dim, s.synthetic_unit_rows)
            return X[:, :n, :d]  # (B, S, H) -> (B, n, d)
        # Reads only the touched pages of the map: (B, n, d) of (M, S, H).
        return torch.from_numpy(np.ascontiguousarray(self._map("embeddings")[rows, :n, :d]))

    def samples(
        self, index, n: int, d: int, normalize: bool = True, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor]:
        """Preprocessed inputs of `index`: X (B, n, d) in `dtype` (rows of norm sqrt(d) if normalize), y (B,) float32.

        Raises:
            ValueError: n not in 1..max_length or d not in 1..hidden_size.
        """
        X = _as_float(self.raw(index, n, d).to(dtype))  # (B, n, d); n and d checked by raw
        return (_rescale_rows(X, d) if normalize else X), self.labels[self._rows(index)]

    def first_copies(self) -> Tensor:
        """(M,) bool, False for a sample whose token ids repeat an earlier sample's (a review the source holds twice).

        So that draws of distinct samples can skip it; synthetic samples are all distinct.
        """
        if self._first is None:
            first = np.ones(len(self), dtype=bool)
            if self._synthetic is None and len(self):
                ids = np.asarray(self._map("input_ids"))  # (M, S)
                _, keep = np.unique(ids, axis=0, return_index=True)
                first[:] = False
                first[keep] = True
            self._first = torch.from_numpy(first)
        return self._first

    def input_ids(self, index) -> Tensor:
        """Token ids of `index`, (B, S) int64 (`[CLS] ... [SEP] [PAD]...`); text sources only."""
        if self._synthetic is not None:
            raise ValueError("input_ids exist only for text sources, got source='synthetic'")
        return torch.from_numpy(np.asarray(self._map("input_ids")[self._rows(index)], dtype=np.int64))
