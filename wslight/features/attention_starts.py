"""The structured starts of the attention maps' word-sensitivity search (docs/theory/search.md §4.3).

Where the maxima of S lie for RAF and ReLU-RAF, as starting directions for the search's chains: attracting every query
onto the moved key, steering the moved query onto one key, and capturing the moved query on its own key (its self
score made large: softmax's self-score starts, ReLU-RAF's self-capture region). Built from an `AttentionMove`'s
tensors; pure maths.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor

from ..chains.ball import project_ball, tangent_unit
from .move import per_trial
from .rows import token_mixes, unit

# ReLU-RAF self-capture starts: their steps (their mixes of x_i and the attracting direction: `token_mixes`)
SELF_CAPTURE_STEPS = 60
# then the captured ascent (docs/theory/search.md §4.3): its steps, and the score margin that keeps query i on key i
# alone
CAPTURED_ASCENT_STEPS = 100
CAPTURE_MARGIN = 0.2
# Bisection steps of the self-score maximiser's secular equation (each halves the bracket of mu)
SELF_SCORE_BISECTIONS = 100


class AttentionMove(Protocol):
    """What the starts read of an attention map's token-move algebra (`attention_move.AttentionMove`)."""

    relu: bool
    positions: list[int]
    X0: Tensor  # (T, B, n, d) the samples
    Oi: Tensor  # (T, B, P, d) the clean output rows i
    xi: Tensor  # (T, B, P, d) the clean tokens i
    Ws: Tensor  # (T, d, d) the symmetric part of W
    onehot: Tensor  # (P, n) bool, the moved tokens
    sq: float  # sqrt(d)

    def value_and_grad(self, delta: Tensor) -> tuple[Tensor, Tensor]:
        """The squared change and its gradient in Delta: (T, B, P, R, d) -> (T, B, P, R), (T, B, P, R, d)."""
        ...


def rows_dot(M: Tensor, y: Tensor) -> Tensor:
    """M[t, b, l] . y[t, b, p, r] for every row l: (T, B, n, d) and (T, B, P, R, d) -> (T, B, P, R, n)."""
    T, B, P, R, d = y.shape
    return (y.reshape(T, B, P * R, d) @ M.transpose(-1, -2)).reshape(T, B, P, R, -1)  # (T, B, PR, d) @ (T, B, d, n)


def structured_starts(move: AttentionMove, W: Tensor, XWt: Tensor) -> Tensor:
    """The attention maps' own starts, (T, B, P, S, d) unit directions, in the order the search takes them.

    Attract every query onto key i (the direction W^T xbar), steer query i onto the key m whose capture changes row i
    most; then, for softmax, the self-score maximiser and its mix with the attracting direction; for ReLU-RAF, the
    self-capture starts. W (T, d, d) the maps' weights, XWt (T, B, n, d) the rows (W x_j)^T.
    """
    d = W.shape[-1]
    P = len(move.positions)
    xbar = move.X0.mean(dim=2)  # (T, B, d)
    attract = unit(per_trial(xbar, W))  # (T, B, d) = (W^T xbar)^T
    gain = (move.X0[:, :, None] - move.Oi[:, :, :, None]).norm(dim=-1) * XWt.norm(dim=-1)[:, :, None]
    gain = gain.masked_fill(move.onehot[None, None], -1.0)  # (T, B, P, n)
    target = gain.argmax(dim=-1)  # (T, B, P), the key m whose capture changes row i most
    steer = unit(torch.gather(XWt, 2, target[..., None].expand(-1, -1, -1, d)))  # (T, B, P, d) = (W x_m)^T
    attract_p = attract[:, :, None].expand(-1, -1, P, -1)  # (T, B, P, d)
    starts = torch.stack([attract_p, steer], dim=3)  # (T, B, P, 2, d)
    if move.relu:
        return torch.cat([starts, self_capture_starts(move, XWt, attract)], dim=3)
    radius = d**0.5  # a start's direction only: the search scales it to its radius
    own = unit(self_score_maximiser(move.Ws, move.xi, radius))  # (T, B, P, d)
    return torch.cat([starts, torch.stack([own, unit(own + attract_p)], dim=3)], dim=3)


