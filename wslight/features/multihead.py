"""Multi-head random attention features: H RAF heads on the d/H-column blocks of X, concatenated.

See docs/theory/maps.md §12.1.

Its token-move algebra is RAF's (`AttentionMove`) applied to every head: a move of token i moves block h of the
token in head h and nothing else, so T maps of H heads are T H RAF maps of dimension d/H.
"""

from __future__ import annotations

from typing import Literal

import torch

from ..base import validate
from ..base.numerics import sum_last
from ..base.seeding import generator
from .attention_move import AttentionMove
from .base import TokenwiseMap, register_map
from .move import TokenMove


@register_map("raf_mh")
class MultiHeadRAF(TokenwiseMap):
    """Multi-head RAF: head h is RAF on the column block X_h (n x d_h, d_h = d / H), the heads concatenated.

        phi(X) = [softmax(X_1 W_1 X_1^T / sqrt(d_h)) X_1, ..., softmax(X_H W_H X_H^T / sqrt(d_h)) X_H],
        (W_h)_jl ~ N(0, 1 / d_h) iid,

    each head's W_h standing for W_Q,h^T W_K,h with the value the identity on its block, no output projection. Under
    the input assumption (rows of norm sqrt(d), so a block of norm about sqrt(d_h)) every head's scores have about unit
    variance, as RAF's. Input (B, n, d) for any n, output (B, n d), row-major as (n, H, d_h): token l's output row is
    the concatenation of its H head outputs. Buffer `W` (H, d_h, d_h), drawn as one randn(H, d_h, d_h) from the
    generator of RAF (`generator(seed, "attention.W")`) divided by sqrt(d_h): with H = 1 it is RAF's W for the same
    seed, and the map is RAF.

    Args:
        d: embedding dimension.
        heads: number of heads H; must divide d.
        seed: seed of the map's own generator.
        dtype: "float32" or "float64".
        n: number of tokens, checked on input when given; None accepts any n.
    """

    W: torch.Tensor  # buffer (H, d_h, d_h)

    def __init__(
        self,
        d: int,
        heads: int = 4,
        seed: int = 0,
        dtype: Literal["float32", "float64"] = "float32",
        n: int | None = None,
    ) -> None:
        super().__init__()
        self.set_dims(d, n)
        self.heads = validate.heads(heads, self.d)
        self.seed = validate.integer("seed", seed, low=0)  # as every map and sweep: a seed is >= 0
        self.dh = d // heads
        g = generator(self.seed, "attention.W")  # RAF's stream: H = 1 draws RAF's W
        W = torch.randn(heads, self.dh, self.dh, generator=g) / self.dh**0.5  # (H, d_h, d_h), N(0, 1/d_h)
        self.register_buffer("W", W.to(validate.dtype("dtype", dtype)))

    def split(self, X: torch.Tensor) -> torch.Tensor:
        """The head blocks: (B, n, d) -> (B, H, n, d_h)."""
        B, n, _ = X.shape
        return X.reshape(B, n, self.heads, self.dh).transpose(1, 2)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """(B, n, d) -> (B, n d)."""
        validate.samples("X", X, self.d, self.n)
        Xh = self.split(X.to(self.W.dtype))  # (B, H, n, d_h)
        S = (Xh @ self.W) @ Xh.transpose(-1, -2) / self.dh**0.5  # (B, H, n, d_h) @ (H, d_h, d_h) @ (B, H, d_h, n)
        out = torch.softmax(S, dim=-1) @ Xh  # (B, H, n, n) @ (B, H, n, d_h) -> (B, H, n, d_h)
        return out.transpose(1, 2).reshape(X.shape[0], -1)  # (B, n, H, d_h) -> (B, n d)

    def extra_repr(self) -> str:
        """The map's sizes and seed for its repr."""
        return f"d={self.d}, heads={self.heads}, seed={self.seed}"


@register_map("raf_mh12")
class MultiHeadRAF12(MultiHeadRAF):
    """Multi-head RAF with H = 12 heads by default (BERT-base's and MiniLM's head count); see MultiHeadRAF."""

    def __init__(
        self,
        d: int,
        heads: int = 12,
        seed: int = 0,
        dtype: Literal["float32", "float64"] = "float32",
        n: int | None = None,
    ) -> None:
        super().__init__(d, heads=heads, seed=seed, dtype=dtype, n=n)


class _Head:
    """One head as AttentionMove reads a map: its W (d_h, d_h) and the softmax."""

    relu_scores = False

    def __init__(self, W: torch.Tensor) -> None:
        self.W = W

    @staticmethod
    def attention(S: torch.Tensor) -> torch.Tensor:
        return torch.softmax(S, dim=-1)


