"""Row helpers of the maps whose output has one row per token (docs/theory/search.md §4.3).

Unit directions, the mixes of the moved token with an attracting direction, the output rows read when a token moves,
each row's direction and top right-singular vectors read off the map's Jacobian, the removal mixes, and the capture
descent. The word-sensitivity search builds its row, removal and self-capture starts from them; they sit beside the
maps, which use them too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

# (copies (C, n, d), i) -> (delta (C, d) -> (C, n d)): the features of each copy with its token i moved by its delta,
# in float64; built once per set of copies, so a map with a cheaper forward of one moved token (`token_moves`) pays
# its clean forward once and each move at the price of one token (`wslight.features.generic_move.float64_moves`)
Moves = Callable[[Tensor, int], Callable[[Tensor], Tensor]]


def forward_moves(forward: Callable[[Tensor], Tensor]) -> Moves:
    """The `Moves` of a full forward (C, n, d) -> (C, n d): each move is a forward of the whole moved copy."""
    return lambda X, i: lambda delta: forward(_moved(X, i, delta))


def unit(v: Tensor) -> Tensor:
    """Every row of v scaled to norm 1 (a start's direction)."""
    return v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)


# The mixes m x_i/||x_i|| + (1 - m) a of the moved token and an attracting direction a that start the ReLU-RAF
# self-capture climbs and the generic path's row starts (docs/theory/search.md §4.3)
SELF_CAPTURE_MIXES = (1.0, 0.7, 0.4, 0.0)


def token_mixes(x: Tensor, attract: Tensor) -> Tensor:
    """unit(m x/||x|| + (1 - m) attract) for each m of SELF_CAPTURE_MIXES.

    (..., d) twice -> (..., K, d); attract a unit vector.
    """
    xu = unit(x)
    return unit(torch.stack([m * xu + (1 - m) * attract for m in SELF_CAPTURE_MIXES], dim=-2))


# Row starts (docs/theory/search.md §4.3, "Row starts"): read off the Jacobians of a map whose output is one d-row per
# token. At most ROW_LIMIT output rows besides the moved token's own are read (evenly spaced); each row's direction
# takes ROW_POWER_STEPS power steps (2 brought the cosine with RAF's W^T x_k from about 0.5 to 0.999, measured)
ROW_LIMIT = 64
ROW_POWER_STEPS = 2
ROW_CHUNK_ELEMENTS = 2**21  # float64 elements of the samples one batch of row copies holds
# Capture descent: steps of cosine-decayed length (CAPTURE_ETA[0] r down to CAPTURE_ETA[1] r) on the sphere
CAPTURE_STEPS = 100
CAPTURE_ETA = (0.05, 0.002)
# Removal starts (docs/theory/search.md §4.3, "Removal starts"): the moved token nearly taken out of the sample, leaning
# toward +- one of the REMOVAL_SINGULAR top right-singular vectors of one row's Jacobian, at each angle (degrees)
# from -x_i, for at most REMOVAL_ROWS of the rows read (evenly spaced). The pre-trained layer's maxima at n = 8 lie
# there and are narrow. A row's top singular values are close (ratios 0.4-0.99), so the vectors take
# REMOVAL_POWER_STEPS steps of subspace iteration: with 4 steps these starts reached 90% of 20 reviews, with 16 all
# (one power-step direction per row at 10, 20 and 30 degrees: 60%; measured)
REMOVAL_ANGLES = (10.0, 20.0)
REMOVAL_ROWS = 8
REMOVAL_SINGULAR = 2
REMOVAL_POWER_STEPS = 16