def self_score_maximiser(Ws: Tensor, x: Tensor, radius: float) -> Tensor:
    """The Delta of norm `radius` that maximises the moved query's self score (x + Delta)^T Ws (x + Delta).

    Softmax RAF's largest changes often have query i attending to key i alone (measured on the bundled reviews: the
    maxima that rounds of random chains missed at d = 32 and 384 all did), which needs a large self score r_ii. On the
    sphere |Delta| = r the maximiser solves (mu I - Ws) Delta = Ws x with mu > lambda_max(Ws) and |Delta| = r (a
    trust-region problem): in the eigenbasis of Ws, |Delta|^2 = sum_k (lambda_k c_k)^2 / (mu - lambda_k)^2 with
    c = V^T x decreases in mu, so bisection finds it. Where Ws x has no component on the top eigenvector (the "hard
    case"), this returns the limit of that family, a direction as good as any for a start.

    Args:
        Ws: (T, d, d) the symmetric part of the maps' W.
        x: (T, B, P, d) the clean tokens i.
        radius: r > 0.

    Returns:
        (T, B, P, d) Delta with |Delta| <= r (= r but in the hard case).
    """
    lam, V = torch.linalg.eigh(Ws)  # (T, d), (T, d, d), ascending eigenvalues
    lam_ = lam[:, None, None, :]  # (T, 1, 1, d)
    b = torch.einsum("tdk,tbpd->tbpk", V, x) * lam_  # (T, B, P, d): Ws x in the eigenbasis
    top = lam[:, -1][:, None, None]  # (T, 1, 1)
    # |Delta(mu)| > r just above lambda_max (unless the hard case) and <= r at mu = lambda_max + |b| / r
    lo = (top + 1e-12 * top.abs().clamp_min(1.0)).expand(b.shape[:-1]).clone()
    hi = top + b.norm(dim=-1) / radius + 1e-12
    for _ in range(SELF_SCORE_BISECTIONS):
        mid = (lo + hi) / 2
        outside = (b / (mid[..., None] - lam_)).norm(dim=-1) > radius
        lo, hi = torch.where(outside, mid, lo), torch.where(outside, hi, mid)
    return torch.einsum("tdk,tbpk->tbpd", V, b / (hi[..., None] - lam_))  # (T, B, P, d)


def self_capture_starts(move: AttentionMove, XWt: Tensor, attract: Tensor) -> Tensor:
    """ReLU-RAF starts where query i attends to itself alone (docs/theory/search.md §4.3).

    Its output row becomes the moved token y = x_i + Delta, the largest change of that row, and the other rows'
    weight on key i stays free.

    From radius * unit(mix x_i/||x_i|| + (1 - mix) attract), for each mix of `token_mixes`, projected steps
    on the capture penalty push every other key's score below zero and the self score above it (the "captured"
    starts). From there, the captured ascent climbs the objective inside the capture region: its steps leave it
    (the other rows pull y across the boundary of a key's score, where the objective has a ridge that plain
    ascent stalls on), so each step is followed by steps back into the region with a margin. Both kinds are
    returned: the ascended ones first, then the captured ones. XWt (T, B, n, d) the rows (W x_j)^T, attract
    (T, B, d) a unit vector; returns (T, B, P, 2 K, d) unit-radius starts.
    """
    radius = move.xi.shape[-1] ** 0.5  # a start's direction only: the search scales it to its radius
    delta = radius * token_mixes(move.xi, attract[:, :, None])  # (T, B, P, K, d)
    for _ in range(SELF_CAPTURE_STEPS):
        step, _ = capture_step(move, XWt, delta, 1.0)
        delta = project_ball(delta - 0.05 * radius * step, radius)
    captured = delta
    for it in range(CAPTURED_ASCENT_STEPS):
        eta = 0.002 + 0.05 * 0.5 * (1 + math.cos(math.pi * it / CAPTURED_ASCENT_STEPS))  # cosine-decayed length
        _, g = move.value_and_grad(delta)
        delta = project_ball(delta + eta * radius * tangent_unit(delta, g, radius), radius)
        for _ in range(3):  # back into the capture region, only where it was left
            step, outside = capture_step(move, XWt, delta, CAPTURE_MARGIN)
            delta = torch.where(outside, project_ball(delta - 0.5 * eta * radius * step, radius), delta)
    return torch.cat([delta, captured], dim=3) / radius


def capture_step(move: AttentionMove, XWt: Tensor, delta: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """The unit descent direction of the capture penalty at delta, and whether the penalty is > 0 there.

    The penalty is sum_{j != i} relu(r_j + margin)^2 + relu(margin - r_ii)^2 (r_j the scores of query i, r_ii its
    self score); delta (T, B, P, K, d) -> direction, (T, B, P, K, 1) bool.
    """
    T, B, n, _ = XWt.shape
    y = move.xi[:, :, :, None] + delta
    r = rows_dot(XWt / move.sq, y)  # (T, B, P, K, n), query i's scores of the keys j
    h = per_trial(y, move.Ws)
    r_ii = (h * y).sum(-1, keepdim=True) / move.sq
    push = torch.relu(r + margin) * (~move.onehot)[None, None, :, None, :].to(delta.dtype)  # keys j != i
    pull = torch.relu(margin - r_ii)
    grad = (push.reshape(T, B, -1, n) @ XWt).reshape(y.shape) / move.sq - pull * 2 * h / move.sq
    outside = (push.pow(2).sum(-1, keepdim=True) + pull.pow(2)) > 0
    return grad / grad.norm(dim=-1, keepdim=True).clamp_min(1e-30), outside
