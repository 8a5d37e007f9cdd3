"""Random features (RF): phi(V flat(X)), docs/theory/maps.md §2.1."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from torch import nn

from ..base import validate
from ..base.numerics import sum_last
from ..base.seeding import generator
from ..chains.settings import SearchSettings
from .base import FeatureMap, register_map
from .move import TokenMove, matmul64, stack_trials

ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh, "gelu": nn.functional.gelu}
# Lipschitz constants of the activations (the RF bound, docs/theory/maps.md §3.2); GELU's derivative peaks at about
# 1.1289.
LIPSCHITZ = {"relu": 1.0, "tanh": 1.0, "gelu": 1.1289}

# V is drawn in fixed chunks of rows, each from its own seeded generator, so that the stored V and the memory-bounded
# path (which regenerates chunks on the fly) produce the very same matrix whatever the block size used to consume it.
ROWS_PER_DRAW = 256
# Above this many bytes V is not stored; the map regenerates it in chunks (the paper's largest RF is 53 GB in float32).
DEFAULT_MAX_STORED_BYTES = 2 * 1024**3


def draw_rows(seed: int, start: int, stop: int, D: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows [start, stop) of V (entries N(0, 1/D)), drawn chunk by chunk from their seeded generators.

    Draws happen in float32 on the CPU and are cast, so a float64 map holds exactly the float32 map's weights.
    """
    parts = []
    for chunk in range(start // ROWS_PER_DRAW, (stop - 1) // ROWS_PER_DRAW + 1):
        lo, hi = chunk * ROWS_PER_DRAW, (chunk + 1) * ROWS_PER_DRAW
        g = generator(seed, "rf.V", chunk)
        rows = torch.randn(ROWS_PER_DRAW, D, generator=g)  # (256, D), the whole chunk, so draws do not depend on range
        parts.append(rows[max(start, lo) - lo : min(stop, hi) - lo])
    # Paper: Eq. (rf), V_ij ~ N(0, 1/D)
    return (torch.cat(parts) / D**0.5).to(dtype)


@register_map("rf")
class RandomFeatures(FeatureMap):
    """Random features map phi_RF(X) = phi(V flat(X)) (docs/theory/maps.md §2.1).

    Input (B, n, d), output (B, k). V in R^{k x D}, D = n d, entries N(0, 1/D), no bias; with rows of norm sqrt(d)
    the pre-activations have unit variance. V is a buffer named `V` when it fits in `max_stored_bytes`; otherwise it is
    never held whole and is regenerated from the seed in row chunks (the memory-bounded path, same numbers).

    Search defaults (`search_defaults`): one round of 4 chains, a chain stopping once S grew by < 0.1% over 10 steps
    (tight at 4 chains: benchmarks/tightness.py; docs/theory/search.md §4.3).

    Args:
        n: number of tokens the map is built for.
        d: embedding dimension.
        k: number of neurons (the paper and the authors' code use k = D = n d); None means D.
        activation: component-wise nonlinearity phi ("relu" as in the paper's experiments, "tanh", "gelu").
        seed: seed of the map's own generator; two maps with the same seed are equal on any device.
        dtype: "float32" or "float64".
        max_stored_bytes: largest V stored as a buffer; larger maps use the memory-bounded path.
        block_rows: rows of V generated at a time on the memory-bounded path (memory ~ block_rows * D floats).
    """

    search_defaults = SearchSettings(chains_per_round=4, max_chains=4, tol=1e-3, window=10)

    n: int  # built for one length
    V: torch.Tensor | None  # buffer (k, D), None on the memory-bounded path
    _dtype_probe: torch.Tensor  # buffer (), the memory-bounded path's dtype and device

    def __init__(
        self,
        n: int,
        d: int,
        k: int | None = None,
        activation: Literal["relu", "tanh", "gelu"] = "relu",
        seed: int = 0,
        dtype: Literal["float32", "float64"] = "float32",
        max_stored_bytes: int = DEFAULT_MAX_STORED_BYTES,
        block_rows: int = 1024,
    ) -> None:
        super().__init__()
        self.n, self.d = validate.positive_int("n", n), validate.positive_int("d", d)
        self.D = n * d
        self.k = self.D if k is None else validate.positive_int("k", k)
        self.activation = validate.choice("activation", activation, sorted(ACTIVATIONS))
        self.phi = ACTIVATIONS[activation]
        self.seed = validate.integer("seed", seed, low=0)  # as every map and sweep: a seed is >= 0
        self.block_rows = validate.positive_int("block_rows", block_rows)
        dt = validate.dtype("dtype", dtype)
        self.stored = self.k * self.D * dt.itemsize <= max_stored_bytes
        if self.stored:
            self.register_buffer("V", draw_rows(self.seed, 0, self.k, self.D, dt))  # (k, D)
        else:
            self.register_buffer("V", None)
            self.register_buffer("_dtype_probe", torch.zeros((), dtype=dt))  # follows .to(device/dtype)

    def out_dim(self, n: int | None = None) -> int:
        """Size p of phi(X): the number of neurons k, whatever n."""
        return self.k

    @classmethod
    def for_cell(cls, n, d, seed, depth=2, width_ratio=1.0, dtype="float32", **options) -> RandomFeatures:
        """A sweep cell's RF: k = max(1, round(width_ratio * n d)) neurons (the paper: k = D)."""
        return cls(n, d, k=max(1, round(width_ratio * n * d)), seed=seed, dtype=dtype, **options)

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype of V (stored or regenerated)."""
        return self.V.dtype if self.V is not None else self._dtype_probe.dtype

    @property
    def weight_device(self) -> torch.device:
        """The device of V (stored or regenerated)."""
        return self.V.device if self.V is not None else self._dtype_probe.device

    def row_blocks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (start row, V[start:start+block_rows]) on the map's device and dtype."""
        if self.V is not None:
            yield 0, self.V
            return
        for start in range(0, self.k, self.block_rows):
            stop = min(start + self.block_rows, self.k)
            yield start, draw_rows(self.seed, start, stop, self.D, self.weight_dtype).to(self.weight_device)

    def preactivations(self, X: torch.Tensor) -> torch.Tensor:
        """The pre-activations z = V flat(X): (B, n, d) -> (B, k)."""
        validate.samples("X", X, self.d, self.n)
        x = X.reshape(X.shape[0], self.D).to(self.weight_dtype)  # (B, D), row-major flat(X)
        if self.V is not None:
            return x @ self.V.T  # (B, D) @ (D, k) -> (B, k)
        return torch.cat([x @ V_b.T for _, V_b in self.row_blocks()], dim=1)  # blocks of (B, rows)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """phi(V flat(X)): (B, n, d) -> (B, k)."""
        # Paper: Eq. (rf), phi applied component-wise
        return self.phi(self.preactivations(X))

    @torch.no_grad()
    def forward64(self, X: torch.Tensor) -> torch.Tensor:
        """phi(V flat(X)) computed in float64 (V cast block by block, never whole): (B, n, d) -> (B, k)."""
        validate.samples("X", X, self.d, self.n)
        x = X.reshape(X.shape[0], self.D).to(device=self.weight_device, dtype=torch.float64)  # (B, D)
        return self.phi(torch.cat([matmul64(x, V_b) for _, V_b in self.row_blocks()], dim=1))  # (B, k)

    def token_block(self, position: int) -> torch.Tensor:
        """V^{(i)}: the k x d columns of V that multiply token `position`, (k, d)."""
        validate.integer("position", position, 0, self.n - 1)
        cols = slice(position * self.d, (position + 1) * self.d)
        return torch.cat([V_b[:, cols] for _, V_b in self.row_blocks()])  # (k, d)

    def preactivations_and_token_blocks(
        self, X: torch.Tensor, positions: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Everything a token move needs, in one pass over V.

        Moving token i by delta changes the pre-activations to z + V^{(i)} delta, so the clean z and the column blocks
        V^{(i)} suffice; the dense V is never held on the memory-bounded path.

        Returns:
            z: (B, k) clean pre-activations; blocks: (P, k, d) with blocks[j] = V^{(positions[j])}.
        """
        validate.samples("X", X, self.d, self.n)
        for p in positions:
            validate.integer("position", p, 0, self.n - 1)
        x = X.reshape(X.shape[0], self.D).to(self.weight_dtype)  # (B, D)
        zs, blocks = [], []
        for _, V_b in self.row_blocks():
            zs.append(x @ V_b.T)  # (B, D) @ (D, rows) -> (B, rows)
            blocks.append(torch.stack([V_b[:, p * self.d : (p + 1) * self.d] for p in positions]))  # (P, rows, d)
        return torch.cat(zs, dim=1), torch.cat(blocks, dim=1)

    def extra_repr(self) -> str:
        """The map's sizes, activation, seed and whether V is stored, for its repr."""
        return (
            f"n={self.n}, d={self.d}, k={self.k}, activation={self.activation}, seed={self.seed}, stored={self.stored}"
        )


class RFMove(TokenMove):
    """RF with one token moved: phi(V flat(X^i(Delta))) = act(z + V^(i) Delta) (docs/theory/maps.md §3).

    Only z = V flat(X) (B, k) and the k x d blocks V^(i) are kept, so an evaluation costs O(k d) per chain. On the
    memory-bounded path one generation of V gives z in float64 and the blocks, and `exact64` returns the full map's
    float64 value through the exact identity z + V^(i) Delta, without generating V a second time.
    """

    def __init__(self, maps, X, positions, dtype) -> None:
        super().__init__(maps, X, positions, dtype)
        zs, blocks, z64s = [], [], []
        with torch.no_grad():
            for t, m in enumerate(maps):
                if m.V is not None:
                    z, blk = m.preactivations_and_token_blocks(X[t], positions)  # (B, k), (P, k, d)
                else:
                    z, blk = _bounded_preactivations(m, X[t], positions)  # z in float64
                    z64s.append(z)
                zs.append(z.to(dtype))
                blocks.append(blk.to(dtype))
        self._setup(maps[0].activation, stack_trials(zs), stack_trials(blocks), stack_trials(z64s) if z64s else None)

    def _setup(self, activation: str, z: torch.Tensor, V: torch.Tensor, z64: torch.Tensor | None) -> None:
        self.activation, self.act, self.z, self.V = activation, ACTIVATIONS[activation], z, V  # (T, B, k), (T, P, k, d)
        self.phi0 = self.act(self.z)  # (T, B, k)
        if z64 is not None:  # the exact float64 value without the full map
            self._z64 = z64

    @classmethod
    def from_preactivations(
        cls, activation: str, z64: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype
    ) -> RFMove:
        """The algebra of T maps known only through z (T, B, k) float64 and their blocks (T, P, k, d).

        E.g. drawn from their law (`fresh_preactivations`); the reported values are exact in float64.
        """
        move = cls.__new__(cls)
        TokenMove.__init__(move, [], z64, [], dtype)
        move._setup(activation, z64.to(dtype), blocks.to(dtype), z64)
        return move

    @classmethod
    def supports(cls, maps) -> bool:
        """Whether one instance can serve all these maps: they share one activation."""
        return len({m.activation for m in maps}) == 1

    def law_twin(self, dtype: torch.dtype) -> RFMove | None:
        """The same algebra in another dtype for maps drawn from their law; None for built maps."""
        # the blocks hold the drawn values (float32) exactly, z is float64: the twin is the algebra `dtype` would get
        if self.maps or getattr(self, "_z64", None) is None:
            return None
        return RFMove.from_preactivations(self.activation, self._z64, self.V, dtype)

    @classmethod
    def chain_elements(cls, maps, B, n, d):
        """Rough working memory, in elements, per chain and per position of one trial (sizes the search's chunks)."""
        return 6 * maps[0].k, maps[0].k * d

    def _moved_preactivations(self, delta: torch.Tensor) -> torch.Tensor:
        """The moved pre-activations z + V^(i) Delta: (T, B, P, R, d) -> (T, B, P, R, k)."""
        T, B, P, R, d = delta.shape
        flat = delta.permute(0, 2, 1, 3, 4).reshape(T, P, B * R, d)  # (T, P, B R, d)
        moved = flat @ self.V.transpose(-1, -2)  # (T, P, B R, d) @ (T, P, d, k) -> (T, P, B R, k)
        # Paper: Eq. (rf) with one token moved, V flat(X^i(Delta)) = z + V^(i) Delta
        return self.z[:, :, None, None] + moved.reshape(T, P, B, R, -1).permute(0, 2, 1, 3, 4)

    def features(self, delta: torch.Tensor) -> torch.Tensor:
        """phi(z + V^(i) Delta): (T, B, P, R, d) -> (T, B, P, R, k)."""
        return self.act(self._moved_preactivations(delta))

    def value_and_grad(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """f(Delta) = ||a||^2 and its gradient, without autograd for ReLU.

        a = act(u) - act(z) with u = z + V^(i) Delta, and the gradient is 2 V^(i)T (a * act'(u)): (T, B, P, R, d) -> (T,
        B, P, R), (T, B, P, R, d).
        """
        if self.activation != "relu":
            with torch.enable_grad():
                x = delta.detach().requires_grad_(True)
                f = self.change_sq(x)
                (g,) = torch.autograd.grad(f.sum(), x)
            return f.detach(), g
        T, B, P, R, d = delta.shape
        u = self._moved_preactivations(delta)  # (T, B, P, R, k)
        a = torch.relu(u) - self.phi0[:, :, None, None]
        f = sum_last(a * a)  # (T, B, P, R), thread-count invariant like change_sq
        w = torch.where(u > 0, a, torch.zeros((), dtype=a.dtype, device=a.device))  # a * relu'(u)
        w = w.permute(0, 2, 1, 3, 4).reshape(T, P, B * R, -1)  # (T, P, B R, k)
        g = 2 * (w @ self.V)  # (T, P, B R, k) @ (T, P, k, d) -> (T, P, B R, d)
        return f, g.reshape(T, P, B, R, d).permute(0, 2, 1, 3, 4)

    def select_trials(self, idx: torch.Tensor) -> RFMove:
        """The same algebra for the trials idx only (their z and blocks copied).

        For a search that has finished the other trials.
        """
        move = RFMove.__new__(RFMove)
        TokenMove.__init__(move, self.maps, self.z, self.positions, self.dtype)
        idx = idx.to(self.z.device)
        move.activation, move.act = self.activation, self.act
        move.z, move.V, move.phi0 = self.z[idx], self.V[idx], self.phi0[idx]
        return move

    def top_curvature(self, v: torch.Tensor) -> torch.Tensor:
        """The exact top eigenvector of the Hessian of f at Delta = 0, signed to agree with the start vector v.

        The Hessian is 2 V^(i)T diag(act'(z)^2) V^(i) (a d x d matrix per sample and position, one pass over the blocks
        and one eigendecomposition in float64): (T, B, P, 1, d) -> (T, B, P, 1, d) unit vectors
        (docs/theory/search.md §4.2).
        """
        T, B, P, _, d = v.shape
        if self.activation == "relu":
            m = (self.z > 0).to(self.V.dtype)  # relu'(z)^2, (T, B, k)
        elif self.activation == "tanh":
            m = (1 - torch.tanh(self.z) ** 2) ** 2
        else:
            with torch.enable_grad():
                z = self.z.detach().requires_grad_(True)
                (dz,) = torch.autograd.grad(self.act(z).sum(), z)
            m = dz**2
        out = []
        for b in range(B):
            H = (self.V * m[:, b, None, :, None]).transpose(-1, -2) @ self.V  # (T, P, d, k) @ (T, P, k, d)
            top = torch.linalg.eigh(H.to(torch.float64))[1][..., -1]  # (T, P, d), eigenvalues ascending
            sign = torch.where((top * v[:, b, :, 0].to(top)).sum(-1) < 0, -1.0, 1.0).to(top)
            out.append((top * sign[..., None]).to(v.dtype))
        return torch.stack(out, dim=1)[:, :, :, None]  # (T, B, P, 1, d)

    def bound_factors(self, j: torch.Tensor) -> torch.Tensor:
        """Lip(act) ||V^(i)||_op for the position index j (T, B) of every sample, (T, B) float64.

        See docs/theory/search.md §4.1.
        """
        # one d x d Gram matrix per trial and position in a batched product (the working dtype), its top eigenvalue in
        # float64: ||V^(i)||_op for every position, then picked per sample
        gram = self.V.transpose(-1, -2) @ self.V  # (T, P, d, k) @ (T, P, k, d) -> (T, P, d, d)
        top = torch.linalg.eigvalsh(gram.to(torch.float64))[..., -1].clamp_min(0).sqrt().cpu()  # (T, P)
        return LIPSCHITZ[self.activation] * torch.gather(top, 1, j.cpu())

    @property
    def exact64(self):
        """The float64 values of candidate moves (`TokenMove.exact64`) when z is known in float64, else None."""
        return self._exact64 if getattr(self, "_z64", None) is not None else None

    def _exact64(self, delta: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T, B, K = j.shape
        # (T, B, K, k): V^(i) Delta in float64, the block cast in row chunks
        moved = self._z64.new_empty(T, B, K, self._z64.shape[-1])
        for t in range(T):
            for b in range(B):
                for c in range(K):  # (1, d) x (k, d)^T
                    moved[t, b, c] = matmul64(delta[t, b, c, None].to(moved), self.V[t, int(j[t, b, c])])[0]
        phi = self.act(self._z64)
        norm = phi.norm(dim=-1)[..., None].expand(T, B, K)
        return ((self.act(self._z64[:, :, None] + moved) - phi[:, :, None]).norm(dim=-1) / norm).cpu(), norm.cpu()


def fresh_preactivations(
    X: torch.Tensor, positions: list[int], k: int, seeds: Sequence[int], variance: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pre-activations z = V flat(X) in float64 and the blocks V^(i) of T fresh maps.

    Drawn from their joint law (docs/theory/maps.md §3.6).

    For a fresh V with entries N(0, variance / D), write z = sum_{i in P} V^(i) x_i + g: the remainder
    g = V^(-P) flat(X_{-P}) is independent of the blocks, and for each neuron Gaussian across the samples with
    covariance variance * G / D, G the Gram matrix of the samples' unmoved tokens. Drawing the blocks and g gives the
    joint law of the full map's (z, V^(i)) from k (P d + M) random numbers instead of k D. The blocks are drawn in
    float32 like a stored map's weights, g in float64.

    Args:
        X: (T, M, n, d) samples; trial t's map is seeded by seeds[t] (its M samples share that map).
        positions: the token indices that move.
        k: neurons.
        seeds: T seeds.
        variance: entries of V are N(0, variance / D) (RF: 1; DeepRF's first layer: 2).

    Returns:
        z: (T, M, k) float64; blocks: (T, P, k, d) float32, on X's device.
    """
    T, M, n, d = X.shape
    D = n * d
    moved = torch.zeros(n, dtype=torch.bool)
    moved[positions] = True
    zs, blocks = [], []
    for Xt, seed in zip(X, seeds):
        g = generator(seed, "rf.fresh")
        blk = torch.randn(len(positions), k, d, generator=g) * (variance / D) ** 0.5  # (P, k, d)
        X64 = Xt.detach().to(device="cpu", dtype=torch.float64)
        rest = X64[:, ~moved].reshape(M, -1)  # (M, (n - P) d), the tokens that never move
        lam, U = torch.linalg.eigh(rest @ rest.T)  # G = U diag(lam) U^T, (M, M); G may be singular
        E = torch.randn(k, M, generator=g, dtype=torch.float64)
        z = (E @ (U * lam.clamp_min(0).sqrt()).T).T * (variance / D) ** 0.5  # (M, k): g in law
        for j, i in enumerate(positions):
            z = z + X64[:, i] @ blk[j].to(torch.float64).T  # (M, d) @ (d, k) -> (M, k)
        zs.append(z)
        blocks.append(blk)
    return torch.stack(zs).to(X.device), torch.stack(blocks).to(X.device)


def _bounded_preactivations(m: RandomFeatures, X: torch.Tensor, positions: list[int]):
    """The pre-activations z = V flat(X) in float64 (B, k) and the blocks V^(i) (P, k, d), from one generation of V."""
    x64 = X.reshape(X.shape[0], m.D).to(device=m.weight_device, dtype=torch.float64)  # (B, D)
    zs, parts = [], []
    for _, V_b in m.row_blocks():
        zs.append(matmul64(x64, V_b))  # (B, D) @ (D, rows) -> (B, rows)
        parts.append(torch.stack([V_b[:, p * m.d : (p + 1) * m.d] for p in positions]))  # (P, rows, d)
    return torch.cat(zs, dim=1), torch.cat(parts, dim=1)


RandomFeatures.move_class = RFMove
