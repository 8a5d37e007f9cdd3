"""The token-move algebra: phi(X^i(Delta)) for trials x samples x positions x restarts at once (docs/theory.md §3).

Both the word-sensitivity estimator and the Delta attack move one token of a sample, X^i(Delta) = X + e_i Delta^T,
and evaluate the features many times. A map family gives a `TokenMove` class (`FeatureMap.move_class`) that
precomputes what does not move (RF: z = V flat(X) and the token blocks V^(i); attention: the scores without key i) and
then costs far less than a full forward per evaluation. Any other module gets `GenericMove`: its full forward on the
perturbed samples, differentiated by autograd.

One axis order everywhere: Delta is (T, B, P, R, d) for T trials (one map each), B samples per trial, P token
positions and R chains (restarts) per sample and position; features come out as (T, B, P, R, p).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import Tensor, nn

from ..base.numerics import sum_last
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


class TokenMove:
    """The features of X (T, B, n, d) with token `positions[j]` moved by Delta, for T maps of one family.

    Subclasses set `phi0` (T, B, p), the clean features in the working dtype, and implement `features`; they may
    override `change_sq` and `readout` with cheaper closed forms, and set `starts` (map-specific starting directions
    of the word-sensitivity search) and `exact64` (an exact float64 value without a second full forward).
    """

    phi0: Tensor
    # (T, B, P, S, d) unit directions the search tries after the curvature ones; None: none
    starts: Tensor | None = None

    @property
    def exact64(self) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None:
        """Exact float64 values of K candidate moves of every sample at once, without a second full forward, or None.

        (Delta (T, B, K, d) float64, index into positions (T, B, K)) -> (S (T, B, K), ||phi(X)|| (T, B, K)) float64. (A
        property, not a stored bound method: a token holding a method of itself would be a reference cycle, and its
        large tensors would wait for the garbage collector.)
        """
        return None

    def __init__(self, maps: Sequence[nn.Module], X: Tensor, positions: list[int], dtype: torch.dtype) -> None:
        self.maps, self.positions, self.dtype = list(maps), list(positions), dtype

    @classmethod
    def supports(cls, maps: Sequence[nn.Module]) -> bool:
        """Whether one instance can serve all these maps (e.g. the same activation)."""
        return True

    @classmethod
    def chain_elements(cls, maps: Sequence[nn.Module], B: int, n: int, d: int) -> tuple[int, int]:
        """Rough working memory, in elements, per chain and per position of one trial (sizes the search's chunks)."""
        p = _out_dim(maps[0], n)
        return 6 * (p + n * d), B * n * d

    def features(self, delta: Tensor) -> Tensor:
        """phi(X^i(Delta)): (T, B, P, R, d) -> (T, B, P, R, p)."""
        raise NotImplementedError

    def select_trials(self, idx: Tensor) -> TokenMove | None:
        """The same algebra restricted to the trials idx (long, (T',)), so a search can leave out its finished trials.

        None when the family cannot (then every trial is evaluated to the end).
        """
        return None

    def law_twin(self, dtype: torch.dtype) -> TokenMove | None:
        """The same algebra in another dtype, for maps drawn from their law (no module to rebuild it from).

        None otherwise.
        """
        return None

    def bound_factors(self, j: Tensor) -> Tensor | None:
        """The factors c (T, B) float64 with S <= c ||Delta|| / ||phi(X)|| (docs/theory.md §3.2).

        For a move of token positions[j[t, b]] of sample (t, b); None when the map has no such bound.
        """
        return None

    def change_sq(self, delta: Tensor) -> Tensor:
        """||phi(X^i(Delta)) - phi(X)||^2: (T, B, P, R, d) -> (T, B, P, R), thread-count invariant."""
        return self._change_sq_of(self.features(delta))

    def readout(self, delta: Tensor, H: Tensor) -> Tensor:
        """phi(X^i(Delta))^T h for C vectors h per sample: (T, B, P, R, d) and H (T, B, p, C) -> (T, B, P, R, C)."""
        return _readout_of(self.features(delta), H)

    def change_sq_and_readout(self, delta: Tensor, H: Tensor) -> tuple[Tensor, Tensor]:
        """`change_sq` and `readout` of the same moves.

        One forward serves both unless the family has its own closed forms (then it overrides this with the two calls).
        """
        feats = self.features(delta)
        return self._change_sq_of(feats), _readout_of(feats, H)

    def _change_sq_of(self, feats: Tensor) -> Tensor:
        return sum_last((feats - self.phi0[:, :, None, None]).pow(2))


def _readout_of(feats: Tensor, H: Tensor) -> Tensor:
    """Features (T, B, P, R, p) read out by H (T, B, p, C): (T, B, P, R, C)."""
    T, B, P, R, p = feats.shape
    return (feats.reshape(T, B, P * R, p) @ H).reshape(T, B, P, R, -1)  # (T, B, P R, p) @ (T, B, p, C)


def _out_dim(m: nn.Module, n: int) -> int:
    out_dim = getattr(m, "out_dim", None)
    return out_dim(n) if callable(out_dim) else n * cast(int, m.d)  # a map exposes d (the FeatureMap contract)


class GenericMove(TokenMove):
    """Any module: its full forward on X + e_i Delta^T, differentiated by autograd (no closed form needed).

    A module may name its own starting directions for the word-sensitivity search with a method
    `search_starts(X, positions)`: X (B, n, d) in the module's dtype and the moved positions (P of them) ->
    (B, P, k, d), k directions per sample and position (their norm does not matter). The search starts a chain from
    each, at the ball's radius, besides its own starts (docs/theory.md §4.3). A module may also offer a cheaper
    forward of its moved samples, `token_moves(X, positions)`: X (B, n, d) in the module's dtype -> a callable
    (b (k,), j (k,), x (k, d)) -> (k, p), the output of sample b with token positions[j] moved by x, or None (e.g.
    `OneTokenAttention`); the values and gradients are then those of that function instead of the full forward.
    """

    def __init__(self, maps: Sequence[nn.Module], X: Tensor, positions: list[int], dtype: torch.dtype) -> None:
        super().__init__(maps, X, positions, dtype)
        T, B, n, d = X.shape
        self.X = X
        self.onehot = torch.zeros(len(positions), n, 1, dtype=dtype, device=X.device)  # (P, n, 1)
        self.onehot[torch.arange(len(positions)), torch.tensor(positions)] = 1
        with torch.no_grad():
            self.phi0 = torch.stack([_forward(m, X[t], dtype) for t, m in enumerate(self.maps)])  # (T, B, p)
            self.moves = [_token_moves(m, X[t], positions) for t, m in enumerate(self.maps)]

    def _moved(self, t: int, b: Tensor, j: Tensor, x: Tensor) -> Tensor:
        """Map t's output of sample b[k] with token positions[j[k]] moved by x[k]: (k,), (k,), (k, d) -> (k, p)."""
        moves = self.moves[t]
        if moves is not None:
            m = self.maps[t]
            return moves(b, j, x.to(weight_dtype(m, x.dtype))).to(self.dtype)
        # (k, n, d) + (k, n, 1) * (k, 1, d): token positions[j] of sample b moved, the rest clean
        Xp = self.X[t][b].to(x.dtype) + self.onehot[j] * x[:, None, :]
        return _forward(self.maps[t], Xp, self.dtype)

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
        token = GenericMove.__new__(GenericMove)
        TokenMove.__init__(token, [self.maps[i] for i in idx.tolist()], self.X, self.positions, self.dtype)
        idx = idx.to(self.X.device)
        token.X, token.onehot, token.phi0 = self.X[idx], self.onehot, self.phi0[idx]
        token.moves = [self.moves[i] for i in idx.tolist()]
        return token

    def own_starts(self) -> Tensor | None:
        """The modules' own starting directions (their `search_starts`), (T, B, P, k, d) unit vectors.

        None unless every module has them. Asked by the word-sensitivity search only (the attack and the substitution
        never start from them).
        """
        with torch.no_grad():
            return _own_starts(self.maps, self.X, self.positions, self.dtype)

    @torch.no_grad()
    def row_starts(self, radius: float, draws: Tensor, lean: Tensor) -> Tensor | None:
        """Starts read off the maps' Jacobians when their output has one d-row per token (docs/theory.md §4.3).

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
                leaning = evenly_spaced(rows, REMOVAL_ROWS)
                v1 = lean[t, :, j, : len(leaning) * REMOVAL_SINGULAR].to(X64).unflatten(1, (len(leaning), -1))
                tops = row_subspaces(moves, X64, i, leaning, radius, v1).flatten(1, 2)  # (B, K' s, d)
                removal = removal_mixes(X64[:, i], torch.cat([tops, -tops], dim=1))
                per_position.append(torch.cat([mixes, captured(moves, X64, i, mixes, radius), removal], dim=1))
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


def _forward(m: nn.Module, X: Tensor, dtype: torch.dtype) -> Tensor:
    """m(X) computed in the map's own dtype, returned in `dtype`."""
    return m(X.to(weight_dtype(m, X.dtype))).to(dtype)


def weight_dtype(m: nn.Module, default: torch.dtype) -> torch.dtype:
    """The dtype a module computes in: its `weight_dtype`, else its first floating parameter or buffer, or `default`."""
    w = getattr(m, "weight_dtype", None)
    if isinstance(w, torch.dtype):
        return w
    t: Tensor | None = next((t for t in m.parameters() if t.is_floating_point()), None)
    t = t if t is not None else next((t for t in m.buffers() if t.is_floating_point()), None)
    return t.dtype if t is not None else default


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


def trial_selector(token: TokenMove) -> Callable[[Tensor], TokenMove | None]:
    """A selector idx (T',) -> the algebra of those trials (`select_trials`; the token itself for all of them).

    The last selection is kept: a search narrows its chains far more often than its trials, and a selection copies
    tensors.
    """
    last: dict = {}

    def select(idx: Tensor) -> TokenMove | None:
        if "idx" not in last or not torch.equal(last["idx"], idx):
            every = len(idx) == token.phi0.shape[0]
            last.update(idx=idx, token=token if every else token.select_trials(idx))
        return last["token"]

    return select


def float64_twin(token: TokenMove, X: Tensor) -> TokenMove:
    """The algebra of the same maps and samples X (T, B, n, d) in float64.

    For final values exact to float64 rounding after a search in a lower precision (the token itself when it is float64
    already).
    """
    if token.dtype == torch.float64:
        return token
    twin = token.law_twin(torch.float64)
    return twin if twin is not None else token_move(token.maps, X, token.positions, torch.float64)


@torch.no_grad()
def map_features(
    feature_map: nn.Module, X: Tensor, exact: bool = False, chunk: int = 256, out: Tensor | None = None
) -> Tensor:
    """phi(X) in float64, (M, n, d) -> (M, p), in chunks of samples.

    Args:
        feature_map: any map.
        X: (M, n, d) samples.
        exact: False: the map's own forward in its dtype, cast to float64 (the features the heads are fitted on);
            True: computed in float64 with the map's weights cast to float64 (`forward64`; the honest final value
            of an estimate).
        chunk: samples per forward pass.
        out: (M, p) float64 to write into (e.g. one trial's slice of a (T, M, p) stack: no second copy).
    """
    if exact:
        forward = getattr(feature_map, "forward64", None) or float64_forward(feature_map)
    else:
        forward = lambda x: _forward(feature_map, x, torch.float64)  # noqa: E731
    if out is None:
        return torch.cat([forward(X[s : s + chunk]) for s in range(0, X.shape[0], chunk)])
    for s in range(0, X.shape[0], chunk):
        out[s : s + chunk] = forward(X[s : s + chunk])
    return out


def trial_features(maps: Sequence[nn.Module], X: Tensor) -> Tensor:
    """phi(X[t]) by map t, float64 as `map_features`: (T, M, n, d) -> (T, M, p).

    Written in place (no stacking copy of what can be hundreds of MB).
    """
    first = map_features(maps[0], X[0])
    out = first.new_empty(len(maps), *first.shape)
    out[0] = first
    for t in range(1, len(maps)):
        map_features(maps[t], X[t], out=out[t])
    return out


def float64_forward(feature_map: nn.Module) -> Callable[[Tensor], Tensor]:
    """The forward of a float64 copy of the map (its weights cast): x -> phi(x) in float64."""
    return _forward64(copy.deepcopy(feature_map).to(torch.float64))


def _forward64(double: nn.Module) -> Callable[[Tensor], Tensor]:
    """The forward of a map already cast to float64: x -> double(x) in float64."""
    return lambda x: double(x.to(torch.float64))


def float64_moves(feature_map: nn.Module) -> Moves:
    """The moved copies of a float64 copy of the map (`wslight.features.rows.Moves`).

    Through the map's `token_moves` where it offers one for the copies (one clean forward of them, then each move at
    the price of one token), else its full forward of every moved copy.
    """
    double = copy.deepcopy(feature_map).to(torch.float64)
    full = forward_moves(_forward64(double))

    def moves(X: Tensor, i: int) -> Callable[[Tensor], Tensor]:
        one = _token_moves(double, X, [i])
        if one is None:
            return full(X, i)
        b, j = torch.arange(len(X), device=X.device), torch.zeros(len(X), dtype=torch.long, device=X.device)
        return lambda delta: one(b, j, delta)

    return moves


def matmul64(h: Tensor, V: Tensor, rows: int = 2048) -> Tensor:
    """The product h @ V^T in float64 without a float64 copy of the whole V: (B, fan_in), (out, fan_in) -> (B, out)."""
    return torch.cat([h @ V[s : s + rows].to(torch.float64).T for s in range(0, V.shape[0], rows)], dim=1)


def stack_trials(tensors: list[Tensor]) -> Tensor:
    """Stack one tensor per trial on a new first axis; a single trial is a view (no copy of a large weight)."""
    return tensors[0][None] if len(tensors) == 1 else torch.stack(tensors)


def per_trial(h: Tensor, W: Tensor) -> Tensor:
    """h[t] @ W[t] for every trial: (T, ..., a) and (T, a, b) -> (T, ..., b).

    One trial is a plain matmul (the exact computation of a single map); several go through one bmm, never
    broadcasting W over the batch dimensions (which would copy it).
    """
    if W.shape[0] == 1:
        return (h[0] @ W[0])[None]
    T = h.shape[0]
    return torch.bmm(h.reshape(T, -1, h.shape[-1]), W).reshape(*h.shape[:-1], W.shape[-1])
