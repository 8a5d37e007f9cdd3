"""Word sensitivity S_phi(X) of the four random feature maps: a pure, batched estimator (paper.md §3, §5, §10b).

    S_phi(X) = sup_i sup_{||Delta|| <= r} ||phi(X^i(Delta)) - phi(X)|| / ||phi(X)||,   X^i(Delta) = X + e_i Delta^T,

with r = sqrt(d) by default (paper.md §3.1). `word_sensitivity` maximises the inner sup for a batch of samples, several
positions and several restarts at once, in one tensor program per chunk of positions (no Python loop over samples or
restarts). It exploits the structure of a single-token perturbation:

- RF: phi(X^i(Delta)) = phi(z + V^{(i)} Delta) with z = V flat(X) fixed, so a step costs O(k d) and only the k x d block
  V^{(i)} is ever held (the dense V of the paper's largest RF would be 53 GB).
- DeepRF: the first layer uses the same identity; deeper layers use their full matrices.
- RAF / ReLU-RAF: only row i and column i of the score matrix move. For a query row l != i the new output is
  (1 - a_l) u_l + a_l (x_i + Delta), where u_l is the attention output of row l with key i removed and a_l the new
  weight of key i; row i is recomputed from its n new scores. A step costs O(n d + d^2) per chain instead of the full
  O(n^2 d + n d^2) forward and backward.

No Lightning import: this is plain maths, called by the Lightning callbacks and usable from a notebook.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .features import DeepRandomFeatures, RandomAttentionFeatures, RandomFeatures, ReLUAttentionFeatures, map_name
from .validate import dtype as _dtype
from .interpolation import sum_last
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
# Argument checks (before any heavy work)
# ----------------------------------------------------------------------------------------------------------------------


def _map_dims(feature_map: object) -> tuple[str, int, int | None]:
    name = map_name(feature_map)  # raises a ValueError naming feature_map for anything else
    return name, feature_map.d, getattr(feature_map, "n", None)  # type: ignore[attr-defined]


def _check_X(X: object, d: int, n: int | None) -> Tensor:
    if not isinstance(X, Tensor) or X.dim() != 3:
        shape = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"X must be a tensor of shape (B, n, d), got {shape}")
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"X must have B >= 1 samples and n >= 1 tokens, got shape {tuple(X.shape)}")
    if X.shape[2] != d:
        raise ValueError(f"X: the map was built for d={d}, got X of shape {tuple(X.shape)} (d={X.shape[2]})")
    if n is not None and X.shape[1] != n:
        raise ValueError(f"X: the map was built for n={n} tokens, got X of shape {tuple(X.shape)} (n={X.shape[1]})")
    if not X.is_floating_point():
        raise ValueError(f"X must be a floating-point tensor, got dtype {X.dtype}")
    return X


def _resolve_positions(positions: object, n: int) -> list[int]:
    if isinstance(positions, str):
        if positions == "first":
            return [0]
        if positions == "all":
            return list(range(n))
        raise ValueError(f"positions must be 'first', 'all' or a list of ints in [0, {n - 1}], got {positions!r}")
    if isinstance(positions, int) and not isinstance(positions, bool):
        positions = [positions]
    if not isinstance(positions, Sequence) or len(positions) == 0:
        raise ValueError(f"positions must be 'first', 'all' or a list of ints in [0, {n - 1}], got {positions!r}")
    out = []
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < n:
            raise ValueError(f"positions: every position must be an int in [0, {n - 1}], got {p!r} in {positions!r}")
        if p not in out:
            out.append(p)
    return out


def _check_number(name: str, value: object, low: float, strict: bool, integer: bool = False) -> float:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) or value < low or (strict and value == low):
        rng = f"{'>' if strict else '>='} {low}"
        raise ValueError(f"{name} must be a finite {'integer' if integer else 'number'} {rng}, got {value!r}")
    return value


# ----------------------------------------------------------------------------------------------------------------------
# Structured objectives: f(Delta) = ||phi(X^i(Delta)) - phi(X)||^2 for a batch of chains (B, P, R)
# ----------------------------------------------------------------------------------------------------------------------


def _block_apply(blocks: Tensor, delta: Tensor) -> Tensor:
    """V^{(i)} Delta for every chain: (P, k, d) and (B, P, R, d) -> (B, P, R, k) (batched matmul, not einsum)."""
    B, P, R, d = delta.shape
    flat = delta.transpose(0, 1).reshape(P, B * R, d)  # (P, B R, d)
    out = flat @ blocks.transpose(1, 2)  # (P, B R, d) @ (P, d, k) -> (P, B R, k)
    return out.reshape(P, B, R, -1).transpose(0, 1)


def _rows_dot(M: Tensor, y: Tensor) -> Tensor:
    """M[b, l] . y[b, p, r] for every row l: (B, n, d) and (B, P, R, d) -> (B, P, R, n)."""
    B, P, R, d = y.shape
    return (y.reshape(B, P * R, d) @ M.transpose(1, 2)).reshape(B, P, R, -1)  # (B, PR, d) @ (B, d, n)


@dataclass
class _Problem:
    """One chunk of positions: the squared change f(Delta) for Delta (B, P, R, d) and structured unit starts."""

    objective: Callable[[Tensor], Tensor]  # (B, P, R, d) -> (B, P, R)
    starts: Tensor  # (B, P, S, d) map-specific unit directions tried after the curvature ones (S may be 0)
    # (Delta (B, d) float64, index into the chunk's positions (B,)) -> (S (B,), ||phi(X)|| (B,)) in float64, for maps
    # whose full forward would be too costly to repeat; None: recompute with the full map at the end
    exact64: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None


def _rf_problem(fm: RandomFeatures, X: Tensor, pos: list[int], dt: torch.dtype) -> _Problem:
    B, d = X.shape[0], fm.d
    exact64 = None
    with torch.no_grad():
        if fm.V is not None:
            z, blocks = fm.preactivations_and_token_blocks(X, pos)  # (B, k), (P, k, d)
        else:
            # memory-bounded path: one generation of V gives z in float64 and the blocks V^{(i)}
            x64 = X.reshape(B, fm.D).to(device=fm.weight_device, dtype=torch.float64)  # (B, D)
            zs, parts = [], []
            for _, V_b in fm.row_blocks():
                zs.append(_matmul64(x64, V_b))  # (B, D) @ (D, rows) -> (B, rows)
                parts.append(torch.stack([V_b[:, p * d : (p + 1) * d] for p in pos]))  # (P, rows, d)
            z64, blocks = torch.cat(zs, dim=1), torch.cat(parts, dim=1)  # (B, k), (P, k, d)
            z = z64
            phi64 = fm.phi(z64)  # (B, k)

            def exact64(delta: Tensor, j: Tensor) -> tuple[Tensor, Tensor]:
                # z(X^i(Delta)) = z + V^{(i)} Delta exactly, z from the full V in float64: the full map's value
                # without a second generation of V (53 GB of draws at the paper's largest size)
                Vi = blocks[j.to(blocks.device)].to(torch.float64)  # (B, k, d)
                zp = z64 + (Vi @ delta.to(Vi)[..., None])[..., 0]  # (B, k, d) @ (B, d, 1) -> (B, k)
                norm = phi64.norm(dim=1)
                return ((fm.phi(zp) - phi64).norm(dim=1) / norm).cpu(), norm.cpu()

        z, blocks = z.to(dt), blocks.to(dt)
        phi0 = fm.phi(z)  # (B, k)

    def objective(delta: Tensor) -> Tensor:
        # Paper: phi(V flat(X^i(Delta))) = phi(z + V^{(i)} Delta), only the k x d block of token i moves
        zp = z[:, None, None, :] + _block_apply(blocks, delta)  # (B, P, R, k)
        return sum_last((fm.phi(zp) - phi0[:, None, None, :]).pow(2))  # (B, P, R), thread-count invariant

    return _Problem(objective, z.new_zeros(B, len(pos), 0, d), exact64)


def _deep_rf_problem(fm: DeepRandomFeatures, X: Tensor, pos: list[int], dt: torch.dtype) -> _Problem:
    d = fm.d
    with torch.no_grad():
        V1 = fm.Vs[0].V  # (width, D)
        x = X.reshape(X.shape[0], fm.D).to(V1.dtype)  # (B, D)
        z1 = (x @ V1.T).to(dt)  # (B, D) @ (D, width) -> (B, width)
        blocks = torch.stack([V1[:, p * d : (p + 1) * d] for p in pos]).to(dt)  # (P, width, d)
        deeper = [layer.V.to(dt) for layer in fm.Vs[1:]]  # (width, width) each
        h = torch.relu(z1)
        for V in deeper:
            h = torch.relu(h @ V.T)  # (B, width) @ (width, width) -> (B, width)
        phi0 = h

    def objective(delta: Tensor) -> Tensor:
        # first layer: the single-token identity of RF; deeper layers: full matrices
        h = torch.relu(z1[:, None, None, :] + _block_apply(blocks, delta))  # (B, P, R, width)
        for V in deeper:
            h = torch.relu(h @ V.T)  # (B, P, R, width) @ (width, width) -> (B, P, R, width)
        return sum_last((h - phi0[:, None, None, :]).pow(2))  # (B, P, R), thread-count invariant

    return _Problem(objective, z1.new_zeros(X.shape[0], len(pos), 0, d))


def _attention_problem(
    fm: RandomAttentionFeatures | ReLUAttentionFeatures, X: Tensor, pos: list[int], dt: torch.dtype
) -> _Problem:
    """RAF / ReLU-RAF with only row i and column i of the scores recomputed (O(n d + d^2) per chain and step).

    For a query row l != i, key i's new score is t_l = x_l^T W y / sqrt(d) with y = x_i + Delta, and
        softmax:  out'_l = (1 - a_l) u_l + a_l y,  a_l = sigmoid(t_l - m_l),  m_l = logsumexp_{j != i} s_lj,
        ReLU:     out'_l = (1 - a_l) u_l + a_l y,  a_l = relu(t_l) / (c_l + relu(t_l)),  c_l = sum_{j != i} relu(s_lj),
    where u_l is row l's output with key i removed (u_l = 0 and a_l = 0 when all is zero: the authors' divisor 1).
    Row i has the new scores r_j = y^T W x_j / sqrt(d) (j != i) and r_i = y^T W y / sqrt(d).
    """
    relu = isinstance(fm, ReLUAttentionFeatures)
    B, n, d = X.shape
    P = len(pos)
    sq = d**0.5
    with torch.no_grad():
        W = fm.W.to(dt)  # (d, d)
        Xw = X.to(dt)  # (B, n, d)
        XW = Xw @ W  # (B, n, d) @ (d, d) -> (B, n, d); row l = x_l^T W (column scores on the moved key)
        XWt = Xw @ W.T  # (B, n, d); row j = (W x_j)^T (row scores of the moved query)
        S = XW @ Xw.transpose(1, 2) / sq  # (B, n, d) @ (B, d, n) -> (B, n, n)
        out0 = fm.attention(S) @ Xw  # (B, n, n) @ (B, n, d) -> (B, n, d), the clean output
        pos_t = torch.tensor(pos, device=X.device)
        onehot = torch.arange(n, device=X.device)[None, :] == pos_t[:, None]  # (P, n), key/row i of each position
        col_mask = onehot[None, :, None, :]  # (1, P, 1, n): key i in every row
        if relu:
            Rm = torch.relu(S)[:, None].masked_fill(col_mask, 0.0)  # (B, P, n, n), key i removed
            c = Rm.sum(-1)  # (B, P, n)
            Am = Rm / torch.where(c > 0, c, torch.ones_like(c))[..., None]
        else:
            Sm = S[:, None].masked_fill(col_mask, -torch.inf)  # (B, P, n, n)
            m = torch.logsumexp(Sm, dim=-1)  # (B, P, n)
            Am = torch.softmax(Sm, dim=-1)
        U = Am @ Xw[:, None]  # (B, P, n, n) @ (B, 1, n, d) -> (B, P, n, d)
        row_i = onehot[None, :, :, None]  # (1, P, n, 1): row i is recomputed separately; zero it (n = 1 gives NaN)
        U = torch.where(row_i, torch.zeros_like(U), U)
        if relu:
            c = torch.where(onehot[None], torch.zeros_like(c), c)
        else:
            m = torch.where(onehot[None], torch.zeros_like(m), m)
        xi = Xw[:, pos_t]  # (B, P, d), the clean token i
        Oi = out0[:, pos_t]  # (B, P, d), clean output row i
        # ||(1 - a) u + a y - o||^2 = e.e + 2 a (e.y - e.u) + a^2 (y.y - 2 u.y + u.u) with e = u - o: O(n) per chain
        # once e.y and u.y are known, so the (B, P, R, n, d) perturbed output is never formed
        Ed = U - out0[:, None]  # (B, P, n, d)
        EU = torch.cat([Ed, U], dim=2).reshape(B * P, 2 * n, d)  # (B P, 2n, d)
        keep = (~onehot)[None, :, None, :].to(dt)  # (1, P, 1, n), rows l != i
        ee = Ed.pow(2).sum(-1)[:, :, None]  # (B, P, 1, n)
        eu = (Ed * U).sum(-1)[:, :, None]
        uu = U.pow(2).sum(-1)[:, :, None]
        # structured starts (paper.md §5.3): attract every query onto key i, or steer query i onto one key m
        xbar = Xw.mean(dim=1)  # (B, d)
        attract = xbar @ W  # (B, d) = (W^T xbar)^T
        attract = attract / attract.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        gain = (Xw[:, None] - Oi[:, :, None]).norm(dim=-1) * XWt.norm(dim=-1)[:, None]  # (B, P, n)
        gain = gain.masked_fill(onehot[None], -1.0)
        target = gain.argmax(dim=-1)  # (B, P), the key m whose capture changes row i most
        steer = torch.gather(XWt, 1, target[..., None].expand(-1, -1, d))  # (B, P, d) = (W x_m)^T
        steer = steer / steer.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        starts = torch.stack([attract[:, None].expand(-1, P, -1), steer], dim=2)  # (B, P, 2, d)

    def objective(delta: Tensor) -> Tensor:
        # Paper: Eq. (raf), softmax(X' W X'^T / sqrt(d)) X' with X' = X + e_i Delta^T (ReLU-RAF: §4.4 normalisation)
        y = xi[:, :, None, :] + delta  # (B, P, R, d), the perturbed token
        # rows l != i: only key i's score moves
        t = _rows_dot(XW, y) / sq  # (B, P, R, n)
        if relu:
            rho = torch.relu(t)
            den = c[:, :, None, :] + rho
            a = rho / torch.where(den > 0, den, torch.ones_like(den))  # (B, P, R, n)
        else:
            a = torch.sigmoid(t - m[:, :, None, :])  # (B, P, R, n)
        R = y.shape[2]
        proj = (y.reshape(B * P, R, d) @ EU.transpose(1, 2)).reshape(B, P, R, 2 * n)  # (B P, R, d) @ (B P, d, 2n)
        ey, uy = proj[..., :n], proj[..., n:]  # (B, P, R, n) each
        yy = y.pow(2).sum(-1, keepdim=True)  # (B, P, R, 1)
        rows = ee + 2 * a * (ey - eu) + a.pow(2) * (yy - 2 * uy + uu)  # (B, P, R, n) = ||out'_l - out_l||^2
        f_rows = (rows * keep).sum(-1)  # (B, P, R)
        # row i: every score of the moved query changes, and so does its score on itself
        r = _rows_dot(XWt, y) / sq  # (B, P, R, n)
        r_ii = ((y @ W) * y).sum(-1) / sq  # (B, P, R, d) @ (d, d) -> (B, P, R)
        r = torch.where(onehot[None, :, None, :], r_ii[..., None], r)
        if relu:
            rr = torch.relu(r)
            s = rr.sum(-1, keepdim=True)
            w = rr / torch.where(s > 0, s, torch.ones_like(s))  # (B, P, R, n)
        else:
            w = torch.softmax(r, dim=-1)  # (B, P, R, n)
        w_i = (w * onehot[None, :, None, :]).sum(-1, keepdim=True)  # (B, P, R, 1)
        out_i = (w.reshape(B, -1, n) @ Xw).reshape(delta.shape) + w_i * delta  # sum_j w_j x'_j, x'_i = x_i + Delta
        f_i = (out_i - Oi[:, :, None]).pow(2).sum(-1)  # (B, P, R)
        return f_rows + f_i  # the expansion may round a zero to a tiny negative: callers clamp before a sqrt

    return _Problem(objective, starts)


_BUILDERS = {"rf": _rf_problem, "deep_rf": _deep_rf_problem, "raf": _attention_problem, "relu_raf": _attention_problem}


def single_token_objective(
    feature_map: object, X: Tensor, positions: Sequence[int], dtype: str | torch.dtype | None = None
) -> Callable[[Tensor], Tensor]:
    """The structured objective Delta -> ||phi(X^i(Delta)) - phi(X)||^2 for a batch, positions and chains.

    The clean quantities (z and the blocks V^{(i)} for RF, the key-i-removed attention outputs for RAF) are computed
    once here; the returned function then costs O(k d) (RF) or O(n d + d^2) (RAF, ReLU-RAF) per chain.

    Args:
        feature_map: one of the four maps of `wslight.features`.
        X: (B, n, d) clean samples.
        positions: P token indices.
        dtype: working dtype (default: the map's).

    Returns:
        A function (B, P, R, d) -> (B, P, R): the squared change of the features for every chain.
    """
    name, d, n = _map_dims(feature_map)
    X = _check_X(X, d, n)
    pos = _resolve_positions(list(positions), X.shape[1])
    return _BUILDERS[name](feature_map, X, pos, _working_dtype(feature_map, dtype)).objective


def _working_dtype(feature_map: object, dtype: object) -> torch.dtype:
    if dtype is None:
        return feature_map.weight_dtype  # type: ignore[attr-defined]
    try:
        return _dtype("dtype", dtype)
    except ValueError:
        raise ValueError(f"dtype must be None, 'float32' or 'float64', got {dtype!r}") from None


# ----------------------------------------------------------------------------------------------------------------------
# Full map in float64 (the honest final value)
# ----------------------------------------------------------------------------------------------------------------------


def _matmul64(h: Tensor, V: Tensor, rows: int = 2048) -> Tensor:
    """h @ V^T in float64 without a float64 copy of the whole V: (B, fan_in), (out, fan_in) -> (B, out)."""
    return torch.cat([h @ V[s : s + rows].to(torch.float64).T for s in range(0, V.shape[0], rows)], dim=1)


@torch.no_grad()
def full_features64(feature_map: object, X: Tensor) -> Tensor:
    """phi(X) in float64 with the full map (the map's own weights cast to float64): (B, n, d) -> (B, p).

    RF goes through the map's row blocks, so the memory-bounded path never holds V whole.
    """
    name, d, n = _map_dims(feature_map)
    X = _check_X(X, d, n)
    if name == "rf":
        fm: RandomFeatures = feature_map  # type: ignore[assignment]
        x = X.reshape(X.shape[0], fm.D).to(device=fm.weight_device, dtype=torch.float64)  # (B, D)
        z = torch.cat([_matmul64(x, V_b) for _, V_b in fm.row_blocks()], dim=1)  # (B, D) @ (D, k) -> (B, k)
        return fm.phi(z)
    if name == "deep_rf":
        h = X.reshape(X.shape[0], -1).to(device=feature_map.Vs[0].V.device, dtype=torch.float64)  # type: ignore
        for layer in feature_map.Vs:  # type: ignore[attr-defined]
            h = torch.relu(_matmul64(h, layer.V))  # (B, fan_in) @ (fan_in, width) -> (B, width)
        return h
    W = feature_map.W.to(torch.float64)  # type: ignore[attr-defined]
    X64 = X.to(device=W.device, dtype=torch.float64)
    S = X64 @ W @ X64.transpose(1, 2) / d**0.5  # (B, n, d) @ (d, d) @ (B, d, n) -> (B, n, n)
    return (feature_map.attention(S) @ X64).reshape(X.shape[0], -1)  # type: ignore[attr-defined]


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


def _project(delta: Tensor, radius: float) -> Tensor:
    norm = delta.norm(dim=-1, keepdim=True)
    return delta * torch.where(norm > radius, radius / norm.clamp_min(1e-300), torch.ones_like(norm))


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
        proposal = _project(delta + (eta * radius)[..., None] * direction, radius)
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
    feature_map: RandomFeatures | DeepRandomFeatures | RandomAttentionFeatures | ReLUAttentionFeatures,
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
    drifts towards it). For RAF/ReLU-RAF, restart 2 is the attention-attracting construction of paper.md §5.3,
    Delta = radius W^T xbar / ||W^T xbar|| (an inferred construction), and restart 3 steers query i onto the key m that
    changes its output most, Delta ∝ W x_m. Further restarts start at random points, drawn from
    `wslight.seeding.generator(seed, "ws.init", position)`, so a chain does not depend on the chunking or on the other
    positions requested.

    The reported S is recomputed in float64 with the full map (the map's weights cast to float64) at the best Delta.
    On the memory-bounded RF path, z = V flat(X) comes from the full V in float64 in the same pass that extracts the
    blocks, and the perturbed value uses the exact identity z + V^{(i)} Delta, which avoids generating V a second time.

    Args:
        feature_map: RandomFeatures, DeepRandomFeatures, RandomAttentionFeatures or ReLUAttentionFeatures.
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

    Returns:
        WSResult with per-sample ws, position, delta, delta_norm, phi_norm, steps (float64 / long, on the CPU).

    Raises:
        ValueError: a bad argument, named in the message, before any heavy work.
    """
    name, d, n_map = _map_dims(feature_map)
    X = _check_X(X, d, n_map)
    B, n, _ = X.shape
    pos_all = _resolve_positions(positions, n)
    if radius is None:
        radius = math.sqrt(d)
    radius = float(_check_number("radius", radius, 0.0, strict=True))
    restarts = int(_check_number("restarts", restarts, 1, strict=False, integer=True))
    max_steps = int(_check_number("max_steps", max_steps, 1, strict=False, integer=True))
    window = int(_check_number("window", window, 1, strict=False, integer=True))
    lr = float(_check_number("lr", lr, 0.0, strict=True))
    tol = float(_check_number("tol", tol, 0.0, strict=False))
    chunk_elements = int(_check_number("chunk_elements", chunk_elements, 1, strict=False, integer=True))
    power_iters = int(_check_number("power_iters", power_iters, 0, strict=False, integer=True))
    dt = _working_dtype(feature_map, dtype)
    device = feature_map.weight_device if name == "rf" else next(iter(feature_map.buffers())).device  # type: ignore
    X = X.to(device)

    # memory per chain and per position, in elements (a rough count of what autograd keeps)
    if name == "rf":
        per_chain, per_pos = 6 * feature_map.k, feature_map.k * d  # type: ignore[attr-defined]
    elif name == "deep_rf":
        per_chain, per_pos = 4 * feature_map.width * feature_map.depth, feature_map.width * d  # type: ignore
    else:
        per_chain, per_pos = 12 * n + 8 * d, B * (3 * n * n + 3 * n * d)
    chains_per_pos = B * restarts
    pos_chunk = max(1, chunk_elements // (chains_per_pos * per_chain + per_pos))
    restart_chunk = restarts
    if pos_chunk == 1 and chains_per_pos * per_chain + per_pos > chunk_elements:
        restart_chunk = max(1, (chunk_elements - per_pos) // max(1, B * per_chain))

    best_f = torch.full((B,), -1.0, dtype=torch.float64)
    best_delta = torch.zeros(B, d, dtype=torch.float64)
    best_pos = torch.zeros(B, dtype=torch.long)
    best_ws = torch.full((B,), math.nan, dtype=torch.float64)  # filled only by problems with an exact64 path
    phi_norm = torch.full((B,), math.nan, dtype=torch.float64)
    steps_max = torch.zeros(B, dtype=torch.long)
    for c0 in range(0, len(pos_all), pos_chunk):
        pos = pos_all[c0 : c0 + pos_chunk]
        P = len(pos)
        problem = _BUILDERS[name](feature_map, X, pos, dt)
        # starting points on the sphere: +- the top curvature direction, the map's own constructions, then random ones
        draws = torch.stack(
            [torch.randn(B, restarts + 1, d, generator=generator(seed, "ws.init", p)) for p in pos], dim=1
        ).to(device=device, dtype=dt)  # (B, P, R + 1, d), one stream per position: chains do not depend on chunking
        top = _top_curvature(problem.objective, draws[:, :, :1], power_iters)  # (B, P, 1, d)
        struct = torch.cat([top, -top, problem.starts.to(dt)], dim=2)[:, :, :restarts]  # (B, P, S, d)
        rand = draws[:, :, 1 : 1 + restarts - struct.shape[2]]
        rand = rand / rand.norm(dim=-1, keepdim=True).clamp_min(1e-30)  # (B, P, R - S, d)
        starts = torch.cat([struct, rand], dim=2) * radius  # (B, P, R, d)
        for r0 in range(0, restarts, restart_chunk):
            delta0 = starts[:, :, r0 : r0 + restart_chunk].contiguous()
            delta, f, steps = _ascend(problem.objective, delta0, radius, max_steps, lr, tol, window)
            f_flat = f.reshape(B, -1).to(torch.float64).cpu()  # (B, P R')
            f_best, idx = f_flat.max(dim=1)
            better = f_best > best_f
            R_c = delta.shape[2]
            chosen = delta.reshape(B, P * R_c, d)[torch.arange(B), idx.to(delta.device)].to(torch.float64).cpu()
            # Deviation: the ball is centred on the clean token; the authors centre it at the noisy start
            # x_i + 0.1 xi, so their ||Delta|| can reach about 1.1 sqrt(d) (paper.md §9.2); we keep §3.1's definition.
            chosen = _project(chosen, radius)  # float32 rounding may leave ||Delta|| a hair above the radius
            if problem.exact64 is not None:
                ws_c, norm_c = problem.exact64(chosen, idx // R_c)
                best_ws = torch.where(better, ws_c, best_ws)
                phi_norm = norm_c
            best_delta = torch.where(better[:, None], chosen, best_delta)
            best_pos = torch.where(better, torch.tensor(pos)[idx // R_c], best_pos)
            best_f = torch.where(better, f_best, best_f)
            steps_max = torch.maximum(steps_max, steps.reshape(B, -1).max(dim=1).values.cpu())

    if bool(best_ws.isnan().any()):
        # final value with the full map in float64 (clean and perturbed samples in one pass)
        X64 = X.to(torch.float64)
        Xp = X64.clone()
        Xp[torch.arange(B), best_pos.to(device)] += best_delta.to(device)
        phi = full_features64(feature_map, torch.cat([X64, Xp]))  # (2B, p)
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
    X = _check_X(X, feature_map.d, feature_map.n)
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
        phi_norm = full_features64(feature_map, X).norm(dim=1).cpu()
    dn = torch.as_tensor(delta_norm, dtype=torch.float64).cpu()
    return LIPSCHITZ[feature_map.activation] * op_per_sample * dn / phi_norm.to(torch.float64)
