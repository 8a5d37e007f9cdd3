"""The exact one-word substitution (docs/theory/words.md §13).

Of all the real words that could stand at position i, which moves phi(X) most, and which flip a linear head.

A map of this package reads layer-0 token embeddings, where replacing the word at position i changes row i only:
x_i -> h_w, the embedding of word w at position i (LayerNorm(E_w + P_i + T), at the rows' norm). So every
vocabulary word is one single-token move Delta_w = h_w - x_i, which the map's token-move algebra evaluates in closed
form (the generic path for any other module), for a chunk of words at once. The maximum over the admissible words is
then exact, not a search: the discrete word sensitivity

    S_words(X, i) = max_{w admissible} ||phi(X with x_i = h_w) - phi(X)|| / ||phi(X)||,

a lower bound of the continuous S of the same position whenever every ||h_w - x_i|| is within its radius (and a
number of its own otherwise: a real word may move the token further than sqrt(d)).

No Lightning import: plain maths, called by the evaluation and usable from a notebook.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Literal, cast

import torch
from torch import Tensor, nn

from ..base import validate
from ..chains.settings import DEFAULT_CHUNK_ELEMENTS
from ..features import map_dims
from ..features.forwards import weight_dtype
from ..features.generic_move import move_class_for, token_move
from ..features.move import TokenMove
from .best_words import best_words
from .result import SubstitutionResult
from .sensitivity import _device, working_dtype


def word_substitution(
    feature_map: nn.Module | Sequence[nn.Module],
    X: Tensor,
    positions: Sequence[int],
    candidates: Tensor,
    allowed: Tensor | None = None,
    heads: Tensor | None = None,
    dtype: Literal["float32", "float64"] | torch.dtype = "float64",
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    bias: Tensor | None = None,
    recheck: bool = True,
) -> SubstitutionResult:
    """For each sample and position, the exact maximum over admissible words of the relative change of phi(X).

    Also the word that attains it, its distance, and (given heads) how many words flip each head
    (docs/theory/words.md §13).

    Args:
        feature_map: one map, or a list of T maps (one per trial, X then (T, B, n, d)).
        X: (B, n, d) clean samples (rows as the map reads them, e.g. at norm sqrt(d)), or (T, B, n, d).
        positions: P token indices to substitute.
        candidates: the words' rows h_w at each position, (P, V, d), or (V, d) for the same rows at every position.
        allowed: the admissible words per sample and position (e.g. no special tokens, the original token's WordPiece
            continuation status, the tokenizer's round trip: `wslight.data.vocabulary.EncoderWords.admissible`), a bool
            (B, P, V) mask, or (T, B, P, V) with one per trial; None: all.
        heads: linear heads theta, (p, C) for one map or (T, p, C) for T maps (one set per trial); None: no flips.
            A head's output is phi^T theta_c + b_c; a word flips it when the sign of that output changes.
        dtype: working dtype; float64 (the default) makes the maximum exact to rounding.
        chunk_elements: working-dtype elements one chunk of words may hold (bounds the memory).
        bias: the heads' biases b, (C,) or (T, C) (a trained head's, e.g. `FeatureMapClassifier(bias=True)`); None:
            no bias (the paper's heads).
        recheck: where the words are evaluated below float64 (dtype float32, or a module whose weights are float32 on
            the generic path), evaluate again in float64 every word rounding could decide: those within `DOUBT` of the
            best relative change, and (with heads) those whose output lies within `DOUBT` of zero relative to its
            scale or of the strongest flip's. The best word, S_words and every flip then are float64's.

    Returns:
        SubstitutionResult.
    """
    trials = not isinstance(feature_map, nn.Module)
    maps: list[nn.Module] = list(cast(Sequence[nn.Module], feature_map)) if trials else [cast(nn.Module, feature_map)]
    if not maps:
        raise ValueError("feature_map: expected a map or a non-empty list of maps")
    d, n_map = map_dims(maps[0])
    T, dt, device = len(maps), working_dtype(maps[0], dtype), _device(maps[0])
    samples = X if trials else X[None]
    if not isinstance(samples, Tensor) or samples.dim() != 4 or samples.shape[0] != T:
        raise ValueError(f"X: expected ({T}, B, n, d) for {T} maps, got {tuple(X.shape)}")
    samples = validate.samples("X", samples.flatten(0, 1), d, n_map).reshape(samples.shape).to(device)
    _, B, n, _ = samples.shape
    pos = validate.positions("positions", list(positions), n)
    cand = _checked_candidates(candidates, len(pos), d)  # (P, V, d)
    ok = _checked_allowed(allowed, T, B, len(pos), cand.shape[1])  # (T, B, P, V)
    H = _checked_heads(heads, T, trials)  # (T, p, C) or None
    b = _checked_bias(bias, H, T)  # (T, C) or None
    move = token_move(maps, samples, pos, dt)
    per_word = move_class_for(maps).chain_elements(maps, B, n, d)[0]
    xi = samples[:, :, pos]
    if not recheck or not _below_float64(move, maps):
        res = _best_of(move, xi, cand, ok, H, per_word, chunk_elements, b)
    else:  # the words rounding could decide, again in float64
        move64 = token_move(_float64_maps(maps), samples, pos, torch.float64)
        sign0 = None if H is None else _clean_signs(move64, H, b)
        values: list[tuple[Tensor, Tensor | None]] = []
        res = _best_of(move, xi, cand, ok, H, per_word, chunk_elements, b, sign0, values=values)
        doubt = _in_doubt(values, move.phi0.double().norm(dim=-1), H, b).cpu() & ok
        exact = _best_of(move64, xi, cand, doubt, H, per_word, chunk_elements, b, sign0)
        res = _merged(res, exact, values, doubt)
    return res if trials else _first_trial(res)


def _best_of(
    move: TokenMove,
    xi: Tensor,
    cand: Tensor,
    ok: Tensor,
    heads: Tensor | None,
    per_word: int,
    chunk_elements: int,
    bias: Tensor | None,
    sign0: Tensor | None = None,
    values: list[tuple[Tensor, Tensor | None]] | None = None,
) -> SubstitutionResult:
    """`_best_words` over the words some sample may take only (a narrow mask costs its own size, not the list's).

    The words' indices it returns number the whole candidate list; `values`, when asked for, hold the whole list
    (-inf where no sample may take a word).
    """
    kept = ok.flatten(0, 2).any(dim=0).nonzero()[:, 0]  # (V',) indices into the candidates
    kept = kept if kept.numel() else torch.zeros(1, dtype=torch.long)  # none admissible: one word, masked for all
    part: list[tuple[Tensor, Tensor | None]] | None = [] if values is not None else None
    res = best_words(move, xi, cand[:, kept], ok[..., kept], heads, per_word, chunk_elements, bias, sign0, part)
    res.word = _original_index(res.word, kept)
    if res.flip_word is not None:
        res.flip_word = _original_index(res.flip_word, kept)
    if values is not None and part is not None:  # back onto the whole list
        f = torch.cat([v for v, _ in part], dim=-1)
        whole_f = f.new_full((*f.shape[:-1], cand.shape[1]), -math.inf)
        whole_f[..., kept.to(f.device)] = f
        outs = [o for _, o in part if o is not None]
        whole_o = None
        if outs:
            o = torch.cat(outs, dim=3)
            whole_o = o.new_full((*o.shape[:3], cand.shape[1], o.shape[-1]), -math.inf)
            whole_o[:, :, :, kept.to(o.device)] = o
        values.append((whole_f, whole_o))
    return res


# A float32 forward is good to about 1e-6 of the scale of its output (through a whole encoder: 2.4e-6 measured, docs/
# theory/maps.md §12.5); a word within 1e-4 of a decision (in units of ||phi(X)||, or of ||theta|| ||phi|| for an
# output) is evaluated again in float64.
DOUBT = 1e-4


def _below_float64(move: TokenMove, maps: list[nn.Module]) -> bool:
    """Whether the words' values come from arithmetic below float64 (the working dtype, or a generic map's weights)."""
    if move.dtype != torch.float64:
        return True
    return move.structure_blind and any(weight_dtype(m, torch.float64) != torch.float64 for m in maps)


def _float64_maps(maps: list[nn.Module]) -> list[nn.Module]:
    """The maps with float64 weights (copies of those that have others)."""
    return [m if weight_dtype(m, torch.float64) == torch.float64 else copy.deepcopy(m).double() for m in maps]


def _clean_signs(move64: TokenMove, heads: Tensor, bias: Tensor | None) -> Tensor:
    """(T, B, C) signs of the clean outputs phi(X)^T theta_c + b_c, in float64."""
    out = move64.phi0 @ heads.to(move64.phi0)  # (T, B, p) @ (T, p, C) -> (T, B, C)
    return torch.sign(out if bias is None else out + bias.to(out)[:, None])


def _in_doubt(
    values: list[tuple[Tensor, Tensor | None]], phi_norm: Tensor, heads: Tensor | None, bias: Tensor | None
) -> Tensor:
    """(T, B, P, V) bool: the words whose rank or flip float32 rounding could decide (see `recheck`)."""
    F = torch.cat([f for f, _ in values], dim=-1).double()  # (T, B, P, V), -inf where not allowed
    scale = phi_norm.to(F.device)[..., None, None]  # (T, B, 1, 1)
    S = F.clamp_min(0).sqrt() / scale
    S = torch.where(F.isfinite(), S, -math.inf)
    doubt = S >= S.max(dim=-1, keepdim=True).values - DOUBT
    if heads is not None:
        opp = torch.cat([o for _, o in values if o is not None], dim=3).double()  # (T, B, P, V, C)
        size = heads.double().norm(dim=1).to(opp.device)[:, None, None, None, :]  # (T, 1, 1, 1, C): ||theta_c||
        size = size * (scale[..., None] + F.clamp_min(0).sqrt()[..., None])  # >= |phi_w^T theta_c|
        if bias is not None:
            size = size + bias.double().abs().to(opp.device)[:, None, None, None, :]
        top = opp.masked_fill(opp <= 0, -math.inf).max(dim=3, keepdim=True).values  # the strongest flip's output
        near = (opp.abs() <= DOUBT * size) | ((opp >= top - DOUBT * size) & (opp > -DOUBT * size))
        doubt |= near.any(dim=-1)
    return doubt & F.isfinite()


def _merged(
    first: SubstitutionResult, exact: SubstitutionResult, values: list[tuple[Tensor, Tensor | None]], doubt: Tensor
) -> SubstitutionResult:
    """The float32 pass's sure words with the float64 values of the words in doubt (indices into the same list)."""
    first.ws, first.word, first.distance = exact.ws, exact.word, exact.distance  # the best word is among those in doubt
    if first.flips is None or exact.flips is None or exact.flip_word is None:
        return first
    opp = torch.cat([o for _, o in values if o is not None], dim=3).cpu()  # (T, B, P, V, C)
    sure = (opp > 0) & ~doubt.cpu()[..., None]  # flips that rounding cannot undo
    first.flips = sure.sum(dim=3) + exact.flips
    top, arg = opp.masked_fill(~sure, -math.inf).max(dim=3)
    fallback = torch.where(top > -math.inf, arg, -1)  # the strongest sure flip, where none in doubt flips
    first.flip_word = torch.where(exact.flip_word >= 0, exact.flip_word, fallback)
    return first


def _original_index(word: Tensor, kept: Tensor) -> Tensor:
    """Indices into the kept candidates back to indices into all of them (-1, no word, stays -1)."""
    return torch.where(word >= 0, kept.to(word.device)[word.clamp_min(0)], word)


def _first_trial(res: SubstitutionResult) -> SubstitutionResult:
    """The one map's result without the trial axis."""
    return SubstitutionResult(
        ws=res.ws[0],
        word=res.word[0],
        distance=res.distance[0],
        phi_norm=res.phi_norm[0],
        admissible=res.admissible[0],
        flips=None if res.flips is None else res.flips[0],
        flip_word=None if res.flip_word is None else res.flip_word[0],
    )


def _checked_candidates(candidates: Tensor, P: int, d: int) -> Tensor:
    if not isinstance(candidates, Tensor) or candidates.dim() not in (2, 3) or candidates.shape[-1] != d:
        shape = tuple(candidates.shape) if isinstance(candidates, Tensor) else type(candidates).__name__
        raise ValueError(f"candidates: expected (V, {d}) or ({P}, V, {d}) word rows, got {shape}")
    if candidates.dim() == 3 and candidates.shape[0] != P:
        raise ValueError(f"candidates: expected {P} position blocks (one per position), got {candidates.shape[0]}")
    if candidates.shape[-2] == 0:
        raise ValueError("candidates: no word rows")
    return candidates[None].expand(P, -1, -1) if candidates.dim() == 2 else candidates


def _checked_allowed(allowed: Tensor | None, T: int, B: int, P: int, V: int) -> Tensor:
    """The mask as (T, B, P, V); a (B, P, V) mask holds for every trial."""
    if allowed is None:
        return torch.ones(T, B, P, V, dtype=torch.bool)
    shapes = ((B, P, V), (T, B, P, V))
    if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool or tuple(allowed.shape) not in shapes:
        shape = tuple(allowed.shape) if isinstance(allowed, Tensor) else type(allowed).__name__
        raise ValueError(f"allowed: expected a ({B}, {P}, {V}) or ({T}, {B}, {P}, {V}) bool mask, got {shape}")
    return (allowed if allowed.dim() == 4 else allowed[None].expand(T, -1, -1, -1)).cpu()


def _checked_heads(heads: Tensor | None, T: int, trials: bool) -> Tensor | None:
    if heads is None:
        return None
    want = "(T, p, C)" if trials else "(p, C)"
    if not isinstance(heads, Tensor) or heads.dim() != (3 if trials else 2):
        shape = tuple(heads.shape) if isinstance(heads, Tensor) else type(heads).__name__
        raise ValueError(f"heads: expected {want}, got {shape}")
    H = heads if trials else heads[None]
    if H.shape[0] != T:
        raise ValueError(f"heads: expected one set of heads per map ({T}), got {H.shape[0]}")
    return H


def _checked_bias(bias: Tensor | None, heads: Tensor | None, T: int) -> Tensor | None:
    """The heads' biases as (T, C); a (C,) bias holds for every trial."""
    if bias is None:
        return None
    if heads is None:
        raise ValueError("bias: a bias needs heads, got heads=None")
    C = heads.shape[-1]
    if not isinstance(bias, Tensor) or tuple(bias.shape) not in ((C,), (T, C)):
        shape = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
        raise ValueError(f"bias: expected ({C},) or ({T}, {C}), one per head, got {shape}")
    return bias if bias.dim() == 2 else bias[None].expand(T, -1)
