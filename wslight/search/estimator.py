"""The word-sensitivity estimate of T trials x B samples, chunk by chunk of positions (docs/theory/search.md §4.2-4.3).

The positions (then the chains) are chunked for memory; each chunk's first round starts from `first_starts`, its
rounds run by `Rounds`; the best few chains of every chunk are kept, their S recomputed in float64, and the largest
reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..chains.ball import project_ball
from ..chains.engine import near_best
from ..features.move import TokenMove
from .batching import chunk_sizes, generic_chunk
from .first_round import first_starts
from .kept import candidate_values
from .result import WSResult
from .rounds import Rounds


@dataclass
class _Candidates:
    """The best chains of every chunk, FINAL_CANDIDATES each, (T, B, K...) per chunk, concatenated at the end.

    Their objective, Delta, position, S, ||phi(X)|| and bound factor (S and ||phi(X)|| stay NaN unless the algebra has
    an exact64), with every chain's best objective (T, B, P C) per chunk.
    """

    parts: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]]
    values: list[Tensor]

    def add(self, move: TokenMove, pos: list[int], radius: float, f: Tensor, delta: Tensor, j: Tensor) -> None:
        """Keep one chunk's candidates (f, delta, j: index into pos), with exact values where the move has them."""
        # Deviation: the ball is centred on the clean token; the authors centre it at the noisy start
        # x_i + 0.1 xi, so their ||Delta|| can reach about 1.1 sqrt(d) (docs/theory/checks.md §9.1); we keep
        # docs/theory/index.md §1.3's
        delta = project_ball(delta, radius)  # float32 may leave ||Delta|| a hair out
        ws, norm, factor = (torch.full(f.shape, math.nan, dtype=torch.float64) for _ in range(3))
        if move.exact64 is not None:  # every candidate in one call (DeepRF reads its weights once)
            ws, norm = move.exact64(delta, j)
        for k in range(f.shape[-1]):
            factors = move.bound_factors(j[..., k])
            if factors is not None:
                factor[..., k] = factors
        self.parts.append((f, delta, torch.tensor(pos)[j], ws, norm, factor))


def estimate(
    rounds: Rounds,
    positions: list[int],
    build: Callable[[list[int]], TokenMove],
    exact: Callable[[Tensor], Tensor] | None,
    X: Tensor,
    seeds: list[int],
    dt: torch.dtype,
    per_chain: int,
    per_pos: int,
    one_chunk: bool = False,
) -> WSResult:
    """Ascend every (trial, sample, position, chain) in rounds until each sample's best is tight.

    Args:
        rounds: the rounds of chains (settings, radius, start plan).
        positions: the token positions searched.
        build: positions -> the token-move algebra of the T trials for them.
        exact: (T, 2B, n, d) float64 -> (T, 2B, p) float64 features, for the final value when the algebra has
            no `exact64`.
        X: (T, B, n, d) samples on the maps' device.
        seeds: T restart seeds.
        dt: working dtype.
        per_chain: working memory, in elements, of one chain.
        per_pos: working memory, in elements, of one position of one trial.
        one_chunk: all positions in one chunk (the algebra draws its map for exactly these positions).
    """
    T, B, n, d = X.shape
    settings = rounds.settings
    pos_chunk, chain_chunk = chunk_sizes(settings, len(positions), T, B, per_chain, per_pos, one_chunk)
    steps = torch.zeros(T, B, dtype=torch.long)  # most steps of any chain
    kept = _Candidates([], [])
    for c0 in range(0, len(positions), pos_chunk):
        pos = positions[c0 : c0 + pos_chunk]
        move = build(pos)
        blind = move.structure_blind
        chunk = generic_chunk(settings.chunk_elements, T * B * len(pos) * per_chain) if blind else chain_chunk
        starts = first_starts(rounds, move, pos, seeds, dt, X, chunk)
        f_c, delta_c, j_c, steps_c, values_c = rounds.run(move, starts, pos, seeds, dt, chunk)
        kept.values.append(values_c)
        kept.add(move, pos, rounds.radius, f_c, delta_c, j_c)
        steps = torch.maximum(steps, steps_c)
    return _best(kept, exact, X, steps)


def _best(kept: _Candidates, exact: Callable[[Tensor], Tensor] | None, X: Tensor, steps: Tensor) -> WSResult:
    """The result of the candidate whose float64 value is largest, with the search's evidence."""
    d = X.shape[-1]
    f, delta, position, ws, phi_norm, factor = (torch.cat(parts, dim=2) for parts in zip(*kept.parts))
    if bool(ws.isnan().any()):
        ws, phi_norm = candidate_values(exact, X, position, delta)
    # the candidate whose float64 value is largest: a float32 objective can be off at a discontinuity of the map
    # (ReLU-RAF's row whose only positive score is ~0, docs/theory/search.md §4.3), so the reported S is the best of the
    # best few chains' exact values
    pick = torch.where(f.isfinite(), ws, -math.inf).argmax(dim=-1, keepdim=True)  # (T, B, 1)

    def chosen(t: Tensor) -> Tensor:
        return t.gather(2, pick if t.dim() == 3 else pick[..., None].expand(-1, -1, -1, d))[:, :, 0]

    best_delta = chosen(delta)
    every = torch.cat(kept.values, dim=-1)  # (T, B, chains at every position)
    delta_norm = best_delta.norm(dim=-1)
    factor_best = chosen(factor)
    return WSResult(
        ws=chosen(ws),
        position=chosen(position),
        delta=best_delta,
        delta_norm=delta_norm,
        phi_norm=chosen(phi_norm),
        steps=steps,
        chains=every.isfinite().sum(-1),
        near_best=near_best(every, chosen(f), squared=True),
        bound=None if factor_best.isnan().all() else factor_best * delta_norm / chosen(phi_norm),
    )
