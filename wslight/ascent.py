"""The search behind the word-sensitivity estimate: monotone projected ascent of ||phi(X^i(Delta)) - phi(X)||^2 for
every (trial, sample, position, restart) chain at once, its starting points, and its result (docs/theory.md §4)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

import torch
from torch import Tensor

from . import validate
from .features.move import TokenMove, project_ball
from .seeding import generator

# Elements (of the working dtype) one chunk of positions/restarts may hold; bounds the memory of the search.
DEFAULT_CHUNK_ELEMENTS = 2**25


class _ClosedForm(Protocol):
    """A token-move algebra with its objective's value and gradient in closed form (e.g. RF, attention)."""

    def value_and_grad(self, delta: Tensor) -> tuple[Tensor, Tensor]: ...


@dataclass
class WSResult:
    """Per-sample word sensitivity and its maximiser (all tensors on the CPU).

    Fields are (B,) for one map and (T, B) for T trials (`FreshMaps`, or a list of maps).

    Attributes:
        ws: (B,) float64, S_phi(X) recomputed in float64 with the full map at the returned Delta.
        position: (B,) long, the token index i whose perturbation attains `ws`.
        delta: (B, d) float64, the maximising Delta (added to the clean token `position`).
        delta_norm: (B,) float64, ||delta|| (<= radius).
        phi_norm: (B,) float64, ||phi(X)|| of the clean sample.
        steps: (B,) long, the most ascent steps any chain of that sample ran.
        bound: (B,) float64 upper bound on S at the realised ||Delta|| (RF: Lip ||V^(i)||_op ||Delta|| / ||phi||,
            docs/theory.md §3.2), or None for maps without one.
    """

    ws: Tensor
    position: Tensor
    delta: Tensor
    delta_norm: Tensor
    phi_norm: Tensor
    steps: Tensor
    bound: Tensor | None = None

    def records(self) -> list[dict]:
        """One dict per sample (trial-major) with the results.jsonl fields position, ws, delta_norm, phi_norm, steps."""
        return [
            {
                "position": int(position),
                "ws": float(ws),
                "delta_norm": float(delta_norm),
                "phi_norm": float(phi_norm),
                "steps": int(steps),
            }
            for position, ws, delta_norm, phi_norm, steps in zip(
                self.position.flatten(),
                self.ws.flatten(),
                self.delta_norm.flatten(),
                self.phi_norm.flatten(),
                self.steps.flatten(),
            )
        ]


