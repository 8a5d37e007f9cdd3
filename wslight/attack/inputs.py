"""The inputs of the Delta attack (`wslight.attack.delta_attacks`) checked before any heavy work.

Shapes, maps, objectives, the settings resolved for the maps and sizes (`AttackSettings.resolved`), seeds, and that no
context sample is a training one; and `draw_samples`, the seeded choice of samples the sweep and the callback both
make. Pure maths: no Lightning import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from ..base import validate
from ..base.names import TRAININGS, Training
from ..base.seeding import generator
from ..features import FreshMaps, map_dims, map_name
from .losses import LOSSES, Loss
from .settings import AttackSettings


@dataclass
class AttackInputs:
    """The checked inputs and settings of one call: samples with a trial axis, T trials of B contexts."""

    attacks: list[tuple[Training, Loss, float]]
    batched: bool  # the caller gave a trial axis (else outputs drop it)
    X_train: Tensor  # (T, N, n, d), the first N training samples
    Y: Tensor  # (T, N)
    X_ctx: Tensor  # (T, B, n, d)
    y_ctx: Tensor  # (T, B)
    maps: list[nn.Module]  # [] for FreshMaps
    settings: AttackSettings  # resolved: every field filled for these maps and sizes
    seeds: list[int]
    per_trial_seeds: bool

    @property
    def T(self) -> int:
        """The number of trials."""
        return self.X_ctx.shape[0]

    @property
    def B(self) -> int:
        """The number of context samples per trial."""
        return self.X_ctx.shape[1]


def checked_inputs(
    feature_map: nn.Module | Sequence[nn.Module] | FreshMaps,
    X_train: Tensor,
    Y: Tensor,
    X_ctx: Tensor,
    y_ctx: Tensor,
    objectives: Sequence[tuple[str, str, float]],
    settings: AttackSettings,
    seed: int | Sequence[int],
    N: int | None,
    train_ids: Tensor | None,
    ctx_ids: Tensor | None,
) -> AttackInputs:
    """Every input of `delta_attacks` checked (a ValueError naming it), the settings resolved, before heavy work."""
    attacks = _checked_objectives(objectives)
    batched, X_train, Y, X_ctx, y_ctx = _checked_samples(X_train, Y, X_ctx, y_ctx)
    T, M, n, d = X_train.shape
    B = X_ctx.shape[1]
    N = validate.integer("N", M if N is None else N, 1, M, why="the training samples available")
    maps, kind = _checked_maps(feature_map, T)
    resolved = settings.resolved(kind, n, d)
    check_ids(train_ids, ctx_ids, T, M, B, N)
    seeds, per_trial_seeds = _checked_seeds(seed, T)
    return AttackInputs(
        attacks, batched, X_train[:, :N], Y[:, :N], X_ctx, y_ctx, maps, resolved, seeds, per_trial_seeds
    )


def _checked_objectives(objectives: Sequence[tuple[str, str, float]]) -> list[tuple[Training, Loss, float]]:
    """The (training, loss, penalty) objectives, each checked; at least one."""
    if not objectives:
        raise ValueError("objectives: expected at least one (training, loss, penalty), got none")
    return [
        (
            validate.choice("training", training, TRAININGS),
            validate.choice("loss", loss, LOSSES),
            validate.number("penalty", penalty, 0.0),
        )
        for training, loss, penalty in objectives
    ]


def _checked_samples(
    X_train: Tensor, Y: Tensor, X_ctx: Tensor, y_ctx: Tensor
) -> tuple[bool, Tensor, Tensor, Tensor, Tensor]:
    """Whether the caller gave a trial axis, and the samples and labels with one: (T, M, n, d), (T, M), (T, B, ...)."""
    if X_train.dim() not in (3, 4) or X_ctx.dim() != X_train.dim():
        raise ValueError(
            f"X_train/X_ctx: expected (M, n, d)/(B, n, d) or (T, M, n, d)/(T, B, n, d), "
            f"got {tuple(X_train.shape)} and {tuple(X_ctx.shape)}"
        )
    batched = X_train.dim() == 4
    if not batched:
        X_train, Y, X_ctx, y_ctx = X_train[None], Y[None], X_ctx[None], y_ctx[None]
    T, M, n, d = X_train.shape
    B = X_ctx.shape[1]
    if X_ctx.shape[0] != T or X_ctx.shape[2:] != (n, d):
        raise ValueError(f"X_ctx: expected ({T}, B, {n}, {d}), got {tuple(X_ctx.shape)}")
    if Y.shape != (T, M) or y_ctx.shape != (T, B):
        raise ValueError(f"Y/y_ctx: expected {(T, M)} and {(T, B)}, got {tuple(Y.shape)} and {tuple(y_ctx.shape)}")
    return batched, X_train, Y, X_ctx, y_ctx


def _checked_maps(feature_map: nn.Module | Sequence[nn.Module] | FreshMaps, T: int) -> tuple[list[nn.Module], str]:
    """The T trials' maps ([] for FreshMaps) and the name of their kind."""
    maps: list[nn.Module]
    if isinstance(feature_map, FreshMaps):
        maps, kind = [], feature_map.name
        if len(feature_map) != T:
            raise ValueError(f"feature_map: FreshMaps with {len(feature_map)} seeds for {T} trials")
    else:
        maps = list(feature_map) if isinstance(feature_map, (Sequence, nn.ModuleList)) else [feature_map] * T
        if len(maps) != T:
            raise ValueError(f"feature_map: expected one map or {T} maps (one per trial), got {len(maps)}")
        for m in maps:
            map_dims(m)  # a ValueError for anything that is not a map of d-dimensional tokens
        kind = map_name(maps[0])
    return maps, kind


