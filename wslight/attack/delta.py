"""The single-token Delta attack on fine-tuned / re-trained linear heads: pure, batched functions.

See docs/theory/attack.md §6.

One trial = a training set (N samples), B context samples (X, y) distinct from it, a feature map; the heads theta*,
theta_f, theta_r come in closed form from `wslight.attack.heads`. Delta moves one token of X inside the ball of radius
sqrt(d) around the clean token and is chosen by projected descent on one of the losses

    err         (16)  (phi(X')^T theta_{f/r} - y_Delta)^2, y_Delta = -y            (the test error itself)
    align       (24a) (<phi(X'), phi(X)> / ||phi(X)||^2 + 1)^2
    align_proj  (24b) (<phi(X'), P phi(X)> / ||P phi(X)||^2 + 1)^2
    penalized         err + penalty (phi(X')^T theta*)^2      (working definition, docs/theory/attack.md §6.1)

The heads only enter through inner products with phi(X'): phi(X')^T theta*, phi(X')^T phi(X), phi(X')^T P phi(X).
phi(X') comes from the map's token-move algebra (`wslight.features.move`, the same engine as the
word-sensitivity estimator): for RF, act(z + V^(i) Delta); for RAF / ReLU-RAF only the scores in row and column i
change, so one step costs O(n d + d^2) per sample instead of O(n^2 d + n d^2); any other module through its forward.
Pure maths: no Lightning import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from ..base.names import Training
from ..base.seeding import generator
from ..chains.engine import Evaluate, FixedStep, MomentumDescent, StepRule, autograd_evaluate, run_chains
from ..features import FreshMaps
from ..features.forwards import trial_features
from ..features.generic_move import float64_twin, token_move
from ..features.move import TokenMove, trial_selector
from .heads import Heads, HeadScalars, fit_heads
from .inputs import AttackInputs, checked_inputs
from .losses import Loss, attack_objective
from .report import best_restarts
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


def _chain_objectives(
    s: Tensor,
    a: Tensor,
    ap: Tensor,
    chain_scalars: HeadScalars,
    attacks: Sequence[tuple[Training, Loss, float]],
    objective: Tensor,
) -> Tensor:
    """Each chain's own objective attacks[objective[t, b, c]] of its inner products s, a, ap (T, B, W); (T, B, W).

    The per-sample scalars are broadcast over the chains. Each objective is computed on its own chains only, so one
    objective's infinities (e.g. align on phi(X) = 0) never reach another's gradient.
    """
    if len(attacks) == 1:
        return attack_objective(s, a, ap, chain_scalars, *attacks[0])
    out = torch.zeros_like(s)
    for o, attack in enumerate(attacks):
        mask = objective == o
        if bool(mask.any()):
            own = {k: getattr(chain_scalars, k).expand_as(s)[mask] for k in ("y", "t0", "phi_sq", "Pphi_sq")}
            scalars = HeadScalars(
                **{f.name: own.get(f.name, getattr(chain_scalars, f.name)) for f in fields(HeadScalars)}
            )
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

    The method is that of docs/theory/attack.md §6.5.

    Batched over B context samples sharing one training set, R restarts, and optionally T trials with their own
    training sets and maps (pass 4-d X_train / X_ctx and a list of T maps, or one map shared by all trials). Any
    map works: the four of `wslight.features` through their closed forms, any other nn.Module through its forward.

    Deviation: by default an improved optimiser (normalised momentum steps with cosine decay, R restarts of which
    the first starts at the clean token and the others uniformly in the ball, early stop per sample, best iterate
    kept) replaces the authors' fixed-step projected GD; `faithful=True` runs the authors' schedule (plain GD,
    RF/DRF lr 100 for 300 steps, RAF/ReLU-RAF lr 1 for 50 n steps, start exactly at x0, final iterate).
    Working definitions (docs/theory/attack.md §6.1): err = (D1 + y)^2 against y_Delta = -y, gamma = max(|t0|, |D0|).

    Several objectives (training, loss, penalty) are attacked in one loop: each has its own R chains (the same
    starts), and every step evaluates the map once for all of them, so they share its cost (e.g. the reads of RF's
    k x d block); a chain follows the path it follows alone.

    Args:
        feature_map: a feature map, a sequence of T maps (one per trial), or `FreshMaps` (T fresh maps of one kind,
            the paper's protocol; RF / DeepRF drawn from the law of their features on the trial's samples,
            docs/theory/maps.md §3.6).
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
        restarts run) and near_best (how many ended within 1% of the best loss, docs/theory/search.md §4.3), gram_cond,
        gram_ill_conditioned.
    """
    settings = (settings or AttackSettings()).replace(**changes)
    inputs = checked_inputs(feature_map, X_train, Y, X_ctx, y_ctx, objectives, settings, seed, N, train_ids, ctx_ids)
    heads, move, readout_vectors = _prepare(inputs, feature_map, inputs.settings.torch_dtype, cache)
    reads = _ChainReads(move, readout_vectors, _with_restart_dim(heads), inputs.attacks)  # scalars (T, B, 1)
    return _run_chains(inputs, heads, reads, return_delta)


