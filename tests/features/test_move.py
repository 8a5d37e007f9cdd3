"""The token-move engine: every map family's closed form equals the generic autograd path and the full forward.

And any plain module works in the estimator and the attack.
"""

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from wslight.attack import delta_attack
from wslight.base.seeding import generator
from wslight.features import RandomAttentionFeatures, RandomFeatures, make_map
from wslight.features.generic_move import GenericMove, move_class_for, token_move
from wslight.search.sensitivity import word_sensitivity

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ["rf", "rf_bounded", "deep_rf", "raf", "relu_raf"]


def build(kind, n, d, seed):
    if kind == "rf_bounded":  # V regenerated in row chunks, never stored
        return RandomFeatures(n, d, seed=seed, dtype="float64", max_stored_bytes=0, block_rows=7)
    return make_map(kind, n, d, seed=seed, depth=3, dtype="float64")


def moved(X, position, delta):
    """X (B, n, d) with token `position` moved by delta (B, R, d) -> (B, R, n, d)."""
    Xp = X[:, None].repeat(1, delta.shape[1], 1, 1)
    Xp[:, :, position] += delta
    return Xp


@pytest.fixture
def case(rows):
    def make(kind, T=2, B=3, n=7, d=6, R=2, positions=(0, 3, 6)):
        maps = [build(kind, n, d, seed) for seed in range(T)]
        X = rows(T * B, n, d, seed=4, dtype=torch.float64).reshape(T, B, n, d)
        g = generator(0, "test.delta")
        delta = 2 * torch.randn(T, B, len(positions), R, d, generator=g, dtype=torch.float64)
        return maps, X, list(positions), delta

    return make


@pytest.mark.parametrize("kind", FAMILIES)
def test_closed_form_equals_generic_path_and_full_forward(case, kind):
    maps, X, positions, delta = case(kind)
    fast = token_move(maps, X, positions, torch.float64)
    generic = GenericMove(maps, X, positions, torch.float64)
    assert type(fast) is not GenericMove and type(fast) is move_class_for(maps)
    f = fast.features(delta)  # (T, B, P, R, p)
    assert torch.allclose(f, generic.features(delta), rtol=1e-9, atol=1e-9)
    assert torch.allclose(fast.phi0, generic.phi0, rtol=1e-9, atol=1e-9)
    for t, m in enumerate(maps):  # the full forward on the moved samples
        for j, i in enumerate(positions):
            ref = m(moved(X[t], i, delta[t, :, j]).flatten(0, 1)).reshape(f.shape[1], f.shape[3], -1)
            assert torch.allclose(f[t, :, j], ref, rtol=1e-9, atol=1e-9)
    assert torch.allclose(fast.change_sq(delta), generic.change_sq(delta), rtol=1e-8, atol=1e-9)
    H = torch.randn(*X.shape[:2], f.shape[-1], 3, generator=generator(1, "test.H"), dtype=torch.float64)
    assert torch.allclose(fast.readout(delta, H), generic.readout(delta, H), rtol=1e-9, atol=1e-9)
    for move in (fast, generic):  # the shared forward of the word substitution gives the two separate values
        both = move.change_sq_and_readout(delta, H)
        assert torch.equal(both[0], move.change_sq(delta)) and torch.equal(both[1], move.readout(delta, H))


@pytest.mark.parametrize("kind", FAMILIES)
def test_closed_form_gradients_equal_autograd_through_the_forward(case, kind):
    maps, X, positions, delta = case(kind, T=1)
    grads = []
    for move in (token_move(maps, X, positions, torch.float64), GenericMove(maps, X, positions, torch.float64)):
        x = delta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(move.change_sq(x).sum(), x)
        grads.append(g)
    assert torch.allclose(grads[0], grads[1], rtol=1e-7, atol=1e-9)


def _autograd_value_and_grad(move, delta):
    x = delta.clone().requires_grad_(True)
    f = move.change_sq(x)
    (g,) = torch.autograd.grad(f.sum(), x)
    return f.detach(), g


