"""Feature maps: shapes, seeds, scalings (docs/theory/checks.md §8.1), structure, the memory-bounded RF, bad input."""

import pytest
import torch

from wslight.features import (
    DeepRandomFeatures,
    RandomAttentionFeatures,
    RandomFeatures,
    ReLUAttentionFeatures,
    output_dim,
)


def all_maps(n, d, seed=0, dtype="float32"):
    return [
        RandomFeatures(n, d, seed=seed, dtype=dtype),
        DeepRandomFeatures(n, d, depth=3, seed=seed, dtype=dtype),
        RandomAttentionFeatures(d, seed=seed, dtype=dtype),
        ReLUAttentionFeatures(d, seed=seed, dtype=dtype),
    ]


def test_shapes(rows):
    n, d = 5, 8
    X = rows(3, n, d)
    for m in all_maps(n, d):
        out = m(X)
        assert out.shape == (3, output_dim(m, n))
    assert RandomFeatures(n, d, k=17)(X).shape == (3, 17)
    assert DeepRandomFeatures(n, d, depth=2, width=11)(X).shape == (3, 11)
    # attention maps accept any n
    assert RandomAttentionFeatures(d)(rows(2, 9, d)).shape == (2, 9 * d)


def test_same_seed_same_map_other_seed_other_map(rows):
    X = rows(2, 4, 6)
    for a, b, c in zip(all_maps(4, 6, seed=3), all_maps(4, 6, seed=3), all_maps(4, 6, seed=4)):
        assert torch.equal(a(X), b(X))
        assert not torch.allclose(a(X), c(X))


def test_weights_do_not_depend_on_global_seed():
    torch.manual_seed(0)
    a = RandomAttentionFeatures(8, seed=5).W
    torch.manual_seed(123)
    torch.randn(100)
    assert torch.equal(a, RandomAttentionFeatures(8, seed=5).W)


def test_buffer_names_and_no_trainable_parameters():
    rf, drf, raf = RandomFeatures(3, 4), DeepRandomFeatures(3, 4, depth=2), RandomAttentionFeatures(4)
    assert "V" in dict(rf.named_buffers())
    assert {"Vs.0.V", "Vs.1.V"} <= set(dict(drf.named_buffers()))
    assert "W" in dict(raf.named_buffers())
    for m in (rf, drf, raf):
        assert list(m.parameters()) == []


def test_rf_preactivation_variance_is_one(rows):
    n, d = 8, 32
    rf = RandomFeatures(n, d, k=4096, seed=1)
    z = rf.preactivations(rows(16, n, d, seed=2))
    assert abs(z.var().item() - 1.0) < 0.05


def test_relu_rf_squared_norm_over_k_is_one_half(rows):
    n, d = 10, 1024  # k = D = 10240 >= 1e4
    rf = RandomFeatures(n, d, seed=0)
    phi = rf(rows(4, n, d, seed=1))
    ratio = (phi.norm(dim=1) ** 2 / rf.k).mean().item()
    assert abs(ratio - 0.5) < 0.025


def test_raf_score_variance_is_one(rows):
    d = 256
    raf = RandomAttentionFeatures(d, seed=0)
    S = raf.scores(rows(8, 64, d, seed=3))
    off_diag = S[:, ~torch.eye(64, dtype=torch.bool)]
    assert abs(off_diag.var().item() - 1.0) < 0.1


def test_drf_norm_roughly_constant_across_layers(rows):
    n, d = 8, 64
    X = rows(4, n, d).reshape(4, -1)
    drf = DeepRandomFeatures(n, d, depth=4, seed=0)
    norms, h = [], X
    for layer in drf.Vs:
        h = torch.relu(h @ layer.V.T)
        norms.append(h.norm(dim=1).mean().item())
    assert max(norms[1:]) / min(norms[1:]) < 1.15


def test_raf_rows_are_convex_combinations(rows):
    n, d = 6, 16
    X = rows(2, n, d)
    raf = RandomAttentionFeatures(d, seed=0)
    A = raf.attention(raf.scores(X))
    assert torch.allclose(A.sum(-1), torch.ones(2, n), atol=1e-6)
    assert (A >= 0).all()
    # output row l equals sum_j A_lj x_j
    assert torch.allclose(raf(X).reshape(2, n, d), A @ X, atol=1e-5)


