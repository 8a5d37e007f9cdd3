"""The one chain engine behind both searches on a moved token: the word-sensitivity ascent and the Delta attack.

A chain is one (trial, sample, position, restart) search for Delta; all chains of a call move together in one tensor
(T, ..., d), the leading dim being the trial. The engine keeps what every search needs: the evaluation of the chains
(narrowed to the chains still moving as they stop, so a batch costs about the sum of its chains' steps rather than all
chains times the longest), the best point of every chain, and the stop of the loop. A step rule (a small
strategy) says how a chain moves and when it has converged: `MonotoneAscent` (word sensitivity),
`MomentumDescent` (the attack's default) and `FixedStep` (the authors' schedule). The engine always maximises; a
search that minimises a loss hands it -loss (negation is exact, so the path is the same).

`near_best` and `more_chains` are the tightness rule of docs/theory/search.md §4.3: a search keeps adding rounds of
chains for a sample until its best has stopped improving and a second chain has confirmed it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from .ball import project_ball, tangent

# x (T', ..., d) -> (f (T', ...), grad f (T', ..., d)), both detached
Evaluate = Callable[[Tensor], tuple[Tensor, Tensor]]
# (trial indices (long, (T',)), chain columns (long, (T', ..., W)): for each row of those trials, the W chains of its
# last axis still evaluated) -> the evaluation of those chains only, on points (T', ..., W, d); None when the family
# cannot restrict
Restrict = Callable[[Tensor, Tensor], Evaluate | None]

# (x (T', ..., d), live (T', ...) bool) -> (f, grad f) at the live chains, -inf and 0 at the others, both detached
LiveEvaluate = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]

# A chain "confirms" the best of its sample when its own best is within this relative distance of it (on S, not S^2)
NEAR_BEST = 0.01


@dataclass
class Chains:
    """The state of a batch of chains: the current points, their value and gradient, each chain's best so far."""

    x: Tensor  # (T, ..., d) current points
    f: Tensor  # (T, ...) value at x
    g: Tensor  # (T, ..., d) gradient at x
    best_x: Tensor
    best_f: Tensor
    active: Tensor  # (T, ...) bool: the chain still moves
    steps: Tensor  # (T, ...) long: steps taken
    extra: dict = field(default_factory=dict)  # the rule's own state (step lengths, moments...)


class StepRule(Protocol):
    """How chains move.

    `propose` gives the next points (and may stop chains that have converged, before they are evaluated); `accept` takes
    the values there.
    """

    def propose(self, c: Chains, t: int) -> Tensor:
        """The next points of the chains at step t (may stop converged chains before they are evaluated)."""
        ...

    def accept(self, c: Chains, x: Tensor, f: Tensor, g: Tensor, t: int) -> None:
        """Take the values f and gradients g at the proposed points x."""
        ...


def autograd_evaluate(objective: Callable[[Tensor], Tensor]) -> Evaluate:
    """An `Evaluate` for an objective without a closed-form gradient: autograd through it."""

    def evaluate(x: Tensor) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            f = objective(x)
            (g,) = torch.autograd.grad(f.sum(), x)
        return f.detach(), g

    return evaluate