def _top_curvature(
    objective: Callable[[Tensor], Tensor],
    v: Tensor,
    iters: int,
    product: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Top eigenvector of the Hessian of f at Delta = 0 by power iteration, for every (sample, position).

    f(0) = 0 and grad f(0) = 0, so the Hessian there is 2 J^T J with J the Jacobian of phi(X^i(Delta)) in Delta: its top
    eigenvector is the direction in which the features move fastest, and the one a small-step ascent from a point near
    the clean token (the authors' procedure) drifts to.

    Args:
        objective: (B, P, R, d) -> (B, P, R).
        v: (B, P, 1, d) start vectors.
        iters: power iterations (one Hessian-vector product each).
        product: v -> H v in closed form (the token's `curvature_product`); None: by double backward of `objective`.

    Returns:
        (B, P, 1, d) unit vectors.
    """
    zero = torch.zeros_like(v)
    v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    for _ in range(iters):
        if product is not None:
            hv = product(v)
        else:
            with torch.enable_grad():
                x = zero.clone().requires_grad_(True)
                (g,) = torch.autograd.grad(objective(x).sum(), x, create_graph=True)
                (hv,) = torch.autograd.grad((g * v).sum(), x)
        norm = hv.norm(dim=-1, keepdim=True)
        v = torch.where(norm > 0, hv / norm.clamp_min(1e-300), v)
    return v.detach()


def _ascend(
    objective: Callable[[Tensor], Tensor],
    delta: Tensor,
    radius: float,
    max_steps: int,
    lr: float,
    tol: float,
    window: int,
    value_and_grad: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None,
    select: Callable[[Tensor], TokenMove | None] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Monotone projected normalised-gradient ascent with a per-chain adaptive step, all chains at once.

    A step moves Delta by eta * radius along the normalised gradient (its tangential part when Delta sits on the sphere
    and the gradient points outwards), then projects onto the ball. A chain keeps the move only if f increases: then eta
    grows by 1.5 (up to 1); otherwise eta halves. A chain stops when sqrt(f) has grown by less than a factor 1 + tol
    over the last `window` steps, or after `max_steps`.

    The chains of a trial (the leading dim) share its map; once every chain of some trials has stopped, `select`
    (given) restricts the evaluations to the trials still running, so a batch costs the sum of its trials' steps
    rather than T times the longest. Every chain follows the same path as without it.

    Args:
        value_and_grad: x -> (f(x), grad f(x)) detached, if the objective has a cheaper closed form; else autograd.
        select: trial indices (long) -> the token of those trials only (`TokenMove.select_trials`), whose
            `value_and_grad` takes inputs (T', ...) for T' trials; None from it: no restriction.

    Returns:
        delta: (..., d) best Delta per chain; f: (...) its objective; steps: (...) steps run per chain.
    """
    shape = delta.shape[:-1]
    eta = torch.full(shape, lr, dtype=delta.dtype, device=delta.device)
    steps = torch.zeros(shape, dtype=torch.long, device=delta.device)
    active = torch.ones(shape, dtype=torch.bool, device=delta.device)
    live: Tensor | None = None  # indices of the trials still evaluated (None: all of them)
    live_eval: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None  # their value_and_grad, set with live

    if value_and_grad is None:

        def value_and_grad(x: Tensor) -> tuple[Tensor, Tensor]:
            with torch.enable_grad():
                x = x.detach().requires_grad_(True)
                f = objective(x)
                (g,) = torch.autograd.grad(f.sum(), x)
            return f.detach(), g

    f, g = value_and_grad(delta)
    history = [f.clamp_min(0).sqrt()]
    for t in range(max_steps):
        norm = delta.norm(dim=-1, keepdim=True)  # (..., 1)
        unit = delta / norm.clamp_min(1e-300)
        radial = (g * unit).sum(-1, keepdim=True)
        on_sphere = (norm >= radius * (1 - 1e-6)) & (radial > 0)
        direction = torch.where(on_sphere, g - radial * unit, g)  # tangential part on the sphere
        direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        proposal = project_ball(delta + (eta * radius)[..., None] * direction, radius)
        if live is None or live_eval is None:
            f_new, g_new = value_and_grad(proposal)
        else:  # stopped trials keep their state: f_new = f is never accepted
            f_live, g_live = live_eval(proposal[live])
            f_new, g_new = f.clone(), g.clone()
            f_new[live], g_new[live] = f_live, g_live
        accept = (f_new > f) & active
        delta = torch.where(accept[..., None], proposal, delta)
        g = torch.where(accept[..., None], g_new, g)
        f = torch.where(accept, f_new, f)
        eta = torch.where(accept, (eta * 1.5).clamp_max(1.0), torch.where(active, eta * 0.5, eta))
        steps = steps + active.long()
        history.append(f.clamp_min(0).sqrt())
        if t + 1 >= window:
            old = history[-1 - window]
            active = active & (history[-1] > old * (1 + tol))
            history = history[-window:]
        if not bool(active.any()):
            break
        if select is not None:
            running = active.reshape(active.shape[0], -1).any(dim=1).nonzero()[:, 0]  # (T',)
            count = shape[0] if live is None else len(live)
            if len(running) <= count - max(1, count // 4):  # restrict (and copy the maps) when a quarter has stopped
                restricted = select(running)
                if restricted is not None:  # the same family as the token `select` came with: it has a value_and_grad
                    live, live_eval = running, cast(_ClosedForm, restricted).value_and_grad
    return delta, f, steps


# ----------------------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class Search:
    """The checked settings of one estimate and the search itself, for T trials x B samples at once."""

    positions: list[int]
    radius: float
    restarts: int
    max_steps: int
    lr: float
    tol: float
    window: int
    chunk_elements: int
    power_iters: int

    @classmethod
    def checked(cls, d, n, positions, radius, restarts, max_steps, lr, tol, window, chunk_elements, power_iters):
        """Every argument checked (a ValueError naming it) before any heavy work."""
        return cls(
            positions=validate.positions("positions", positions, n),
            radius=validate.number("radius", math.sqrt(d) if radius is None else radius, 0.0, strict=True),
            restarts=validate.integer("restarts", restarts, 1),
            max_steps=validate.integer("max_steps", max_steps, 1),
            lr=validate.number("lr", lr, 0.0, strict=True),
            tol=validate.number("tol", tol, 0.0),
            window=validate.integer("window", window, 1),
            chunk_elements=validate.integer("chunk_elements", chunk_elements, 1),
            power_iters=validate.integer("power_iters", power_iters, 0),
        )

    def run(
        self,
        build: Callable[[list[int]], TokenMove],
        exact: Callable[[Tensor], Tensor] | None,
        X: Tensor,
        seeds: list[int],
        dt: torch.dtype,
        per_chain: int,
        per_pos: int,
        one_chunk: bool = False,
    ) -> WSResult:
        """Ascend every (trial, sample, position, restart) chain; positions (then restarts) chunked for memory.

        Args:
            build: positions -> the token-move algebra of the T trials for them.
            exact: (T, 2B, n, d) float64 -> (T, 2B, p) float64 features, for the final value when the algebra has
                no `exact64`.
            X: (T, B, n, d) samples on the maps' device.
            seeds: T restart seeds.
            dt: working dtype.
            per_chain, per_pos: working memory, in elements, of one chain and of one position of one trial.
            one_chunk: all positions in one chunk (the algebra draws its map for exactly these positions).
        """
        T, B, n, d = X.shape
        device, restarts, radius = X.device, self.restarts, self.radius
        chains_per_pos = T * B * restarts
        pos_chunk = max(1, self.chunk_elements // (chains_per_pos * per_chain + T * per_pos))
        pos_chunk = len(self.positions) if one_chunk else pos_chunk
        restart_chunk = restarts
        if pos_chunk == 1 and chains_per_pos * per_chain + T * per_pos > self.chunk_elements:
            # the position's own memory (e.g. RF blocks) is held whatever the restart chunking, so the chains of one
            # position get the whole budget: splitting them would only re-read that memory once per chunk
            restart_chunk = max(1, self.chunk_elements // max(1, T * B * per_chain))

        best_f = torch.full((T, B), -1.0, dtype=torch.float64)
        best_delta = torch.zeros(T, B, d, dtype=torch.float64)
        best_pos = torch.zeros(T, B, dtype=torch.long)
        best_ws = torch.full((T, B), math.nan, dtype=torch.float64)  # filled only by algebras with an exact64
        phi_norm = torch.full((T, B), math.nan, dtype=torch.float64)
        steps_max = torch.zeros(T, B, dtype=torch.long)
        factor = torch.full((T, B), math.nan, dtype=torch.float64)  # of the bound at the best position, if any
        rows = torch.arange(T * B)
        for c0 in range(0, len(self.positions), pos_chunk):
            pos = self.positions[c0 : c0 + pos_chunk]
            P = len(pos)
            token = build(pos)
            # starting points on the sphere: +- the top curvature direction, the map's own constructions, then random
            # ones, one stream per trial and position: a chain does not depend on the chunking or the other trials
            draws = torch.stack(
                [
                    torch.stack(
                        [torch.randn(B, restarts + 1, d, generator=generator(s, "ws.init", p)) for p in pos], dim=1
                    )
                    for s in seeds
                ]
            ).to(device=device, dtype=dt)  # (T, B, P, R + 1, d)
            exact_top = getattr(token, "top_curvature", None)  # e.g. RF: the d x d Hessian in closed form
            if exact_top is not None and self.power_iters > 0:
                top = exact_top(draws[:, :, :, :1])  # (T, B, P, 1, d)
            else:
                product = getattr(token, "curvature_product", None)  # e.g. attention: H v in closed form
                top = _top_curvature(token.change_sq, draws[:, :, :, :1], self.power_iters, product)  # (T, B, P, 1, d)
            own = token.starts if token.starts is not None else top.new_zeros(T, B, P, 0, d)
            struct = torch.cat([top, -top, own.to(dt)], dim=3)[:, :, :, :restarts]  # (T, B, P, S, d)
            rand = draws[:, :, :, 1 : 1 + restarts - struct.shape[3]]
            rand = rand / rand.norm(dim=-1, keepdim=True).clamp_min(1e-30)  # (T, B, P, R - S, d)
            starts = torch.cat([struct, rand], dim=3) * radius  # (T, B, P, R, d)
            for r0 in range(0, restarts, restart_chunk):
                delta0 = starts[:, :, :, r0 : r0 + restart_chunk].contiguous()
                delta, f, steps = _ascend(
                    token.change_sq,
                    delta0,
                    radius,
                    self.max_steps,
                    self.lr,
                    self.tol,
                    self.window,
                    value_and_grad=getattr(token, "value_and_grad", None),
                    select=token.select_trials if getattr(token, "value_and_grad", None) is not None else None,
                )
                R_c = delta.shape[3]
                f_flat = f.reshape(T * B, -1).to(torch.float64).cpu()  # (T B, P R')
                f_best, idx = f_flat.max(dim=1)
                chosen = delta.reshape(T * B, P * R_c, d)[rows, idx.to(device)].to(torch.float64).cpu()
                # Deviation: the ball is centred on the clean token; the authors centre it at the noisy start
                # x_i + 0.1 xi, so their ||Delta|| can reach about 1.1 sqrt(d) (docs/theory.md §9.1); we keep
                # docs/theory.md §1.3's
                chosen = project_ball(chosen, radius).reshape(T, B, d)  # float32 may leave ||Delta|| a hair out
                f_best, j = f_best.reshape(T, B), (idx // R_c).reshape(T, B)
                better = f_best > best_f
                if token.exact64 is not None:
                    ws_c, norm_c = token.exact64(chosen, j)
                    best_ws = torch.where(better, ws_c, best_ws)
                    phi_norm = norm_c
                factors = token.bound_factors(j)
                if factors is not None:
                    factor = torch.where(better, factors, factor)
                best_delta = torch.where(better[..., None], chosen, best_delta)
                best_pos = torch.where(better, torch.tensor(pos)[j], best_pos)
                best_f = torch.where(better, f_best, best_f)
                steps_max = torch.maximum(steps_max, steps.reshape(T, B, -1).max(dim=2).values.cpu())

        if bool(best_ws.isnan().any()):
            # final value with the full maps in float64 (clean and perturbed samples in one pass per trial)
            assert exact is not None  # only algebras with an exact64 (which fills best_ws) come without it
            X64 = X.to(torch.float64)
            Xp = X64.clone()
            t_idx, b_idx = torch.meshgrid(torch.arange(T), torch.arange(B), indexing="ij")
            Xp[t_idx, b_idx, best_pos.to(device)] += best_delta.to(device)
            phi = exact(torch.cat([X64, Xp], dim=1))  # (T, 2B, p)
            phi0, phi1 = phi[:, :B].cpu(), phi[:, B:].cpu()
            phi_norm = phi0.norm(dim=-1)
            best_ws = (phi1 - phi0).norm(dim=-1) / phi_norm
        delta_norm = best_delta.norm(dim=-1)
        return WSResult(
            ws=best_ws,
            position=best_pos,
            delta=best_delta,
            delta_norm=delta_norm,
            phi_norm=phi_norm,
            steps=steps_max,
            bound=None if factor.isnan().all() else factor * delta_norm / phi_norm.to(torch.float64),
        )
