"""Deep random features (DeepRF / DRF): L ReLU layers with He-scaled Gaussian weights, docs/theory/maps.md §2.2."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, cast

import torch
from torch import nn

from ..base import validate
from ..base.numerics import sum_last
from ..base.seeding import derive_seed, generator
from ..chains.settings import SearchSettings
from .base import FeatureMap, register_map
from .move import TokenMove, matmul64, stack_trials


class _Frozen(nn.Module):
    """Holds one layer's random weight as a buffer `V` (no gradient, moves with .to, lands in checkpoints)."""

    V: torch.Tensor  # buffer (width, fan_in)

    def __init__(self, V: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("V", V)


# Rows drawn per call on a non-CPU device: fixed, so that the weights do not depend on anything configurable.
DEVICE_DRAW_ROWS = 1024


def _draw_on_device(
    seed: int, layer: int, rows: int, fan_in: int, dt: torch.dtype, dev: torch.device, salt: str = "deep_rf.Vs"
) -> torch.Tensor:
    """One layer's weight (rows, fan_in), entries N(0, 2/fan_in), drawn on `dev` by its own device generator.

    The draws are float32, DEVICE_DRAW_ROWS rows at a time from the generator seeded with
    derive_seed(seed, salt, layer); float32 maps draw straight into the weight (no extra memory), float64 maps go
    through one float32 chunk (peak extra memory DEVICE_DRAW_ROWS * fan_in floats).
    """
    g = torch.Generator(device=dev).manual_seed(derive_seed(seed, salt, layer))
    V = torch.empty(rows, fan_in, dtype=dt, device=dev)  # (width, fan_in)
    scale = (2.0 / fan_in) ** 0.5  # Paper (authors' code): N(0, 2/fan_in) for every layer
    for start in range(0, rows, DEVICE_DRAW_ROWS):
        stop = min(start + DEVICE_DRAW_ROWS, rows)
        if dt == torch.float32:
            V[start:stop].normal_(generator=g).mul_(scale)
        else:
            chunk = torch.empty(stop - start, fan_in, dtype=torch.float32, device=dev).normal_(generator=g)
            V[start:stop].copy_(chunk.mul_(scale))
    return V


@register_map("deep_rf")
class DeepRandomFeatures(FeatureMap):
    """Deep random features phi_DRF(X) = relu(V_L relu(... relu(V_1 flat(X)))) (docs/theory/maps.md §2.2).

    Input (B, n, d), output (B, width). Every layer has entries N(0, 2/fan_in), the first layer included: the
    authors' scaling (He), which keeps the feature norm roughly constant through depth. No biases. Weights are
    buffers `Vs.<l>.V`, drawn in order from one generator seeded by `seed`.

    Search defaults (`search_defaults`): as RF, one round of 4 chains stopping at < 0.1% over 10 steps (each step reads
    each D x D layer twice; mean S within 0.15% of 64 chains at tol 1e-4, window 20).

    Args:
        n: number of tokens the map is built for.
        d: embedding dimension.
        depth: number of layers L (the paper uses 2, 4, 8).
        width: width of every layer (the authors' code uses D = n d); None means D.
        seed: seed of the map's own generator.
        dtype: "float32" or "float64".
        device: where the weights are drawn and live. None or "cpu": drawn on the CPU from one generator (every CPU
            number of the package). A CUDA device: drawn there, layer l from its own device generator seeded with
            `derive_seed(seed, "deep_rf.Vs", l)`, in fixed chunks of rows, so the paper's largest map (d = 768, n = 80,
            D = 61,440, L = 8: 15 GB of float32 per layer) never passes through host memory. The CUDA draws differ
            from the CPU draws of the same seed (another generator), and CUDA's generator is reproducible for one
            GPU model and torch version, not across them; a float64 map holds exactly the float32 map's weights on
            either device. For CPU-identical weights on a GPU, build on the CPU and move the map with `.to(device)`.
    """

    search_defaults = SearchSettings(chains_per_round=4, max_chains=4, tol=1e-3, window=10)

    n: int  # built for one length

    def __init__(
        self,
        n: int,
        d: int,
        depth: int = 2,
        width: int | None = None,
        seed: int = 0,
        dtype: Literal["float32", "float64"] = "float32",
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__()
        self.n, self.d = validate.positive_int("n", n), validate.positive_int("d", d)
        self.depth = validate.positive_int("depth", depth)
        self.D = n * d
        self.width = self.D if width is None else validate.positive_int("width", width)
        self.seed = validate.integer("seed", seed, low=0)  # as every map and sweep: a seed is >= 0
        dt = validate.dtype("dtype", dtype)
        dev = torch.device("cpu") if device is None else torch.device(device)
        layers = []
        fan_in = self.D
        if dev.type == "cpu":
            g = generator(self.seed, "deep_rf.Vs")
            for _ in range(self.depth):
                # Paper (authors' code): sqrt(2) * randn(D, D) / sqrt(D) for every layer, i.e. N(0, 2/fan_in)
                V = torch.randn(self.width, fan_in, generator=g) * (2.0 / fan_in) ** 0.5
                layers.append(_Frozen(V.to(dt)))
                fan_in = self.width
        else:
            for layer in range(self.depth):
                layers.append(_Frozen(_draw_on_device(self.seed, layer, self.width, fan_in, dt, dev)))
                fan_in = self.width
        self.Vs = nn.ModuleList(layers)

    def out_dim(self, n: int | None = None) -> int:
        """Size p of phi(X): the width of the last layer, whatever n."""
        return self.width

    def weights(self) -> list[torch.Tensor]:
        """The layers' weights V_1, ..., V_L: (width, D) then (width, width)."""
        return [cast(_Frozen, layer).V for layer in self.Vs]

    @classmethod
    def for_cell(cls, n, d, seed, depth=2, width_ratio=1.0, dtype="float32", **options) -> DeepRandomFeatures:
        """A sweep cell's DeepRF: depth L, every layer max(1, round(width_ratio * n d)) wide (the paper: D)."""
        return cls(n, d, depth=depth, width=max(1, round(width_ratio * n * d)), seed=seed, dtype=dtype, **options)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """(B, n, d) -> (B, width)."""
        validate.samples("X", X, self.d, self.n)
        h = X.reshape(X.shape[0], self.D).to(self.weight_dtype)  # (B, D)
        for V in self.weights():
            h = torch.relu(h @ V.T)  # (B, fan_in) @ (fan_in, width) -> (B, width)
        return h

    @torch.no_grad()
    def forward64(self, X: torch.Tensor) -> torch.Tensor:
        """The forward computed in float64 (each layer's weights cast in row chunks): (B, n, d) -> (B, width)."""
        validate.samples("X", X, self.d, self.n)
        weights = self.weights()
        h = X.reshape(X.shape[0], self.D).to(device=weights[0].device, dtype=torch.float64)  # (B, D)
        for V in weights:
            h = torch.relu(matmul64(h, V))  # (B, fan_in) @ (fan_in, width) -> (B, width)
        return h

    def extra_repr(self) -> str:
        """The map's sizes and seed for its repr."""
        return f"n={self.n}, d={self.d}, depth={self.depth}, width={self.width}, seed={self.seed}"


class DeepRFMove(TokenMove):
    """DeepRF with one token moved: the first layer by the RF identity z1 + V1^(i) Delta, deeper layers dense.

    The deeper layers are held once for all trials, (T, width, width) each; a search that has finished some trials
    evaluates the others through `rows` (the trials' indices into that stack) without copying a weight, one product
    per trial (so a trial's numbers do not depend on which other trials are still searched).
    """

    # the ReLU layers' kinks make ridges: the search keeps its ridge steps on this closed form
    # (docs/theory/search.md §4.3)
    ridges = True

    def __init__(self, maps, X, positions, dtype) -> None:
        super().__init__(maps, X, positions, dtype)
        d = maps[0].d
        z1, blocks = [], []
        with torch.no_grad():
            for t, m in enumerate(maps):
                V1 = m.Vs[0].V  # (width, D)
                x = X[t].reshape(X.shape[1], m.D).to(V1.dtype)  # (B, D)
                z1.append((x @ V1.T).to(dtype))  # (B, D) @ (D, width) -> (B, width)
                blocks.append(torch.stack([V1[:, p * d : (p + 1) * d] for p in positions]).to(dtype))  # (P, width, d)
            # deeper layers, (T, width, width) each (one map: a view of its weight, no copy)
            deeper = [stack_trials([m.Vs[k].V.to(dtype) for m in maps]) for k in range(1, maps[0].depth)]
            self._setup(stack_trials(z1), stack_trials(blocks), deeper)

    def _setup(self, z1, V1, deeper, z1_64=None) -> None:
        self.z1, self.V1, self.deeper = z1, V1, deeper  # (T, B, width), (T, P, width, d), [(T, width, width)]
        self.rows = torch.arange(z1.shape[0])  # trial t's weights: deeper[k][rows[t]]
        # the clean forward once: its features and which units of every layer are active (the curvature at 0)
        pre = self.z1
        self.on = [pre > 0]  # [(T, B, width)] * L
        for V in self.deeper:
            pre = self._layer(torch.relu(pre), V)
            self.on.append(pre > 0)
        self.phi0 = torch.relu(pre)  # (T, B, width)
        if z1_64 is not None:
            self._z1_64 = z1_64

    @classmethod
    def from_preactivations(
        cls, z1_64: torch.Tensor, blocks: torch.Tensor, deeper: list[torch.Tensor], dtype: torch.dtype
    ) -> DeepRFMove:
        """The algebra of T maps known through their first layer and their deeper layers.

        The first layer through its z1 (T, B, width) float64 and blocks (T, P, width, d), the deeper layers as [(T,
        width, width)] (e.g. `fresh_deeper_layers`).
        """
        move = cls.__new__(cls)
        TokenMove.__init__(move, [], z1_64, [], dtype)
        with torch.no_grad():
            move._setup(z1_64.to(dtype), blocks.to(dtype), [V.to(dtype) for V in deeper], z1_64)
        return move

    def law_twin(self, dtype: torch.dtype) -> DeepRFMove | None:
        """The same algebra in another dtype for maps drawn from their law; None for built maps."""
        # the layers hold the drawn values (float32) exactly, z1 is float64: the twin is the algebra `dtype` would get
        if self.maps or getattr(self, "_z1_64", None) is None:
            return None
        return DeepRFMove.from_preactivations(self._z1_64, self.V1, self.deeper, dtype)

    @property
    def exact64(self):
        """The float64 values of candidate moves (`TokenMove.exact64`) when z1 is known in float64, else None."""
        return self._exact64 if getattr(self, "_z1_64", None) is not None else None

    def _exact64(self, delta: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """S in float64 of K candidates per sample, delta (T, B, K, d) at positions j (T, B, K): -> (T, B, K) twice.

        From the float64 first layer and one pass of the clean and the K moved samples through the deeper layers (each
        weight cast to float64 once, in row chunks).
        """
        T, B, K = j.shape
        V1 = self.V1[torch.arange(T)[:, None, None], j.to(self.V1.device)].to(torch.float64)  # (T, B, K, width, d)
        z1 = self._z1_64[:, :, None] + (V1 @ delta.to(V1)[..., None])[..., 0]  # (T, B, K, width)
        h = torch.cat([torch.relu(self._z1_64), torch.relu(z1).flatten(1, 2)], dim=1)  # (T, B + B K, width)
        h = deeper_forward64(h, self.deeper, self.rows)
        h0, h1 = h[:, :B], h[:, B:].reshape(T, B, K, -1)
        norm = h0.norm(dim=-1)[..., None].expand(T, B, K)
        return ((h1 - h0[:, :, None]).norm(dim=-1) / norm).cpu(), norm.contiguous().cpu()

    @classmethod
    def supports(cls, maps) -> bool:
        """Whether one instance can serve all these maps: they share one depth."""
        return len({m.depth for m in maps}) == 1

    @classmethod
    def chain_elements(cls, maps, B, n, d):
        """Rough working memory, in elements, per chain and per position of one trial (sizes the search's chunks)."""
        return 4 * maps[0].width * maps[0].depth, maps[0].width * d

    def _layer(self, h: torch.Tensor, V: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        """h[t] @ V[rows[t]]^T (the layer's forward), one product per trial: (T, ..., width) -> (T, ..., width).

        With `transpose`, h[t] @ V[rows[t]], its backward.
        """
        w = h.shape[-1]
        out = [h[t].reshape(-1, w) @ (V[r] if transpose else V[r].T) for t, r in enumerate(self.rows.tolist())]
        return torch.stack(out).reshape(h.shape)

    def _moved(self, delta: torch.Tensor) -> torch.Tensor:
        """V1^(i) Delta, the first layer's change: (T, B, P, R, d) -> (T, B, P, R, width)."""
        T, B, P, R, d = delta.shape
        flat = delta.permute(0, 2, 1, 3, 4).reshape(T, P, B * R, d)  # (T, P, B R, d)
        return (flat @ self.V1.transpose(-1, -2)).reshape(T, P, B, R, -1).permute(0, 2, 1, 3, 4)  # (T, B, P, R, w)

    def _moved_back(self, g: torch.Tensor) -> torch.Tensor:
        """The transpose of `_moved`, V1^(i)T g: (T, B, P, R, width) -> (T, B, P, R, d)."""
        T, B, P, R, w = g.shape
        flat = g.permute(0, 2, 1, 3, 4).reshape(T, P, B * R, w)  # (T, P, B R, w)
        return (flat @ self.V1).reshape(T, P, B, R, -1).permute(0, 2, 1, 3, 4)  # (T, P, B R, w) @ (T, P, w, d)

    def features(self, delta: torch.Tensor) -> torch.Tensor:
        """phi(X^i(Delta)), the first layer by the token-move identity: (T, B, P, R, d) -> (T, B, P, R, width)."""
        # first layer: the token-move identity of RF; deeper layers: full matrices
        h = torch.relu(self.z1[:, :, None, None] + self._moved(delta))
        for V in self.deeper:
            h = torch.relu(self._layer(h, V))
        return h

    def value_and_grad(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`change_sq` and its gradient in Delta by hand-written backpropagation through the L layers.

        No autograd graph (docs/theory/maps.md §3.3): (T, B, P, R, d) -> (T, B, P, R), (T, B, P, R, d).
        """
        pre = [self.z1[:, :, None, None] + self._moved(delta)]  # every layer's pre-activation, (T, B, P, R, width)
        h = torch.relu(pre[0])
        for V in self.deeper:
            pre.append(self._layer(h, V))
            h = torch.relu(pre[-1])
        e = h - self.phi0[:, :, None, None]
        f = sum_last(e.pow(2))
        g = 2 * e
        for k in range(len(self.deeper), 0, -1):  # back through layer k + 1 (weight deeper[k - 1]) and its ReLU
            g = self._layer(torch.where(pre[k] > 0, g, torch.zeros_like(g)), self.deeper[k - 1], transpose=True)
        return f, self._moved_back(torch.where(pre[0] > 0, g, torch.zeros_like(g)))

    def curvature_product(self, v: torch.Tensor) -> torch.Tensor:
        """H v for the Hessian H = 2 J^T J of `change_sq` at Delta = 0, one pass forward and one back.

        J is the Jacobian of the features there (the ReLUs are linear almost everywhere): (T, B, P, R, d) -> (T, B, P,
        R, d).
        """
        on = [m[:, :, None, None] for m in self.on]  # (T, B, 1, 1, width) each
        u = self._through_active(torch.where(on[0], self._moved(v), torch.zeros(())))  # (T, B, P, R, width): J v
        for k in range(len(self.deeper), 0, -1):
            u = torch.where(on[k - 1], self._layer(u, self.deeper[k - 1], transpose=True), torch.zeros(()))
        return 2 * self._moved_back(u)

    def _through_active(self, u: torch.Tensor) -> torch.Tensor:
        """The deeper part of J: a change u of the first layer's output through the deeper layers, linearised.

        u (T, B, ..., width) goes through the layers linearised at the clean sample (each layer's inactive units
        zeroed).
        """
        for V, mask in zip(self.deeper, self.on[1:]):
            mask = mask.reshape(*mask.shape[:2], *[1] * (u.dim() - 3), -1)  # (T, B, 1, ..., width)
            u = torch.where(mask, self._layer(u, V), torch.zeros(()))
        return u

    def top_curvature(self, v: torch.Tensor) -> torch.Tensor:
        """The exact top eigenvector of the Hessian 2 J^T J at Delta = 0, signed to agree with the start vector v.

        (T, B, P, 1, d) -> (T, B, P, 1, d) unit vectors (docs/theory/search.md §4.2).

        J (width x d per sample and position) is pushed through the layers as d columns at once: one pass in which
        every weight is read once (where the power iteration reads each weight twice per iteration), then a d x d
        eigendecomposition in float64.
        """
        T, B, P, _, d = v.shape
        out = []
        for p in range(P):  # one position at a time bounds the memory to T B d columns
            J = self.on[0][:, :, :, None] * self.V1[:, p, None]  # (T, B, width, d): the first layer's Jacobian
            J = self._through_active(J.transpose(-1, -2))  # (T, B, d, width): rows are the columns of J
            J64 = J.to(torch.float64)
            top = torch.linalg.eigh(J64 @ J64.transpose(-1, -2))[1][..., -1]  # (T, B, d), eigenvalues ascending
            sign = torch.where((top * v[:, :, p, 0].to(top)).sum(-1) < 0, -1.0, 1.0).to(top)
            out.append((top * sign[..., None]).to(v.dtype))
        return torch.stack(out, dim=2)[:, :, :, None]  # (T, B, P, 1, d)

    def select_trials(self, idx: torch.Tensor) -> DeepRFMove:
        """The algebra of the trials idx only (the search leaves its finished trials out).

        The deeper layers are not copied, `rows` points into them.
        """
        move = DeepRFMove.__new__(DeepRFMove)
        TokenMove.__init__(
            move, [self.maps[i] for i in idx.tolist()] if self.maps else [], self.z1, self.positions, self.dtype
        )
        idx = idx.to(self.z1.device)
        move.z1, move.V1, move.phi0 = self.z1[idx], self.V1[idx], self.phi0[idx]
        move.deeper, move.rows = self.deeper, self.rows[idx.cpu()]
        move.on = [m[idx] for m in self.on]
        if getattr(self, "_z1_64", None) is not None:
            move._z1_64 = self._z1_64[idx]
        return move


def fresh_deeper_layers(
    seeds: Sequence[int], depth: int, width: int, device: torch.device | str = "cpu"
) -> list[torch.Tensor]:
    """Layers 2..L of T fresh DeepRF maps, N(0, 2 / width) each: [(T, width, width)] * (depth - 1).

    On the CPU each layer comes from the generator derive_seed(seed, "deep_rf.fresh", layer), drawn straight into
    its place in the stack; on another device it is drawn there (other numbers, see `_draw_on_device`), so the
    paper's widest layers never pass through host memory.
    """
    device = torch.device(device)
    layers = []
    for layer in range(1, depth):
        if device.type == "cpu":
            stack = torch.empty(len(seeds), width, width)
            for t, s in enumerate(seeds):
                torch.randn(width, width, generator=generator(s, "deep_rf.fresh", layer), out=stack[t])
            layers.append(stack.mul_((2.0 / width) ** 0.5))
        else:
            draws = [_draw_on_device(s, layer, width, width, torch.float32, device, "deep_rf.fresh") for s in seeds]
            layers.append(stack_trials(draws))
    return layers


def deeper_forward64(h: torch.Tensor, deeper: list[torch.Tensor], rows: torch.Tensor | None = None) -> torch.Tensor:
    """The ReLU layers of the deeper part in float64, trial t by the weights `deeper[k][rows[t]]` (rows None: t).

    (T, M, width) -> (T, M, width).
    """
    index = range(h.shape[0]) if rows is None else rows.tolist()
    for V in deeper:
        h = torch.relu(torch.stack([matmul64(h[t], V[r]) for t, r in enumerate(index)]))
    return h


DeepRandomFeatures.move_class = DeepRFMove
