"""The objectives of the Delta attack (docs/theory/attack.md §6.1).

The test error (16), the alignments (24a) and (24b), and the penalized error, computed from three inner products of
phi(X') with the heads' vectors. Pure maths: no Lightning.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from .heads import HeadScalars

Loss = Literal["err", "align", "align_proj", "penalized"]
LOSSES: tuple[Loss, ...] = ("err", "align", "align_proj", "penalized")


def attack_objective(
    s: Tensor,
    a: Tensor,
    ap: Tensor,
    heads: HeadScalars,
    training: Literal["finetune", "retrain"],
    loss: Literal["err", "align", "align_proj", "penalized"],
    penalty: float = 0.0,
) -> Tensor:
    """The Delta-objective from the three inner products of phi(X') with the heads' vectors.

    Args:
        s: (..., B) phi(X')^T theta*  (D0).
        a: (..., B) phi(X')^T phi(X).
        ap: (..., B) phi(X')^T P phi(X).
        heads: the fitted heads; its (..., B) tensors broadcast against s (e.g. with a restart dim appended).
        training: which head, theta_f or theta_r, the test error uses.
        loss: "err" (16), "align" (24a), "align_proj" (24b) or "penalized".
        penalty: weight of the penalty term of "penalized".

    Returns:
        (..., B) loss values.
    """
    if loss == "align":
        # Paper: Eq. (24a), (<phi(X'), phi(X)> / ||phi(X)||^2 + 1)^2
        return (a / heads.phi_sq + 1) ** 2
    if loss == "align_proj":
        # Paper: Eq. (24b), the same with P phi(X)
        return (ap / heads.Pphi_sq + 1) ** 2
    D1 = s + heads.coef(training) * (a if training == "finetune" else ap)
    # Paper: Eq. (16), test error against the flipped label y_Delta = -y (working definition of Err)
    err = (D1 + heads.y) ** 2
    if loss == "penalized":
        # Working definition (docs/theory/attack.md §6.1): l_{Err,p} = Err + p (phi(X')^T theta*)^2, p the penalty
        # weight
        return err + penalty * s**2
    return err
