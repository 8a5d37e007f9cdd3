"""The settings of the Delta attack's optimiser, written, checked and documented once (docs/theory/attack.md §6.5-6.6).

`AttackSettings` travels whole from a sweep's YAML (`model.init_args.attack: {...}`), a callback's
(`trainer.callbacks[i].init_args.attack: {...}`) or a notebook call
(`delta_attack(map, X_train, Y, X_ctx, y_ctx, settings=AttackSettings(restarts=8))`) down to the chains. A field left
at None takes its default when the map and sizes are known (`resolved`): the improved optimiser's
(DEFAULT_STEPS, DEFAULT_LR, DEFAULT_RESTARTS), or with `faithful` the authors' schedule of the map (FAITHFUL_SCHEDULES).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

from ..base import validate

# Authors' fixed-step schedules (docs/theory/attack.md §6.5), per map: (lr, steps, steps per token); steps = fixed + per
# token * n.
FAITHFUL_SCHEDULES = {
    "rf": (100.0, 300, 0),
    "deep_rf": (100.0, 300, 0),
    "raf": (1.0, 0, 50),
    "relu_raf": (1.0, 0, 50),
}
# Defaults of the improved optimiser (docs/theory/attack.md §6.6)
DEFAULT_STEPS, DEFAULT_LR, DEFAULT_RESTARTS = 400, 0.1, 4


@dataclass(frozen=True)
class AttackSettings:
    """How the attack looks for Delta: steps, step length, restarts, schedule, token, ball, dtype.

    See docs/theory/attack.md §6.6.

    A field left at None takes its default once the map and the sizes are known (`resolved`). A given value is
    checked here, once, with a ValueError naming the field.

    Args:
        steps: most optimiser steps per chain, >= 1 (None: 400; with faithful, the authors' count, 300 for
            RF/DeepRF and 50 n for RAF/ReLU-RAF).
        lr: the first step's length as a fraction of the radius, cosine-decayed to 1% of it, > 0 (None: 0.1; with
            faithful, the plain descent's step size, 100 for RF/DeepRF and 1 for RAF/ReLU-RAF).
        restarts: chains per context sample and objective, >= 1, the first at the clean token and the others uniform
            in the ball (None: 4; with faithful, exactly 1, the only value it takes).
        faithful: the authors' fixed-step projected descent from the clean token, final iterate kept, instead of the
            improved optimiser (docs/theory/attack.md §6.5).
        position: index of the perturbed token, below the context length n (0: [CLS], as the paper).
        radius: radius of the ball around the clean token, > 0 (None: sqrt(d)).
        dtype: working dtype of the chains, "float32" or "float64" (None: float32; with faithful, float64, as the
            authors' code); the heads and the reported values are float64 either way.
    """

    steps: int | None = None
    lr: float | None = None
    restarts: int | None = None
    faithful: bool = False
    position: int = 0
    radius: float | None = None
    dtype: Literal["float32", "float64"] | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, _check(f.name, value))
        if self.faithful and self.restarts not in (None, 1):
            raise ValueError(f"restarts must be 1 (or None) when faithful=True, got {self.restarts!r}")

    def replace(self, **changes: Any) -> AttackSettings:
        """These settings with some fields changed (an unknown name is refused, naming the closest field)."""
        validate.known_names("an attack setting", changes, [f.name for f in fields(self)])
        return dataclasses.replace(self, **changes)

    def resolved(self, kind: str, n: int, d: int) -> AttackSettings:
        """Every field filled for a map of the family `kind` on n tokens of dimension d; `position` checked against n.

        With `faithful`: one restart, and the authors' schedule of `kind` for n tokens where lr or steps is None (a
        ValueError for a map without one). Else DEFAULT_RESTARTS, DEFAULT_STEPS and DEFAULT_LR. The radius defaults to
        sqrt(d), the dtype to float32 (faithful: float64).
        """
        self.check_position(n)
        steps, lr, restarts = self.steps, self.lr, self.restarts
        if self.faithful:
            schedule = FAITHFUL_SCHEDULES.get(kind)
            if schedule is None and (lr is None or steps is None):
                raise ValueError(
                    f"faithful: the authors' schedule exists for {sorted(FAITHFUL_SCHEDULES)}; give lr and steps for a "
                    f"{kind} map"
                )
            if schedule is not None:
                lr = _given(lr, schedule[0])
                steps = _given(steps, schedule[1] + schedule[2] * n)
            restarts = 1
        return dataclasses.replace(
            self,
            steps=_given(steps, DEFAULT_STEPS),
            lr=_given(lr, DEFAULT_LR),
            restarts=_given(restarts, DEFAULT_RESTARTS),
            radius=_given(self.radius, d**0.5),
            dtype=_given(self.dtype, "float64" if self.faithful else "float32"),
        )

    def check_position(self, n: int) -> int:
        """The position, if it is a token of a context of n tokens (else a ValueError naming it)."""
        return validate.integer("position", self.position, 0, n - 1)

    def given(self) -> dict[str, Any]:
        """The fields that differ from their defaults: what a config changes."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    @property
    def torch_dtype(self) -> torch.dtype:
        """The working dtype as a torch dtype (of resolved settings)."""
        return validate.dtype("dtype", self.dtype)


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _check(name: str, value: Any) -> Any:
    """One field's value checked, with a ValueError naming it."""
    if name in ("steps", "restarts"):
        return validate.integer(name, value, 1)
    if name == "position":
        return validate.integer(name, value, 0)
    if name in ("lr", "radius"):
        return validate.number(name, value, 0.0, strict=True)
    if name == "faithful":
        return validate.boolean(name, value)
    # dtype: "float32" / "float64" (a torch dtype is taken by its name)
    return next(k for k, v in validate.DTYPES.items() if v == validate.dtype(name, value))
