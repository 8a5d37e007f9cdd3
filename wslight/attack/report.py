"""What an attack reports: the best restart per sample and objective, the heads' outputs there.

See docs/theory/attack.md §6.4.

`delta_attacks` hands its chains here; `output_records` flattens one output into a record per context sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..base.names import Training
from ..base.numerics import sum_last
from ..chains.ball import project_ball
from ..chains.engine import near_best
from .heads import Heads
from .losses import Loss, attack_objective


def best_restarts(
    attacks: Sequence[tuple[Training, Loss, float]],
    heads: Heads,
    inner: Callable[[Tensor], Tensor],
    loss: Tensor,
    delta: Tensor,
    taken: Tensor,
    radius: float,
    return_delta: bool,
    batched: bool,
    atol: float,
) -> list[dict[str, Tensor]]:
    """Keep the best restart per sample and objective and report the heads' outputs there in float64.

    Args:
        attacks: the checked (training, loss, penalty) objectives, in the order of the chains' blocks.
        heads: the closed-form heads, float64.
        inner: the float64 read-out (T, B, K, d) -> (T, B, K, 3); the kept points are projected onto the ball in
            float64 first (a point of a float32 chain may sit outside it by a rounding), and the objective is
            recomputed there.
        loss: (T, B, n_obj R) each chain's loss.
        delta: (T, B, n_obj R, d) each chain's point, float64.
        taken: (T, B, n_obj R) each chain's steps.
        radius: the ball's radius.
        return_delta: whether each output holds the kept Delta (T, B, d).
        batched: whether the caller gave a trial axis (else the outputs drop it).
        atol: the absolute tolerance of "within 1% of the best loss" (the optimiser's stopping one).
    """
    T, B = loss.shape[:2]
    d, n_obj = delta.shape[-1], len(attacks)
    loss, delta, taken = (
        loss.unflatten(2, (n_obj, -1)),
        delta.unflatten(2, (n_obj, -1)),
        taken.unflatten(2, (n_obj, -1)),
    )
    r_best = loss.argmin(dim=3)  # (T, B, n_obj)
    best = loss.gather(3, r_best[..., None])[..., 0]
    near = near_best(-loss, -best, atol=atol)  # restarts within 1% of the best loss (docs/theory/search.md §4.3)
    delta_k = delta.gather(3, r_best[..., None, None].expand(T, B, n_obj, 1, d))[:, :, :, 0]
    delta_k = project_ball(delta_k, radius)
    sap = inner(delta_k)  # (T, B, n_obj, 3) float64
    outs = []
    for o, (training, loss_name, penalty) in enumerate(attacks):
        D0 = sap[:, :, o, 0]
        D1 = D0 + heads.coef(training) * (sap[:, :, o, 1] if training == "finetune" else sap[:, :, o, 2])
        t1 = heads.t0 + heads.coef(training) * (
            heads.phi_sq if training == "finetune" else sum_last(heads.phi * heads.Pphi)
        )
        y = heads.y
        out = {
            "y": y,
            "t0": heads.t0,
            "t1": t1,
            "D0": D0,
            "D1": D1,
            # Working definitions (docs/theory/attack.md §6.1): Err against y_Delta = -y, its sign version, gamma
            "err": (D1 + y) ** 2,
            "sign_err": (torch.sign(D1) != -torch.sign(y)).to(torch.float64),
            "gamma": torch.maximum(heads.t0.abs(), D0.abs()),
            "proj_ratio": heads.proj_ratio,
            "abs_t0": heads.t0.abs(),
            "abs_D0": D0.abs(),
            "delta_norm": delta_k[:, :, o].to(torch.float64).norm(dim=-1),
            "steps": taken[:, :, o].gather(2, r_best[:, :, o, None])[..., 0],
            "loss": attack_objective(D0, sap[:, :, o, 1], sap[:, :, o, 2], heads, training, loss_name, penalty),
            "restart": r_best[:, :, o],
            "chains": torch.full_like(r_best[:, :, o], loss.shape[3]),
            "near_best": near[:, :, o],
            "gram_cond": heads.cond[:, None].expand(T, B),
            "gram_ill_conditioned": heads.ill_conditioned[:, None].expand(T, B),
        }
        if return_delta:
            out["delta"] = delta_k[:, :, o]  # (T, B, d)
        outs.append(out if batched else {k: v[0] for k, v in out.items()})
    return outs


def output_records(out: dict[str, Tensor]) -> list[dict]:
    """One flat dict per context sample of a `delta_attack` output (B contexts, no trial dimension).

    The final objective value `loss` is renamed `objective` (in records, `loss` names the objective), and `nonfinite`
    flags a NaN or infinite value (e.g. phi(X) = 0 for a ReLU-RAF context whose scores are all <= 0, where the heads'
    updates divide by zero); `gram_cond` is left out of that test, since inf there means a singular Gram, which
    `gram_ill_conditioned` already flags.
    """
    B = max((v.shape[0] for v in out.values() if v.dim() > 0), default=1)
    records = []
    for b in range(B):
        rec = {k: (v[b].item() if v.dim() > 0 else v.item()) for k, v in out.items()}
        rec["objective"] = rec.pop("loss")
        rec["nonfinite"] = any(
            isinstance(v, float) and not math.isfinite(v) for k, v in rec.items() if k != "gram_cond"
        )
        records.append(rec)
    return records