def _run_chains(inputs: AttackInputs, heads: Heads, reads: _ChainReads, return_delta: bool) -> list[dict[str, Tensor]]:
    """Every objective's R chains of every context sample, as one batch; the best restarts reported in float64."""
    chosen, dtype = inputs.settings, inputs.settings.torch_dtype
    filled = (chosen.restarts, chosen.steps, chosen.lr, chosen.radius)  # resolved: every field set
    R, steps, lr, radius = cast(tuple[int, int, float, float], filled)
    T, B, d = inputs.T, inputs.B, inputs.X_ctx.shape[-1]
    select = trial_selector(reads.move)

    def restrict(idx: Tensor, columns: Tensor) -> Evaluate | None:
        """The evaluation of the chains `columns` of the trials idx only (the trials' algebra copied once)."""
        restricted = select(idx)  # the chains are objective-major: chain c attacks objective c // R
        return None if restricted is None else reads.of_trials(restricted, idx).evaluate(columns // R)

    n_obj = len(inputs.attacks)
    starts = _starts(inputs.seeds, inputs.per_trial_seeds, T, B, R, d, radius, dtype, inputs.X_ctx.device)
    starts = starts.repeat(1, 1, n_obj, 1)
    if chosen.faithful:
        rule: StepRule = FixedStep(radius, lr)
    else:
        rule = MomentumDescent(radius, lr, steps, LR_FLOOR, PATIENCE, RTOL, ATOL)
    every = torch.arange(n_obj * R, device=starts.device).div(R, rounding_mode="floor").expand(T, B, -1)
    chains = run_chains(reads.evaluate(every), starts, rule, steps, restrict)
    with torch.no_grad():
        # Paper (authors' code): the final iterate; otherwise the best point of each chain
        value, point = (chains.f, chains.x) if chosen.faithful else (chains.best_f, chains.best_x)
        vectors = reads.readout_vectors
        vectors64 = vectors if vectors.dtype == torch.float64 else _head_vectors(heads)
        reads64 = dataclasses.replace(reads, move=float64_twin(reads.move, inputs.X_ctx), readout_vectors=vectors64)
        point = point.to(torch.float64)
        taken = chains.steps
        return best_restarts(
            inputs.attacks, heads, reads64.inner, -value, point, taken, radius, return_delta, inputs.batched, ATOL
        )


@dataclass(frozen=True)
class _ChainReads:
    """What every chain of the attack reads: the contexts' algebra, the heads' vectors and scalars, the objectives.

    Args:
        move: the contexts' token-move algebra.
        readout_vectors: (T, B, p, 3) theta*, phi and P phi, in the working dtype.
        chain_scalars: the heads' per-sample scalars with a restart dim, (T, B, 1).
        attacks: the checked (training, loss, penalty) objectives.
    """

    move: TokenMove
    readout_vectors: Tensor
    chain_scalars: HeadScalars
    attacks: list[tuple[Training, Loss, float]]

    def inner(self, delta: Tensor) -> Tensor:
        """(T, B, R, d) -> (T, B, R, 3): phi(X')^T [theta*, phi, P phi]."""
        return self.move.readout(delta[:, :, None], self.readout_vectors)[:, :, 0]

    def gain(self, delta: Tensor, objective: Tensor) -> Tensor:
        """-objective objective[t, b, c] of every chain c, (T, B, W, d) -> (T, B, W): the engine maximises."""
        s, a, ap = self.inner(delta).to(torch.float64).unbind(-1)  # (T, B, W) each
        return -_chain_objectives(s, a, ap, self.chain_scalars, self.attacks, objective)

    def evaluate(self, objective: Tensor) -> Evaluate:
        """The chains' value and gradient, chain c attacking objective[t, b, c]."""
        return autograd_evaluate(partial(self.gain, objective=objective))

    def of_trials(self, move: TokenMove, idx: Tensor) -> _ChainReads:
        """The same reads for the trials idx only, `move` their algebra."""
        scalars = _trials(self.chain_scalars, idx)
        return dataclasses.replace(self, move=move, readout_vectors=self.readout_vectors[idx], chain_scalars=scalars)


def _prepare(
    inputs: AttackInputs, feature_map: object, dtype: torch.dtype, cache: dict | None
) -> tuple[Heads, TokenMove, Tensor]:
    """The closed-form heads, float64 (docs/theory/attack.md §5.2), the contexts' token-move algebra, readout vectors.

    The readout vectors (T, B, p, 3) are the three vectors the losses read; all come from `cache` when it holds them
    for the same samples, maps and position.
    """
    X_train, Y, X_ctx = inputs.X_train, inputs.Y, inputs.X_ctx
    # ---- closed-form heads, float64 (docs/theory/attack.md §5.2), and the contexts' token-move algebra
    key = (
        id(feature_map),
        X_train.data_ptr(),
        X_ctx.data_ptr(),
        tuple(X_train.shape),
        tuple(X_ctx.shape),
        inputs.settings.position,
        dtype,
    )
    if cache is not None and cache.get("key") == key:  # another objective on the same samples and maps
        heads, move, readout_vectors = cache["heads"], cache["move"], cache["readout_vectors"]
    else:
        if isinstance(feature_map, FreshMaps):  # one draw of each trial's map for its training and context samples
            Phi, phi, move = feature_map.attack_inputs(X_train, X_ctx, inputs.settings.position, dtype)
        else:
            Phi, phi = trial_features(inputs.maps, X_train), trial_features(inputs.maps, X_ctx)  # (T, N, p), (T, B, p)
            move = token_move(inputs.maps, X_ctx, [inputs.settings.position], dtype)
        heads = fit_heads(Phi, Y, phi, inputs.y_ctx)
        del Phi  # heads.Phi keeps the float64 copy for P
        readout_vectors = _head_vectors(heads).to(dtype)
        if cache is not None:
            cache.clear()
            cache.update(key=key, heads=heads, move=move, readout_vectors=readout_vectors)
    return heads, move, readout_vectors


def _head_vectors(heads: Heads) -> Tensor:
    """(T, B, p, 3) float64: theta*, phi and P phi, the three vectors the losses read phi(X') with."""
    return torch.stack([heads.theta_star.unsqueeze(1).expand_as(heads.phi), heads.phi, heads.Pphi], -1)


def _starts(
    seeds: list[int],
    per_trial_seeds: bool,
    T: int,
    B: int,
    R: int,
    d: int,
    radius: float,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor:
    """(T, B, R, d): the first restart at the clean token, the others uniform in the ball.

    One stream for all trials or one per trial (then a trial's draws do not depend on its batch).
    """
    delta = torch.zeros(T, B, R, d, dtype=dtype, device=device)
    if R > 1:
        draws = [_in_ball(s, 1 if per_trial_seeds else T, R - 1, B, d, radius) for s in seeds]  # (T, R - 1, B, d)
        delta[:, :, 1:] = torch.cat(draws).transpose(1, 2).to(dtype=dtype, device=device)
    return delta
