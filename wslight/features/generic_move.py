"""The generic path of any module, and the choice between it and a family's closed form.

See docs/theory/maps.md §3, docs/theory/search.md §4.3.

`GenericMove` evaluates a moved token by the module's own forward (or its `token_moves`) and differentiates it by
autograd; `token_move` gives a family's own `TokenMove` where one serves all the maps, else this path.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..base.numerics import sum_last
from .forwards import double_forward, forward_in, weight_dtype
from .move import TokenMove
from .rows import (
    REMOVAL_ROWS,
    REMOVAL_SINGULAR,
    Moves,
    captured,
    evenly_spaced,
    forward_moves,
    read_rows,
    removal_mixes,
    row_directions,
    row_subspaces,
    token_mixes,
    unit,
)


class GenericMove(TokenMove):
    """Any module: its full forward on X + e_i Delta^T, differentiated by autograd (no closed form needed).

    A module may name its own starting directions for the word-sensitivity search with a method
    `search_starts(X, positions)`: X (B, n, d) in the module's dtype and the moved positions (P of them) ->
    (B, P, k, d), k directions per sample and position (their norm does not matter). The search starts a chain from
    each, at the ball's radius, besides its own starts (docs/theory/search.md §4.3). A module may also offer a cheaper
    forward of its moved samples, `token_moves(X, positions)`: X (B, n, d) in the module's dtype -> a callable
    (b (k,), j (k,), x (k, d)) -> (k, p), the output of sample b with token positions[j] moved by x, or None (e.g.
    `OneTokenAttention`); the values and gradients are then those of that function instead of the full forward.
    """

    structure_blind = True

    def __init__(self, maps: Sequence[nn.Module], X: Tensor, positions: list[int], dtype: torch.dtype) -> None:
        super().__init__(maps, X, positions, dtype)
        T, B, n, d = X.shape
        self.X = X
        self.onehot = torch.zeros(len(positions), n, 1, dtype=dtype, device=X.device)  # (P, n, 1)
        self.onehot[torch.arange(len(positions)), torch.tensor(positions)] = 1
        with torch.no_grad():
            self.phi0 = torch.stack([forward_in(m, X[t], dtype) for t, m in enumerate(self.maps)])  # (T, B, p)
            self.moves = [_token_moves(m, X[t], positions) for t, m in enumerate(self.maps)]

    def _moved(self, t: int, b: Tensor, j: Tensor, x: Tensor) -> Tensor:
        """Map t's output of sample b[k] with token positions[j[k]] moved by x[k]: (k,), (k,), (k, d) -> (k, p)."""
        moves = self.moves[t]
        if moves is not None:
            m = self.maps[t]
            return moves(b, j, x.to(weight_dtype(m, x.dtype))).to(self.dtype)
        # (k, n, d) + (k, n, 1) * (k, 1, d): token positions[j] of sample b moved, the rest clean
        Xp = self.X[t][b].to(x.dtype) + self.onehot[j] * x[:, None, :]
        return forward_in(self.maps[t], Xp, self.dtype)

    def features(self, delta: Tensor) -> Tensor:
        """phi(X^i(Delta)) by the maps' own forward, map t for trial t: (T, B, P, R, d) -> (T, B, P, R, p)."""
        T, B, P, R, d = delta.shape
        b = torch.arange(B, device=delta.device).repeat_interleave(P * R)  # the moves flat over (B, P, R)
        j = torch.arange(P, device=delta.device).repeat_interleave(R).repeat(B)
        out = [self._moved(t, b, j, delta[t].reshape(-1, d)).reshape(B, P, R, -1) for t in range(T)]
        return torch.stack(out)  # (T, B, P, R, p)

    def live_value_and_grad(self, delta: Tensor, live: Tensor) -> tuple[Tensor, Tensor]:
        """`change_sq` and its gradient at the chains `live` only: -inf and 0 at the others.

        delta (T, B, P, R, d), live (T, B, P, R) bool. Each map forwards only its live chains (a search's stopped
        chains cost nothing), and one backward serves every trial; a live chain's value and gradient are those of
        `change_sq` through `features` (the same arithmetic per chain, in a smaller batch).
        """
        T, B, P, R, d = delta.shape
        f = torch.full(live.shape, -math.inf, dtype=self.dtype, device=delta.device)
        g = torch.zeros_like(delta)
        flat = delta.detach().reshape(T, B * P * R, d)
        picks, leaves, values = [], [], []
        with torch.enable_grad():
            for t in range(len(self.maps)):
                idx = live[t].reshape(-1).nonzero()[:, 0]  # (k,) live chains of trial t, flat over (B, P, R)
                if len(idx) == 0:
                    continue
                b, j = idx // (P * R), idx // R % P
                x = flat[t, idx].requires_grad_(True)  # (k, d)
                values.append(sum_last((self._moved(t, b, j, x) - self.phi0[t][b]).pow(2)))  # (k,)
                picks.append((t, idx))
                leaves.append(x)
            if not leaves:
                return f, g
            grads = torch.autograd.grad(torch.cat(values).sum(), leaves)
        f_flat, g_flat = f.view(T, -1), g.view(T, -1, d)
        for (t, idx), value, grad in zip(picks, values, grads):
            f_flat[t, idx] = value.detach()
            g_flat[t, idx] = grad
        return f, g

    def select_trials(self, idx: Tensor) -> GenericMove:
        """The same algebra for the trials idx only (their maps and samples kept)."""
        move = GenericMove.__new__(GenericMove)
        TokenMove.__init__(move, [self.maps[i] for i in idx.tolist()], self.X, self.positions, self.dtype)
        idx = idx.to(self.X.device)
        move.X, move.onehot, move.phi0 = self.X[idx], self.onehot, self.phi0[idx]
        move.moves = [self.moves[i] for i in idx.tolist()]
        return move

    def own_starts(self) -> Tensor | None:
        """The modules' own starting directions (their `search_starts`), (T, B, P, k, d) unit vectors.

        None unless every module has them. Asked by the word-sensitivity search only (the attack and the substitution
        never start from them).
        """
        with torch.no_grad():
            return _own_starts(self.maps, self.X, self.positions, self.dtype)

    @torch.no_grad()
    def row_starts(self, radius: float, draws: Tensor, lean: Tensor, removal: bool = True) -> Tensor | None:
        """Starts read off the maps' Jacobians when their output has one d-row per token (docs/theory/search.md §4.3).

        The generic path's stand-in for an attention map's attracting and self-capture constructions, and removal
        starts: (T, B, P, S, d) unit directions. First the 4 `token_mixes` of the moved token and the attracting
        direction a, the sum of the row directions of `row_directions` (a = x_i/||x_i|| where they all vanish), then the
        4 points `captured` from each of them, then the `removal_mixes` of the moved token and +- the REMOVAL_SINGULAR
        top right-singular vectors (`row_subspaces`) of at most REMOVAL_ROWS of those rows (evenly spaced, the own row
        first): S = 8 + 2 REMOVAL_SINGULAR len(REMOVAL_ANGLES) min(n, REMOVAL_ROWS). None for any other output. Computed
        with float64 copies of the maps (through their `token_moves` where they have one, `float64_moves`).

        Args:
            radius: r.
            draws: (T, B, P, K, d) the power iterations' start vectors, K >= len(read_rows(n, i)).
            lean: (T, B, P, REMOVAL_ROWS REMOVAL_SINGULAR, d) the subspace iterations' start vectors.
            removal: False leaves the removal starts out (S = 8).
        """
        T, B, n, d = self.X.shape
        if self.phi0.shape[-1] != n * d or n < 2:
            return None
        out = []
        for t, m in enumerate(self.maps):
            moves = float64_moves(m)
            X64 = self.X[t].to(torch.float64)
            per_position = []
            for j, i in enumerate(self.positions):
                rows = read_rows(n, i)
                v0 = draws[t, :, j, : len(rows)].to(X64)
                dirs = row_directions(moves, X64, i, rows, radius, v0)  # (B, K, d)
                total = dirs.sum(dim=1)
                xi = unit(X64[:, i])
                attract = torch.where(total.norm(dim=-1, keepdim=True) > 0, unit(total), xi)
                mixes = token_mixes(X64[:, i], attract)  # (B, 4, d)
                starts = [mixes, captured(moves, X64, i, mixes, radius)]
                if removal:
                    leaning = evenly_spaced(rows, REMOVAL_ROWS)
                    v1 = lean[t, :, j, : len(leaning) * REMOVAL_SINGULAR].to(X64).unflatten(1, (len(leaning), -1))
                    tops = row_subspaces(moves, X64, i, leaning, radius, v1).flatten(1, 2)  # (B, K' s, d)
                    starts.append(removal_mixes(X64[:, i], torch.cat([tops, -tops], dim=1)))
                per_position.append(torch.cat(starts, dim=1))
            out.append(torch.stack(per_position, dim=1))  # (B, P, S, d)
        return torch.stack(out).to(self.dtype)