def _checked_seeds(seed: int | Sequence[int], T: int) -> tuple[list[int], bool]:
    """The seeds of the random restarts (one per trial, or one for all) and whether they are one per trial."""
    per_trial_seeds = isinstance(seed, (list, tuple))
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [cast(int, seed)]  # one per trial, or one for all
    if per_trial_seeds and len(seeds) != T:
        raise ValueError(f"seed: expected one seed or {T} (one per trial), got {len(seeds)}")
    return seeds, per_trial_seeds


def check_ids(train_ids: Tensor | None, ctx_ids: Tensor | None, T: int, M: int, B: int, N: int) -> None:
    """Raise a ValueError if a context sample id is also among the N training ids of its trial."""
    if train_ids is None or ctx_ids is None:
        return
    tr = torch.as_tensor(train_ids).reshape(T, -1)
    cx = torch.as_tensor(ctx_ids).reshape(T, -1)
    if tr.shape[1] != M or cx.shape[1] != B:
        raise ValueError(
            f"train_ids/ctx_ids: expected {M} training and {B} context ids per trial, "
            f"got {tr.shape[1]} and {cx.shape[1]}"
        )
    for t in range(T):
        shared = sorted(set(tr[t, :N].tolist()) & set(cx[t].tolist()))
        if shared:
            raise ValueError(
                f"ctx_ids: a context sample must not be one of the N={N} training samples (allowed: ids not in "
                f"train_ids[:N]), got shared id(s) {shared[:10]} in trial {t}"
            )


def draw_samples(pool: Tensor, k: int, seed: int, stream: str, keep: Tensor | None = None) -> Tensor:
    """The first k of `pool` in the seeded random order of `generator(seed, stream)`: the attack's choice of samples.

    Its one home: the sweep draws each trial's `contexts` context samples and N training samples from the embeddings'
    distinct reviews, the `DeltaAttackCallback` its N training samples from the training split (when N is smaller)
    and its context samples from the test split. Fewer than k available: all of them (the caller names its limit).

    Args:
        pool: (M,) sample indices to choose from.
        k: how many to keep.
        seed: the seed of the draw (`wslight.base.seeding.generator`).
        stream: the name of the draw's stream.
        keep: optional boolean mask over sample indices: a drawn index i is skipped where keep[i] is False (the
            permutation is drawn over the whole pool first, then filtered).

    Returns:
        (min(k, available),) sample indices, in drawn order.
    """
    order = pool[torch.randperm(len(pool), generator=generator(seed, stream))]  # (M,)
    if keep is not None:
        order = order[keep[order]]
    return order[:k]