def removal_mixes(x: Tensor, dirs: Tensor) -> Tensor:
    """unit(-cos t x/||x|| + sin t v) for each angle t of REMOVAL_ANGLES and each direction v of `dirs`.

    Each v is made orthogonal to x (zero where a direction is parallel to x or zero, so the start is -x/||x||): (B, d),
    (B, K, d) -> (B, K A, d), direction by direction, then angle by angle.

    With ||x_i|| = r, Delta = r u takes token i to x_i + Delta of norm 2 r sin(t/2) (0.17 r at 10 degrees): the word
    nearly removed, what is left of it pointing along v.
    """
    xu = unit(x)[:, None]  # (B, 1, d)
    v = _beside(dirs, xu)  # (B, K, d)
    angles = [math.radians(t) for t in REMOVAL_ANGLES]
    mixes = torch.stack([-math.cos(t) * xu + math.sin(t) * v for t in angles], dim=2)  # (B, K, A, d)
    return unit(mixes.flatten(1, 2))


def _beside(dirs: Tensor, away: Tensor) -> Tensor:
    """The directions `dirs` (..., d) with their parts along the unit vectors `away` (broadcastable) removed.

    Scaled to norm 1; zero where nothing is left (rounding leaves a parallel direction a residue that `unit` would blow
    up to an arbitrary one).
    """
    beside = dirs - (dirs * away).sum(-1, keepdim=True) * away
    some = beside.norm(dim=-1, keepdim=True) > 1e-9 * dirs.norm(dim=-1, keepdim=True)
    return torch.where(some, unit(beside), torch.zeros_like(beside))


def read_rows(n: int, i: int) -> Tensor:
    """The output rows whose directions are read when token i of n moves.

    Every row (i itself through a copy, see `row_directions`), at most ROW_LIMIT of the others, evenly spaced.
    """
    others = torch.tensor([k for k in range(n) if k != i], dtype=torch.long)
    return torch.cat([torch.tensor([i]), evenly_spaced(others, ROW_LIMIT)])


def evenly_spaced(items: Tensor, k: int) -> Tensor:
    """At most k entries of `items` (1-D), evenly spaced, the first and last included.

    All of them if there are no more than k.
    """
    if len(items) <= k:
        return items
    return items[torch.linspace(0, len(items) - 1, k).round().long()]