def run_chains(
    evaluate: Evaluate,
    x0: Tensor,
    rule: StepRule,
    max_steps: int,
    restrict: Restrict | None = None,
    moving_only: LiveEvaluate | None = None,
) -> Chains:
    """Move every chain from x0 by `rule` for at most `max_steps` steps, keeping each chain's best point.

    x0 is (T, ..., C, d): T trials, C chains per row (the last axis before d). Once a quarter of the trials still
    evaluated has stopped, or the most chains still moving in any row has fallen by a quarter, `restrict` (given)
    narrows the evaluations to the trials still running and, in each of their rows, to the chains still moving (as many
    per row as the busiest row needs: the others are stopped chains, evaluated and ignored). A batch then costs about
    the sum of its chains' steps rather than all chains times the longest. A chain follows the same path as without
    it: a stopped chain is never moved and its values no longer count (-inf where it is not evaluated).

    `moving_only` (given: `restrict` is not used) evaluates the chains still moving and no other, at every step (the
    generic path, where an evaluation is a full forward and backward of a module: no stopped chain is worth one).
    """
    if moving_only is not None:
        return _run_live(moving_only, x0, rule, max_steps)
    f, g = evaluate(x0)
    shape = f.shape
    c = Chains(
        x=x0,
        f=f,
        g=g,
        best_x=x0.clone(),
        best_f=f.clone(),
        active=torch.ones(shape, dtype=torch.bool, device=x0.device),
        steps=torch.zeros(shape, dtype=torch.long, device=x0.device),
    )
    live: tuple[Tensor, Tensor] | None = None  # (trials, columns) still evaluated (None: every chain)
    live_eval = evaluate
    for t in range(max_steps):
        moving = c.active  # the chains this step moves (a rule may stop some of them before their new point counts)
        x = rule.propose(c, t)
        f, g = evaluate(x) if live is None else _evaluate_live(live_eval, x, *live)
        if not _take_step(c, rule, t, x, f, g, moving):
            break
        if restrict is not None:
            narrowed = _narrowed(c.active, live)
            if narrowed is not None:
                narrowed_eval = restrict(*narrowed)
                if narrowed_eval is not None:
                    live, live_eval = narrowed, narrowed_eval
    return c


def _run_live(live: LiveEvaluate, x0: Tensor, rule: StepRule, max_steps: int) -> Chains:
    """`run_chains` with every step evaluated on the chains still moving only (-inf and 0 elsewhere)."""
    active = torch.ones(x0.shape[:-1], dtype=torch.bool, device=x0.device)
    f, g = live(x0, active)
    c = Chains(x=x0, f=f, g=g, best_x=x0.clone(), best_f=f.clone(), active=active, steps=torch.zeros_like(f).long())
    for t in range(max_steps):
        moving = c.active  # the chains this step moves (a rule may stop some of them before their new point counts)
        x = rule.propose(c, t)
        f, g = live(x, moving)
        if not _take_step(c, rule, t, x, f, g, moving):
            break
    return c


def _take_step(c: Chains, rule: StepRule, t: int, x: Tensor, f: Tensor, g: Tensor, moving: Tensor) -> bool:
    """Take step t's values at the proposed points, keep each moving chain's best; whether any chain still moves."""
    rule.accept(c, x, f, g, t)
    better = (f > c.best_f) & moving
    c.best_f = torch.where(better, f, c.best_f)
    c.best_x = torch.where(better[..., None], x, c.best_x)
    return bool(c.active.any())


