"""The single-token Delta attack on fine-tuned / re-trained linear heads (docs/theory.md §6): pure, batched functions.

One trial = a training set (N samples), B context samples (X, y) distinct from it, a feature map; the heads theta*,
theta_f, theta_r come in closed form from `wslight.attack.heads`. Delta moves one token of X inside the ball of radius
sqrt(d) around the clean token and is chosen by projected descent on one of the losses

    err         (16)  (phi(X')^T theta_{f/r} - y_Delta)^2, y_Delta = -y            (the test error itself)
    align       (24a) (<phi(X'), phi(X)> / ||phi(X)||^2 + 1)^2
    align_proj  (24b) (<phi(X'), P phi(X)> / ||P phi(X)||^2 + 1)^2
    penalized         err + penalty (phi(X')^T theta*)^2                       (working definition, docs/theory.md §6.1)

The heads only enter through inner products with phi(X'): phi(X')^T theta*, phi(X')^T phi(X), phi(X')^T P phi(X).
phi(X') comes from the map's token-move algebra (`wslight.features.move`, the same engine as the
word-sensitivity estimator): for RF, act(z + V^(i) Delta); for RAF / ReLU-RAF only the scores in row and column i
change, so one step costs O(n d + d^2) per sample instead of O(n^2 d + n d^2); any other module through its forward.
Pure maths: no Lightning import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields
from functools import partial
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from ..base.numerics import sum_last
from ..base.seeding import generator
from ..chains.ball import project_ball
from ..chains.engine import Evaluate, FixedStep, MomentumDescent, StepRule, autograd_evaluate, near_best, run_chains
from ..features import FreshMaps
from ..features.move import TokenMove, float64_twin, token_move, trial_features, trial_selector
from .heads import Heads, HeadScalars, fit_heads
from .inputs import AttackInputs, checked_inputs
from .losses import attack_objective
from .settings import AttackSettings

# The improved optimiser: momentum steps normalised per sample (initial length lr * radius), cosine decay,
# restarts batched, early stop when the best loss improves by less than rtol * |loss| + atol over `patience` steps.
PATIENCE, RTOL, ATOL = 25, 1e-5, 1e-12
LR_FLOOR = 0.01


def _with_restart_dim(heads: Heads) -> Heads:
    """A view of the (T, B) per-sample scalars of `heads` with a singleton restart dim appended, (T, B, 1)."""
    fields = {k: getattr(heads, k) for k in heads.__dataclass_fields__}
    for k in ("y", "t0", "phi_sq", "Pphi_sq"):
        fields[k] = fields[k].unsqueeze(-1)
    return Heads(**fields)


def _trials(heads: HeadScalars, idx: Tensor) -> HeadScalars:
    """The per-sample scalars of the heads of the trials idx only, all the objective reads.

    The large matrices (Phi, chol, theta*, phi, P phi) are left out rather than copied.
    """
    return HeadScalars(**{f.name: getattr(heads, f.name)[idx] for f in fields(HeadScalars)})


def _chain_objectives(s: Tensor, a: Tensor, ap: Tensor, hR: HeadScalars, attacks, objective: Tensor) -> Tensor:
    """Each chain's own objective attacks[objective[t, b, c]] of its inner products s, a, ap (T, B, W); (T, B, W).

    hR's per-sample scalars are broadcast over the chains. Each objective is computed on its own chains only, so one
    objective's infinities (e.g. align on phi(X) = 0) never reach another's gradient.
    """
    if len(attacks) == 1:
        return attack_objective(s, a, ap, hR, *attacks[0])
    out = torch.zeros_like(s)
    for o, attack in enumerate(attacks):
        mask = objective == o
        if bool(mask.any()):
            own = {k: getattr(hR, k).expand_as(s)[mask] for k in ("y", "t0", "phi_sq", "Pphi_sq")}
            scalars = HeadScalars(**{f.name: own.get(f.name, getattr(hR, f.name)) for f in fields(HeadScalars)})
            out[mask] = attack_objective(s[mask], a[mask], ap[mask], scalars, *attack)
    return out


def _in_ball(seed: int, T: int, R: int, B: int, d: int, radius: float) -> Tensor:
    """Restart points uniform in the ball, (T, R, B, d) float64, drawn restart-major from `seed`."""
    g = generator(seed, "attack.restarts")
    u = torch.randn(T, R, B, d, generator=g, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True)
    rad = radius * torch.rand(T, R, B, 1, generator=g, dtype=torch.float64) ** (1.0 / d)  # uniform in the ball
    return u * rad


def delta_attack(
    feature_map: nn.Module | Sequence[nn.Module] | FreshMaps,
    X_train: Tensor,
    Y: Tensor,
    X_ctx: Tensor,
    y_ctx: Tensor,
    training: Literal["finetune", "retrain"] = "retrain",
    loss: Literal["err", "align", "align_proj", "penalized"] = "err",
    penalty: float = 0.0,
    **options: Any,
) -> dict[str, Tensor]:
    """The attack under one objective (training, loss, penalty): `delta_attacks` with that one.

    See it for the arguments and the output.
    """
    return delta_attacks(feature_map, X_train, Y, X_ctx, y_ctx, [(training, loss, penalty)], **options)[0]


def delta_attacks(
    feature_map: nn.Module | Sequence[nn.Module] | FreshMaps,
    X_train: Tensor,
    Y: Tensor,
    X_ctx: Tensor,
    y_ctx: Tensor,
    objectives: Sequence[tuple[str, str, float]] = (("retrain", "err", 0.0),),
    settings: AttackSettings | None = None,
    seed: int | Sequence[int] = 0,
    N: int | None = None,
    train_ids: Tensor | None = None,
    ctx_ids: Tensor | None = None,
    return_delta: bool = False,
    cache: dict | None = None,
    **changes: Any,
) -> list[dict[str, Tensor]]:
    """Optimise Delta on one token of each context sample and report the closed-form heads' outputs.

    The method is that of docs/theory.md §6.5.

    Batched over B context samples sharing one training set, R restarts, and optionally T trials with their own
    training sets and maps (pass 4-d X_train / X_ctx and a list of T maps, or one map shared by all trials). Any
    map works: the four of `wslight.features` through their closed forms, any other nn.Module through its forward.

    Deviation: by default an improved optimiser (normalised momentum steps with cosine decay, R restarts of which
    the first starts at the clean token and the others uniformly in the ball, early stop per sample, best iterate
    kept) replaces the authors' fixed-step projected GD; `faithful=True` runs the authors' schedule (plain GD,
    RF/DRF lr 100 for 300 steps, RAF/ReLU-RAF lr 1 for 50 n steps, start exactly at x0, final iterate).
    Working definitions (docs/theory.md §6.1): err = (D1 + y)^2 against y_Delta = -y, gamma = max(|t0|, |D0|).

    Several objectives (training, loss, penalty) are attacked in one loop: each has its own R chains (the same
    starts), and every step evaluates the map once for all of them, so they share its cost (e.g. the reads of RF's
    k x d block); a chain follows the path it follows alone.

    Args:
        feature_map: a feature map, a sequence of T maps (one per trial), or `FreshMaps` (T fresh maps of one kind,
            the paper's protocol; RF / DeepRF drawn from the law of their features on the trial's samples,
            docs/theory.md §3.6).
        X_train: (M, n, d) or (T, M, n, d) training samples; the first N are used.
        Y: (M,) or (T, M) training labels.
        X_ctx: (B, n, d) or (T, B, n, d) context samples (not in the training set).
        y_ctx: (B,) or (T, B) context labels y (the attack targets -y).
        objectives: (training, loss, penalty) triples; training "finetune" (theta_f) or "retrain" (theta_r); loss
            "err" (16), "align" (24a), "align_proj" (24b) or "penalized" (err + penalty (phi^T theta*)^2); penalty
            the weight (called p in the paper and in results.jsonl), >= 0, used by "penalized".
        settings: the optimiser's settings (`AttackSettings`: steps, lr, restarts, faithful, position, radius, dtype);
            a field left at None takes its default for the map and sizes (`AttackSettings.resolved`). None: every
            field at its default. With dtype float32 (the default) every step of a chain reads the map's weights (RF:
            a k x d block per trial) in float32, which halves its memory traffic; the heads are always float64, and
            so are the reported values: the kept Delta is read out once more by the same map's algebra in float64
            (`float64_twin`).
        seed: seed of the restart draws: one for all trials, or a list with one per trial.
        N: number of training samples used; None means all M.
        train_ids: optional (M,) or (T, M) sample ids of X_train, to check that no context sample is a training one.
        ctx_ids: optional (B,) or (T, B) sample ids of X_ctx.
        return_delta: also return "delta", the kept perturbation of the token, (B, d) ((T, B, d) with trials).
        cache: a dict shared by the calls that attack the same samples with the same maps under several objectives
            (training, loss, penalty): the heads and the contexts' algebra are computed by the first call and reused
            (the dict holds them; a call on other samples, maps or position recomputes and replaces them).
        **changes: fields of `settings` to change for this call (`steps=60`); an unknown name is refused.

    Returns:
        one dict per objective, of (B,) tensors ((T, B) with trials): y, t0, t1, D0, D1, err, sign_err, gamma,
        proj_ratio, abs_t0, abs_D0, delta_norm, steps, loss (final objective), restart (the one kept), chains (the
        restarts run) and near_best (how many ended within 1% of the best loss, docs/theory.md §4.3), gram_cond,
        gram_ill_conditioned.
    """
    settings = (settings or AttackSettings()).replace(**changes)
    at = checked_inputs(feature_map, X_train, Y, X_ctx, y_ctx, objectives, settings, seed, N, train_ids, ctx_ids)
    chosen, dtype = at.settings, at.settings.torch_dtype
    filled = (chosen.restarts, chosen.steps, chosen.lr, chosen.radius)  # resolved: every field set
    R, steps, lr, radius = cast(tuple[int, int, float, float], filled)
    heads, token, hv = _prepare(at, feature_map, dtype, cache)
    attacks, T, B, d = at.attacks, at.T, at.B, at.X_ctx.shape[-1]
    hR = _with_restart_dim(heads)  # (T, B, 1) scalars, broadcast over restarts
    n_obj = len(attacks)

    def inner(delta: Tensor, token=token, hv=hv) -> Tensor:
        """(T, B, R, d) -> (T, B, R, 3): phi(X')^T [theta*, phi, P phi]."""
        return token.readout(delta[:, :, None], hv)[:, :, 0]

    def gain(delta: Tensor, objective: Tensor, token=token, hv=hv, hR=hR) -> Tensor:
        """-objective objective[t, b, c] of every chain c, (T, B, W, d) -> (T, B, W): the engine maximises."""
        s, a, ap = inner(delta, token, hv).to(torch.float64).unbind(-1)  # (T, B, W) each
        return -_chain_objectives(s, a, ap, hR, attacks, objective)

    def restrict(idx: Tensor, columns: Tensor) -> Evaluate | None:
        """The evaluation of the chains `columns` of the trials idx only (the trials' algebra copied once)."""
        restricted = select(idx)
        if restricted is None:
            return None
        objective = columns // R  # the chains are objective-major
        return autograd_evaluate(partial(gain, objective=objective, token=restricted, hv=hv[idx], hR=_trials(hR, idx)))

    select = trial_selector(token)
    starts = _starts(at.seeds, at.per_trial_seeds, T, B, R, d, radius, dtype, at.X_ctx.device).repeat(1, 1, n_obj, 1)
    if chosen.faithful:
        rule: StepRule = FixedStep(radius, lr)
    else:
        rule = MomentumDescent(radius, lr, steps, LR_FLOOR, PATIENCE, RTOL, ATOL)
    every = torch.arange(n_obj * R, device=starts.device).div(R, rounding_mode="floor").expand(T, B, -1)
    chains = run_chains(autograd_evaluate(partial(gain, objective=every)), starts, rule, steps, restrict)
    with torch.no_grad():
        # Paper (authors' code): the final iterate; otherwise the best point of each chain
        value, point = (chains.f, chains.x) if chosen.faithful else (chains.best_f, chains.best_x)
        token64 = float64_twin(token, at.X_ctx)
        hv64 = hv if hv.dtype == torch.float64 else _head_vectors(heads)
        inner64 = partial(inner, token=token64, hv=hv64)
        point = point.to(torch.float64)
        return _report(attacks, heads, inner64, -value, point, chains.steps, radius, return_delta, at.batched)


def _prepare(at: AttackInputs, feature_map, dtype: torch.dtype, cache: dict | None) -> tuple[Heads, TokenMove, Tensor]:
    """The closed-form heads, float64 (docs/theory.md §5.2), the contexts' token-move algebra and hv (T, B, p, 3).

    hv holds the three vectors the losses read; all come from `cache` when it holds them for the same samples, maps and
    position.
    """
    X_train, Y, X_ctx = at.X_train, at.Y, at.X_ctx
    # ---- closed-form heads, float64 (docs/theory.md §5.2), and the contexts' token-move algebra
    key = (
        id(feature_map),
        X_train.data_ptr(),
        X_ctx.data_ptr(),
        tuple(X_train.shape),
        tuple(X_ctx.shape),
        at.settings.position,
        dtype,
    )
    if cache is not None and cache.get("key") == key:  # another objective on the same samples and maps
        heads, token, hv = cache["heads"], cache["token"], cache["hv"]
    else:
        if isinstance(feature_map, FreshMaps):  # one draw of each trial's map for its training and context samples
            Phi, phi, token = feature_map.attack_inputs(X_train, X_ctx, at.settings.position, dtype)
        else:
            Phi, phi = trial_features(at.maps, X_train), trial_features(at.maps, X_ctx)  # (T, N, p), (T, B, p)
            token = token_move(at.maps, X_ctx, [at.settings.position], dtype)
        heads = fit_heads(Phi, Y, phi, at.y_ctx)
        del Phi  # heads.Phi keeps the float64 copy for P
        hv = _head_vectors(heads).to(dtype)
        if cache is not None:
            cache.clear()
            cache.update(key=key, heads=heads, token=token, hv=hv)
    return heads, token, hv


def _head_vectors(heads: Heads) -> Tensor:
    """(T, B, p, 3) float64: theta*, phi and P phi, the three vectors the losses read phi(X') with."""
    return torch.stack([heads.theta_star.unsqueeze(1).expand_as(heads.phi), heads.phi, heads.Pphi], -1)


def _starts(seeds, per_trial_seeds, T, B, R, d, radius, dtype, device) -> Tensor:
    """(T, B, R, d): the first restart at the clean token, the others uniform in the ball.

    One stream for all trials or one per trial (then a trial's draws do not depend on its batch).
    """
    delta = torch.zeros(T, B, R, d, dtype=dtype, device=device)
    if R > 1:
        draws = [_in_ball(s, 1 if per_trial_seeds else T, R - 1, B, d, radius) for s in seeds]  # (T, R - 1, B, d)
        delta[:, :, 1:] = torch.cat(draws).transpose(1, 2).to(dtype=dtype, device=device)
    return delta


def _report(attacks, heads: Heads, inner, loss: Tensor, delta: Tensor, taken: Tensor, radius, return_delta, batched):
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
    near = near_best(-loss, -best, atol=ATOL)  # restarts within 1% of the best loss (docs/theory.md §4.3)
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
            # Working definitions (docs/theory.md §6.1): Err against y_Delta = -y, its sign version, gamma
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
