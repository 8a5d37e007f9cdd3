"""The attack's shared computations against what they replace: the heads' passes, the stacked features, the starts."""

import pytest
import torch

from wslight.attack.heads import gram_factor, min_norm, min_norm_and_projection, project
from wslight.features import FreshMaps
from wslight.features.attention_starts import structured_starts
from wslight.features.forwards import trial_features
from wslight.features.fresh import stacked_features
from wslight.features.generic_move import token_move
from wslight.features.move import per_trial, stack_trials


def _problem(T=3, N=30, p=200, B=2, seed=0, scale=None):
    g = torch.Generator().manual_seed(seed)
    Phi = torch.randn(T, N, p, generator=g, dtype=torch.float64)
    if scale is not None:  # columns of very different sizes: a poorly conditioned Gram
        Phi = Phi * torch.logspace(0, scale, N, dtype=torch.float64)[:, None]
    Y = torch.randint(0, 2, (T, N), generator=g).double() * 2 - 1
    phi = torch.randn(T, B, p, generator=g, dtype=torch.float64)
    return Phi, Y, phi


@pytest.mark.parametrize("refine", [1, 2])
@pytest.mark.parametrize("scale", [None, 4.0])
def test_equal_to_min_norm_and_project_apart(refine, scale):
    """theta* and P phi equal those of min_norm and project to 1e-10 (relative), refined once or twice."""
    Phi, Y, phi = _problem(scale=scale)
    chol = gram_factor(Phi)[0]
    theta, Pphi = min_norm_and_projection(Phi, Y, chol, phi, refine=refine)
    theta_ref, Pphi_ref = min_norm(Phi, Y, chol, refine=refine), project(Phi, chol, phi)
    assert (theta - theta_ref).abs().max() <= 1e-10 * theta_ref.abs().max()
    assert (Pphi - Pphi_ref).abs().max() <= 1e-10 * Pphi_ref.abs().max()
    # the definitions: Phi theta* = Y, Phi P phi = 0
    assert torch.allclose(Phi @ theta.unsqueeze(-1), Y.unsqueeze(-1), atol=1e-8)
    assert (Phi @ Pphi.mT).abs().max() <= 1e-8 * phi.abs().max() * Phi.abs().max()


@pytest.mark.parametrize("name", ["raf", "relu_raf"])
def test_stacked_features_equal_the_trials_features(rows, name):
    """The contexts' and training samples' features in one buffer: those of trial_features apart.

    Equal to float64 rounding: the buffer runs the forwards on chunks of 3 samples, trial_features on the 2 contexts
    and the 5 training samples, and a matrix product of another batch size may take another BLAS kernel.
    """
    T, B, N, n, d = 2, 2, 5, 4, 8
    maps = FreshMaps(name, [3, 4]).maps(n, d)
    X = rows(T * (B + N), n, d, seed=5, dtype=torch.float64).reshape(T, B + N, n, d)
    feats = stacked_features(maps, X[:, :B], X[:, B:], chunk=3)
    assert feats.dtype == torch.float64
    torch.testing.assert_close(feats[:, :B], trial_features(maps, X[:, :B]), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(feats[:, B:], trial_features(maps, X[:, B:]), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["raf", "relu_raf"])
def test_starts_computed_on_first_use_equal_the_eager_ones(rows, name):
    """The attention algebra's search starts, computed when first read, equal structured_starts at construction."""
    T, B, n, d = 2, 3, 5, 8
    maps = FreshMaps(name, [1, 2]).maps(n, d)
    X = rows(T * B, n, d, seed=7).reshape(T, B, n, d)
    move = token_move(maps, X, [1], torch.float32)
    W = stack_trials([m.W for m in maps])
    eager = structured_starts(move, W, per_trial(X, W.transpose(1, 2)))
    assert move.starts is not None and torch.equal(move.starts, eager)
    assert move.select_trials(torch.tensor([1])).starts is None  # a selection carries none, as before
