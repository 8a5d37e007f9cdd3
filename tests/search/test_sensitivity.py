"""Word sensitivity: structured paths against the full map, the scaling laws, and more.

The scaling laws of docs/theory/index.md §1.4 and docs/theory/checks.md §8.

Optimiser sanity, determinism, bad input, and the S-against-n figure.
"""

import dataclasses
import math

import pytest
import torch

from wslight.chains.settings import GENERIC_DEFAULTS, SearchSettings
from wslight.features import FreshMaps, RandomAttentionFeatures, RandomFeatures, ReLUAttentionFeatures
from wslight.features import make_map as package_make_map
from wslight.features.forwards import map_features
from wslight.plots.ws import plot_ws_curves, ws_curves
from wslight.search.sensitivity import (
    WSResult,
    moved_token_objective,
    word_sensitivity,
    ws_bound_rf,
)

# Tiny tensors, many small steps: one torch thread (the conftest fixture) avoids pool contention.
pytestmark = pytest.mark.usefixtures("one_thread")


def make_map(name, n, d, seed=1, dtype="float32", **kw):
    return package_make_map(name, n, d, seed=seed, dtype=dtype, **kw)


MAPS = ["rf", "deep_rf", "raf", "relu_raf"]


def full_change(fm, X, position, delta):
    """||phi(X^i(Delta)) - phi(X)|| and ||phi(X)|| through the plain forward of a float64 map, one sample at a time."""
    Xp = X.clone()
    Xp[:, position] += delta
    return (fm(Xp) - fm(X)).norm(dim=1), fm(X).norm(dim=1)


# ---------------------------------------------------------------------------------------------------------------------
# Structured token-move paths equal the full map
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MAPS)
def test_structured_objective_equals_full_map(rows, name):
    B, n, d = 3, 7, 8
    X = rows(B, n, d, dtype=torch.float64)
    fm = make_map(name, n, d, dtype="float64")
    positions = [0, 3, 6]
    g = torch.Generator().manual_seed(5)
    delta = torch.randn(B, len(positions), 2, d, generator=g, dtype=torch.float64) * 2
    f = moved_token_objective(fm, X, positions)(delta)  # (B, P, R)
    phi0 = fm(X)
    for b in range(B):
        for j, p in enumerate(positions):
            for r in range(2):
                Xp = X[b : b + 1].clone()
                Xp[0, p] += delta[b, j, r]
                ref = (fm(Xp)[0] - phi0[b]).pow(2).sum()
                assert abs(f[b, j, r] - ref) <= 1e-6 * ref, (name, b, p, r)


def test_attention_structured_path_edge_cases():
    """Edge cases: n = 1, and ReLU rows whose scores are all <= 0 (the authors' divisor 1: a zero attention row)."""
    for cls in (RandomAttentionFeatures, ReLUAttentionFeatures):
        fm = cls(4, seed=0, dtype="float64")
        X = torch.randn(2, 1, 4, dtype=torch.float64)
        delta = torch.randn(2, 1, 3, 4, dtype=torch.float64)
        f = moved_token_objective(fm, X, [0])(delta)
        ref = torch.stack([(fm(X + delta[:, 0, r, None]) - fm(X)).pow(2).sum(1) for r in range(3)], dim=1)
        assert torch.allclose(f[:, 0], ref, rtol=1e-9, atol=1e-12)
    relu = ReLUAttentionFeatures(4, seed=0, dtype="float64")
    relu.W.copy_(-torch.eye(4, dtype=torch.float64))
    X = torch.ones(1, 3, 4, dtype=torch.float64)  # every score is negative: all rows of A are zero
    delta = torch.tensor([[[[-3.0, 0.5, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]]]], dtype=torch.float64)
    f = moved_token_objective(relu, X, [1])(delta)
    for r in range(2):
        Xp = X.clone()
        Xp[0, 1] += delta[0, 0, r]
        assert torch.isfinite(f[0, 0, r])
        assert abs(f[0, 0, r] - (relu(Xp) - relu(X)).pow(2).sum()) < 1e-9


