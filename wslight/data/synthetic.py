"""Synthetic token embeddings with labels from a planted direction, generated on demand (docs/theory/checks.md §10.3).

Sample j is X_j in R^{S x H} (S = max_length tokens, H = synthetic_dim) with i.i.d. N(0, 1) entries, drawn from its
own generator seeded by (seed, j), so any sample can be regenerated alone (random access, DataLoader workers, DDP
ranks) without storing the whole set.
Labels: y_j = sign(<flat(X_j), u>) with u ~ N(0, I_D / D), D = S * H (ties go to +1).
"""

from __future__ import annotations

import numpy as np
import torch

from wslight.base.seeding import generator


def planted_direction(seed: int, length: int, dim: int) -> torch.Tensor:
    """The planted direction u ~ N(0, I_D / D) with D = length * dim, as a (length, dim) float64 tensor."""
    D = length * dim
    g = generator(seed, "data/synthetic/u")
    return torch.randn(length, dim, generator=g, dtype=torch.float64) / D**0.5  # (S, H)


def synthetic_tokens(seed: int, ids, length: int, dim: int, unit_rows: bool = False) -> torch.Tensor:
    """Tokens of samples `ids`, (B, S, H) float64.

    Args:
        seed: data seed.
        ids: (B,) candidate ids (the samples' `sample_id`).
        length: S, tokens per sample.
        dim: H, hidden size.
        unit_rows: rescale each token to norm sqrt(H) (the paper's input assumption) before anything else.
    """
    ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1).tolist()
    out = torch.empty(len(ids), length, dim, dtype=torch.float64)
    for b, j in enumerate(ids):
        out[b] = torch.randn(length, dim, generator=generator(seed, "data/synthetic/x", j), dtype=torch.float64)
    if unit_rows:
        out = out / out.norm(dim=-1, keepdim=True) * dim**0.5  # (B, S, H), rows of norm sqrt(H)
    return out


def synthetic_labels(X: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Paper (docs/theory/checks.md §10.3): y = sign(<flat(X), u>), ties to +1.

    X (B, S, H), u (S, H) -> (B,) float32 in {+1, -1}.
    """
    s = torch.einsum("bsh,sh->b", X, u)  # (B, S, H) . (S, H) -> (B,)
    return torch.where(s >= 0, 1.0, -1.0).to(torch.float32)


def select_synthetic(
    seed: int, num_samples: int, length: int, dim: int, unit_rows: bool = False, chunk: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Balanced synthetic samples: walk candidates 0, 1, 2, ... and keep num_samples/2 of each label.

    Returns:
        sample_ids (M,) int64 (candidate ids, in acceptance order) and labels (M,) float32 in {+1, -1}.
    """
    u = planted_direction(seed, length, dim)
    per_class = num_samples // 2
    kept: dict[float, list[int]] = {1.0: [], -1.0: []}
    ids: list[int] = []
    labels: list[float] = []
    start = 0
    while len(ids) < num_samples:
        cand = torch.arange(start, start + chunk)
        y = synthetic_labels(synthetic_tokens(seed, cand, length, dim, unit_rows), u)
        for j, lab in zip(cand.tolist(), y.tolist(), strict=True):
            if len(kept[lab]) < per_class:
                kept[lab].append(j)
                ids.append(j)
                labels.append(lab)
        start += chunk
    return np.asarray(ids, dtype=np.int64), np.asarray(labels, dtype=np.float32)
