"""A start for maps whose change is a sum over blocks of Delta (docs/theory/maps.md §12.1).

The radius is shared out among the blocks.

Multi-head RAF moves block h of the token in head h only, so ||phi(X^i(Delta)) - phi(X)||^2 = sum_h f_h(Delta_h) and

    max_{||Delta|| <= r} sum_h f_h(Delta_h) = max_{sum_h r_h^2 <= r^2} sum_h g_h(r_h),
    g_h(s) = max_{||D|| <= s} f_h(D).

`radius_split_start` estimates every g_h at `levels` radii r sqrt(m / M), m = 1..M, by the ascent on each block alone
(a small problem of dimension d_h, from the block's structured starts, their negatives and random ones), then shares
the M units of r^2 among the blocks by dynamic programming (a knapsack, exact on that grid), and returns the blocks'
maximisers at their allocated radii, put together: a point that already holds the best split of the radius found,
which the full search then refines.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..chains.engine import Evaluate, MonotoneAscent, run_chains
from ..chains.settings import ResolvedSearch
from ..features.move import TokenMove

# Radius levels per block: r^2 is shared out in units of r^2 / ALLOCATION_LEVELS. Measured on raf_mh12 at n = 8, 20
# bundled reviews, the zoo config's search against the best value of every run (512-1,024 chains): with 32 random
# chains per block and level, 2 levels gave 85-100% within 1% (two random streams); with 64, 2 levels gave 100% on one
# draw of reviews and maps and 85% on another, 4 levels 100% and 95%, at about twice the cost of 2
ALLOCATION_LEVELS = 4
# Random chains per block and level besides the block's structured starts and their negatives
ALLOCATION_RANDOM = 64
# Chains of the blocks' problems run together (bounds their memory: with every position of a long sample they would
# outnumber the search's own chains by far)
CHAIN_BATCH = 16


def radius_split_start(
    move: TokenMove,
    radius: float,
    settings: ResolvedSearch,
    draws: Tensor | None = None,
    levels: int = ALLOCATION_LEVELS,
) -> Tensor:
    """The best split of the radius among the blocks, as a start (T, B, P, 1, d) of norm <= radius.

    Args:
        move: a move with its blocks' algebra (`block_move`: G = T H problems (G, B, P, R, d_h), with their own
            starts and closed-form gradient), `split` cutting moves (T, B, P, R, d) into blocks and `merge` putting
            them back.
        radius: the ball's radius.
        settings: the search's; its ascent (lr, tol, window, max_steps of `MonotoneAscent`) runs every block and
            level.
        draws: (T, B, P, K, d) Gaussian draws: their blocks start K random chains per block and level besides the
            block's structured starts and their negatives; None: the structured starts only.
        levels: M, the grid of r^2.
    """
    inner, H = move.block_move, move.blocks
    if inner is None or inner.starts is None or inner.value_and_grad is None:
        raise ValueError("radius_split_start: the move's block_move must have its own starts and value_and_grad")
    starts = inner.starts  # (G, B, P, S, d_h) unit directions of each block's own problem
    if draws is not None:
        blocks = move.split(draws)  # (G, B, P, K, d_h)
        starts = torch.cat([starts, -starts, blocks / blocks.norm(dim=-1, keepdim=True).clamp_min(1e-30)], dim=3)
    G, B, P, S, dh = starts.shape
    T = G // H
    # one chain per (level, start): the block's problem at radius r sqrt(m/M) is the problem at radius r of the
    # scaled objective u -> f(s u), s = sqrt(m/M), which one MonotoneAscent with a single radius can run
    scale = torch.arange(1, levels + 1, dtype=starts.dtype, device=starts.device).div(levels).sqrt()  # (M,)
    scale = scale.repeat_interleave(S)[:, None]  # (M S, 1)
    u0 = starts.repeat(1, 1, 1, levels, 1) * radius  # (G, B, P, M S, d_h), level-major
    rule = MonotoneAscent(radius, settings.lr, settings.tol, settings.window)
    # CHAIN_BATCH chains a batch: the blocks' chains outnumber the search's own, and only their best point is kept
    runs = [
        run_chains(
            _scaled(inner.value_and_grad, scale[r0 : r0 + CHAIN_BATCH]),
            u0[:, :, :, r0 : r0 + CHAIN_BATCH],
            rule,
            settings.max_steps,
        )
        for r0 in range(0, levels * S, CHAIN_BATCH)
    ]
    value = torch.cat([c.best_f for c in runs], dim=3).reshape(G, B, P, levels, S)
    best, which = value.max(dim=-1)  # (G, B, P, M): g_h at each level, and the start that reached it
    x = torch.cat([c.best_x for c in runs], dim=3).reshape(G, B, P, levels, S, dh)
    x = x.gather(4, which[..., None, None].expand(-1, -1, -1, -1, 1, dh))[..., 0, :] * scale[::S, 0, None]
    g = torch.cat([torch.zeros_like(best[..., :1]), best], dim=-1)  # (G, B, P, M + 1), g_h(0) = 0
    level = _share_out(g.reshape(T, H, B, P, levels + 1))  # (T, H, B, P) levels per block, summing to <= M
    x = torch.cat([torch.zeros_like(x[..., :1, :]), x], dim=3)  # (G, B, P, M + 1, d_h)
    level = level.reshape(G, B, P)
    block = x.gather(3, level[..., None, None].expand(-1, -1, -1, 1, dh))  # (G, B, P, 1, d_h)
    return move.merge(block)  # (T, B, P, 1, d)


def _scaled(value_and_grad: Callable[[Tensor], tuple[Tensor, Tensor]], scale: Tensor) -> Evaluate:
    """The value f(scale u) of u (G, B, P, R, d_h), and its gradient in u; scale (R, 1) per chain."""

    def evaluate(u: Tensor) -> tuple[Tensor, Tensor]:
        f, g = value_and_grad(u * scale)
        return f, g * scale

    return evaluate


def _share_out(g: Tensor) -> Tensor:
    """The levels m_h (summing to at most M) that maximise sum_h g[h, m_h].

    By dynamic programming over the blocks: g (T, H, B, P, M + 1) -> m (T, H, B, P) long.
    """
    T, H, B, P, M1 = g.shape
    total = torch.zeros(T, B, P, M1, dtype=g.dtype, device=g.device)  # best sum of the blocks so far within budget k
    choices = []
    budget = torch.arange(M1, device=g.device)
    for h in range(H):
        # cand[..., k, m] = total[k - m] + g_h[m] for m <= k
        spent = budget[:, None] - budget[None, :]  # (k, m) -> k - m
        cand = total[..., spent.clamp_min(0)] + g[:, h, :, :, None, :]  # (T, B, P, M + 1, M + 1)
        cand = cand.masked_fill(spent < 0, -torch.inf)
        total, choice = cand.max(dim=-1)
        choices.append(choice)
    k = torch.full((T, B, P), M1 - 1, dtype=torch.long, device=g.device)
    level = torch.zeros(T, H, B, P, dtype=torch.long, device=g.device)
    for h in reversed(range(H)):
        m = choices[h].gather(-1, k[..., None])[..., 0]
        level[:, h] = m
        k = k - m
    return level
