"""The generic path's evaluations: the live chains' values and gradients against a per-chain autograd loop.

A module without a closed form is searched through its own forward, differentiated by autograd. Its chains evaluate
only the chains still moving (`GenericMove.live_value_and_grad`); that batching must equal the full one and a plain
per-chain loop, and the float32 chains' final value must be the float64 one.
"""

import math

import torch
from torch import nn

from tests.conftest import unit_rows
from wslight.chains.engine import MonotoneAscent, autograd_evaluate, run_chains
from wslight.chains.settings import SearchSettings
from wslight.features import make_map
from wslight.features.generic_move import GenericMove
from wslight.search.rounds import Rounds
from wslight.search.sensitivity import word_sensitivity
from wslight.search.start_plan import StartPlan


class _Plain(nn.Module):
    """A user's map that only forwards: the search takes the generic path."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.n, self.d = inner, inner.n, inner.d

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.inner(X)


def _case(kind="relu_raf", T=2, B=2, n=6, d=8, R=5, positions=(0, 3), dtype="float64"):
    maps = [_Plain(make_map(kind, n, d, seed=s, dtype=dtype)) for s in range(T)]
    X = unit_rows(T * B, n, d, seed=3, dtype=getattr(torch, dtype)).reshape(T, B, n, d)
    move = GenericMove(maps, X, list(positions), getattr(torch, dtype))
    g = torch.Generator().manual_seed(5)
    delta = torch.randn(T, B, len(positions), R, d, generator=g, dtype=getattr(torch, dtype)) * 0.7
    return maps, X, move, delta


def test_live_values_and_gradients_equal_a_per_chain_autograd_loop_through_forward():
    """Each live chain's f = ||phi(X^i(Delta)) - phi(X)||^2 and its gradient, against one forward per chain (float64).

    The other chains read -inf and 0.
    """
    maps, X, move, delta = _case()
    live = torch.rand(delta.shape[:-1], generator=torch.Generator().manual_seed(1)) < 0.6
    f, g = move.live_value_and_grad(delta, live)
    for t, b, j, r in live.nonzero().tolist():
        x = delta[t, b, j, r].clone().requires_grad_(True)
        Xp = X[t, b].clone()
        Xp = torch.cat([Xp[: move.positions[j]], (Xp[move.positions[j]] + x)[None], Xp[move.positions[j] + 1 :]])
        ref = (maps[t](Xp[None]) - maps[t](X[t, b][None])).pow(2).sum()
        (ref_g,) = torch.autograd.grad(ref, x)
        assert math.isclose(f[t, b, j, r].item(), ref.item(), rel_tol=1e-6)
        torch.testing.assert_close(g[t, b, j, r], ref_g, rtol=1e-6, atol=1e-9)
    assert (f[~live] == -math.inf).all() and (g[~live] == 0).all()


def test_live_evaluation_equals_the_full_batch_of_every_chain():
    """Evaluating only the live chains gives what one batch of every chain gives at those chains."""
    _, _, move, delta = _case(kind="raf", T=3, R=4)
    live = torch.rand(delta.shape[:-1], generator=torch.Generator().manual_seed(2)) < 0.5
    f, g = move.live_value_and_grad(delta, live)
    f_all, g_all = autograd_evaluate(move.change_sq)(delta)
    torch.testing.assert_close(f[live], f_all[live], rtol=1e-12, atol=0)
    torch.testing.assert_close(g[live], g_all[live], rtol=1e-10, atol=1e-12)


def test_chains_on_live_evaluations_follow_the_narrowed_engines_paths():
    """The engine with live evaluations moves every chain as the engine with its narrowed batches does (float64)."""
    _, _, move, delta = _case(R=6)
    x0 = delta / delta.norm(dim=-1, keepdim=True) * 8**0.5
    rule = MonotoneAscent(8**0.5, 0.25, 1e-4, 10, ridge=True)
    plain = run_chains(autograd_evaluate(move.change_sq), x0, rule, 80)
    live = run_chains(autograd_evaluate(move.change_sq), x0, rule, 80, moving_only=move.live_value_and_grad)
    assert torch.equal(plain.steps, live.steps) and int(live.steps.min()) < int(live.steps.max())
    torch.testing.assert_close(live.best_f, plain.best_f, rtol=1e-12, atol=0)
    torch.testing.assert_close(live.best_x, plain.best_x, rtol=1e-10, atol=1e-12)


def test_the_float32_chains_final_value_is_the_float64_one():
    """A float32 plain module's chains run in float32; the reported S is recomputed in float64 at the best Delta.

    The float64 value of the module's weights at the reported Delta, to 1e-12; the float32 forward there is off by more
    (so a report of the chains' own float32 value would fail).
    """
    T, B, n, d = 2, 3, 6, 16
    maps = [_Plain(make_map("raf", n, d, seed=s)) for s in range(T)]
    X = unit_rows(T * B, n, d, seed=7).reshape(T, B, n, d)
    res = word_sensitivity(maps, X, seed=[1, 2], search=SearchSettings(max_steps=8, max_chains=4))
    assert res.ws.dtype == torch.float64
    gap32 = 0.0
    for t in range(T):
        m64 = make_map("raf", n, d, seed=t).to(torch.float64)
        Xp = X[t].clone().to(torch.float64)
        Xp[torch.arange(B), res.position[t]] += res.delta[t].to(torch.float64)
        phi0, phi = m64(X[t].to(torch.float64)), m64(Xp)
        ws64 = (phi - phi0).norm(dim=-1) / phi0.norm(dim=-1)
        torch.testing.assert_close(res.ws[t], ws64, rtol=1e-12, atol=0)
        phi0_32, phi_32 = maps[t](X[t]), maps[t](Xp.float())
        ws32 = ((phi_32 - phi0_32).norm(dim=-1) / phi0_32.norm(dim=-1)).double()
        gap32 = max(gap32, (ws32 - ws64).abs().max().item())
    assert gap32 > 1e-10


def test_the_search_hands_its_generic_rounds_the_live_evaluation(monkeypatch):
    """Every round of a plain module's search (homotopy balls included) evaluates only its moving chains."""
    calls = {"live": 0}
    original = GenericMove.live_value_and_grad

    def counted(self, delta, live):
        calls["live"] += 1
        return original(self, delta, live)

    monkeypatch.setattr(GenericMove, "live_value_and_grad", counted)
    monkeypatch.setattr(GenericMove, "change_sq", lambda self, delta: (_ for _ in ()).throw(AssertionError("full")))
    maps, X, move, _ = _case(T=1, B=1, dtype="float32")
    resolved = SearchSettings(max_steps=5, max_chains=4, power_iters=0).resolved()
    f, x, steps = Rounds(resolved, resolved.radius(8), StartPlan()).round(move, torch.randn(1, 1, 1, 3, 8), 64)
    assert calls["live"] > 0 and f.shape == (1, 1, 1, 3)


# ----------------------------------------------------------------------------------------------------------------------
# A module's own single-token forward (`token_moves`): the attention sublayers
# ----------------------------------------------------------------------------------------------------------------------


def _attention_maps(n):
    """The two attention sublayers that offer `token_moves`, in float64 (the pre-trained one with its biases)."""
    return {
        "transformer": make_map("transformer", n, 24, seed=1, dtype="float64", heads=4),
        "pretrained_attn": make_map("pretrained_attn", n, 384, dtype="float64"),
    }


def test_one_token_attention_equals_the_full_forward_and_its_gradient():
    n, positions = 7, [0, 3, 6]
    for name, m in _attention_maps(n).items():
        d = m.d
        X = unit_rows(3, n, d, seed=2, dtype=torch.float64)
        moves = m.token_moves(X, positions)
        # position 0: samples moved unequally often (sample by sample), 1 and 2: equally (one batch)
        b, j = torch.tensor([0, 1, 2, 2, 0, 1, 1, 0]), torch.tensor([0, 1, 2, 0, 2, 1, 0, 0])
        x = torch.randn(8, d, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2 * d**0.5
        x.requires_grad_(True)
        onehot = torch.nn.functional.one_hot(torch.tensor(positions)[j], n)[..., None].double()
        fast, full = moves(b, j, x), m(X[b] + onehot * x[:, None])
        assert (fast - full).abs().max() <= 1e-12 * full.abs().max(), name
        probe = torch.randn(full.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
        (g_fast,) = torch.autograd.grad((fast * probe).sum(), x)
        (g_full,) = torch.autograd.grad((full * probe).sum(), x)
        assert (g_fast - g_full).abs().max() <= 1e-11 * g_full.abs().max(), name


def test_a_module_with_token_moves_searches_as_its_plain_forward_does():
    n, positions = 6, [0, 4]
    for name, m in _attention_maps(n).items():
        X = unit_rows(2, n, m.d, seed=3, dtype=torch.float64)[None]
        own, plain = (
            GenericMove([m], X, positions, torch.float64),
            GenericMove([_Plain(m)], X, positions, torch.float64),
        )
        assert own.moves[0] is not None and plain.moves[0] is None
        delta = torch.randn(1, 2, 2, 5, m.d, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 3
        assert torch.allclose(own.features(delta), plain.features(delta), rtol=0, atol=1e-11)
        live = torch.rand(1, 2, 2, 5, generator=torch.Generator().manual_seed(8)) < 0.6
        (f_own, g_own), (f_plain, g_plain) = (
            own.live_value_and_grad(delta, live),
            plain.live_value_and_grad(delta, live),
        )
        assert torch.equal(f_own.isinf(), ~live) and torch.allclose(f_own[live], f_plain[live], rtol=1e-11, atol=0)
        assert torch.allclose(g_own, g_plain, rtol=0, atol=1e-10 * g_plain.abs().max().item()), name
        kept = own.select_trials(torch.tensor([0]))
        assert kept.moves == own.moves


def test_row_starts_read_through_token_moves_equal_those_of_the_full_forward(monkeypatch):
    """The row, capture and removal starts of a module with `token_moves` read its moved copies through it.

    Every power step, capture step and removal subspace step then moves one token. The row and removal starts equal
    those read through the full forward of every moved copy to 1e-10 (float64); the 4 captured ones (starts 4 to 7)
    come out of 100 normalised descent steps each, which carry rounding differences further: the same points to a
    cosine of 0.9999.
    """
    from wslight.features.rows import REMOVAL_ROWS, REMOVAL_SINGULAR
    from wslight.search.starts import seeded_draws

    n, i = 6, 2
    for name, m in _attention_maps(n).items():
        d = m.d
        X = unit_rows(2, n, d, seed=9, dtype=torch.float64)[None]
        own, plain = GenericMove([m], X, [i], torch.float64), GenericMove([_Plain(m)], X, [i], torch.float64)
        draws = seeded_draws([2], [i], 2, n, d, "rows").double()
        lean = seeded_draws([2], [i], 2, REMOVAL_ROWS * REMOVAL_SINGULAR, d, "removal").double()
        forwards = []
        inner = type(m).forward
        monkeypatch.setattr(type(m), "forward", lambda self, x: forwards.append(len(x)) or inner(self, x))
        fast, through_moves = own.row_starts(d**0.5, draws, lean), len(forwards)
        full = plain.row_starts(d**0.5, draws, lean)
        assert through_moves == 0 and len(forwards) > 100, name  # no full forward of a moved copy: the moves' own
        assert fast.shape == full.shape and fast.shape[3] == 8 + 2 * REMOVAL_SINGULAR * 2 * min(n, REMOVAL_ROWS)
        rows = torch.cat([fast[..., :4, :] - full[..., :4, :], fast[..., 8:, :] - full[..., 8:, :]], dim=-2)
        assert rows.abs().max() <= 1e-10, name
        assert ((fast[..., 4:8, :] * full[..., 4:8, :]).sum(-1) > 0.9999).all(), name


def test_token_moves_are_left_to_the_full_forward_where_every_row_changes():
    X = unit_rows(1, 4, 24, seed=1, dtype=torch.float64)
    assert make_map("transformer", 4, 24, seed=1, dtype="float64", heads=4, ffn_ratio=2).token_moves(X, [0]) is None
    assert make_map("transformer", 1, 24, seed=1, dtype="float64", heads=4).token_moves(X[:, :1], [0]) is None