def test_memory_bounded_rf_gives_the_same_estimate(rows):
    n, d = 6, 10
    X = rows(2, n, d, dtype=torch.float64)
    dense = RandomFeatures(n, d, seed=3, dtype="float64")
    bounded = RandomFeatures(n, d, seed=3, dtype="float64", max_stored_bytes=0, block_rows=100)
    assert bounded.V is None
    a, b = word_sensitivity(dense, X, max_steps=50), word_sensitivity(bounded, X, max_steps=50)
    assert torch.allclose(a.ws, b.ws, rtol=1e-9)
    assert torch.allclose(a.delta, b.delta, atol=1e-9)
    # the bounded path's float64 value (z from one pass over V plus V^(i) Delta) is the full map's value
    change, norm = full_change(dense, X, 0, b.delta)
    assert torch.allclose(b.ws, change / norm, rtol=1e-9)
    assert torch.allclose(b.phi_norm, norm, rtol=1e-12)


@pytest.mark.parametrize("name", MAPS)
def test_reported_ws_is_the_full_map_at_the_reported_delta(rows, name):
    B, n, d = 3, 6, 8
    X = rows(B, n, d, dtype=torch.float64)
    fm = make_map(name, n, d, dtype="float64")
    res = word_sensitivity(fm, X, positions="all", max_steps=60)
    assert isinstance(res, WSResult)
    assert res.ws.shape == (B,) and res.delta.shape == (B, d) and res.position.dtype == torch.long
    assert res.steps.shape == (B,) and res.steps.dtype == torch.long and (res.steps >= 1).all()
    Xp = X.clone()
    Xp[torch.arange(B), res.position] += res.delta
    ref = (fm(Xp) - fm(X)).norm(dim=1) / fm(X).norm(dim=1)
    assert torch.allclose(res.ws, ref, rtol=1e-9)
    assert torch.allclose(res.phi_norm, fm(X).norm(dim=1), rtol=1e-12)
    assert torch.allclose(res.delta_norm, res.delta.norm(dim=1), rtol=1e-12)
    # the float64 recomputation of a float32 map equals the float64 map with the same seed
    assert torch.allclose(map_features(make_map(name, n, d), X, exact=True), fm(X), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# Scaling laws (docs/theory/index.md §1.4, docs/theory/checks.md §8.2-8.6) on synthetic unit-norm rows
# ---------------------------------------------------------------------------------------------------------------------


def mean_ws(name, n, d, rows, B=4, **kw):
    fm = make_map(name, n, d)
    X = rows(B, n, d, seed=n)
    return word_sensitivity(fm, X, **kw), fm, X


def test_rf_ws_times_sqrt_n_is_flat_and_below_the_operator_norm_bound(rows):
    d, scaled = 32, []
    for n in (16, 32, 64):
        res, fm, X = mean_ws("rf", n, d, rows)
        bound = ws_bound_rf(fm, X, res.position, res.delta_norm, phi_norm=res.phi_norm)
        assert (res.ws <= bound * (1 + 1e-9)).all(), (n, res.ws, bound)
        # the bound recomputed from scratch (its own pass over V and phi) agrees
        assert torch.allclose(ws_bound_rf(fm, X, 0, res.delta_norm), bound, rtol=1e-5)
        scaled.append(res.ws.mean().item() * math.sqrt(n))
    assert max(scaled) / min(scaled) < 1.3, scaled
    assert 0.7 < min(scaled) and max(scaled) < 2.0, scaled  # level of docs/theory/checks.md §8, §11: about 1.0-1.5


def test_deep_rf_ws_decays_in_n(rows):
    d = 16
    s = [mean_ws("deep_rf", n, d, rows)[0].ws.mean().item() for n in (8, 32)]
    assert s[1] < 0.7 * s[0], s
    assert s[1] < 0.5, s


def test_raf_ws_is_order_one_and_flat_in_n(rows):
    d = 32
    s = [mean_ws("raf", n, d, rows)[0].ws.mean().item() for n in (8, 64)]
    assert min(s) > 1.0, s
    assert s[1] / s[0] >= 0.5, s  # 1/sqrt(n) would give sqrt(8/64) = 0.35


def test_relu_raf_ws_decays_in_n_and_sits_below_raf(rows):
    d = 32
    relu = [mean_ws("relu_raf", n, d, rows)[0].ws.mean().item() for n in (8, 64)]
    raf64 = mean_ws("raf", 64, d, rows)[0].ws.mean().item()
    assert relu[1] < 0.5 * relu[0], relu
    assert relu[1] < 0.5 * raf64, (relu, raf64)


# ---------------------------------------------------------------------------------------------------------------------
# Optimiser sanity
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("radius", [None, 2.0])
def test_delta_stays_in_the_ball_and_the_optimum_is_on_its_boundary(rows, name, radius):
    n, d = 8, 16
    X = rows(3, n, d)
    res = word_sensitivity(make_map(name, n, d), X, radius=radius)
    r = math.sqrt(d) if radius is None else radius
    assert (res.delta.norm(dim=1) <= r * (1 + 1e-6)).all()
    assert (res.delta_norm >= r * (1 - 1e-3)).all(), res.delta_norm


@pytest.mark.parametrize("name", MAPS)
def test_doubling_the_step_budget_never_lowers_the_estimate(rows, name):
    n, d = 8, 16
    X = rows(2, n, d, dtype=torch.float64)
    fm = make_map(name, n, d, dtype="float64")
    short = word_sensitivity(fm, X, max_steps=15, tol=0.0)
    long = word_sensitivity(fm, X, max_steps=30, tol=0.0)
    assert (short.steps == 15).all() and (long.steps == 30).all()
    assert (long.ws >= short.ws * (1 - 1e-12)).all(), (short.ws, long.ws)
    # converged runs are stable (docs/theory/checks.md §8.7: change < 5% when the budget doubles)
    a = word_sensitivity(fm, X, max_steps=200)
    b = word_sensitivity(fm, X, max_steps=400, tol=1e-6, window=40)
    assert ((b.ws - a.ws) / a.ws).abs().max() < 0.05


@pytest.mark.parametrize("name", MAPS)
def test_all_positions_at_least_first(rows, name):
    n, d = 6, 8
    X = rows(3, n, d, dtype=torch.float64)
    fm = make_map(name, n, d, dtype="float64")
    # the generic settings for every map: RF's own (one round, a coarser stop) leave a sample's confirmation round to
    # its best position, so position 0 of [3, 0] may run fewer chains than position 0 alone
    tight = SearchSettings(**dataclasses.asdict(GENERIC_DEFAULTS))
    first = word_sensitivity(fm, X, positions="first", search=tight)
    some = word_sensitivity(fm, X, positions=[3, 0], search=tight)
    every = word_sensitivity(fm, X, positions="all", search=tight)
    assert (first.position == 0).all()
    assert set(some.position.tolist()) <= {0, 3}
    assert (some.ws >= first.ws * (1 - 1e-9)).all()
    assert (every.ws >= some.ws * (1 - 1e-9)).all()


def test_chunking_over_positions_and_chains_does_not_change_the_result(rows):
    n, d = 6, 8
    X = rows(2, n, d, dtype=torch.float64)
    for name in ("rf", "raf"):
        fm = make_map(name, n, d, dtype="float64")
        whole = word_sensitivity(fm, X, positions="all", max_steps=40)
        tiny = word_sensitivity(fm, X, positions="all", max_steps=40, chunk_elements=1)
        assert torch.allclose(whole.ws, tiny.ws, rtol=1e-9)
        assert torch.equal(whole.position, tiny.position)


def test_determinism_by_seed(rows):
    n, d = 8, 16
    X = rows(2, n, d)
    fm = make_map("raf", n, d)
    a, b = word_sensitivity(fm, X, seed=3), word_sensitivity(fm, X, seed=3)
    assert torch.equal(a.ws, b.ws) and torch.equal(a.delta, b.delta)
    # one random start only (no power iteration): the seed picks the start, so the path changes
    c = word_sensitivity(fm, X, seed=3, chains_per_round=1, power_iters=0, max_steps=5, tol=0.0)
    e = word_sensitivity(fm, X, seed=4, chains_per_round=1, power_iters=0, max_steps=5, tol=0.0)
    assert not torch.allclose(c.delta, e.delta)
    # the global RNG plays no part
    torch.manual_seed(0)
    f = word_sensitivity(fm, X, seed=3)
    torch.manual_seed(123)
    g = word_sensitivity(fm, X, seed=3)
    assert torch.equal(f.ws, g.ws)


def test_float32_and_float64_agree_on_rf(rows):
    n, d = 8, 16
    X = rows(3, n, d)
    a = word_sensitivity(make_map("rf", n, d), X)
    b = word_sensitivity(make_map("rf", n, d, dtype="float64"), X.double())
    assert a.ws.dtype == torch.float64 and b.ws.dtype == torch.float64
    assert torch.allclose(a.ws, b.ws, rtol=2e-3), (a.ws, b.ws)
    # a float64 search on a float32 map also works
    c = word_sensitivity(make_map("rf", n, d), X, dtype="float64")
    assert torch.allclose(c.ws, b.ws, rtol=2e-3)


def test_estimate_beats_the_attention_attracting_construction(rows):
    """docs/theory/maps.md §3.5: Delta = sqrt(d) W^T xbar / ||W^T xbar|| alone gives order-1 S.

    The search only adds to it.
    """
    n, d = 16, 32
    X = rows(4, n, d, dtype=torch.float64)
    fm = make_map("raf", n, d, dtype="float64")
    xbar = X.mean(dim=1)  # (B, d)
    delta = xbar @ fm.W
    delta = delta / delta.norm(dim=1, keepdim=True) * math.sqrt(d)
    change, norm = full_change(fm, X, 0, delta)
    res = word_sensitivity(fm, X)
    assert (res.ws >= change / norm * (1 - 1e-9)).all()
    # and random Deltas of the same norm do far worse (their S decays like 1/sqrt(n))
    rand = torch.randn(4, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rand = rand / rand.norm(dim=1, keepdim=True) * math.sqrt(d)
    change_r, _ = full_change(fm, X, 0, rand)
    assert res.ws.mean() > 2 * (change_r / norm).mean()


def authors_estimate(fm, X, lr, steps, seed):
    """The authors' procedure (docs/theory/search.md §4.1) on one sample.

    Fixed-step projected GD on -RMSE, noisy-start centre.
    """
    g = torch.Generator().manual_seed(seed)
    d = X.shape[-1]
    xt = X[0] + 0.1 * torch.randn(d, generator=g, dtype=X.dtype)
    x0 = xt.clone()
    phi0 = fm(X[None])
    for _ in range(steps):
        xt.requires_grad_(True)
        loss = -torch.sqrt(torch.mean((fm(torch.cat([xt[None], X[1:]])[None]) - phi0) ** 2))
        (grad,) = torch.autograd.grad(loss, xt)
        with torch.no_grad():
            xt = xt - lr * grad
            dist = (xt - x0).norm()
            if dist > d**0.5:
                xt = x0 + (xt - x0) * d**0.5 / dist
    with torch.no_grad():
        out = fm(torch.cat([xt[None], X[1:]])[None])
        return ((out - phi0).norm() / phi0.norm()).item(), (xt - X[0]).norm().item()


def test_at_least_the_authors_fixed_step_estimate(rows):
    n, d = 8, 16
    X = rows(2, n, d, dtype=torch.float64)
    fm = make_map("raf", n, d, dtype="float64")
    for b in range(2):
        theirs, realised = authors_estimate(fm, X[b], lr=10.0, steps=50 * n, seed=b)
        # their ball is centred at the noisy start, so their ||Delta|| can exceed sqrt(d): compare at their radius
        ours = word_sensitivity(fm, X[b : b + 1], radius=realised)
        assert ours.ws[0] >= theirs * (1 - 1e-3), (b, ours.ws[0], theirs, realised)


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: a ValueError naming the argument, before any heavy work
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"positions": "middle"}, r"positions must be 'first', 'all' or a list of ints in \[0, 3\], got 'middle'"),
        ({"positions": [4]}, r"positions: every position must be an int in \[0, 3\], got 4"),
        ({"positions": [-1]}, r"positions: every position must be an int in \[0, 3\], got -1"),
        ({"positions": []}, r"positions must be"),
        ({"radius": 0.0}, r"radius must be a finite number > 0, got 0.0"),
        ({"radius": -1}, r"radius must be a finite number > 0, got -1"),
        ({"chains_per_round": 0}, r"chains_per_round must be a positive integer, got 0"),
        ({"max_steps": 0}, r"max_steps must be a positive integer, got 0"),
        ({"lr": 0}, r"lr must be a finite number > 0, got 0"),
        ({"tol": -1e-3}, r"tol must be a finite number >= 0, got -0.001"),
        ({"dtype": "float16"}, r"dtype must be one of \['float32', 'float64'\] or None, got 'float16'"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(rows, kwargs, match):
    fm = make_map("raf", 4, 8)
    with pytest.raises(ValueError, match=match):
        word_sensitivity(fm, rows(2, 4, 8), **kwargs)


def test_bad_X_shapes_raise_value_errors(rows):
    with pytest.raises(ValueError, match=r"X must be a tensor of shape \(B, n, d\), got \(4, 8\)"):
        word_sensitivity(make_map("raf", 4, 8), rows(1, 4, 8)[0])
    with pytest.raises(ValueError, match=r"X: the map was built for d=8, got X of shape \(1, 4, 6\)"):
        word_sensitivity(make_map("raf", 4, 8), rows(1, 4, 6))
    with pytest.raises(ValueError, match=r"X: the map was built for n=4 tokens, got X of shape \(1, 5, 8\)"):
        word_sensitivity(make_map("rf", 4, 8), rows(1, 5, 8))
    with pytest.raises(ValueError, match=r"feature_map must be an nn.Module .* with an int attribute `d`"):
        word_sensitivity(torch.nn.Linear(2, 2), rows(1, 4, 8))
    with pytest.raises(ValueError, match=r"position must be an int or \(B,\) tensor of ints in \[0, 3\], got 7"):
        ws_bound_rf(make_map("rf", 4, 8), rows(1, 4, 8), 7, 1.0)


# ---------------------------------------------------------------------------------------------------------------------
# Figure: S against n with a 1-sd band
# ---------------------------------------------------------------------------------------------------------------------


def test_plot_ws_curves_means_bands_and_scaling():
    import matplotlib.pyplot as plt

    records = []
    for d in (192, 384):
        for n in (10, 40):
            for trial, ws in enumerate((0.1, 0.3)):
                records.append({"map": "rf", "d": d, "n": n, "L": 1, "trial": trial, "ws": ws * d / 192})
    records.append({"map": "raf", "d": 192, "n": 10, "L": 1, "trial": 0, "ws": 9.0})  # another map: ignored
    curves = ws_curves(records, "rf", "d")
    assert sorted(curves) == [192, 384]
    ns, means, sds = curves[384]
    assert ns == [10, 40] and means == pytest.approx([0.4, 0.4]) and sds == pytest.approx([0.2 * 2**0.5] * 2)
    fig = plot_ws_curves(records, "rf", "d")
    ax = fig.axes[0]
    assert len(ax.lines) == 2 and len(ax.collections) == 2  # one curve and one band per d
    assert list(ax.lines[0].get_ydata()) == pytest.approx([0.2, 0.2])
    plt.close(fig)
    fig = plot_ws_curves(records, "rf", "d", scaled=True)
    assert list(fig.axes[0].lines[1].get_ydata()) == pytest.approx([0.4 * 10**0.5, 0.4 * 40**0.5])
    plt.close(fig)
    with pytest.raises(ValueError, match="group must be 'd' or 'L', got 'n'"):
        ws_curves(records, "rf", "n")
    with pytest.raises(ValueError, match="map_name: no record has map='deep_rf'"):
        ws_curves(records, "deep_rf", "L")


def test_result_carries_the_rf_operator_norm_bound(rows):
    fm = make_map("rf", 5, 6, dtype="float64")
    X = rows(3, 5, 6, dtype=torch.float64)
    res = word_sensitivity(fm, X, positions="all", max_steps=30)
    ref = ws_bound_rf(fm, X, res.position, res.delta_norm, res.phi_norm)
    assert torch.allclose(res.bound, ref, rtol=1e-10) and bool((res.ws <= res.bound).all())
    assert word_sensitivity(make_map("raf", 5, 6), X.float(), max_steps=5).bound is None


def test_a_call_at_its_defaults_searches_with_the_map_familys_settings(monkeypatch):
    """`word_sensitivity(map, X)` resolves unset settings from the map's family, else the generic defaults.

    The family of a built map, a list of them, or FreshMaps drawn from the law (RF); the call's own changes win.
    """
    from wslight.search import sensitivity

    seen = []
    real = sensitivity.Rounds

    def spy(settings, radius, plan):
        seen.append(settings)
        return real(settings, radius, plan)

    monkeypatch.setattr(sensitivity, "Rounds", spy)

    class Plain(torch.nn.Module):  # a user's module: no family
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.d, self.n = package_make_map("raf", 4, 8), 8, 4

        def forward(self, X):
            return self.inner(X)

    X = torch.randn(2, 4, 8)
    word_sensitivity(package_make_map("rf", 4, 8), X, max_steps=2)
    word_sensitivity(FreshMaps("rf", [1, 2]), X[:, None], seed=[1, 2], max_steps=2)
    word_sensitivity(FreshMaps("raf", [1, 2]), X[:, None], seed=[1, 2], max_steps=2)
    word_sensitivity(Plain(), X, max_steps=2, chains_per_round=3)
    rf, fresh_rf, raf, plain = seen
    assert (rf.chains_per_round, rf.max_chains, rf.tol, rf.window) == (4, 4, 1e-3, 10)
    assert fresh_rf == rf  # drawn from the law: the class's defaults too
    assert (raf.chains_per_round, raf.max_chains) == (6, 64) and raf.max_steps == 2  # the call's change wins
    assert plain.chains_per_round == 3 and plain.max_chains == GENERIC_DEFAULTS.max_chains
