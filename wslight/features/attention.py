"""Random attention features: softmax (RAF) and ReLU-renormalised (ReLU-RAF) scores, paper.md §4.3-4.4."""

from __future__ import annotations

from typing import Literal

import torch

from .. import validate
from ..seeding import generator
from .base import FeatureMap, register_map


class _RandomAttentionBase(FeatureMap):
    """Shared part: the buffer W (d x d, entries N(0, 1/d)) and the scores S = X W X^T / sqrt(d)."""

    def __init__(
        self, d: int, seed: int = 0, dtype: Literal["float32", "float64"] = "float32", n: int | None = None
    ) -> None:
        super().__init__()
        self.d = validate.positive_int("d", d)
        self.n = None if n is None else validate.positive_int("n", n)  # None: any number of tokens
        self.seed = int(seed)
        g = generator(self.seed, "attention.W")
        # Paper: Eq. (raf), W_ij ~ N(0, 1/d); W stands for W_Q^T W_K, no value matrix
        self.register_buffer("W", (torch.randn(d, d, generator=g) / d**0.5).to(validate.dtype("dtype", dtype)))

    def out_dim(self, n: int | None = None) -> int:
        """Output size for n tokens: the flattened n x d attention output."""
        n = self.n if n is None else n
        if n is None:
            raise ValueError("n: this map accepts any number of tokens; give n to out_dim")
        return n * self.d

    @classmethod
    def for_cell(cls, n, d, seed, depth=2, width_ratio=1.0, dtype="float32", **options) -> _RandomAttentionBase:
        """A sweep cell's map: any number of tokens (n is not fixed), so one W serves every n of a grid."""
        return cls(d, seed=seed, dtype=dtype, **options)

    def scores(self, X: torch.Tensor) -> torch.Tensor:
        """S = X W X^T / sqrt(d): (B, n, d) -> (B, n, n); unit variance for rows of norm sqrt(d)."""
        validate.samples("X", X, self.d, self.n)
        X = X.to(self.W.dtype)
        return (X @ self.W) @ X.transpose(1, 2) / self.d**0.5  # (B, n, d) @ (d, d) @ (B, d, n) -> (B, n, n)

    def attention(self, S: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """A(X) X flattened row-major: (B, n, d) -> (B, n d)."""
        A = self.attention(self.scores(X))  # (B, n, n)
        out = A @ X.to(self.W.dtype)  # (B, n, n) @ (B, n, d) -> (B, n, d)
        return out.reshape(X.shape[0], -1)

    def extra_repr(self) -> str:
        return f"d={self.d}, seed={self.seed}"


@register_map("raf")
class RandomAttentionFeatures(_RandomAttentionBase):
    """Random attention features phi_RAF(X) = softmax(X W X^T / sqrt(d)) X, softmax row-wise (paper.md §4.3).

    Input (B, n, d) for any n, output (B, n d). W is a buffer `W` (d x d, N(0, 1/d)) drawn from a generator seeded
    by `seed`; RAF and ReLU-RAF built with the same seed share W.

    Args:
        d: embedding dimension.
        seed: seed of the map's own generator.
        dtype: "float32" or "float64".
        n: number of tokens, checked on input when given; None accepts any n (the map itself works for any n).
    """

    def attention(self, S: torch.Tensor) -> torch.Tensor:
        # Paper: Eq. (raf), row-wise softmax; torch subtracts the row max, so huge scores stay finite
        return torch.softmax(S, dim=-1)


@register_map("relu_raf")
class ReLUAttentionFeatures(_RandomAttentionBase):
    """ReLU-RAF: the softmax of RAF replaced by ReLU on the scores, each row divided by its sum (paper.md §4.4).

    A row whose ReLU scores are all zero has divisor 1 (the authors' code), so it is a zero row: no NaN.
    Input (B, n, d), output (B, n d).

    Args:
        d: embedding dimension.
        seed: seed of the map's own generator (same seed, same W as RandomAttentionFeatures).
        dtype: "float32" or "float64".
        n: number of tokens, checked on input when given; None accepts any n.
    """

    def attention(self, S: torch.Tensor) -> torch.Tensor:
        R = torch.relu(S)  # (B, n, n)
        row_sum = R.sum(dim=-1, keepdim=True)  # (B, n, 1)
        # Paper (authors' code): a zero row sum is replaced by 1, giving a zero attention row
        return R / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
