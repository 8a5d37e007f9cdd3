"""Exactly which candidate words flip a text classifier at each position of a text (docs/tasks/classifier.md).

A flip is a change of the argmax label. The clean prediction c0 is the argmax of the text's logits; a word's margin is
logit[c0] - max over c != c0 of logit[c] after the substitution (> 0: c0 kept, < 0: flipped). Every candidate of every
position of one text is one row of a batch of edited ids (the text's ids with one id changed, which the candidate set
has checked against the tokenizer), so a text's candidates run as a few large forwards.

Where the forwards run below float64, every word whose margin rounding could decide (within `DOUBT` of 0 or of the
position's lowest margin, relative to the logits' scale) is evaluated again in float64, and the clean prediction too,
so every flip, its count and the strongest word are float64's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .substitution import DOUBT


@dataclass
class PositionWords:
    """The candidates of one position, as ids the classifier reads.

    Attributes:
        token: the position's index among the text's tokens.
        ids: (K,) candidate ids (each checked: the edited text tokenises to the text's ids with this one changed).
        words: the K candidate words.
    """

    token: int
    ids: Tensor
    words: list[str]


@dataclass
class PositionVerdict:
    """What the candidates of one position do to the classifier.

    Attributes:
        checked: candidates evaluated exactly.
        flips: how many of them change the argmax label.
        best_word: the candidate with the lowest margin ('' when none was checked).
        best_margin: its margin (< 0: it flips; NaN when none was checked).
        flip_label: the label the best word gives where it flips, else -1.
        rechecked: candidates evaluated again in float64.
    """

    checked: int
    flips: int
    best_word: str
    best_margin: float
    flip_label: int
    rechecked: int

    @property
    def flipped(self) -> bool:
        """Whether some candidate flips the label."""
        return self.flips > 0


def margins(logits: Tensor, label: int) -> Tensor:
    """(B,) logit[label] - the largest other logit, of (B, C) logits."""
    others = logits.clone()
    others[:, label] = -math.inf
    return logits[:, label] - others.max(dim=1).values


@torch.no_grad()
def _forward(logits_of: Callable[[Tensor], Tensor], base: Tensor, tokens: Tensor, ids: Tensor, batch: int) -> Tensor:
    """(K, C) logits of the text `base` (T,) with token tokens[k] replaced by ids[k], in batches of `batch` rows."""
    out = []
    for a in range(0, len(ids), batch):
        rows = base.repeat(min(batch, len(ids) - a), 1)  # (b, T)
        rows[torch.arange(len(rows)), tokens[a : a + batch]] = ids[a : a + batch]
        out.append(logits_of(rows).double())  # (b, C)
    return torch.cat(out) if out else torch.zeros(0, 0, dtype=torch.float64)


@torch.no_grad()
def review_verdicts(
    logits_of: Callable[[Tensor], Tensor],
    ids: Tensor,
    candidates: list[PositionWords],
    batch: int = 64,
    logits64_of: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, list[PositionVerdict]]:
    """The clean logits of a text and, per position, what its candidates do.

    Args:
        logits_of: (B, T) ids -> (B, C) logits (the classifier in its working dtype).
        ids: (T,) the text's ids.
        candidates: per position, the candidates to check.
        batch: edited texts per forward.
        logits64_of: the same classifier in float64, to re-check the words rounding could decide (None: the
            working dtype is float64 already, or no re-check is asked).

    Returns:
        (C,) float64 clean logits (float64's where `logits64_of` is given) and one verdict per position.
    """
    clean = (logits64_of or logits_of)(ids[None])[0].double()  # (C,)
    label = int(clean.argmax())
    slices = _slices(candidates)
    tokens = torch.cat([torch.full((len(p.ids),), p.token) for p in candidates]) if candidates else ids[:0]
    flat = torch.cat([p.ids for p in candidates]) if candidates else ids[:0]
    logits = _forward(logits_of, ids, tokens, flat, batch)  # (K, C) float64
    m = margins(logits, label) if len(flat) else torch.zeros(0, dtype=torch.float64)
    doubt = torch.zeros(len(flat), dtype=torch.bool)
    if logits64_of is not None and len(flat):
        scale = 1.0 + float(clean.abs().max())
        lowest = torch.cat([m[s].min().expand(s.stop - s.start) for s in slices if s.stop > s.start])
        doubt = (m.abs() <= DOUBT * scale) | (m <= lowest + DOUBT * scale)
        if doubt.any():  # the words rounding could decide, again in float64
            logits[doubt] = _forward(logits64_of, ids, tokens[doubt], flat[doubt], batch)
            m = margins(logits, label)
    verdicts = []
    for p, s in zip(candidates, slices, strict=True):
        mp = m[s]
        if not len(mp):
            verdicts.append(PositionVerdict(0, 0, "", math.nan, -1, 0))
            continue
        best = int(mp.argmin())
        flip_label = int(logits[s][best].argmax()) if mp[best] < 0 else -1
        verdicts.append(
            PositionVerdict(
                len(mp), int((mp < 0).sum()), p.words[best], float(mp[best]), flip_label, int(doubt[s].sum())
            )
        )
    return clean, verdicts


def _slices(candidates: list[PositionWords]) -> list[slice]:
    out, a = [], 0
    for p in candidates:
        out.append(slice(a, a + len(p.ids)))
        a += len(p.ids)
    return out


def margin_gradients(logits_of_embeds: Callable[[Tensor], Tensor], embeds: Tensor, label: int) -> tuple[float, Tensor]:
    """The clean margin and its gradient with respect to every input embedding: (T, H) -> (float, (T, H)).

    The first-order screen of the whole vocabulary (`wslight.search.candidates.first_order_ranking`) reads it.
    """
    x = embeds.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        margin = margins(logits_of_embeds(x[None]), label)[0]
        (grad,) = torch.autograd.grad(margin, x)
    return float(margin.detach()), grad
