"""Random attention features: softmax (RAF) and ReLU-renormalised (ReLU-RAF) scores, docs/theory/maps.md §2.3-2.4."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from ..base import validate
from ..base.seeding import generator
from ..chains.settings import SearchSettings
from .attention_move import AttentionMove
from .base import TokenwiseMap, register_map


class _RandomAttentionBase(TokenwiseMap):
    """Shared part: the buffer W (d x d, entries N(0, 1/d)) and the scores S = X W X^T / sqrt(d)."""

    W: torch.Tensor  # buffer (d, d)
    # ReLU scores renormalised per row (ReLU-RAF) rather than a softmax: the token-move algebra reads it
    relu_scores: ClassVar[bool] = False

    def __init__(
        self, d: int, seed: int = 0, dtype: Literal["float32", "float64"] = "float32", n: int | None = None
    ) -> None:
        super().__init__()
        self.set_dims(d, n)
        self.seed = validate.integer("seed", seed, low=0)  # as every map and sweep: a seed is >= 0
        g = generator(self.seed, "attention.W")
        # Paper: Eq. (raf), W_ij ~ N(0, 1/d); W stands for W_Q^T W_K, no value matrix
        self.register_buffer("W", (torch.randn(d, d, generator=g) / d**0.5).to(validate.dtype("dtype", dtype)))

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

    @torch.no_grad()
    def forward64(self, X: torch.Tensor) -> torch.Tensor:
        """The forward computed in float64 (W cast): (B, n, d) -> (B, n d)."""
        validate.samples("X", X, self.d, self.n)
        W = self.W.to(torch.float64)
        X64 = X.to(device=W.device, dtype=torch.float64)
        S = X64 @ W @ X64.transpose(1, 2) / self.d**0.5  # (B, n, d) @ (d, d) @ (B, d, n) -> (B, n, n)
        return (self.attention(S) @ X64).reshape(X.shape[0], -1)

    def extra_repr(self) -> str:
        return f"d={self.d}, seed={self.seed}"


@register_map("raf")
class RandomAttentionFeatures(_RandomAttentionBase):
    """Random attention features phi_RAF(X) = softmax(X W X^T / sqrt(d)) X, softmax row-wise (docs/theory/maps.md §2.3).

    Input (B, n, d) for any n, output (B, n d). W is a buffer `W` (d x d, N(0, 1/d)) drawn from a generator seeded
    by `seed`; RAF and ReLU-RAF built with the same seed share W.

    Search defaults (`search_defaults`): rounds of 6 chains (+-curvature, attract, steer, the self-score start and its
    mix with attract, `wslight.features.attention_starts`) up to 64, 60 steps a chain: within 1% of a 256-chain
    reference on >= 95% of 20 bundled reviews at d = 32 and 384, n = 10, 50, 250 (docs/theory/search.md §4.3).

    Args:
        d: embedding dimension.
        seed: seed of the map's own generator.
        dtype: "float32" or "float64".
        n: number of tokens, checked on input when given; None accepts any n (the map itself works for any n).
    """

    search_defaults = SearchSettings(chains_per_round=6, max_chains=64, max_steps=60)

    def attention(self, S: torch.Tensor) -> torch.Tensor:
        """Row-wise softmax of the scores: (B, n, n) -> (B, n, n)."""
        # Paper: Eq. (raf), row-wise softmax; torch subtracts the row max, so huge scores stay finite
        return torch.softmax(S, dim=-1)


@register_map("relu_raf")
class ReLUAttentionFeatures(_RandomAttentionBase):
    """ReLU-RAF: the softmax of RAF replaced by ReLU on the scores, each row divided by its sum.

    See docs/theory/maps.md §2.4.

    A row whose ReLU scores are all zero has divisor 1 (the authors' code), so it is a zero row: no NaN.
    Input (B, n, d), output (B, n d).

    Search defaults (`search_defaults`): rounds of 12 chains (+-curvature, attract, steer, 4 ascended and 4 plain
    self-capture starts) up to 256: within 1% of a 256-chain reference on every bundled review at d = 384.

    Args:
        d: embedding dimension.
        seed: seed of the map's own generator (same seed, same W as RandomAttentionFeatures).
        dtype: "float32" or "float64".
        n: number of tokens, checked on input when given; None accepts any n.
    """

    relu_scores = True
    search_defaults = SearchSettings(chains_per_round=12, max_chains=256)

    def attention(self, S: torch.Tensor) -> torch.Tensor:
        """ReLU of the scores divided by the row sum (1 where it is 0): (B, n, n) -> (B, n, n)."""
        R = torch.relu(S)  # (B, n, n)
        row_sum = R.sum(dim=-1, keepdim=True)  # (B, n, 1)
        # Paper (authors' code): a zero row sum is replaced by 1, giving a zero attention row
        return R / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))


_RandomAttentionBase.move_class = AttentionMove
