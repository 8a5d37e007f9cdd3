"""The paper's protocol, a fresh map per trial, batched.

Trials searched together equal trials searched alone, and the RF / DeepRF maps drawn from the law of (z, V^(i)) give the
word sensitivity of dense fresh maps.
"""

import pytest
import torch

from wslight.attack import delta_attack
from wslight.features import FreshMaps, make_map
from wslight.features.rf import fresh_preactivations
from wslight.search.sensitivity import word_sensitivity


def ks_statistic(a, b):
    """Two-sample Kolmogorov-Smirnov statistic sup_x |F_a(x) - F_b(x)|."""
    grid = torch.cat([a, b]).sort().values
    Fa = (a[None, :] <= grid[:, None]).double().mean(1)
    Fb = (b[None, :] <= grid[:, None]).double().mean(1)
    return float((Fa - Fb).abs().max())


@pytest.mark.parametrize("name", ["raf", "relu_raf", "rf", "deep_rf"])
def test_trials_batched_equal_trials_alone(rows, name):
    T, B, n, d = 3, 2, 5, 6
    X = rows(T * B, n, d, seed=3).reshape(T, B, n, d)
    maps = [make_map(name, n, d, seed=10 + t) for t in range(T)]
    together = word_sensitivity(maps, X, max_steps=80, seed=[1, 2, 3])
    assert together.ws.shape == (T, B)
    for t in range(T):
        alone = word_sensitivity(maps[t], X[t], max_steps=80, seed=t + 1)
        assert torch.allclose(together.ws[t], alone.ws, rtol=1e-4), (name, t)


def test_fresh_attention_maps_are_make_map_maps(rows):
    T, n, d = 3, 6, 8
    X = rows(T, n, d, seed=1).reshape(T, 1, n, d)
    fresh = word_sensitivity(FreshMaps("raf", [5, 6, 7]), X, max_steps=60, seed=[5, 6, 7])
    listed = word_sensitivity([make_map("raf", n, d, seed=s) for s in (5, 6, 7)], X, max_steps=60, seed=[5, 6, 7])
    assert torch.equal(fresh.ws, listed.ws)


def test_fresh_rf_preactivations_have_the_dense_maps_law(rows):
    """Across many seeds, (z_b . z_b') / k of fresh draws matches <x_b, x_b'> / D, as for dense maps."""
    B, n, d, k = 3, 4, 5, 4000
    X = rows(B, n, d, seed=2).double()
    z, blocks = fresh_preactivations(X[None], [1], k, seeds=[0])
    z, blocks = z[0], blocks[0]
    assert blocks.shape == (1, k, d)
    target = (X.reshape(B, -1) @ X.reshape(B, -1).T) / (n * d)  # E[z z^T] per neuron
    emp = z @ z.T / k
    assert torch.allclose(emp, target, atol=4 * (2 / k) ** 0.5 * float(target.diag().max()))
    dense = make_map("rf", n, d, seed=0, width_ratio=k / (n * d)).preactivations(X.float()).double()
    assert torch.allclose(dense @ dense.T / k, target, atol=4 * (2 / k) ** 0.5 * float(target.diag().max()))


@pytest.mark.parametrize("name", ["rf", "deep_rf"])
def test_fresh_law_word_sensitivity_matches_dense_fresh_maps(rows, name):
    """Two-sample test of S over 200 trials: law-drawn maps against dense maps, same samples, other seeds."""
    T, n, d = 200, 4, 6
    X = rows(T, n, d, seed=4).reshape(T, 1, n, d)
    kw = dict(max_steps=60, chains_per_round=2, power_iters=5)
    law = word_sensitivity(FreshMaps(name, list(range(T))), X, seed=list(range(T)), **kw).ws.flatten()
    dense_maps = [make_map(name, n, d, seed=1000 + t, depth=2) for t in range(T)]
    dense = word_sensitivity(dense_maps, X, seed=list(range(T)), **kw).ws.flatten()
    # 200 vs 200 samples: the KS statistic exceeds 0.17 with probability < 1% under the same law
    assert ks_statistic(law, dense) < 0.17, (law.mean(), dense.mean())
    assert abs(float(law.mean() / dense.mean()) - 1) < 0.05


def test_fresh_rf_reported_value_is_exact(rows):
    """The law-drawn RF reports S through the exact float64 identity z + V^(i) Delta."""
    X = rows(2, 5, 4, seed=0).reshape(2, 1, 5, 4)
    res = word_sensitivity(FreshMaps("rf", [0, 1]), X, max_steps=50)
    assert torch.isfinite(res.ws).all() and torch.all(res.delta_norm <= 2.0 + 1e-9)
    assert torch.allclose(res.delta_norm, torch.full((2, 1), 2.0, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("name", ["rf", "deep_rf"])
def test_fresh_law_attack_matches_dense_fresh_maps(rows, name):
    """The attack on law-drawn maps: the closed forms hold (t1 = y) and y D1 has the law of dense fresh maps."""
    T, N, n, d = 60, 16, 4, 6
    X = rows(T * (N + 1), n, d, seed=6).reshape(T, N + 1, n, d)
    Y = torch.sign(torch.randn(T, N + 1, generator=torch.Generator().manual_seed(3)))
    kw = dict(training="retrain", loss="err", steps=40, restarts=2)
    law = delta_attack(FreshMaps(name, list(range(T))), X[:, 1:], Y[:, 1:], X[:, :1], Y[:, :1], **kw)
    dense_maps = [make_map(name, n, d, seed=500 + t) for t in range(T)]
    dense = delta_attack(dense_maps, X[:, 1:], Y[:, 1:], X[:, :1], Y[:, :1], **kw)
    assert torch.allclose(law["t1"], law["y"], atol=1e-8)
    a, b = (law["y"] * law["D1"]).flatten(), (dense["y"] * dense["D1"]).flatten()
    # 60 vs 60 samples: the KS statistic exceeds 0.30 with probability about 1% under the same law
    assert ks_statistic(a, b) < 0.30, (a.mean(), b.mean())
