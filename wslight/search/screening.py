"""Screening the vocabulary before the exact substitution: the words most likely to flip a head (docs/theory.md §13.5).

The exact check of one word costs one forward of the map; through a whole pre-trained encoder on a CPU the whole
admissible vocabulary at one position takes minutes. A first-order screen ranks every word at the cost of one forward
and one backward: with f(X) = phi(X)^T theta + b and g = df/dx_i at the clean review,

    f(X with x_i = h_w) ~ f(X) + g^T (h_w - x_i),

and the words whose predicted output lies furthest on the other side of zero come first. The screen only chooses which
words are checked: `word_substitution` then evaluates each kept word exactly, so every flip reported is a real one,
and what the screen can cost is recall (flipping words it did not keep), which a run measures against the exact
enumeration on a subset of its positions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..base import validate
from ..features.move import weight_dtype


def first_order_outputs(
    feature_map: nn.Module, X: Tensor, position: int, rows: Tensor, theta: Tensor, bias: float = 0.0
) -> tuple[Tensor, Tensor]:
    """The head's clean output and its first-order prediction for every candidate word at `position`.

    Args:
        feature_map: the map phi, (1, n, d) -> (1, p).
        X: (1, n, d) the clean review.
        position: the token i replaced.
        rows: (V, d) the words' rows h_w at that position.
        theta: (p,) the head.
        bias: the head's bias b.

    Returns:
        f(X) (a 0-dim float64 tensor) and (V,) float64 predictions f(X) + g^T (h_w - x_i).
    """
    x = X.detach().to(weight_dtype(feature_map, X.dtype)).clone().requires_grad_(True)  # the map's own dtype
    with torch.enable_grad():
        out = feature_map(x).reshape(-1).double() @ theta.double() + bias
        (grad,) = torch.autograd.grad(out, x)
    g = grad[0, position].double()  # (d,)
    move = rows.to(device=g.device, dtype=torch.float64) - x[0, position].detach().double()  # (V, d)
    return out.detach().double(), out.detach().double() + move @ g


def screened_words(
    feature_map: nn.Module,
    X: Tensor,
    position: int,
    rows: Tensor,
    allowed: Tensor,
    theta: Tensor,
    bias: float,
    keep: int,
) -> Tensor:
    """(V,) bool: the `keep` admissible words whose first-order output lies furthest beyond zero from f(X)'s side.

    Args:
        feature_map: the map phi, (1, n, d) -> (1, p).
        X: (1, n, d) the clean review.
        position: the token i replaced.
        rows: (V, d) the words' rows h_w at that position.
        allowed: (V,) bool, the admissible words.
        theta: (p,) the head.
        bias: the head's bias b.
        keep: how many words to keep (all the admissible ones where there are fewer).
    """
    keep = validate.positive_int("keep", keep)
    clean, predicted = first_order_outputs(feature_map, X, position, rows, theta, bias)
    allowed = allowed.to(predicted.device)
    toward = torch.where(allowed, -torch.sign(clean) * predicted, -torch.inf)  # > 0: predicted to flip
    k = min(keep, int(allowed.sum()))
    out = torch.zeros_like(allowed)
    out[toward.topk(k).indices] = True
    return out