def row_directions(moves: Moves, X: Tensor, i: int, rows: Tensor, radius: float, v0: Tensor) -> Tensor:
    """For each output row k of `rows`, the unit direction of Delta in which row k of phi(X^i(Delta)) moves fastest.

    Signed so that the move r v changes that row more than -r v.

    For an attention map, row k != i moves with Delta only through the score of key i, so this is (up to its norm)
    the key direction of query k: W^T x_k for RAF and ReLU-RAF. Row i's own entry is read through a copy of token i
    at position (i + 1) mod n: the direction a query equal to token i would follow. A row whose Jacobian vanishes at
    Delta = 0 (ReLU: a negative score) is read with token i reflected to -x_i instead, which flips the sign of its
    scores and keeps their directions; of the two readings the one with the larger singular value is kept.

    Args:
        moves: the map's moved copies in float64 (`Moves`; row-major output rows).
        X: (B, n, d) float64 clean samples.
        i: the moved position.
        rows: (K,) the rows to read (`read_rows`).
        radius: the ball's radius r.
        v0: (B, K, d) the power iterations' start vectors.

    Returns:
        (B, K, d) unit directions (zero where a row does not move with Delta in either reading).
    """
    B, n, d = X.shape
    K = len(rows)
    base, read = _row_copies(X, i, rows)
    reflected = base.clone()
    reflected[:, :, i] = -base[:, :, i]
    chunk = max(1, ROW_CHUNK_ELEMENTS // (n * d))
    copies = torch.cat([base, reflected], dim=1).flatten(0, 1)  # (B 2K, n, d)
    reads = read.repeat(2 * B).to(X.device)
    start = torch.cat([v0, v0], dim=1).flatten(0, 1)
    parts = [
        _top_directions(
            moves, copies[c : c + chunk], reads[c : c + chunk], i, start[c : c + chunk, None], radius, ROW_POWER_STEPS
        )
        for c in range(0, len(copies), chunk)
    ]
    v = torch.cat([p[0] for p in parts]).reshape(B, 2, K, d)
    sigma = torch.cat([p[1] for p in parts]).reshape(B, 2, K)
    v = torch.where((sigma[:, 0] >= sigma[:, 1])[..., None], v[:, 0], v[:, 1])  # (B, K, d)
    change = _row_changes(moves, base.flatten(0, 1), reads[: B * K], i, radius * v.flatten(0, 1), chunk)
    return torch.where((change[:, 0] >= change[:, 1]).reshape(B, K, 1), v, -v)


def row_subspaces(moves: Moves, X: Tensor, i: int, rows: Tensor, radius: float, v0: Tensor) -> Tensor:
    """For each output row k of `rows`, the top s right-singular vectors of d row_k / d x_i at Delta = 0.

    Read as in `row_directions` (row i through a copy of token i; no reflection, no sign), by REMOVAL_POWER_STEPS steps
    of subspace iteration: X (B, n, d) float64, v0 (B, K, s, d) the start vectors -> (B, K, s, d) orthonormal per row,
    the largest singular value first (zero where a row does not move with Delta).
    """
    B, n, d = X.shape
    K, s = v0.shape[1], v0.shape[2]
    base, read = _row_copies(X, i, rows)
    copies, reads, start = base.flatten(0, 1), read.repeat(B).to(X.device), v0.flatten(0, 1)
    chunk = max(1, ROW_CHUNK_ELEMENTS // (n * d * s))
    parts = [
        _top_directions(
            moves, copies[c : c + chunk], reads[c : c + chunk], i, start[c : c + chunk], radius, REMOVAL_POWER_STEPS
        )[0]
        for c in range(0, len(copies), chunk)
    ]
    return torch.cat(parts).reshape(B, K, s, d)


def _row_copies(X: Tensor, i: int, rows: Tensor) -> tuple[Tensor, Tensor]:
    """One copy of each sample per row read, (B, K, n, d), and the row each copy reads, (K,).

    Row i's own entry is read through a copy of token i at position (i + 1) mod n.
    """
    n = X.shape[1]
    own = rows == i
    base = X[:, None].repeat(1, len(rows), 1, 1)
    base[:, own, (i + 1) % n] = X[:, None, i]
    return base, torch.where(own, (i + 1) % n, rows)


def _row_changes(moves: Moves, X: Tensor, reads: Tensor, i: int, delta: Tensor, chunk: int) -> Tensor:
    """||row reads[c] of phi(X^i(+-delta)) - the same row of phi(X)|| for each copy c: (C, 2), + then -.

    `chunk` copies at a time.
    """
    out = []
    for s in range(0, len(X), chunk):
        part, rows, step = X[s : s + chunk], reads[s : s + chunk], delta[s : s + chunk]
        at = moves(part, i)
        d = step.shape[-1]
        clean = _rows(at(torch.zeros_like(step)), rows, d)
        moved = [_rows(at(sign * step), rows, d) for sign in (1.0, -1.0)]
        out.append(torch.stack([(m - clean).norm(dim=-1) for m in moved], dim=-1))
    return torch.cat(out)


def _rows(features: Tensor, reads: Tensor, d: int) -> Tensor:
    """Output row reads[c] of copy c's features: (C, n d) -> (C, d)."""
    C = features.shape[0]
    return features.reshape(C, -1, d)[torch.arange(C, device=features.device), reads]


def _moved(X: Tensor, i: int, delta: Tensor) -> Tensor:
    """X (C, n, d) with token i moved by delta (C, d); differentiable in delta."""
    onehot = torch.zeros(X.shape[1], 1, dtype=X.dtype, device=X.device)
    onehot[i] = 1
    return X + onehot * delta[:, None]


def _top_directions(
    moves: Moves, X: Tensor, reads: Tensor, i: int, V: Tensor, radius: float, steps: int
) -> tuple[Tensor, Tensor]:
    """The top s right-singular vectors of d row_k / d x_i at Delta = 0 for each copy (C, n, d).

    By `steps` steps of subspace iteration from V (C, s, d): J v by a central difference, J^T u by autograd, then
    Gram-Schmidt in order (s = 1: power steps). Returns ((C, s, d) orthonormal rows, (C, s) the norms of the last J^T J
    v).
    """
    C, s, d = V.shape
    Xs, rs = X.repeat_interleave(s, dim=0), reads.repeat_interleave(s)
    eps = 1e-5 * radius
    v = _orthonormal(V).reshape(C * s, d)
    sigma = torch.zeros(C, s, dtype=X.dtype, device=X.device)
    with torch.enable_grad():
        at = moves(Xs, i)
        delta = torch.zeros_like(v, requires_grad=True)
        row = _rows(at(delta), rs, d)
        for _ in range(steps):
            with torch.no_grad():
                u = (_rows(at(eps * v), rs, d) - _rows(at(-eps * v), rs, d)) / (2 * eps)
            (g,) = torch.autograd.grad(row, delta, grad_outputs=u, retain_graph=True)
            sigma = g.norm(dim=-1).reshape(C, s)
            v = _orthonormal(g.reshape(C, s, d)).reshape(C * s, d)
    return v.detach().reshape(C, s, d), sigma.detach()


def _orthonormal(V: Tensor) -> Tensor:
    """Gram-Schmidt on the rows of each (s, d) block of V (..., s, d), in order (a zero row stays zero)."""
    out: list[Tensor] = []
    for j in range(V.shape[-2]):
        v = V[..., j, :]
        for u in out:
            v = v - (v * u).sum(-1, keepdim=True) * u
        out.append(v / v.norm(dim=-1, keepdim=True).clamp_min(1e-300))
    return torch.stack(out, dim=-2)


def captured(moves: Moves, X: Tensor, i: int, dirs: Tensor, radius: float) -> Tensor:
    """Where the moved token's output row comes closest to the moved token itself.

    From r dirs, CAPTURE_STEPS normalised descent steps along the sphere of radius r on ||row_i(X^i(Delta)) - (x_i +
    Delta)||^2 / ||x_i + Delta||^2, the best point of each kept. Where that is 0 the moved query attends to itself alone
    (ReLU-RAF's self-capture region, docs/theory/search.md §4.3); the generic path's stand-in for the closed form's
    capture steps, for a map whose output rows live where its tokens do.

    Args:
        moves: the map's moved copies in float64 (`Moves`).
        X: (B, n, d) float64 clean samples.
        i: the moved position.
        dirs: (B, K, d) unit start directions.
        radius: r.

    Returns:
        (B, K, d) unit directions (the best points, divided by r).
    """
    B, K, d = dirs.shape
    n = X.shape[1]
    copies = X[:, None].expand(B, K, n, d).reshape(B * K, n, d)
    delta = radius * dirs.reshape(B * K, d)
    best, best_g = delta, torch.full((B * K,), math.inf, dtype=X.dtype, device=X.device)
    at, own = moves(copies, i), torch.full((B * K,), i, device=X.device)
    for step in range(CAPTURE_STEPS + 1):
        with torch.enable_grad():
            moving = delta.clone().requires_grad_(True)
            y = copies[:, i] + moving
            row = _rows(at(moving), own, d)
            g = ((row - y) ** 2).sum(-1) / (y**2).sum(-1)
            (grad,) = torch.autograd.grad(g.sum(), moving)
        better = g.detach() < best_g
        best, best_g = torch.where(better[:, None], delta, best), torch.where(better, g.detach(), best_g)
        if step == CAPTURE_STEPS:
            break
        lo, hi = CAPTURE_ETA[1], CAPTURE_ETA[0]
        eta = lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * step / CAPTURE_STEPS))
        along = grad - (grad * delta).sum(-1, keepdim=True) * delta / radius**2  # the sphere's tangent part
        delta = radius * unit(delta - eta * radius * unit(along))
    return unit(best).reshape(B, K, d)
