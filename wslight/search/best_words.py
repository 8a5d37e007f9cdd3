"""The exact best words over chunks of candidate rows, given a token-move algebra (docs/theory/words.md §13).

Every admissible word of a chunk is one move of the token, evaluated at once by the map's algebra; the largest change
and, with linear heads, the words that flip each head are kept across the chunks.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..chains.settings import DEFAULT_CHUNK_ELEMENTS
from ..features.move import TokenMove
from .result import SubstitutionResult


def best_words(
    move: TokenMove,
    xi: Tensor,
    candidates: Tensor,
    allowed: Tensor,
    heads: Tensor | None,
    per_word: int,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    bias: Tensor | None = None,
    sign0: Tensor | None = None,
    values: list[tuple[Tensor, Tensor | None]] | None = None,
) -> SubstitutionResult:
    """The exact best words over chunks of candidate rows, given the token-move algebra (checked arguments).

    Args:
        move: the algebra of T maps for X (T, B, n, d) with the P positions moved, in the working dtype.
        xi: (T, B, P, d) the clean rows at those positions.
        candidates: (P, V, d) the words' rows.
        allowed: (T, B, P, V) bool.
        heads: (T, p, C) or None.
        per_word: working elements one word's move takes per sample and position (sizes the chunks).
        chunk_elements: working-dtype elements one chunk of words may hold.
        bias: (T, C) the heads' biases, or None.
        sign0: (T, B, C) the signs of the clean outputs, when known more precisely than the working dtype gives them.
        values: a list that, when given, receives each chunk's change_sq (T, B, P, R) and the heads' opposite outputs
            (T, B, P, R, C) (> 0 where the word flips a head), -inf where a word is not allowed.

    Returns:
        SubstitutionResult with the trial axis.
    """
    T, B, P, d = xi.shape
    V = candidates.shape[1]
    dt, device = move.phi0.dtype, move.phi0.device
    xi = xi.to(device=device, dtype=dt)
    phi_norm = move.phi0.norm(dim=-1)  # (T, B)
    if heads is not None:
        Hb, b, sign = _heads_read(move, heads, bias, sign0)
    chunk = max(1, chunk_elements // max(1, T * B * P * (per_word + d)))
    best = torch.full((T, B, P), -math.inf, dtype=dt, device=device)
    word = torch.full((T, B, P), -1, dtype=torch.long, device=device)
    C = 0 if heads is None else heads.shape[-1]
    flips = torch.zeros(T, B, P, C, dtype=torch.long, device=device)
    flip_word = torch.full((T, B, P, C), -1, dtype=torch.long, device=device)
    flip_out = torch.full((T, B, P, C), -math.inf, dtype=dt, device=device)  # the largest opposite output
    with torch.no_grad():
        for v0 in range(0, V, chunk):
            rows = candidates[:, v0 : v0 + chunk].to(device=device, dtype=dt)  # (P, R, d)
            delta = rows[None, None] - xi[:, :, :, None]  # (T, B, P, R, d): the moves to every word of the chunk
            mask = allowed[:, :, :, v0 : v0 + chunk].to(device)  # (T, B, P, R)
            if heads is None:
                f = move.change_sq(delta)
                if values is not None:
                    values.append((f.masked_fill(~mask, -math.inf), None))
            else:  # one forward serves the change and the heads' outputs where the map has no closed forms
                f, out = move.change_sq_and_readout(delta, Hb)  # (T, B, P, R), (T, B, P, R, C)
            f = f.masked_fill(~mask, -math.inf)  # (T, B, P, R)
            top, arg = f.max(dim=-1)
            better = top > best
            best = torch.where(better, top, best)
            word = torch.where(better, arg + v0, word)
            if heads is not None:
                out = (out + b[:, :, None, None]) * -sign[:, :, None, None]  # > 0 where the word flips the head
                flipped = (out > 0) & mask[..., None]
                if values is not None:
                    values.append((f, out.masked_fill(~mask[..., None], -math.inf)))
                flips = flips + flipped.sum(dim=3)
                top_out, arg_out = out.masked_fill(~flipped, -math.inf).max(dim=3)  # (T, B, P, C)
                take = top_out > flip_out
                flip_out = torch.where(take, top_out, flip_out)
                flip_word = torch.where(take, arg_out + v0, flip_word)
    flip_result = None if heads is None else (flips.cpu(), flip_word.cpu())
    return _words_result(best, word, xi, candidates, phi_norm, allowed, flip_result)


def _heads_read(
    move: TokenMove, heads: Tensor, bias: Tensor | None, sign0: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The heads (T, B, p, C), their biases (T, 1, C) and the clean outputs' signs (T, B, C), in the working dtype."""
    T, B, p = move.phi0.shape
    dt, device = move.phi0.dtype, move.phi0.device
    if heads.shape[1] != p:
        raise ValueError(f"heads: expected {p} features per head, got {heads.shape[1]}")
    Hb = heads.to(device=device, dtype=dt)[:, None].expand(-1, B, -1, -1)  # (T, B, p, C)
    b = torch.zeros(T, heads.shape[-1]) if bias is None else bias
    b = b.to(device=device, dtype=dt)[:, None]  # (T, 1, C)
    if sign0 is None:
        sign0 = torch.sign((move.phi0[:, :, None, :] @ Hb)[:, :, 0] + b)  # (T, B, C)
    return Hb, b, sign0.to(device=device, dtype=dt)


def _words_result(
    best: Tensor,
    word: Tensor,
    xi: Tensor,
    candidates: Tensor,
    phi_norm: Tensor,
    allowed: Tensor,
    flipped: tuple[Tensor, Tensor] | None,
) -> SubstitutionResult:
    """The result of the best words `word` (T, B, P) (-1: none admissible) and their change_sq `best`."""
    P, d = xi.shape[2], xi.shape[3]
    found = word >= 0
    ws = torch.where(found, best.clamp_min(0).sqrt() / phi_norm[..., None], math.nan)
    cand = candidates.to(device=xi.device, dtype=xi.dtype)
    chosen = cand[torch.arange(P, device=xi.device), word.clamp_min(0)]  # (T, B, P, d)
    distance = torch.where(found, (chosen - xi).norm(dim=-1) / math.sqrt(d), math.nan)
    return SubstitutionResult(
        ws=ws.double().cpu(),
        word=word.cpu(),
        distance=distance.double().cpu(),
        phi_norm=phi_norm.double().cpu(),
        admissible=allowed.sum(-1).cpu(),
        flips=None if flipped is None else flipped[0],
        flip_word=None if flipped is None else flipped[1],
    )
