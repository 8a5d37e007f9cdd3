"""Closed-form heads: identities, implicit projector, conditioning, bad input.

See docs/theory/attack.md §5.2 and docs/theory/checks.md §8.8.
"""

import warnings

import pytest
import torch

from wslight.attack.heads import fit_heads, min_norm_interpolator, ridge_head
from wslight.base.numerics import gram
from wslight.features import RandomAttentionFeatures


def _problem(N=12, p=40, B=3, seed=0, T=None):
    g = torch.Generator().manual_seed(seed)
    lead = () if T is None else (T,)
    Phi = torch.randn(*lead, N, p, generator=g, dtype=torch.float64)
    Y = torch.randint(0, 2, (*lead, N), generator=g).double() * 2 - 1
    phi = torch.randn(*lead, B, p, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (*lead, B), generator=g).double() * 2 - 1
    return Phi, Y, phi, y


def test_identities_on_raf_features(rows):
    """Phi theta* = Y, phi^T theta_f = phi^T theta_r = y, theta* = pinv(Phi) Y, on real RAF features."""
    n, d, N, B = 6, 8, 20, 3
    m = RandomAttentionFeatures(d, seed=1, dtype="float64")
    Phi = m(rows(N, n, d, seed=1, dtype=torch.float64))  # (N, 48)
    phi = m(rows(B, n, d, seed=2, dtype=torch.float64))
    Y = torch.tensor([1.0, -1.0] * (N // 2), dtype=torch.float64)
    y = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    h = fit_heads(Phi, Y, phi, y)
    assert torch.allclose(Phi @ h.theta_star, Y, atol=1e-6)
    assert torch.allclose(h.theta_star, torch.linalg.pinv(Phi) @ Y, atol=1e-6)
    for training in ("finetune", "retrain"):
        th = h.theta(training)  # (B, p)
        assert torch.allclose((phi * th).sum(-1), y, atol=1e-6)
        # outputs() uses inner products only and agrees with the explicit heads
        s, out = h.outputs(phi, training)
        assert torch.allclose(out, y, atol=1e-6)
        assert torch.allclose(s, h.t0, atol=1e-12)
    assert not bool(h.ill_conditioned)


def test_retrained_is_min_norm_solution_of_stacked_system():
    Phi, Y, phi, y = _problem(N=10, p=25, B=4)
    h = fit_heads(Phi, Y, phi, y)
    th_r = h.theta("retrain")
    for b in range(4):
        A = torch.cat([Phi, phi[b : b + 1]])  # (N + 1, p)
        ref = torch.linalg.pinv(A) @ torch.cat([Y, y[b : b + 1]])
        assert torch.allclose(th_r[b], ref, atol=1e-6)
        # re-trained head still interpolates the training set; fine-tuned moves only along phi
        assert torch.allclose(Phi @ th_r[b], Y, atol=1e-6)
    diff = h.theta("finetune") - h.theta_star  # (B, p)
    cos = (diff * phi).sum(-1).abs() / (diff.norm(dim=-1) * phi.norm(dim=-1))
    assert torch.allclose(cos, torch.ones(4, dtype=torch.float64), atol=1e-10)


def test_projector_is_idempotent_orthogonal_and_nonzero():
    Phi, Y, phi, y = _problem(N=15, p=30, B=5)
    h = fit_heads(Phi, Y, phi, y)
    assert bool((h.Pphi.norm(dim=-1) > 0.1 * phi.norm(dim=-1)).all())
    assert torch.allclose(h.project(h.Pphi), h.Pphi, atol=1e-10)  # P P = P
    assert (Phi @ h.Pphi.T).abs().max() < 1e-10  # P phi orthogonal to the rows of Phi
    # P is symmetric: <P u, v> = <u, P v>
    u, v = phi[:2], phi[2:4]
    assert torch.allclose((h.project(u) * v).sum(-1), (u * h.project(v)).sum(-1), atol=1e-10)
    # matches the dense projector, built here only for the check
    P = torch.eye(30, dtype=torch.float64) - torch.linalg.pinv(Phi) @ Phi
    assert torch.allclose(h.Pphi, phi @ P, atol=1e-8)
    assert torch.allclose(h.proj_ratio, (phi @ P).norm(dim=-1) / phi.norm(dim=-1), atol=1e-8)


def test_batched_trials_equal_one_by_one():
    Phi, Y, phi, y = _problem(N=8, p=20, B=2, T=3)
    h = fit_heads(Phi, Y, phi, y)
    assert h.theta_star.shape == (3, 20) and h.Pphi.shape == (3, 2, 20) and h.cond.shape == (3,)
    for t in range(3):
        ht = fit_heads(Phi[t], Y[t], phi[t], y[t])
        assert torch.allclose(h.theta_star[t], ht.theta_star, atol=1e-12)
        assert torch.allclose(h.theta("retrain")[t], ht.theta("retrain"), atol=1e-10)


def test_ill_conditioned_gram_warns_flags_and_stays_accurate():
    g = torch.Generator().manual_seed(3)
    N, p = 10, 40
    U, _ = torch.linalg.qr(torch.randn(N, N, generator=g, dtype=torch.float64))
    Vt, _ = torch.linalg.qr(torch.randn(p, N, generator=g, dtype=torch.float64))
    sv = torch.logspace(0, -6.5, N, dtype=torch.float64)  # cond(Phi) ~ 3e6, cond(G) ~ 1e13
    Phi = U @ torch.diag(sv) @ Vt.T
    Y = torch.randn(N, generator=g, dtype=torch.float64)
    phi = torch.randn(2, p, generator=g, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="condition number"):
        h = fit_heads(Phi, Y, phi, torch.ones(2, dtype=torch.float64))
    assert bool(h.ill_conditioned) and float(h.cond) > 1e10
    assert torch.allclose(Phi @ h.theta_star, Y, atol=1e-6)
    assert (Phi @ h.Pphi.T).abs().max() < 1e-8


def test_singular_gram_uses_jitter_and_flags():
    Phi, Y, phi, y = _problem(N=6, p=20, B=2)
    Phi = torch.cat([Phi, Phi[:1]])  # a duplicated training sample with the same label
    Y = torch.cat([Y, Y[:1]])
    with pytest.warns(RuntimeWarning, match="jitter"):
        h = fit_heads(Phi, Y, phi, y)
    assert bool(h.ill_conditioned) and float(h.jitter) > 0
    assert torch.allclose(Phi @ h.theta_star, Y, atol=1e-5)


def test_well_conditioned_does_not_warn():
    Phi, Y, phi, y = _problem()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = fit_heads(Phi, Y, phi, y)
    assert not bool(h.ill_conditioned) and float(h.jitter) == 0


def test_bad_input():
    Phi, Y, phi, y = _problem(N=12, p=40)
    with pytest.raises(ValueError, match=r"N: .*N < p = 12, got N=40"):
        fit_heads(Phi.T.contiguous(), torch.ones(40), phi[:, :12], y)
    with pytest.raises(ValueError, match=r"Y: expected shape \(12,\), got \(11,\)"):
        fit_heads(Phi, Y[:11], phi, y)
    h = fit_heads(Phi, Y, phi, y)
    with pytest.raises(ValueError, match=r"training must be one of \['finetune', 'retrain'\], got 'total'"):
        h.theta("total")


@pytest.mark.parametrize("N", [5, 8, 13, 24])
def test_gram_from_the_lower_blocks_is_the_symmetric_full_product(N):
    """`gram` computes only the row blocks up to the diagonal, and equals Phi Phi^T to rounding.

    For N below, at and past a multiple of the block, with trial axes, and it is symmetric to the last bit.
    """
    Phi = torch.randn(2, 3, N, 40, generator=torch.Generator().manual_seed(N), dtype=torch.float64)
    G = gram(Phi, block=4)
    assert G.shape == (2, 3, N, N) and torch.equal(G, G.mT)
    assert torch.allclose(G, Phi @ Phi.mT, rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("N, p", [(30, 50), (50, 30)])
@pytest.mark.parametrize("ridge", [0.0, 0.3])
def test_ridge_head_with_bias_equals_the_normal_equations_in_p_space(N, p, ridge):
    """(theta, b) minimise ||Phi theta + b - Y||^2 + ridge ||theta||^2 (minimum-norm theta where there are many)."""
    g = torch.Generator().manual_seed(N + p)
    Phi = torch.randn(N, p, generator=g, dtype=torch.float64) + 0.7  # a mean to centre away
    Y = torch.randn(N, generator=g, dtype=torch.float64) + 0.2
    theta, b = ridge_head(Phi, Y, ridge, bias=True)
    Pc, Yc = Phi - Phi.mean(0), Y - Y.mean()
    # p-space reference: (Pc^T Pc + ridge I)^+ Pc^T Yc (pinv: the minimum-norm solution when ridge = 0 and N <= p)
    expected = torch.linalg.pinv(Pc.T @ Pc + ridge * torch.eye(p, dtype=Pc.dtype), hermitian=True) @ Pc.T @ Yc
    assert torch.allclose(theta, expected, atol=1e-8)
    assert torch.allclose(b, Y.mean() - Phi.mean(0) @ expected, atol=1e-8)


def test_ridge_head_without_penalty_or_bias_is_the_min_norm_interpolator():
    g = torch.Generator().manual_seed(0)
    Phi, Y = torch.randn(20, 40, generator=g, dtype=torch.float64), torch.randn(20, generator=g, dtype=torch.float64)
    theta, b = ridge_head(Phi, Y)
    assert torch.equal(theta, min_norm_interpolator(Phi, Y)) and float(b) == 0.0
    theta, _ = ridge_head(Phi, Y, ridge=0.1)  # no bias: theta = Phi^T (G + ridge I)^{-1} Y
    assert torch.allclose(theta, Phi.T @ torch.linalg.solve(Phi @ Phi.T + 0.1 * torch.eye(20, dtype=Phi.dtype), Y))
    with pytest.raises(ValueError, match=r"ridge must be a finite number >= 0"):
        ridge_head(Phi, Y, ridge=-0.1)