def _narrowed(active: Tensor, live: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor] | None:
    """The trials and chain columns to evaluate from now on, or None to keep `live`.

    Narrowed once a quarter of the evaluated trials, or of the evaluated columns, has stopped.
    """
    T, C = active.shape[0], active.shape[-1]
    running = active.reshape(T, -1).any(dim=1).nonzero()[:, 0]  # (T',)
    width = int(active[running].sum(-1).max())  # chains still moving in the busiest row
    count, columns = (T, C) if live is None else (len(live[0]), live[1].shape[-1])
    if len(running) > count - max(1, count // 4) and width > columns - max(1, columns // 4):
        return None
    # the moving chains of each row first, in their order, then stopped ones to fill the row (distinct indices)
    order = torch.sort((~active[running]).to(torch.uint8), dim=-1, stable=True).indices
    return running, order[..., :width]


def _evaluate_live(evaluate: Evaluate, x: Tensor, trials: Tensor, columns: Tensor) -> tuple[Tensor, Tensor]:
    """The values f and gradients g of every chain, evaluated on the live chains only: -inf and 0 elsewhere."""
    d = x.shape[-1]
    at = columns[..., None].expand(*columns.shape, d)
    f_live, g_live = evaluate(x[trials].gather(-2, at))
    f = torch.full(x.shape[:-1], -math.inf, dtype=f_live.dtype, device=x.device)
    g = torch.zeros(x.shape, dtype=g_live.dtype, device=x.device)
    f[trials] = torch.full(columns.shape[:-1] + x.shape[-2:-1], -math.inf, dtype=f.dtype, device=x.device).scatter(
        -1, columns, f_live
    )
    g[trials] = torch.zeros(columns.shape[:-1] + x.shape[-2:], dtype=g.dtype, device=x.device).scatter(-2, at, g_live)
    return f, g


@dataclass
class MonotoneAscent:
    """Projected normalised-gradient ascent with a per-chain adaptive step, monotone (docs/theory/search.md §4.2).

    A step moves Delta by eta * radius along the normalised gradient (its tangential part when Delta sits on the sphere
    and the gradient points outwards), then projects onto the ball. A chain keeps the move only if f increases: then
    eta grows by 1.5 (up to 1); otherwise eta halves. A chain stops when sqrt(f) has grown by less than a factor
    1 + tol over the last `window` steps.

    With `ridge`, a step after a rejected one goes along the shortest vector of the segment between the (tangential)
    gradients here and at the rejected point: where the objective has a ridge (a kink, as where a ReLU score
    crosses zero) the two gradients point across it from both sides, and that vector points along it, where plain
    steps zig-zag across and stall (docs/theory/search.md §4.3).
    """

    # a tensor (C, 1): one radius per chain column (the homotopy starts' balls), for engines that keep every column
    # in place (the generic path's live evaluation; a narrowing `restrict` would reorder the columns)
    radius: float | Tensor
    lr: float
    tol: float
    window: int
    ridge: bool = False

    def propose(self, c: Chains, t: int) -> Tensor:
        """The next points: a tangent step of each active chain's own length (a ridge step after a rejected one)."""
        if t == 0:
            c.extra["eta"] = torch.full_like(c.f, self.lr)
            c.extra["history"] = [c.f.clamp_min(0).sqrt()]
        direction = tangent(c.x, c.g, self.radius)
        if self.ridge and "rejected" in c.extra:
            other = tangent(c.x, c.extra["rejected"], self.radius)
            gap = direction - other
            lam = ((-gap * other).sum(-1, keepdim=True) / gap.pow(2).sum(-1, keepdim=True).clamp_min(1e-30)).clamp(0, 1)
            shortest = other + lam * gap  # the point of the segment [other, direction] nearest 0
            use = (c.extra["rejected"].abs().sum(-1, keepdim=True) > 0) & (shortest.abs().sum(-1, keepdim=True) > 0)
            direction = torch.where(use, shortest, direction)
        direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        return project_ball(c.x + c.extra["eta"][..., None] * self.radius * direction, self.radius)

    def accept(self, c: Chains, x: Tensor, f: Tensor, g: Tensor, t: int) -> None:
        """Keep each point that raised its chain's value; stop the chains that stalled.

        An accepted step's length grows by 1.5 (up to 1), a rejected one's halves.
        """
        accept = (f > c.f) & c.active
        if self.ridge:  # the gradient at a rejected point, zero where the step was taken
            c.extra["rejected"] = torch.where((accept | ~c.active)[..., None], torch.zeros_like(g), g)
        c.x = torch.where(accept[..., None], x, c.x)
        c.g = torch.where(accept[..., None], g, c.g)
        c.f = torch.where(accept, f, c.f)
        eta = c.extra["eta"]
        c.extra["eta"] = torch.where(accept, (eta * 1.5).clamp_max(1.0), torch.where(c.active, eta * 0.5, eta))
        c.steps = c.steps + c.active.long()
        history = c.extra["history"]
        history.append(c.f.clamp_min(0).sqrt())
        if t + 1 >= self.window:
            c.active = c.active & (history[-1] > history[-1 - self.window] * (1 + self.tol))
            c.extra["history"] = history[-self.window :]


def _move_to(c: Chains, x: Tensor, f: Tensor, g: Tensor) -> None:
    """Take every step for good (a descent moves on whatever the value; the engine keeps each chain's best point)."""
    c.x, c.f, c.g = x, f, g


@dataclass
class FixedStep:
    """The authors' schedule: plain projected gradient steps of a fixed size, no early stop.

    See docs/theory/attack.md §6.5.
    """

    radius: float
    lr: float

    def propose(self, c: Chains, t: int) -> Tensor:
        """The next points: a gradient step of the fixed size, projected onto the ball."""
        # Paper (authors' code): plain gradient step, lr fixed, then projection onto the ball
        x = torch.where(c.active[..., None], project_ball(c.x + self.lr * c.g, self.radius), c.x)
        c.steps = c.steps + c.active.long()
        return x

    def accept(self, c: Chains, x: Tensor, f: Tensor, g: Tensor, t: int) -> None:
        """Take every step for good."""
        _move_to(c, x, f, g)


@dataclass
class MomentumDescent:
    """Adam-type steps with one isotropic second moment per chain and a cosine-decayed length.

    A chain stops when its best gained less than rtol |best| + atol over `patience` steps, or once its loss -f is below
    atol.

    Deviation from the authors' plain steps (docs/theory/attack.md §6.5): the isotropic second moment (the mean of g^2
    over the d coordinates) keeps the fixed points of the projected iteration at the KKT points of the ball constraint
    (per-coordinate Adam scaling distorts the projection).
    """

    radius: float
    lr: float  # initial step length, in units of radius / sqrt(d) per coordinate of the normalised step
    steps: int  # the schedule's length (the cosine decays over it)
    floor: float
    patience: int
    rtol: float
    atol: float
    b1: float = 0.9
    b2: float = 0.999

    def propose(self, c: Chains, t: int) -> Tensor:
        """The next points: an Adam-type step of cosine-decayed length, projected onto the ball; stalled chains stop."""
        if t == 0:
            c.extra["m1"], c.extra["m2"] = torch.zeros_like(c.x), torch.zeros_like(c.x[..., :1])
            c.extra["ref"] = torch.full_like(c.best_f, -math.inf)
        m1 = c.extra["m1"] = self.b1 * c.extra["m1"] + (1 - self.b1) * c.g
        m2 = c.extra["m2"] = self.b2 * c.extra["m2"] + (1 - self.b2) * c.g.pow(2).mean(-1, keepdim=True)
        mh, vh = m1 / (1 - self.b1 ** (t + 1)), m2 / (1 - self.b2 ** (t + 1))
        sched = self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * t / self.steps))
        unit = self.radius / c.x.shape[-1] ** 0.5
        upd = self.lr * unit * sched * mh / (vh.sqrt() + 1e-30)
        x = torch.where(c.active[..., None], project_ball(c.x + upd, self.radius), c.x)
        c.steps = c.steps + c.active.long()
        # stop before evaluating x, on the best so far (the last point is still evaluated)
        c.active = c.active & (-c.best_f > self.atol)
        if (t + 1) % self.patience == 0:
            c.active = c.active & ((c.best_f - c.extra["ref"]) > self.rtol * c.best_f.abs() + self.atol)
            c.extra["ref"] = c.best_f.clone()
        return x

    def accept(self, c: Chains, x: Tensor, f: Tensor, g: Tensor, t: int) -> None:
        """Take every step for good (the engine keeps each chain's best point)."""
        _move_to(c, x, f, g)


