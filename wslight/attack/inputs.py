"""The inputs of the Delta attack (`wslight.attack.delta_attacks`) checked before any heavy work.

Shapes, maps, objectives, the optimiser's settings and their defaults (the authors' schedules behind `faithful`), seeds,
and that no context sample is a training one. Pure maths: no Lightning import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from ..base import validate
from ..base.names import TRAININGS, Training
from ..features import FreshMaps, map_dims, map_name
from .losses import LOSSES, Loss

# Authors' fixed-step schedules (docs/theory.md §6.5), per map: (lr, steps, steps per token); steps = fixed + per
# token * n.
FAITHFUL_SCHEDULES = {
    "rf": (100.0, 300, 0),
    "deep_rf": (100.0, 300, 0),
    "raf": (1.0, 0, 50),
    "relu_raf": (1.0, 0, 50),
}
# Defaults of the improved optimiser (docs/theory.md §6.6)
DEFAULT_STEPS, DEFAULT_LR, DEFAULT_RESTARTS = 400, 0.1, 4


@dataclass
class AttackInputs:
    """The checked inputs and settings of one call: samples with a trial axis, T trials of B contexts."""

    attacks: list[tuple[Training, Loss, float]]
    batched: bool  # the caller gave a trial axis (else outputs drop it)
    X_train: Tensor  # (T, N, n, d), the first N training samples
    Y: Tensor  # (T, N)
    X_ctx: Tensor  # (T, B, n, d)
    y_ctx: Tensor  # (T, B)
    N: int
    position: int
    radius: float
    maps: list[nn.Module]  # [] for FreshMaps
    restarts: int
    steps: int
    lr: float
    seeds: list[int]
    per_trial_seeds: bool
    faithful: bool

    @property
    def T(self) -> int:
        """The number of trials."""
        return self.X_ctx.shape[0]

    @property
    def B(self) -> int:
        """The number of context samples per trial."""
        return self.X_ctx.shape[1]


def checked_inputs(
    feature_map,
    X_train,
    Y,
    X_ctx,
    y_ctx,
    objectives,
    position,
    radius,
    steps,
    lr,
    restarts,
    seed,
    faithful,
    N,
    train_ids,
    ctx_ids,
) -> AttackInputs:
    """Every input of `delta_attacks` checked (a ValueError naming it), its defaults filled, before heavy work."""
    attacks = _checked_objectives(objectives)
    batched, X_train, Y, X_ctx, y_ctx = _checked_samples(X_train, Y, X_ctx, y_ctx)
    T, M, n, d = X_train.shape
    B = X_ctx.shape[1]
    N = validate.integer("N", M if N is None else N, 1, M, why="the training samples available")
    position = validate.integer("position", position, 0, n - 1)
    radius = validate.number("radius", d**0.5 if radius is None else radius, 0.0, strict=True)
    maps, kind = _checked_maps(feature_map, T)
    restarts, steps, lr = _optimiser_settings(faithful, kind, n, restarts, steps, lr)
    check_ids(train_ids, ctx_ids, T, M, B, N)
    seeds, per_trial_seeds = _checked_seeds(seed, T)
    return AttackInputs(
        attacks,
        batched,
        X_train[:, :N],
        Y[:, :N],
        X_ctx,
        y_ctx,
        N,
        position,
        radius,
        maps,
        restarts,
        steps,
        lr,
        seeds,
        per_trial_seeds,
        faithful,
    )


def _checked_objectives(objectives) -> list[tuple[Training, Loss, float]]:
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


def _checked_samples(X_train, Y, X_ctx, y_ctx) -> tuple[bool, Tensor, Tensor, Tensor, Tensor]:
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


def _checked_maps(feature_map, T: int) -> tuple[list[nn.Module], str]:
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


def _optimiser_settings(faithful, kind: str, n: int, restarts, steps, lr) -> tuple[int, int, float]:
    """The optimiser's restarts, steps and lr, checked, with their defaults.

    With `faithful`: one restart, and the authors' schedule of the map `kind` for n tokens where lr or steps is None.
    Else DEFAULT_RESTARTS, DEFAULT_STEPS and DEFAULT_LR.
    """
    if faithful:
        if restarts not in (None, 1):
            raise ValueError(f"restarts must be 1 (or None) when faithful=True, got {restarts!r}")
        restarts = 1
        schedule = FAITHFUL_SCHEDULES.get(kind)
        if schedule is None and (lr is None or steps is None):
            raise ValueError(
                f"faithful: the authors' schedule exists for {sorted(FAITHFUL_SCHEDULES)}; give lr and steps for a "
                f"{kind} map"
            )
        if schedule is not None:
            lr = schedule[0] if lr is None else lr
            steps = schedule[1] + schedule[2] * n if steps is None else steps
    restarts = validate.integer("restarts", DEFAULT_RESTARTS if restarts is None else restarts, 1)
    steps = validate.integer("steps", DEFAULT_STEPS if steps is None else steps, 1)
    lr = validate.number("lr", DEFAULT_LR if lr is None else lr, 0.0, strict=True)
    return restarts, steps, lr


def _checked_seeds(seed, T: int) -> tuple[list[int], bool]:
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
