"""Word sensitivity S_phi(X) of any feature map: a pure, batched estimator (paper.md §3, §5, §10b).

    S_phi(X) = sup_i sup_{||Delta|| <= r} ||phi(X^i(Delta)) - phi(X)|| / ||phi(X)||,   X^i(Delta) = X + e_i Delta^T,

with r = sqrt(d) by default (paper.md §3.1). `word_sensitivity` maximises the inner sup for a batch of samples, several
positions and several restarts at once, in one tensor program per chunk of positions (no Python loop over samples or
restarts). Each evaluation goes through the map's single-token algebra (`wslight.features.single_token`): RF and
DeepRF move only z + V^{(i)} Delta (O(k d) per step; the memory-bounded RF never holds V), RAF / ReLU-RAF recompute
only row and column i of the scores (O(n d + d^2) per step), and any other module is differentiated through its full
forward.

No Lightning import: this is plain maths, called by the Lightning callbacks and usable from a notebook.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from . import validate
from .features import RandomFeatures, map_dims
from .features.single_token import map_features, project_ball, single_token, token_class_for
from .seeding import generator

# Lipschitz constants of the RF activations (for the bound of paper.md §12.3); GELU's derivative peaks at about 1.1289.
LIPSCHITZ = {"relu": 1.0, "tanh": 1.0, "gelu": 1.1289}
# Elements (of the working dtype) one chunk of positions/restarts may hold; bounds the memory of the search.
DEFAULT_CHUNK_ELEMENTS = 2**25


@dataclass
class WSResult:
    """Per-sample word sensitivity and its maximiser (all tensors on the CPU).

    Attributes:
        ws: (B,) float64, S_phi(X) recomputed in float64 with the full map at the returned Delta.
        position: (B,) long, the token index i whose perturbation attains `ws`.
        delta: (B, d) float64, the maximising Delta (added to the clean token `position`).
        delta_norm: (B,) float64, ||delta|| (<= radius).
        phi_norm: (B,) float64, ||phi(X)|| of the clean sample.
        steps: (B,) long, the most ascent steps any chain of that sample ran.
    """

    ws: Tensor
    position: Tensor
    delta: Tensor
    delta_norm: Tensor
    phi_norm: Tensor
    steps: Tensor

    def records(self) -> list[dict]:
        """One dict per sample with the results.jsonl fields position, ws, delta_norm, phi_norm, steps."""
        return [
            {
                "position": int(self.position[b]),
                "ws": float(self.ws[b]),
                "delta_norm": float(self.delta_norm[b]),
                "phi_norm": float(self.phi_norm[b]),
                "steps": int(self.steps[b]),
            }
            for b in range(self.ws.shape[0])
        ]


# ----------------------------------------------------------------------------------------------------------------------
# The ascent
# ----------------------------------------------------------------------------------------------------------------------


def _top_curvature(objective: Callable[[Tensor], Tensor], v: Tensor, iters: int) -> Tensor:
    """Top eigenvector of the Hessian of f at Delta = 0 by power iteration, for every (sample, position).

    f(0) = 0 and grad f(0) = 0, so the Hessian there is 2 J^T J with J the Jacobian of phi(X^i(Delta)) in Delta: its top
    eigenvector is the direction in which the features move fastest, and the one a small-step ascent from a point near
    the clean token (the authors' procedure) drifts to.

    Args:
        objective: (B, P, R, d) -> (B, P, R).
        v: (B, P, 1, d) start vectors.
        iters: power iterations (one Hessian-vector product each, by double backward).

    Returns:
        (B, P, 1, d) unit vectors.
    """
    zero = torch.zeros_like(v)
    v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    for _ in range(iters):
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
) -> tuple[Tensor, Tensor, Tensor]:
    """Monotone projected normalised-gradient ascent with a per-chain adaptive step, all chains at once.

    A step moves Delta by eta * radius along the normalised gradient (its tangential part when Delta sits on the sphere
    and the gradient points outwards), then projects onto the ball. A chain keeps the move only if f increases: then eta
    grows by 1.5 (up to 1); otherwise eta halves. A chain stops when sqrt(f) has grown by less than a factor 1 + tol
    over the last `window` steps, or after `max_steps`.

    Returns:
        delta: (..., d) best Delta per chain; f: (...) its objective; steps: (...) steps run per chain.
    """
    shape = delta.shape[:-1]
    eta = torch.full(shape, lr, dtype=delta.dtype, device=delta.device)
    steps = torch.zeros(shape, dtype=torch.long, device=delta.device)
    active = torch.ones(shape, dtype=torch.bool, device=delta.device)

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
        f_new, g_new = value_and_grad(proposal)
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
    return delta, f, steps


# ----------------------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------------------


def word_sensitivity(
    feature_map: nn.Module,
    X: Tensor,
    positions: Literal["first", "all"] | Sequence[int] = "first",
    radius: float | None = None,
    restarts: int = 4,
    max_steps: int = 500,
    lr: float = 0.25,
    tol: float = 1e-4,
    window: int = 20,
    seed: int = 0,
    dtype: Literal["float32", "float64"] | torch.dtype | None = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    power_iters: int = 20,
) -> WSResult:
    """Estimate the word sensitivity S_phi(X) of each sample of a batch (paper.md §3.1).

    All samples, positions and restarts ascend together; positions (then restarts) are chunked only to keep about
    `chunk_elements` working-dtype elements alive. The search maximises ||phi(X^i(Delta)) - phi(X)||^2 by the monotone
    projected normalised-gradient ascent of `_ascend`; the value at the best Delta is recomputed in float64 with the
    full map.

    Restarts per (sample, position), all on the sphere of the given radius: restarts 0 and 1 are plus and minus the
    top eigenvector of the Hessian of the squared change at Delta = 0 (the direction in which phi moves fastest, found
    by `power_iters` Hessian-vector products; a small-step ascent from near the clean token, as in the authors' code,
    drifts towards it). Then come the map's own starting directions (RAF/ReLU-RAF: the attention-attracting
    construction of paper.md §5.3, Delta = radius W^T xbar / ||W^T xbar|| (an inferred construction), and a start that
    steers query i onto the key m that changes its output most, Delta ∝ W x_m). Further restarts start at random
    points, drawn from `wslight.seeding.generator(seed, "ws.init", position)`, so a chain does not depend on the
    chunking or on the other positions requested.

    The reported S is recomputed in float64 with the full map (the map's weights cast to float64) at the best Delta.
    On the memory-bounded RF path, z = V flat(X) comes from the full V in float64 in the same pass that extracts the
    blocks, and the perturbed value uses the exact identity z + V^{(i)} Delta, which avoids generating V a second time.

    Args:
        feature_map: any nn.Module mapping (B, n, d) to (B, p) with an int attribute `d` (and `n` when it is built for
            one length): the four maps of `wslight.features` use their closed forms, any other module autograd.
        X: (B, n, d) clean samples (rows of norm sqrt(d) under the paper's assumption).
        positions: "first" (token 0, the paper's figures), "all" (the true sup over i), or a list of token indices.
        radius: radius of the ball of Delta; None means sqrt(d) (paper.md §3.1). Must be > 0.
        restarts: chains per sample and position (>= 1).
        max_steps: most ascent steps per chain.
        lr: initial step, as a fraction of the radius (adapted per chain afterwards).
        tol: a chain stops when its S grew by a relative amount below tol over `window` steps.
        window: the convergence window, in steps.
        seed: seed of the random restarts.
        dtype: working dtype of the search ("float32" or "float64"); None means the map's dtype.
        chunk_elements: memory bound of one chunk, in working-dtype elements.
        power_iters: Hessian-vector products of the curvature starts.

    Returns:
        WSResult with per-sample ws, position, delta, delta_norm, phi_norm, steps (float64 / long, on the CPU).

    Raises:
        ValueError: a bad argument, named in the message, before any heavy work.
    """
    d, n_map = map_dims(feature_map)
    X = validate.samples("X", X, d, n_map)
    B, n, _ = X.shape
    pos_all = validate.positions("positions", positions, n)
    radius = validate.number("radius", math.sqrt(d) if radius is None else radius, 0.0, strict=True)
    restarts = validate.integer("restarts", restarts, 1)
    max_steps = validate.integer("max_steps", max_steps, 1)
    window = validate.integer("window", window, 1)
    lr = validate.number("lr", lr, 0.0, strict=True)
    tol = validate.number("tol", tol, 0.0)
    chunk_elements = validate.integer("chunk_elements", chunk_elements, 1)
    power_iters = validate.integer("power_iters", power_iters, 0)
    dt = working_dtype(feature_map, dtype)
    device = _device(feature_map)
    X = X.to(device)

    # working memory per chain and per position (a rough count of what autograd keeps) sizes the chunks
    per_chain, per_pos = token_class_for([feature_map]).chain_elements([feature_map], B, n, d)
    chains_per_pos = B * restarts
    pos_chunk = max(1, chunk_elements // (chains_per_pos * per_chain + per_pos))
    restart_chunk = restarts
    if pos_chunk == 1 and chains_per_pos * per_chain + per_pos > chunk_elements:
        restart_chunk = max(1, (chunk_elements - per_pos) // max(1, B * per_chain))

    best_f = torch.full((B,), -1.0, dtype=torch.float64)
    best_delta = torch.zeros(B, d, dtype=torch.float64)
    best_pos = torch.zeros(B, dtype=torch.long)
    best_ws = torch.full((B,), math.nan, dtype=torch.float64)  # filled only by maps with an exact64 path
    phi_norm = torch.full((B,), math.nan, dtype=torch.float64)
    steps_max = torch.zeros(B, dtype=torch.long)
    for c0 in range(0, len(pos_all), pos_chunk):
        pos = pos_all[c0 : c0 + pos_chunk]
        P = len(pos)
        token = single_token([feature_map], X[None], pos, dt)  # one trial: T = 1
        # starting points on the sphere: +- the top curvature direction, the map's own constructions, then random ones
        draws = torch.stack(
            [torch.randn(B, restarts + 1, d, generator=generator(seed, "ws.init", p)) for p in pos], dim=1
        ).to(device=device, dtype=dt)[None]  # (1, B, P, R + 1, d), one stream per position: chunk-independent
        top = _top_curvature(token.change_sq, draws[:, :, :, :1], power_iters)  # (1, B, P, 1, d)
        own = token.starts if token.starts is not None else top.new_zeros(1, B, P, 0, d)
        struct = torch.cat([top, -top, own.to(dt)], dim=3)[:, :, :, :restarts]  # (1, B, P, S, d)
        rand = draws[:, :, :, 1 : 1 + restarts - struct.shape[3]]
        rand = rand / rand.norm(dim=-1, keepdim=True).clamp_min(1e-30)  # (1, B, P, R - S, d)
        starts = torch.cat([struct, rand], dim=3) * radius  # (1, B, P, R, d)
        for r0 in range(0, restarts, restart_chunk):
            delta0 = starts[:, :, :, r0 : r0 + restart_chunk].contiguous()
            delta, f, steps = _ascend(token.change_sq, delta0, radius, max_steps, lr, tol, window)
            f_flat = f[0].reshape(B, -1).to(torch.float64).cpu()  # (B, P R')
            f_best, idx = f_flat.max(dim=1)
            better = f_best > best_f
            R_c = delta.shape[3]
            chosen = delta[0].reshape(B, P * R_c, d)[torch.arange(B), idx.to(delta.device)].to(torch.float64).cpu()
            # Deviation: the ball is centred on the clean token; the authors centre it at the noisy start
            # x_i + 0.1 xi, so their ||Delta|| can reach about 1.1 sqrt(d) (paper.md §9.2); we keep §3.1's definition.
            chosen = project_ball(chosen, radius)  # float32 rounding may leave ||Delta|| a hair above the radius
            if token.exact64 is not None:
                ws_c, norm_c = token.exact64(chosen[None], (idx // R_c)[None])
                best_ws = torch.where(better, ws_c[0], best_ws)
                phi_norm = norm_c[0]
            best_delta = torch.where(better[:, None], chosen, best_delta)
            best_pos = torch.where(better, torch.tensor(pos)[idx // R_c], best_pos)
            best_f = torch.where(better, f_best, best_f)
            steps_max = torch.maximum(steps_max, steps[0].reshape(B, -1).max(dim=1).values.cpu())

    if bool(best_ws.isnan().any()):
        # final value with the full map in float64 (clean and perturbed samples in one pass)
        X64 = X.to(torch.float64)
        Xp = X64.clone()
        Xp[torch.arange(B), best_pos.to(device)] += best_delta.to(device)
        phi = map_features(feature_map, torch.cat([X64, Xp]), exact=True, chunk=2 * B)  # (2B, p)
        phi0, phi1 = phi[:B].cpu(), phi[B:].cpu()
        phi_norm = phi0.norm(dim=1)
        best_ws = (phi1 - phi0).norm(dim=1) / phi_norm
    return WSResult(
        ws=best_ws,
        position=best_pos,
        delta=best_delta,
        delta_norm=best_delta.norm(dim=1),
        phi_norm=phi_norm,
        steps=steps_max,
    )


def single_token_objective(
    feature_map: nn.Module, X: Tensor, positions: Sequence[int], dtype: str | torch.dtype | None = None
) -> Callable[[Tensor], Tensor]:
    """The objective Delta -> ||phi(X^i(Delta)) - phi(X)||^2 of one map for a batch, positions and chains.

    Args:
        feature_map: any map (see `word_sensitivity`).
        X: (B, n, d) clean samples.
        positions: P token indices.
        dtype: working dtype (default: the map's).

    Returns:
        A function (B, P, R, d) -> (B, P, R): the squared change of the features for every chain.
    """
    d, n = map_dims(feature_map)
    X = validate.samples("X", X, d, n)
    pos = validate.positions("positions", list(positions), X.shape[1])
    token = single_token([feature_map], X[None].to(_device(feature_map)), pos, working_dtype(feature_map, dtype))
    return lambda delta: token.change_sq(delta[None])[0]


def working_dtype(feature_map: nn.Module, dtype: object) -> torch.dtype:
    """`dtype` as a torch dtype; None means the map's own."""
    if dtype is None:
        w = getattr(feature_map, "weight_dtype", None)
        return w if isinstance(w, torch.dtype) else torch.float32
    return validate.dtype("dtype", dtype, allow_none=True)


def _device(feature_map: nn.Module) -> torch.device:
    t = next(iter(feature_map.buffers()), None)
    t = t if t is not None else next(iter(feature_map.parameters()), None)
    return getattr(feature_map, "weight_device", t.device if t is not None else torch.device("cpu"))


def ws_bound_rf(
    feature_map: RandomFeatures,
    X: Tensor,
    position: int | Tensor,
    delta_norm: float | Tensor,
    phi_norm: Tensor | None = None,
) -> Tensor:
    """Upper bound on the RF word sensitivity at one position (paper.md §5.1, §12.3).

        S <= Lip(phi) ||V^{(i)}||_op ||Delta|| / ||phi(X)||,

    a hard bound since phi is Lipschitz (ReLU: 1). Evaluate it with the realised ||Delta|| of each sample.

    Args:
        feature_map: a RandomFeatures map.
        X: (B, n, d) clean samples.
        position: the perturbed token, one int or a (B,) tensor (e.g. WSResult.position).
        delta_norm: ||Delta||, a number or a (B,) tensor (e.g. WSResult.delta_norm).
        phi_norm: optional (B,) ||phi(X)|| (e.g. WSResult.phi_norm) to skip a pass over V.

    Returns:
        (B,) float64 bound per sample.
    """
    if not isinstance(feature_map, RandomFeatures):
        raise ValueError(f"feature_map must be a RandomFeatures map, got {type(feature_map).__name__}")
    X = validate.samples("X", X, feature_map.d, feature_map.n)
    B = X.shape[0]
    pos = torch.as_tensor(position, dtype=torch.long).reshape(-1).cpu()
    if pos.numel() == 1:
        pos = pos.expand(B)
    if pos.numel() != B or (pos < 0).any() or (pos >= feature_map.n).any():
        raise ValueError(
            f"position must be an int or (B,) tensor of ints in [0, {feature_map.n - 1}], got {position!r}"
        )
    uniq = sorted(set(pos.tolist()))
    _, blocks = feature_map.preactivations_and_token_blocks(X[:1], uniq)  # (U, k, d)
    blocks = blocks.to(torch.float64)
    op = torch.linalg.eigvalsh(blocks.transpose(1, 2) @ blocks)[:, -1].clamp_min(0).sqrt().cpu()  # (U,)
    op_per_sample = op[torch.tensor([uniq.index(p) for p in pos.tolist()])]
    if phi_norm is None:
        phi_norm = map_features(feature_map, X, exact=True, chunk=X.shape[0]).norm(dim=1).cpu()
    dn = torch.as_tensor(delta_norm, dtype=torch.float64).cpu()
    return LIPSCHITZ[feature_map.activation] * op_per_sample * dn / phi_norm.to(torch.float64)