def _own_starts(maps: Sequence[nn.Module], X: Tensor, positions: list[int], dtype: torch.dtype) -> Tensor | None:
    if not all(callable(getattr(m, "search_starts", None)) for m in maps):
        return None
    T, B, n, d = X.shape
    out = []
    for t, m in enumerate(maps):
        s = m.search_starts(X[t].to(weight_dtype(m, X.dtype)), positions)  # type: ignore[operator]
        if not isinstance(s, Tensor) or s.dim() != 4 or s.shape[:2] != (B, len(positions)) or s.shape[3] != d:
            got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
            raise ValueError(f"search_starts: expected a ({B}, {len(positions)}, k, {d}) tensor, got {got}")
        norm = s.detach().norm(dim=-1)
        if not bool(norm.isfinite().all()) or bool((norm == 0).any()):
            raise ValueError("search_starts: every direction must be finite and non-zero (it is scaled to the radius)")
        out.append(s.to(device=X.device, dtype=dtype))
    if len({s.shape[2] for s in out}) > 1:
        raise ValueError(f"search_starts: every map must give as many directions, got {[s.shape[2] for s in out]}")
    return unit(torch.stack(out))


def _token_moves(m: nn.Module, X: Tensor, positions: list[int]) -> Callable[[Tensor, Tensor, Tensor], Tensor] | None:
    """The module's `token_moves` for its samples X (B, n, d) (see `GenericMove`), or None where it has none."""
    offer = getattr(m, "token_moves", None)
    return offer(X.to(weight_dtype(m, X.dtype)), positions) if callable(offer) else None