def test_relu_raf_rows_sum_to_one_or_are_zero():
    d = 4
    relu = ReLUAttentionFeatures(d, seed=0)
    # a sample whose scores are all <= 0: x_l^T W x_j with X = [x, -x] can be arranged; force via W directly
    relu.W.copy_(-torch.eye(d))
    X = torch.ones(1, 3, d)  # scores = -d / sqrt(d) < 0 everywhere
    out = relu(X)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isfinite(out).all()
    scores = torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(0))
    scores[0, 2] = -scores[0, 2].abs()  # a row without a positive score
    sums = ReLUAttentionFeatures(8, seed=1).attention(scores).sum(-1)
    assert float(sums[0, 2]) == 0.0
    others = torch.ones_like(sums, dtype=torch.bool)
    others[0, 2] = False
    assert torch.all((sums[others] - 1).abs() < 1e-6)


def test_softmax_huge_scores_stay_finite(rows):
    raf = RandomAttentionFeatures(16, seed=0)
    assert torch.isfinite(raf(rows(2, 5, 16) * 1e3)).all()


def test_float64_path_matches_float32(rows):
    n, d = 4, 8
    X = rows(2, n, d, dtype=torch.float64)
    for m32, m64 in zip(all_maps(n, d, seed=7), all_maps(n, d, seed=7, dtype="float64")):
        out64 = m64(X)
        assert out64.dtype == torch.float64
        assert torch.allclose(out64, m32(X.float()).double(), atol=1e-5)


def test_memory_bounded_rf_equals_stored(rows):
    n, d = 6, 10
    X = rows(3, n, d)
    dense = RandomFeatures(n, d, k=700, seed=9)
    bounded = RandomFeatures(n, d, k=700, seed=9, max_stored_bytes=0, block_rows=300)
    assert dense.stored and not bounded.stored and bounded.V is None
    assert torch.allclose(dense(X), bounded(X), atol=1e-6)
    z, blocks = bounded.preactivations_and_token_blocks(X, [0, 4])
    assert torch.allclose(z, dense.preactivations(X), atol=1e-6)
    assert torch.equal(blocks[1], dense.V[:, 4 * d : 5 * d])
    assert torch.equal(bounded.token_block(0), dense.V[:, :d])


def test_token_move_update_identity(rows):
    """z(X + e_i delta^T) = z(X) + V^{(i)} delta, the identity the memory-bounded WS search relies on."""
    n, d, i = 5, 6, 3
    rf = RandomFeatures(n, d, seed=2, dtype="float64")
    X = rows(1, n, d, dtype=torch.float64)
    delta = torch.randn(d, dtype=torch.float64)
    Xp = X.clone()
    Xp[0, i] += delta
    z, blocks = rf.preactivations_and_token_blocks(X, [i])
    assert torch.allclose(rf.preactivations(Xp), z + blocks[0] @ delta, atol=1e-12)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: RandomFeatures(0, 4), "n must be a positive integer, got 0"),
        (lambda: RandomFeatures(3, -1), "d must be a positive integer, got -1"),
        (lambda: RandomFeatures(3, 4, k=0), "k must be a positive integer, got 0"),
        (lambda: RandomFeatures(3, 4, activation="sigmoid"), "activation must be one of .* got 'sigmoid'"),
        (lambda: DeepRandomFeatures(3, 4, depth=0), "depth must be a positive integer, got 0"),
        (lambda: RandomAttentionFeatures(0), "d must be a positive integer, got 0"),
        (lambda: RandomAttentionFeatures(4, dtype="float16"), "dtype must be one of .* got 'float16'"),
    ],
)
def test_bad_construction_arguments(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_wrong_input_shape_names_expected_and_received(rows):
    with pytest.raises(ValueError, match=r"X: the map was built for n=4 tokens, got X of shape \(1, 5, 8\) \(n=5\)"):
        RandomFeatures(4, 8)(rows(1, 5, 8))
    with pytest.raises(ValueError, match=r"X: the map was built for d=8, got X of shape \(1, 5, 6\) \(d=6\)"):
        RandomAttentionFeatures(8)(rows(1, 5, 6))
    with pytest.raises(ValueError, match=r"position must be an integer in \[0, 3\], got 4"):
        RandomFeatures(4, 8).token_block(4)


def test_huge_rf_is_not_allocated_at_construction():
    """The paper's largest RF (d=768, n=150, k=D) builds instantly without its 53 GB V."""
    rf = RandomFeatures(150, 768, seed=0)
    assert rf.V is None and rf.k == 115_200
