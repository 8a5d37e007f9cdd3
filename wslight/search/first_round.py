"""The first round's starting points of the word-sensitivity search (docs/theory/search.md §4.3).

+- the top curvature direction, the radius shared out among blocks, the map's own constructions, then random ones; on
the generic path (a structure-blind move) also the module's own starts, the row starts, the homotopy starts and more
random ones, as the `StartPlan` says. Every capability is read by its declared name on `TokenMove`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..features.move import TokenMove
from ..features.rows import REMOVAL_ROWS, REMOVAL_SINGULAR, ROW_LIMIT, unit
from .radius_split import ALLOCATION_RANDOM, radius_split_start
from .rounds import Rounds
from .starts import seeded_draws, top_curvature


def first_starts(
    rounds: Rounds, move: TokenMove, pos: list[int], seeds: list[int], dt: torch.dtype, X: Tensor, chain_chunk: int = 64
) -> Tensor:
    """The first round's starting points on the sphere, (T, B, P, chains_per_round, d) (generic path: more).

    +- the top curvature direction, the map's own constructions, then random ones; on the generic path, after these,
    every direction of the module's `search_starts`, the row starts (`GenericMove.row_starts`), the homotopy starts
    and (generic_first_round - 1) x chains_per_round more random ones. One stream per trial and position (a chain
    does not depend on the chunking or the other trials). X (T, B, n, d) the samples; chain_chunk: chains run
    together by the homotopy starts.
    """
    settings, plan = rounds.settings, rounds.plan
    R = settings.chains_per_round
    B, d = X.shape[1], X.shape[3]
    draws = seeded_draws(seeds, pos, B, R + 1, d).to(device=X.device, dtype=dt)  # (T, B, P, R + 1, d)
    if move.top_curvature is not None and settings.power_iters > 0:  # e.g. RF: the d x d Hessian in closed form
        top = move.top_curvature(draws[:, :, :, :1])  # (T, B, P, 1, d)
    else:  # e.g. attention: H v in closed form (`curvature_product`), else by double backward
        top = top_curvature(move.change_sq, draws[:, :, :, :1], settings.power_iters, move.curvature_product)
    none = top.new_zeros(*top.shape[:3], 0, top.shape[-1])
    own = move.starts if move.starts is not None else none
    if move.block_move is not None and R > 2:
        # a change that sums over blocks (multi-head): first the best split of the radius among them (§12.1)
        rand = seeded_draws(seeds, pos, B, ALLOCATION_RANDOM, d, "split").to(device=X.device, dtype=dt)
        split = radius_split_start(move, rounds.radius, settings, rand)
        own = torch.cat([unit(split).to(own.dtype), own], dim=3)
    struct = torch.cat([top, -top, own.to(dt)], dim=3)[:, :, :, :R]  # (T, B, P, S, d)
    rand = draws[:, :, :, 1 : 1 + R - struct.shape[3]]
    usual = torch.cat([struct, unit(rand)], dim=3)
    if move.structure_blind:  # the module's `search_starts` (all), row, homotopy, more random starts
        mine = move.own_starts()
        mine = mine if mine is not None else none
        n = X.shape[2]
        power = seeded_draws(seeds, pos, B, min(n, ROW_LIMIT + 1), d, "rows").to(X.device)
        lean = seeded_draws(seeds, pos, B, REMOVAL_ROWS * REMOVAL_SINGULAR, d, "removal").to(X.device)
        rows = move.row_starts(rounds.radius, power, lean, plan.removal_starts) if plan.row_starts else None
        rows = rows if rows is not None else none
        extra = seeded_draws(seeds, pos, B, (plan.generic_first_round - 1) * R, d, "generic")
        homotopy = _homotopy_starts(rounds, move, pos, seeds, dt, X, chain_chunk)
        usual = torch.cat([usual, mine.to(usual), rows.to(usual), homotopy.to(usual), unit(extra).to(usual)], dim=3)
    return usual * rounds.radius


def _homotopy_starts(
    rounds: Rounds, move: TokenMove, pos: list[int], seeds: list[int], dt: torch.dtype, X: Tensor, chain_chunk: int
) -> Tensor:
    """Unit directions (T, B, P, len(homotopy_scales), d) from chains on larger balls.

    For each scale s of the plan, the best point of `homotopy_chains` random chains climbing the objective on the ball
    of radius s r (plain steps), scaled to norm 1.

    A measured heuristic, not a guarantee: in high dimension random chains on the ball of radius r rarely reach
    the basins that the attention maps' own starts aim at (the attracting direction, docs/theory/maps.md §3.5), and
    the best points of larger balls, brought back to radius r, start closer to them (docs/theory/search.md §4.3).
    """
    T, B, _, d = X.shape
    scales, per_ball = rounds.plan.homotopy_scales, rounds.plan.homotopy_chains
    K = len(scales)
    if K == 0:
        return torch.zeros(T, B, len(pos), 0, d, dtype=dt, device=X.device)
    draws = [seeded_draws(seeds, pos, B, per_ball, d, "homotopy", k) for k in range(K)]
    radius = (torch.tensor(scales, dtype=dt, device=X.device).repeat_interleave(per_ball) * rounds.radius)[:, None]
    # (K per_ball, 1): each chain on its scale's ball
    starts = unit(torch.cat(draws, dim=3)).to(device=X.device, dtype=dt) * radius
    # every ball's chains in one round (its chains are independent: the same paths as one round per ball)
    f, x, _ = rounds.round(move, starts, chain_chunk, radius)
    best = f.unflatten(3, (K, per_ball)).argmax(dim=-1).to(x.device)  # (T, B, P, K)
    best += torch.arange(K, device=x.device) * per_ball
    return unit(x.gather(3, best[..., None].expand(*best.shape, d)))