def float64_moves(feature_map: nn.Module) -> Moves:
    """The moved copies of a float64 copy of the map (`wslight.features.rows.Moves`).

    Through the map's `token_moves` where it offers one for the copies (one clean forward of them, then each move at
    the price of one token), else its full forward of every moved copy.
    """
    double = copy.deepcopy(feature_map).to(torch.float64)
    full = forward_moves(double_forward(double))

    def moves(X: Tensor, i: int) -> Callable[[Tensor], Tensor]:
        one = _token_moves(double, X, [i])
        if one is None:
            return full(X, i)
        b, j = torch.arange(len(X), device=X.device), torch.zeros(len(X), dtype=torch.long, device=X.device)
        return lambda delta: one(b, j, delta)

    return moves


def move_class_for(maps: Sequence[nn.Module]) -> type[TokenMove]:
    """The maps' own closed form when they share one, else the generic autograd path.

    They share one when the `move_class` of one map type `supports` all of them.
    """
    kinds = {type(m) for m in maps}
    cls = getattr(next(iter(kinds)), "move_class", None) if len(kinds) == 1 else None
    return cls if cls is not None and cls.supports(maps) else GenericMove


def token_move(maps: Sequence[nn.Module], X: Tensor, positions: list[int], dtype: torch.dtype) -> TokenMove:
    """The token-move algebra of T maps for X (T, B, n, d) with the tokens `positions` moved."""
    return move_class_for(maps)(maps, X, positions, dtype)


def float64_twin(move: TokenMove, X: Tensor) -> TokenMove:
    """The algebra of the same maps and samples X (T, B, n, d) in float64.

    For final values exact to float64 rounding after a search in a lower precision (the token itself when it is float64
    already).
    """
    if move.dtype == torch.float64:
        return move
    twin = move.law_twin(torch.float64)
    return twin if twin is not None else token_move(move.maps, X, move.positions, torch.float64)
