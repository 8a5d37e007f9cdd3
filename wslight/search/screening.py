"""Screening the vocabulary before the exact substitution: the words most likely to flip a head.

See docs/theory/words.md §13.5.

The exact check of one word costs one forward of the map; through a whole pre-trained encoder on a CPU the whole
admissible vocabulary at one position takes minutes. A screen ranks every word at the cost of a few forwards and
backwards. With f(X) = phi(X)^T theta + b, it expands f to first order at a few anchor rows a_0..a_C for token i
(a_0 = x_i, the clean row; a_1..a_C the centroids of a k-means clustering of the words' rows at i) and predicts
each word's output from the anchor nearest to its row:

    f(X with x_i = h_w) ~ f(X with x_i = a) + g_a^T (h_w - a),   g_a = df/dx_i at x_i = a,   a nearest to h_w.

With no centroids (C = 0) this is the plain first-order screen around the clean review. A single expansion
misses the words whose flip lies in a region of the vocabulary where the clean gradient says nothing: a position
with one or two flipping words among thousands; expanding at the centroid of each region finds most of them (the
measured recall of both is on the results page real_classifier.md).

The words whose predicted output lies furthest on the other side of zero come first. The screen only chooses which
words are checked: `word_substitution` then evaluates each kept word exactly, so every flip reported is a real one,
and what the screen can cost is recall (flipping words it did not keep), which a run measures against the exact
enumeration on a subset of its positions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..base import validate
from ..features.forwards import weight_dtype

CENTROID_SEED = 0  # the k-means start is drawn from its own generator: the same words give the same anchors
CENTROID_ITERATIONS = 8
# The default expansion points besides the clean review (docs/theory/words.md §13.5). 64: on the real classifier at
# n = 128, over the whole vocabulary at 78 positions the screen was not tuned on, 64 centroids found 31 of the 32
# flipped positions and 16 found 28 (docs/results/gpu_words.md).
SCREEN_CENTROIDS = 64


def word_centroids(rows: Tensor, count: int) -> Tensor:
    """(count, d) float64 centroids of `rows` (V, d): Lloyd's k-means from `count` rows drawn with a fixed seed.

    A cluster that empties keeps its previous centre. With count >= V every row is its own centroid.
    """
    points = rows.double()
    if count >= len(points):
        return points.clone()
    generator = torch.Generator().manual_seed(CENTROID_SEED)
    centres = points[torch.randperm(len(points), generator=generator)[:count].to(points.device)].clone()
    for _ in range(CENTROID_ITERATIONS):
        nearest = torch.cdist(points, centres).argmin(1)  # (V,)
        sums = torch.zeros_like(centres).index_add_(0, nearest, points)
        sizes = torch.bincount(nearest, minlength=count)[:, None]
        centres = torch.where(sizes > 0, sums / sizes.clamp(min=1), centres)
    return centres


def expansions(
    feature_map: nn.Module, X: Tensor, position: int, anchors: Tensor, theta: Tensor, bias: float = 0.0
) -> tuple[Tensor, Tensor]:
    """The head's output with each anchor at `position`, and its gradient there, in one batched forward and backward.

    The map runs in its own dtype (a float32 module that does not cast its input is differentiated in float32); the
    outputs and gradients are read out in float64.

    Args:
        feature_map: the map phi, (A, n, d) -> (A, p).
        X: (1, n, d) the clean review.
        position: the token i replaced.
        anchors: (A, d) the rows placed at i.
        theta: (p,) the head.
        bias: the head's bias b.

    Returns:
        (A,) float64 outputs f(X with x_i = a) and (A, d) float64 gradients df/dx_i there.
    """
    dtype = weight_dtype(feature_map, X.dtype)
    x = X.detach().to(dtype).repeat(len(anchors), 1, 1)
    x[:, position] = anchors.to(device=x.device, dtype=dtype)
    x.requires_grad_(True)
    with torch.enable_grad():
        out = feature_map(x).reshape(len(anchors), -1).double() @ theta.double() + bias  # (A,)
        (grad,) = torch.autograd.grad(out.sum(), x)  # each output depends on its own sample only
    return out.detach(), grad[:, position].double()


def first_order_outputs(
    feature_map: nn.Module,
    X: Tensor,
    position: int,
    rows: Tensor,
    theta: Tensor,
    bias: float = 0.0,
    centroids: int = 0,
    allowed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The head's clean output and the screen's prediction of its output for every candidate word at `position`.

    Args:
        feature_map: the map phi, (A, n, d) -> (A, p).
        X: (1, n, d) the clean review.
        position: the token i replaced.
        rows: (V, d) the words' rows h_w at that position.
        theta: (p,) the head.
        bias: the head's bias b.
        centroids: C, the k-means centroids of the words' rows added to the clean row as expansion points (0: the
            plain first-order prediction f(X) + g^T (h_w - x_i)).
        allowed: (V,) bool, the words the centroids are drawn from (None: all of them).

    Returns:
        f(X) (a 0-dim float64 tensor) and (V,) float64 predictions f(a) + g_a^T (h_w - a), a the anchor nearest h_w.
    """
    centroids = validate.integer("centroids", centroids, low=0)
    rows64 = rows.double().to(X.device)
    anchors = X[0, position].detach().double()[None]  # (1, d): a_0 = x_i
    if centroids:
        pool = rows64 if allowed is None else rows64[allowed.to(rows64.device)]
        anchors = torch.cat([anchors, word_centroids(pool, centroids)])
    outputs, grads = expansions(feature_map, X, position, anchors, theta, bias)
    anchors = anchors.to(grads)
    nearest = torch.cdist(rows64, anchors).argmin(1) if len(anchors) > 1 else torch.zeros(len(rows64), dtype=torch.long)
    nearest = nearest.to(grads.device)
    moves = rows64.to(grads) - anchors[nearest]  # (V, d)
    return outputs[0], outputs[nearest] + (moves * grads[nearest]).sum(1)


def screened_words(
    feature_map: nn.Module,
    X: Tensor,
    position: int,
    rows: Tensor,
    allowed: Tensor,
    theta: Tensor,
    bias: float,
    keep: int,
    centroids: int = SCREEN_CENTROIDS,
) -> Tensor:
    """(V,) bool: the `keep` admissible words whose predicted output lies furthest beyond zero from f(X)'s side.

    Args:
        feature_map: the map phi, (A, n, d) -> (A, p).
        X: (1, n, d) the clean review.
        position: the token i replaced.
        rows: (V, d) the words' rows h_w at that position.
        allowed: (V,) bool, the admissible words.
        theta: (p,) the head.
        bias: the head's bias b.
        keep: how many words to keep (all the admissible ones where there are fewer).
        centroids: expansion points besides the clean row (`first_order_outputs`); each costs one forward and backward.
    """
    keep = validate.positive_int("keep", keep)
    clean, predicted = first_order_outputs(feature_map, X, position, rows, theta, bias, centroids, allowed)
    allowed = allowed.to(predicted.device)
    toward = torch.where(allowed, -torch.sign(clean) * predicted, -torch.inf)  # > 0: predicted to flip
    k = min(keep, int(allowed.sum()))
    out = torch.zeros_like(allowed)
    out[toward.topk(k).indices] = True
    return out
