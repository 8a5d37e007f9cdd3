"""The first-order screen of the vocabulary (docs/theory/words.md §13.5)."""

import pytest
import torch

from wslight.features import RandomAttentionFeatures
from wslight.search.screening import SCREEN_CENTROIDS, first_order_outputs, screened_words, word_centroids


def _setup(n=6, d=16, V=40):
    g = torch.Generator().manual_seed(0)
    phi = RandomAttentionFeatures(d, n=n, seed=1, dtype="float64")
    X = torch.randn(1, n, d, generator=g, dtype=torch.float64)
    rows = torch.randn(V, d, generator=g, dtype=torch.float64)
    theta = torch.randn(n * d, generator=g, dtype=torch.float64)
    return phi, X, rows, theta


def test_first_order_outputs_are_the_output_and_its_directional_derivative_toward_each_word():
    phi, X, rows, theta = _setup()
    i, b, t = 2, 0.3, 1e-6
    clean, predicted = first_order_outputs(phi, X, i, rows, theta, b)
    # the screen's batched forward against a forward of its own: float64 of the same sum in another order
    assert float(clean) == pytest.approx(float(phi(X)[0] @ theta + b), rel=1e-12)
    for w in range(5):  # central differences along h_w - x_i
        move = torch.zeros_like(X)
        move[0, i] = rows[w] - X[0, i]
        slope = (phi(X + t * move)[0] @ theta - phi(X - t * move)[0] @ theta) / (2 * t)
        assert torch.isclose(predicted[w] - clean, slope, rtol=1e-6, atol=1e-8)


def test_the_screen_keeps_the_admissible_words_predicted_furthest_across_zero():
    phi, X, rows, theta = _setup()
    allowed = torch.ones(len(rows), dtype=torch.bool)
    allowed[::3] = False
    clean, predicted = first_order_outputs(phi, X, 1, rows, theta, 0.0, SCREEN_CENTROIDS, allowed)
    kept = screened_words(phi, X, 1, rows, allowed, theta, 0.0, keep=7)
    assert int(kept.sum()) == 7 and not (kept & ~allowed).any()
    toward = -torch.sign(clean) * predicted
    assert toward[kept].min() >= toward[allowed & ~kept].max()
    assert torch.equal(screened_words(phi, X, 1, rows, allowed, theta, 0.0, keep=1000), allowed)


def test_a_float32_module_is_screened_in_its_own_dtype():
    """A module that does not cast its input (float32 weights) is differentiated in float32, read out in float64."""
    n, d, V = 5, 8, 30
    g = torch.Generator().manual_seed(2)
    W = torch.randn(d, d, generator=g)

    class Plain(torch.nn.Module):
        def __init__(self, W):
            super().__init__()
            self.register_buffer("W", W)

        def forward(self, X):
            return torch.tanh(X @ self.W).flatten(1)

    X = torch.randn(1, n, d, generator=g, dtype=torch.float64)
    rows = torch.randn(V, d, generator=g, dtype=torch.float64)
    theta = torch.randn(n * d, generator=g, dtype=torch.float64)
    clean32, pred32 = first_order_outputs(Plain(W), X, 3, rows, theta, 0.1)
    clean64, pred64 = first_order_outputs(Plain(W.double()), X, 3, rows, theta, 0.1)
    assert pred32.dtype == torch.float64 and torch.allclose(pred32, pred64, rtol=1e-4, atol=1e-4)
    assert abs(float(clean32 - clean64)) < 1e-4


def test_each_word_is_predicted_from_the_expansion_at_its_nearest_anchor():
    """The prediction of a word is f(a) + g_a^T (h_w - a), a the anchor (clean row or centroid) nearest to h_w."""
    phi, X, rows, theta = _setup()
    i, b = 2, 0.3
    clean, predicted = first_order_outputs(phi, X, i, rows, theta, b, centroids=4)
    anchors = torch.cat([X[0, i][None], word_centroids(rows, 4)])
    nearest = torch.cdist(rows, anchors).argmin(1)
    for w in range(len(rows)):
        a = anchors[nearest[w]]
        Xa = X.clone()
        Xa[0, i] = a
        Xa.requires_grad_(True)
        out = phi(Xa)[0] @ theta + b
        (g,) = torch.autograd.grad(out, Xa)
        assert torch.isclose(predicted[w], out.detach() + g[0, i] @ (rows[w] - a), rtol=1e-10, atol=1e-10)
    assert abs(float(clean) - float(phi(X)[0] @ theta + b)) < 1e-12  # a batched forward: equal to rounding


def test_the_centroids_are_the_means_of_separated_clusters_and_do_not_depend_on_the_global_seed():
    g = torch.Generator().manual_seed(3)
    centres = 50.0 * torch.eye(3, 8, dtype=torch.float64)
    rows = torch.cat([c + 0.1 * torch.randn(20, 8, generator=g, dtype=torch.float64) for c in centres])
    torch.manual_seed(0)
    found = word_centroids(rows, 3)
    torch.manual_seed(1)
    assert torch.equal(word_centroids(rows, 3), found)
    means = rows.reshape(3, 20, 8).mean(1)
    assert torch.allclose(found[found[:, :3].argmax(1)], means, atol=1e-12)  # each centre is one cluster's mean


class _Needle(torch.nn.Module):
    """f(X) = -1 + 10 relu(u^T x_1 - 5): flat around the clean row, where the plain first-order screen sees nothing."""

    def __init__(self, u: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("u", u)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.ones(len(X), dtype=X.dtype), torch.relu(X[:, 1] @ self.u - 5)], 1)


def test_the_centroids_find_a_flip_in_a_region_the_clean_gradient_cannot_see():
    """Words in a cluster along u flip the head; the clean review's gradient is 0, so its ranking is blind to them."""
    d, V = 8, 300
    g = torch.Generator().manual_seed(4)
    u = torch.zeros(d, dtype=torch.float64)
    u[0] = 1.0
    rows = torch.randn(V, d, generator=g, dtype=torch.float64)
    rows[:10] += 10 * u  # the flipping words: u^T h_w ~ 10, f ~ +49
    rows[10:] -= 3 * u  # the others are far on the flat side
    X = torch.zeros(1, 3, d, dtype=torch.float64)
    phi, theta, allowed = _Needle(u), torch.tensor([-1.0, 10.0], dtype=torch.float64), torch.ones(V, dtype=torch.bool)
    flips = torch.zeros(V, dtype=torch.bool)
    flips[:10] = True
    plain = screened_words(phi, X, 1, rows, allowed, theta, 0.0, keep=5, centroids=0)
    assert not (plain & flips).any()  # f(X) + 0: no word is predicted to flip, the order is arbitrary
    centred = screened_words(phi, X, 1, rows, allowed, theta, 0.0, keep=5, centroids=4)
    assert (centred & flips).sum() == 5


def test_negative_centroids_are_refused():
    phi, X, rows, theta = _setup()
    with pytest.raises(ValueError, match=r"centroids must be .*got -1"):
        first_order_outputs(phi, X, 1, rows, theta, 0.0, centroids=-1)