def near_best(values: Tensor, best: Tensor, squared: bool = False, atol: float = 0.0) -> Tensor:
    """How many chains (the last dim of `values`) ended within NEAR_BEST of `best`, relatively.

    See docs/theory/search.md §4.3.

    Args:
        values: (..., C) the chains' best values, larger is better (S; S^2 when `squared`; -loss for a descent).
        best: (...) the best value.
        squared: the values are squares of the quantity compared (the ascent's ||phi' - phi||^2).
        atol: an absolute slack on top (a descent whose loss reaches 0 compares in absolute terms).
    """
    rel = 1 - (1 - NEAR_BEST) ** 2 if squared else NEAR_BEST
    return (values >= (best - rel * best.abs() - atol)[..., None]).sum(-1)


def more_chains(gain: Tensor, near: Tensor, chains: Tensor, gain_tol: float, max_chains: int) -> Tensor:
    """Which samples need another round of chains.

    Those whose last round raised their best by more than `gain_tol` (relatively), or whose best no second chain
    confirms yet, and that have run fewer than `max_chains` chains.

    Args:
        gain: (...) best after the round / best before it, minus 1.
        near: (...) chains within NEAR_BEST of the best.
        chains: (...) chains run so far.
        gain_tol: the relative gain of a round below which a confirmed best needs no further round.
        max_chains: the most chains a sample runs.
    """
    return ((gain > gain_tol) | (near < 2)) & (chains < max_chains)
