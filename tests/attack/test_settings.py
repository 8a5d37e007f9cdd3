"""`AttackSettings`: checked once, its defaults and the authors' schedules filled by `resolved`, taken whole."""

import pytest
import torch

from wslight.attack import AttackSettings, delta_attack, draw_samples
from wslight.attack.settings import DEFAULT_LR, DEFAULT_RESTARTS, DEFAULT_STEPS
from wslight.base.seeding import generator
from wslight.features import RandomAttentionFeatures


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"steps": 0}, r"^steps must be a positive integer, got 0"),
        ({"restarts": 1.5}, r"^restarts must be a positive integer, got 1.5"),
        ({"lr": 0.0}, r"^lr must be a finite number > 0"),
        ({"radius": -1.0}, r"^radius must be a finite number > 0"),
        ({"position": -1}, r"^position must be an integer >= 0, got -1"),
        ({"faithful": "yes"}, r"^faithful must be true or false, got 'yes'"),
        ({"dtype": "float16"}, r"^dtype must be one of \['float32', 'float64'\], got 'float16'"),
        ({"faithful": True, "restarts": 3}, r"^restarts must be 1 \(or None\) when faithful=True, got 3"),
    ],
)
def test_a_bad_field_is_refused_when_the_settings_are_made(fields, match):
    with pytest.raises(ValueError, match=match):
        AttackSettings(**fields)


def test_replace_refuses_an_unknown_field_naming_the_closest():
    with pytest.raises(ValueError, match=r"restart: not an attack setting; did you mean restarts\?"):
        AttackSettings().replace(restart=2)
    assert AttackSettings().replace(steps=7) == AttackSettings(steps=7)


def test_resolved_fills_the_improved_optimisers_defaults_and_sqrt_d():
    r = AttackSettings().resolved("raf", n=5, d=16)
    defaults = (DEFAULT_STEPS, DEFAULT_LR, DEFAULT_RESTARTS, 4.0, "float32")
    assert (r.steps, r.lr, r.restarts, r.radius, r.dtype) == defaults
    assert r.torch_dtype == torch.float32
    given = AttackSettings(steps=9, lr=0.5, restarts=2, radius=1.0, dtype=torch.float64).resolved("rf", 5, 16)
    assert (given.steps, given.lr, given.restarts, given.radius, given.dtype) == (9, 0.5, 2, 1.0, "float64")


@pytest.mark.parametrize(
    "kind, n, lr, steps", [("rf", 7, 100.0, 300), ("deep_rf", 7, 100.0, 300), ("raf", 7, 1.0, 350)]
)
def test_faithful_takes_the_authors_schedule_of_the_map(kind, n, lr, steps):
    r = AttackSettings(faithful=True).resolved(kind, n, d=4)
    assert (r.lr, r.steps, r.restarts, r.dtype) == (lr, steps, 1, "float64")
    assert AttackSettings(faithful=True, steps=3).resolved(kind, n, 4).steps == 3


def test_faithful_for_a_map_without_a_schedule_needs_lr_and_steps():
    with pytest.raises(ValueError, match=r"faithful: the authors' schedule exists for .*give lr and steps for a Mine"):
        AttackSettings(faithful=True).resolved("Mine", 4, 4)
    assert AttackSettings(faithful=True, lr=0.1, steps=5).resolved("Mine", 4, 4).steps == 5


def test_the_position_is_checked_against_the_context_length():
    with pytest.raises(ValueError, match=r"^position must be an integer in \[0, 3\], got 4"):
        AttackSettings(position=4).resolved("raf", 4, 8)


def test_delta_attack_takes_the_settings_whole_or_field_by_field(rows):
    fm = RandomAttentionFeatures(6, seed=1, dtype="float64")
    X = rows(12, 4, 6, seed=2, dtype=torch.float64)
    y = torch.tensor([1.0, -1.0] * 6, dtype=torch.float64)
    whole = delta_attack(fm, X[2:], y[2:], X[:2], y[:2], settings=AttackSettings(steps=20, restarts=2, position=1))
    loose = delta_attack(fm, X[2:], y[2:], X[:2], y[:2], steps=20, restarts=2, position=1)
    changed = delta_attack(fm, X[2:], y[2:], X[:2], y[:2], settings=AttackSettings(steps=20), restarts=2, position=1)
    for key in ("err", "D1", "delta_norm", "steps"):
        assert torch.equal(whole[key], loose[key]) and torch.equal(whole[key], changed[key])
    assert bool((whole["chains"] == 2).all())
    with pytest.raises(ValueError, match="stepz: not an attack setting; did you mean steps"):
        delta_attack(fm, X[2:], y[2:], X[:2], y[:2], stepz=3)


def test_draw_samples_is_a_seeded_permutation_skipping_the_refused():
    pool = torch.arange(10, 30)
    drawn = draw_samples(pool, 5, 3, "test.draw")
    order = torch.randperm(20, generator=generator(3, "test.draw"))
    assert torch.equal(drawn, pool[order][:5])
    keep = torch.arange(40) % 2 == 0
    kept = draw_samples(pool, 5, 3, "test.draw", keep=keep)
    assert torch.equal(kept, pool[order][keep[pool[order]]][:5]) and bool((kept % 2 == 0).all())
    assert len(draw_samples(pool, 50, 3, "test.draw", keep=keep)) == 10  # fewer available: all of them
