"""The first-order screen of the vocabulary (docs/theory.md §13.5)."""

import torch

from wslight.features import RandomAttentionFeatures
from wslight.search.screening import first_order_outputs, screened_words


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
    assert float(clean) == float(phi(X)[0] @ theta + b)
    for w in range(5):  # central differences along h_w - x_i
        move = torch.zeros_like(X)
        move[0, i] = rows[w] - X[0, i]
        slope = (phi(X + t * move)[0] @ theta - phi(X - t * move)[0] @ theta) / (2 * t)
        assert torch.isclose(predicted[w] - clean, slope, rtol=1e-6, atol=1e-8)


def test_the_screen_keeps_the_admissible_words_predicted_furthest_across_zero():
    phi, X, rows, theta = _setup()
    allowed = torch.ones(len(rows), dtype=torch.bool)
    allowed[::3] = False
    clean, predicted = first_order_outputs(phi, X, 1, rows, theta, 0.0)
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
