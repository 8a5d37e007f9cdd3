"""FreshMaps: the paper's protocol, a fresh random map of one kind per trial, for the estimator and the attack.

RF and DeepRF maps are never built: the samples a trial meets see a fresh RF map only through z = V flat(X) and the
blocks V^(i) of the moved token, which are drawn from their exact joint law (docs/theory/maps.md §3.6); DeepRF draws its
first layer so and its deeper layers dense. Every other kind is built with `make_map` (attention maps are d x d).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..base import validate
from .base import MAPS, FeatureMap, make_map
from .deep_rf import DeepRFMove, deeper_forward64, fresh_deeper_layers
from .entries import MapEntry
from .forwards import weight_dtype
from .generic_move import move_class_for, token_move
from .move import TokenMove
from .rf import ACTIVATIONS, RFMove, fresh_preactivations

# kinds drawn from the law of (z, V^(i)) instead of being built
LAW_MAPS = ("rf", "deep_rf")


@dataclass
class FreshMaps:
    """T fresh maps of the registered kind `name`, trial t's seeded by seeds[t].

    Pass it as the map of `word_sensitivity(maps, X)` or `delta_attack(maps, ...)`, with X (T, B, n, d) and per-trial
    training sets (T, N, n, d): all trials run in one tensor program.

    Args:
        name: a registered map ("rf", "deep_rf", "raf", "relu_raf", ...).
        seeds: one map seed per trial.
        depth: depth of DeepRF.
        width_ratio: RF neurons and DeepRF widths = max(1, round(width_ratio * n d)) (the paper: 1).
        dtype: working dtype of the maps.
        device: where the maps (or their drawn parts) live.
    """

    name: str
    seeds: Sequence[int]
    depth: int = 2
    width_ratio: float = 1.0
    dtype: Literal["float32", "float64"] = "float32"
    device: str | torch.device | None = None
    _built: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        validate.choice("map", self.name, sorted(MAPS))
        self.seeds = [validate.integer("seeds", s) for s in self.seeds]
        if not self.seeds:
            raise ValueError("seeds must list one seed per trial, got an empty list")
        validate.positive_int("depth", self.depth)
        validate.number("width_ratio", self.width_ratio, 0.0, strict=True)
        self.working_dtype = validate.dtype("dtype", self.dtype)

    def __len__(self) -> int:
        return len(self.seeds)

    @property
    def drawn_from_law(self) -> bool:
        """Whether the maps are drawn from their law (RF, DeepRF) rather than built."""
        return self.name in LAW_MAPS

    @property
    def variance(self) -> float:
        """Entries of the (first-layer) weights are N(0, variance / D): RF 1, DeepRF 2 (He-scaled)."""
        return 1.0 if self.name == "rf" else 2.0

    def width(self, n: int, d: int) -> int:
        """The width of a map for n tokens of dimension d: width_ratio n d, at least 1."""
        return max(1, round(self.width_ratio * n * d))

    def maps(self, n: int, d: int) -> list[FeatureMap]:
        """The T maps built in full (attention maps; RF / DeepRF when every block is needed)."""
        if (n, d) not in self._built:
            self._built = {
                (n, d): [
                    make_map(
                        self.name,
                        n,
                        d,
                        seed=s,
                        depth=self.depth,
                        width_ratio=self.width_ratio,
                        dtype=self.dtype,
                        device=self.device,
                    )
                    for s in self.seeds
                ]
            }
        return self._built[(n, d)]

    def chain_elements(self, B: int, n: int, d: int) -> tuple[int, int]:
        """Working memory per chain and per position of one trial, in elements (sizes the search's chunks)."""
        w = self.width(n, d)
        if self.name == "rf":
            return 6 * w, w * d
        if self.name == "deep_rf":
            return 4 * w * self.depth, w * d + (self.depth - 1) * w * w
        return move_class_for(self.maps(n, d)).chain_elements(self.maps(n, d), B, n, d)

    def move(self, X: Tensor, positions: list[int]) -> TokenMove:
        """The token-move algebra of the T maps for X (T, B, n, d), drawn for exactly these positions."""
        T, B, n, d = X.shape
        dt = self.working_dtype
        if not self.drawn_from_law:
            return token_move(self.maps(n, d), X, positions, dt)
        z64, blocks = fresh_preactivations(X, positions, self.width(n, d), self.seeds, self.variance)
        if self.name == "rf":
            return RFMove.from_preactivations("relu", z64, blocks, dt)
        deeper = fresh_deeper_layers(self.seeds, self.depth, self.width(n, d), X.device)
        return DeepRFMove.from_preactivations(z64, blocks, deeper, dt)

    def attack_inputs(
        self, X_train: Tensor, X_ctx: Tensor, position: int, dt: torch.dtype
    ) -> tuple[Tensor, Tensor, TokenMove]:
        """Training features Phi (T, N, p), context features phi (T, B, p), float64, and the contexts' algebra.

        The algebra is in the working dtype dt; all come from one draw of each trial's map (the training and context
        samples share it).
        """
        T, B, n, d = X_ctx.shape
        if not self.drawn_from_law:
            maps = self.maps(n, d)
            feats = stacked_features(maps, X_ctx, X_train)  # (T, B + N, p)
            return feats[:, B:], feats[:, :B], token_move(maps, X_ctx, [position], dt)
        X_all = torch.cat([X_ctx, X_train], dim=1)  # (T, B + N, n, d): one draw of z for every sample
        z64, blocks = fresh_preactivations(X_all, [position], self.width(n, d), self.seeds, self.variance)
        move: TokenMove
        if self.name == "rf":
            feats = ACTIVATIONS["relu"](z64)  # (T, B + N, k)
            move = RFMove.from_preactivations("relu", z64[:, :B], blocks, dt)
        else:
            deeper = fresh_deeper_layers(self.seeds, self.depth, self.width(n, d), X_ctx.device)
            feats = deeper_forward64(torch.relu(z64), deeper)  # (T, B + N, width)
            move = DeepRFMove.from_preactivations(z64[:, :B], blocks, deeper, dt)
        return feats[:, B:], feats[:, :B], move


@torch.no_grad()
def stacked_features(maps: Sequence[nn.Module], X_ctx: Tensor, X_train: Tensor, chunk: int = 256) -> Tensor:
    """The features of every trial's contexts and training samples in one float64 buffer, contexts first.

    (T, B, n, d), (T, N, n, d) -> (T, B + N, p). Each map's forward runs in its own dtype (the samples cast to it
    once) and its output is written straight into the float64 buffer: the same numbers as `trial_features` of the two
    apart, without their float64 copies and the stacking.
    """
    T, B = X_ctx.shape[:2]
    out: Tensor | None = None
    for t, m in enumerate(maps):
        dtype = weight_dtype(m, X_ctx.dtype)
        for first, X in ((0, X_ctx[t]), (B, X_train[t])):
            for s in range(0, X.shape[0], chunk):
                f = m(X[s : s + chunk].to(dtype))  # (c, p) in the map's dtype
                if out is None:
                    out = f.new_empty(T, B + X_train.shape[1], f.shape[-1], dtype=torch.float64)
                out[t, first + s : first + s + f.shape[0]].copy_(f)
    assert out is not None  # at least one trial and one sample
    return out


def trial_maps(entry: MapEntry, seeds: Sequence[int], n: int, d: int, **kwargs: Any) -> FreshMaps | list[nn.Module]:
    """One fresh map per trial of a sweep's map entry, trial t's seeded by seeds[t].

    `FreshMaps` for a registered name (RF and DeepRF drawn from their law), else the entry built once per seed.

    Args:
        entry: the map entry (`resolve_map`).
        seeds: one map seed per trial.
        n: context length.
        d: embedding dimension.
        kwargs: depth, width_ratio, dtype, device (as `make_map`).
    """
    if entry.by_name:
        return FreshMaps(entry.name, seeds, **kwargs)
    return [entry.build(n, d, s, **kwargs) for s in seeds]