class MultiHeadMove(TokenMove):
    """Multi-head RAF with one token moved: RAF's closed form (`AttentionMove`) for each of the T H heads.

    Head h of trial t sees the block X_h and the block Delta_h of the move; its output rows are RAF's on that block.
    Axes: the inner token runs over T H "trials" (trial-major), features are reassembled as (n, H, d_h) per sample.
    """

    def __init__(self, maps, X, positions, dtype) -> None:
        super().__init__(maps, X, positions, dtype)
        T, B, n, d = X.shape
        self.H, self.dh = maps[0].heads, maps[0].dh
        heads = [_Head(m.W[h]) for m in maps for h in range(self.H)]
        Xh = X.reshape(T, B, n, self.H, self.dh).permute(0, 3, 1, 2, 4).reshape(T * self.H, B, n, self.dh)
        self.inner = AttentionMove(heads, Xh, positions, dtype)
        self.phi0 = self._join(self.inner.phi0.reshape(T * self.H, B, 1, 1, n * self.dh))[:, :, 0, 0]  # (T, B, n d)
        st = self.inner.starts  # (T H, B, P, S, d_h): RAF's directions per head
        if st is not None:
            self.starts = self._head_starts(st, T, B, d)

    def _head_starts(self, st: torch.Tensor, T: int, B: int, d: int) -> torch.Tensor:
        """Starts from the heads' RAF directions st (T H, B, P, S, d_h), as unit vectors (T, B, P, H + S, d).

        The whole radius in one head, along its first direction (attract), the heads in the order of the change that
        gives alone (docs/theory/maps.md §12.1: the change is a sum over heads, and one head's grows faster than
        linearly with its share of the radius, so the best moves often put most of it in one head); then every head
        along its own direction at once (S starts).
        """
        P, S = st.shape[2], st.shape[3]
        together = st.reshape(T, self.H, B, P, S, self.dh).permute(0, 2, 3, 4, 1, 5).reshape(T, B, P, S, d)
        together = together / together.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        one = st[:, :, :, :1] / st[:, :, :, :1].norm(dim=-1, keepdim=True).clamp_min(1e-30)  # (T H, B, P, 1, d_h)
        alone = self.inner.change_sq(one * d**0.5)  # (T H, B, P, 1): head h's change with the whole radius
        alone = alone.reshape(T, self.H, B, P).permute(0, 2, 3, 1)  # (T, B, P, H)
        order = alone.argsort(dim=-1, descending=True)  # (T, B, P, H)
        blocks = one[:, :, :, 0].reshape(T, self.H, B, P, self.dh).permute(0, 2, 3, 1, 4)  # (T, B, P, H, d_h)
        single = torch.zeros(T, B, P, self.H, self.H, self.dh, dtype=st.dtype, device=st.device)
        rank = torch.arange(self.H, device=st.device)
        for k in range(self.H):  # start k: head order[k] alone
            h = order[..., k]  # (T, B, P)
            single[..., k, :, :] = torch.where(
                (rank == h[..., None])[..., None],
                blocks.gather(3, h[..., None, None].expand(*h.shape, 1, self.dh)),
                0.0,
            )
        return torch.cat([single.reshape(T, B, P, self.H, d), together], dim=3)

    @classmethod
    def supports(cls, maps) -> bool:
        """Whether one instance can serve all these maps: they share the number of heads and d."""
        return len({(m.heads, m.d) for m in maps}) == 1

    @classmethod
    def chain_elements(cls, maps, B, n, d):
        """Rough working memory, in elements, per chain and per position of one trial (sizes the search's chunks)."""
        H = maps[0].heads
        return 12 * n * H + 8 * d, B * (3 * n * n * H + 3 * n * d)

    def split(self, delta: torch.Tensor) -> torch.Tensor:
        """(T, B, P, R, d) -> (T H, B, P, R, d_h)."""
        T, B, P, R, _ = delta.shape
        return delta.reshape(T, B, P, R, self.H, self.dh).permute(0, 4, 1, 2, 3, 5).reshape(T * self.H, B, P, R, -1)

    def _join(self, f: torch.Tensor) -> torch.Tensor:
        """Head outputs (T H, B, P, R, n d_h) -> (T, B, P, R, n d), row-major as (n, H, d_h)."""
        TH, B, P, R, _ = f.shape
        T = TH // self.H
        f = f.reshape(T, self.H, B, P, R, -1, self.dh).permute(0, 2, 3, 4, 5, 1, 6)  # (T, B, P, R, n, H, d_h)
        return f.reshape(T, B, P, R, -1)

    @property
    def blocks(self) -> int:
        """The change is a sum over the H heads, head h seeing block h of Delta only (`wslight.search.radius_split`)."""
        return self.H

    @property
    def block_move(self) -> AttentionMove:
        """The heads' own algebra: T H RAF problems of dimension d_h, trial-major."""
        return self.inner

    def merge(self, delta: torch.Tensor) -> torch.Tensor:
        """Per-head blocks back into moves, the inverse of `split`: (T H, B, P, R, d_h) -> (T, B, P, R, d)."""
        TH, B, P, R, _ = delta.shape
        T = TH // self.H
        return delta.reshape(T, self.H, B, P, R, self.dh).permute(0, 2, 3, 4, 1, 5).reshape(T, B, P, R, -1)

    def features(self, delta: torch.Tensor) -> torch.Tensor:
        """phi(X^i(Delta)), the heads' outputs joined: (T, B, P, R, d) -> (T, B, P, R, n d)."""
        return self._join(self.inner.features(self.split(delta)))

    def change_sq(self, delta: torch.Tensor) -> torch.Tensor:
        """||phi(X^i(Delta)) - phi(X)||^2 as the sum of the heads' changes: (T, B, P, R, d) -> (T, B, P, R)."""
        T = delta.shape[0]
        per_head = self.inner.change_sq(self.split(delta))  # (T H, B, P, R)
        per_head = per_head.reshape(T, self.H, *per_head.shape[1:]).movedim(1, -1)  # (T, B, P, R, H)
        return sum_last(per_head)

    def change_sq_and_readout(self, delta: torch.Tensor, H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`change_sq` and `readout` of the same moves, each by the heads' closed forms."""
        return self.change_sq(delta), self.readout(delta, H)  # the heads' closed-form change, as the search sees it


MultiHeadRAF.move_class = MultiHeadMove