@pytest.mark.parametrize("kind", ["rf", "deep_rf", "raf", "relu_raf"])
@pytest.mark.parametrize("scores", ["plain", "all_negative"])
def test_hand_written_value_and_grad_equal_the_generic_path(case, kind, scores):
    """The ascent's closed-form value and gradient (no autograd) against autograd through the full forward.

    With scores all negative every ReLU-RAF row is a zero row (the authors' divisor 1).
    """
    maps, X, positions, delta = case(kind)
    if scores == "all_negative":
        if kind in ("rf", "deep_rf"):
            pytest.skip("no scores")
        for m in maps:
            m.W.copy_(-torch.eye(m.d, dtype=m.W.dtype))  # x_l^T W x_j < 0 for positive rows
        X, delta = X.abs(), delta.abs()
    fast = token_move(maps, X, positions, torch.float64)
    f, g = fast.value_and_grad(delta)
    f_ref, g_ref = _autograd_value_and_grad(GenericMove(maps, X, positions, torch.float64), delta)
    assert torch.allclose(f, f_ref, rtol=1e-9, atol=1e-9)
    assert torch.allclose(g, g_ref, rtol=1e-8, atol=1e-9)
    # a search that has finished some trials evaluates the others only: the same values and gradients, to float64
    # rounding (one trial's batch instead of two: a matrix product of another shape may sum in another order)
    idx = torch.tensor([1])
    f_sel, g_sel = fast.select_trials(idx).value_and_grad(delta[idx])
    torch.testing.assert_close(f_sel, f[idx], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_sel, g[idx], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["deep_rf", "raf", "relu_raf"])
@pytest.mark.parametrize("n", [1, 7])
def test_closed_form_curvature_product_is_the_hessian_at_zero(case, kind, n):
    """H v = 2 J^T J v in closed form against the double backward of the squared change at Delta = 0."""
    maps, X, positions, delta = case(kind, n=n, positions=(0,) if n == 1 else (0, 3, 6))
    move = token_move(maps, X, positions, torch.float64)
    v = delta / delta.norm(dim=-1, keepdim=True)
    zero = torch.zeros_like(v, requires_grad=True)
    (g,) = torch.autograd.grad(
        GenericMove(maps, X, positions, torch.float64).change_sq(zero).sum(), zero, create_graph=True
    )
    (hv,) = torch.autograd.grad((g * v).sum(), zero)
    assert torch.allclose(move.curvature_product(v), hv, rtol=1e-8, atol=1e-9)


def test_deep_rf_top_curvature_is_the_top_eigenvector_of_the_hessian(case):
    """DeepRF's one-pass Jacobian start: the top eigenvector of the d x d Hessian.

    The Hessian is assembled from the curvature product (itself checked against double backward above); the start is
    signed to agree with the start vector, after a search has left a trial out too.
    """
    maps, X, positions, delta = case("deep_rf", T=3)
    move = token_move(maps, X, positions, torch.float64)
    T, B, P, _, d = delta.shape
    v = delta[:, :, :, :1]
    for tok, idx in ((move, torch.arange(T)), (move.select_trials(torch.tensor([2, 0])), torch.tensor([2, 0]))):
        top = tok.top_curvature(v[idx])  # (T', B, P, 1, d)
        basis = torch.eye(d, dtype=torch.float64).expand(len(idx), B, P, d, d)
        H = tok.curvature_product(basis)  # (T', B, P, d, d): H e_k, row k
        vecs = torch.linalg.eigh(H)[1][..., -1]  # (T', B, P, d)
        vecs = vecs * torch.sign((vecs * v[idx, :, :, 0]).sum(-1, keepdim=True))
        assert torch.allclose(top[:, :, :, 0], vecs, atol=1e-8)
        assert ((top[:, :, :, 0] * v[idx, :, :, 0]).sum(-1) >= 0).all()


