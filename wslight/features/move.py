"""The token-move algebra: phi(X^i(Delta)) for trials x samples x positions x restarts at once (docs/theory/maps.md §3).

Both the word-sensitivity estimator and the Delta attack move one token of a sample, X^i(Delta) = X + e_i Delta^T,
and evaluate the features many times. A map family gives a `TokenMove` class (`FeatureMap.move_class`) that
precomputes what does not move (RF: z = V flat(X) and the token blocks V^(i); attention: the scores without key i) and
then costs far less than a full forward per evaluation; `TokenMove` declares what a family may offer besides (the
contract the engines read). Any other module gets `wslight.features.generic_move.GenericMove`: its full forward on the
perturbed samples, differentiated by autograd.

One axis order everywhere: Delta is (T, B, P, R, d) for T trials (one map each), B samples per trial, P token
positions and R chains (restarts) per sample and position; features come out as (T, B, P, R, p).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import Tensor, nn

from ..base.numerics import sum_last


class TokenMove:
    """The features of X (T, B, n, d) with token `positions[j]` moved by Delta, for T maps of one family.

    The contract between a map family and the engines that move one token (the word-sensitivity search, the exact
    word substitution, the Delta attack): every family gives `phi0` (T, B, p), the clean features in the working dtype,
    and `features`. Everything else is a capability, declared here with its default (None, False or the plain
    computation through `features`), so a family states what it offers by overriding a name of this class and the
    engines read these names only. What each capability buys is listed in docs/tasks/own_map.md.

    Capabilities:
        value_and_grad: (T, B, P, R, d) -> (`change_sq`, its gradient) in closed form, a method. None: autograd
            through `change_sq`. The search also takes ridge steps where it is None (see `ridges`).
        live_value_and_grad: (delta, live (T, B, P, R) bool) -> the value and gradient at the live chains only (-inf
            and 0 elsewhere), so stopped chains cost nothing; a method. None: every chain is evaluated.
        curvature_product: v (T, B, P, 1, d) -> H v, the Hessian of `change_sq` at Delta = 0 times v, in closed form;
            a method. None: by double backward.
        top_curvature: v (T, B, P, 1, d) -> the top eigenvector of that Hessian, exactly (e.g. RF's d x d Hessian);
            a method. None: power iteration.
        ridges: the closed form has kinks (ReLU layers): the search keeps its ridge steps on it.
        structure_blind: each evaluation is the map's whole forward (the generic path): the search adds the generic
            start plan (`wslight.search.start_plan.StartPlan`: the module's own and the row starts, homotopy and more
            random starts) and a polishing round.
        starts: (T, B, P, S, d) the family's own starting directions of the search (attracting, steering...).
        blocks, block_move, split, merge: a change that is the sum of `blocks` per-block changes, block h moved by
            block h of Delta only (multi-head attention): the search first shares the radius out among the blocks
            (`wslight.search.radius_split`).
        exact64: exact float64 values of candidate moves without a second full forward.
        bound_factors: the factors of a closed-form bound on S.
        select_trials, law_twin: the same algebra for some trials, or in another dtype.
        own_starts, row_starts: the starts read off the module itself (the generic path).
        change_sq, readout, change_sq_and_readout: cheaper closed forms of the plain computations through `features`.
    """

    phi0: Tensor
    # (T, B, P, S, d) unit directions the search tries after the curvature ones; None: none
    starts: Tensor | None = None
    # The closed-form value and gradient of `change_sq`, and the same at the live chains only (see the class docstring)
    value_and_grad: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None
    live_value_and_grad: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
    # The curvature at Delta = 0: H v in closed form, or its top eigenvector exactly
    curvature_product: Callable[[Tensor], Tensor] | None = None
    top_curvature: Callable[[Tensor], Tensor] | None = None
    ridges: bool = False
    structure_blind: bool = False

    @property
    def exact64(self) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None:
        """Exact float64 values of K candidate moves of every sample at once, without a second full forward, or None.

        (Delta (T, B, K, d) float64, index into positions (T, B, K)) -> (S (T, B, K), ||phi(X)|| (T, B, K)) float64. (A
        property, not a stored bound method: a token holding a method of itself would be a reference cycle, and its
        large tensors would wait for the garbage collector.)
        """
        return None

    @property
    def blocks(self) -> int:
        """How many blocks the change sums over (see `block_move`); 1: a single block."""
        return 1

    @property
    def block_move(self) -> TokenMove | None:
        """The blocks' own algebra of a change that sums over `blocks` blocks; None: the change does not split.

        T `blocks` problems of moves (T blocks, B, P, R, d_h), trial-major, with own `starts` and `value_and_grad`.
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

    def split(self, delta: Tensor) -> Tensor:
        """Cut moves (T, B, P, R, d) into the blocks of `block_move` (T blocks, B, P, R, d_h); one block: unchanged."""
        return delta

    def merge(self, delta: Tensor) -> Tensor:
        """Put blocks (T blocks, B, P, R, d_h) back together into moves (T, B, P, R, d), the inverse of `split`."""
        return delta

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
        """The factors c (T, B) float64 with S <= c ||Delta|| / ||phi(X)|| (docs/theory/maps.md §3.2).

        For a move of token positions[j[t, b]] of sample (t, b); None when the map has no such bound.
        """
        return None

    def own_starts(self) -> Tensor | None:
        """The module's own starting directions of the search, (T, B, P, k, d) unit vectors; None: none."""
        return None

    def row_starts(self, radius: float, draws: Tensor, lean: Tensor, removal: bool = True) -> Tensor | None:
        """Starts read off the maps' Jacobians rows, (T, B, P, S, d) unit vectors; None: none (see `GenericMove`)."""
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


def trial_selector(move: TokenMove) -> Callable[[Tensor], TokenMove | None]:
    """A selector idx (T',) -> the algebra of those trials (`select_trials`; the move itself for all of them).

    The last selection is kept: a search narrows its chains far more often than its trials, and a selection copies
    tensors.
    """
    last: dict = {}

    def select(idx: Tensor) -> TokenMove | None:
        if "idx" not in last or not torch.equal(last["idx"], idx):
            every = len(idx) == move.phi0.shape[0]
            last.update(idx=idx, move=move if every else move.select_trials(idx))
        return last["move"]

    return select


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
