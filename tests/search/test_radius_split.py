"""The radius shared out among the blocks of a separable change (multi-head RAF).

The dynamic programme is exact on its grid, and the start it gives holds that split, inside the ball, at least as good
as the best one-block start.
"""

import itertools

import pytest
import torch

from wslight.chains.settings import SearchSettings
from wslight.features import make_map
from wslight.features.generic_move import token_move
from wslight.search.radius_split import _share_out, radius_split_start
from wslight.search.sensitivity import word_sensitivity

# The ascent every block and level runs: lr 0.25, tol 1e-4, window 20, 300 steps
ASCENT = SearchSettings(lr=0.25, tol=1e-4, window=20, max_steps=300).resolved()

pytestmark = pytest.mark.usefixtures("one_thread")


def test_share_out_is_the_best_split_of_the_levels_by_brute_force():
    """Every split (m_1..m_H) with sum m_h <= M, enumerated: the programme's is one of the best."""
    torch.manual_seed(0)
    H, M = 4, 5
    g = torch.rand(3, H, 2, 1, M + 1, dtype=torch.float64).cumsum(-1)  # nondecreasing in the level, as a max is
    g[..., 0] = 0
    g[0, 1] = g[0, 1] ** 3  # one block growing faster than linearly: its best split is lopsided
    level = _share_out(g)  # (T, H, B, P)
    assert (level.sum(1) <= M).all()
    for t, b in itertools.product(range(3), range(2)):
        best = max(
            sum(g[t, h, b, 0, m[h]].item() for h in range(H))
            for m in itertools.product(range(M + 1), repeat=H)
            if sum(m) <= M
        )
        got = sum(g[t, h, b, 0, level[t, h, b, 0]].item() for h in range(H))
        assert got == pytest.approx(best, rel=1e-12)


def test_radius_split_start_is_in_the_ball_and_beats_every_one_head_start(rows):
    """The allocated start lies in the ball and beats every one-head start.

    The start has its blocks at their allocated radii; its change is at least that of every start putting the whole
    radius in one head along that head's own directions (the programme may choose those).
    """
    X = rows(3, 6, 24)[None].double()  # (T = 1, B = 3, n, d)
    fmap = make_map("raf_mh", 6, 24, seed=4)  # H = 4 heads of d_h = 6
    move = token_move([fmap], X, [0], torch.float64)
    radius = 24**0.5
    draws = torch.randn(1, 3, 1, 8, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    start = radius_split_start(move, radius, ASCENT, draws)  # (1, B, 1, 1, d)
    assert (start.norm(dim=-1) <= radius * (1 + 1e-9)).all()
    H = fmap.heads
    one_head = move.starts[:, :, :, :H] * radius  # (1, B, 1, H, d): the whole radius in one head
    assert (move.change_sq(start)[..., 0] >= move.change_sq(one_head).amax(-1) * (1 - 1e-9)).all()


def test_multi_head_search_starts_from_the_split_and_is_seeded(rows):
    """word_sensitivity on raf_mh12 gives the same S for the same seed and one at least the split start's value."""
    X = rows(2, 8, 24)
    fmap = make_map("raf_mh12", 8, 24, seed=2)
    a = word_sensitivity(fmap, X, seed=5, chains_per_round=4, max_chains=8)
    b = word_sensitivity(fmap, X, seed=5, chains_per_round=4, max_chains=8)
    assert torch.equal(a.ws, b.ws)
    move = token_move([fmap], X[None].float(), [0], torch.float32)
    start = radius_split_start(move, 24**0.5, ASCENT)
    S_start = move.change_sq(start)[0, :, 0, 0].clamp_min(0).sqrt() / move.phi0[0].norm(dim=-1)
    assert (a.ws >= S_start.double() * (1 - 1e-4)).all()