def test_exact64_of_the_memory_bounded_rf_is_the_float64_forward(case):
    maps, X, positions, delta = case("rf_bounded")
    move = token_move(maps, X, positions, torch.float64)
    j = torch.tensor([[0, 1, 2], [2, 2, 0]])  # index into positions, per trial and sample
    chosen = delta[:, :, 0, 0]  # (T, B, d)
    ws, norm = (v[..., 0] for v in move.exact64(chosen[:, :, None], j[..., None]))  # one candidate per sample
    for t, m in enumerate(maps):
        for b in range(X.shape[1]):
            Xp = X[t, b : b + 1].clone()
            Xp[0, positions[j[t, b]]] += chosen[t, b]
            ref = (m(Xp) - m(X[t, b : b + 1])).norm() / m(X[t, b : b + 1]).norm()
            assert abs(float(ws[t, b]) - float(ref)) < 1e-10


def test_mixed_maps_fall_back_to_the_generic_path(case):
    maps, X, positions, _ = case("rf")
    assert move_class_for([maps[0], RandomFeatures(7, 6, activation="tanh")]) is GenericMove
    assert move_class_for([maps[0], make_map("raf", 7, 6)]) is GenericMove


class PlainRAF(nn.Module):
    """RAF behind a plain module: the estimators see only its forward (no closed form, no structured starts)."""

    def __init__(self, raf):
        super().__init__()
        self.raf, self.d = raf, raf.d

    def forward(self, X):
        return self.raf(X)


def test_plain_module_gives_the_fast_path_word_sensitivity(rows):
    raf = RandomAttentionFeatures(16, seed=3, dtype="float64")
    X = rows(4, 10, 16, seed=2, dtype=torch.float64)
    fast = word_sensitivity(raf, X, chains_per_round=4, max_steps=300, seed=1)
    plain = word_sensitivity(PlainRAF(raf), X, chains_per_round=4, max_steps=300, seed=1)
    rel = (plain.ws - fast.ws).abs() / fast.ws
    assert float(rel.max()) < 0.01, (fast.ws, plain.ws)
    assert torch.all(plain.delta_norm <= 4.0 + 1e-9)


def test_plain_module_gives_the_fast_path_attack(rows):
    raf = RandomAttentionFeatures(8, seed=3, dtype="float64")
    X = rows(24, 6, 8, seed=5, dtype=torch.float64)
    Y = torch.sign(torch.randn(24, generator=torch.Generator().manual_seed(1))).double()
    kw = dict(training="retrain", loss="err", steps=60, seed=2)
    fast = delta_attack(raf, X[2:], Y[2:], X[:2], Y[:2], **kw)
    plain = delta_attack(PlainRAF(raf), X[2:], Y[2:], X[:2], Y[:2], **kw)
    for key in ("t0", "t1", "D0", "D1", "err"):
        assert torch.allclose(fast[key], plain[key], rtol=1e-6, atol=1e-8), key


def test_readme_example_map_registers_and_runs_everywhere(rows):
    """The README's 20-line example: one class plus `register_map` makes a map usable by name."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- example-map -->\s*```python\n(.*?)```", readme, re.S)
    assert block is not None, "README.md must hold the example map after <!-- example-map -->"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 25
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    fmap = make_map("mean_rf", n=5, d=8, seed=0)
    assert type(fmap).__name__ in namespace and fmap.out_dim(5) == fmap(rows(2, 5, 8)).shape[1]
    assert torch.equal(fmap(rows(2, 5, 8)), make_map("mean_rf", n=5, d=8, seed=0)(rows(2, 5, 8)))
    res = word_sensitivity(fmap, rows(3, 5, 8), max_steps=50)
    assert torch.all(res.ws > 0) and torch.all(res.delta_norm <= 8**0.5 + 1e-6)
    X = rows(40, 5, 8, seed=1)
    Y = torch.sign(torch.randn(40, generator=torch.Generator().manual_seed(0)))
    out = delta_attack(fmap, X[2:], Y[2:], X[:2], Y[:2], steps=20)
    assert torch.allclose(out["t1"], out["y"], atol=1e-6)
