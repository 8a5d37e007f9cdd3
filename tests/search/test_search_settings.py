"""The search's settings: typed family defaults, the one radius rule, and max_chains below chains_per_round refused.

`search.max_chains` below `search.chains_per_round` is refused, naming both (a round runs all its chains).
"""

import math
from pathlib import Path

import pytest
import yaml
from conftest import unit_rows

from wslight.chains.settings import GENERIC_DEFAULTS, SearchSettings
from wslight.features import MAPS, FeatureMap, RandomFeatures, family_defaults, register_map, resolve_maps
from wslight.search import word_sensitivity
from wslight.tasks import GridSettings, WordSensitivitySweep

ROOT = Path(__file__).resolve().parents[2]
BELOW = r"search\.max_chains 4 is below search\.chains_per_round 12"


def test_max_chains_below_chains_per_round_is_refused_naming_both_keys_and_values():
    with pytest.raises(ValueError, match=BELOW + r": a round starts its 12 chains at once.*>= 12"):
        SearchSettings(chains_per_round=12, max_chains=4)
    assert SearchSettings(chains_per_round=12, max_chains=12).max_chains == 12  # equal: one round


def test_a_family_default_that_the_given_setting_contradicts_is_named_as_such():
    family = SearchSettings(chains_per_round=12, max_chains=256)
    with pytest.raises(ValueError, match=BELOW + r" \(the map family's default\)"):
        SearchSettings(max_chains=4).resolved(family)
    generic = r"search\.max_chains 64 \(the generic default\) is below search\.chains_per_round 80"
    with pytest.raises(ValueError, match=generic):
        SearchSettings(chains_per_round=80).resolved()


def test_a_misspelt_family_default_fails_when_the_class_is_defined():
    """Family defaults are a `SearchSettings`: a misspelt field is a TypeError at import, not a silent default."""
    with pytest.raises(TypeError, match="chains_per_rond"):

        class Misspelt(FeatureMap):
            search_defaults = SearchSettings(chains_per_rond=6)  # type: ignore[call-arg]


def test_the_one_radius_rule_is_the_scale_times_the_square_root_of_d():
    assert SearchSettings().resolved().radius(384) == math.sqrt(384)
    assert SearchSettings(radius_scale=0.5).resolved().radius(2921) == 0.5 * math.sqrt(2921)
    assert GENERIC_DEFAULTS.radius(16) == 4.0


@register_map("half_ball_rf")
class HalfBallRF(RandomFeatures):
    """RF whose family searches the ball of half the paper's radius."""

    search_defaults = SearchSettings(chains_per_round=4, max_chains=4, radius_scale=0.5)


def test_a_sweep_and_a_call_take_the_radius_by_the_same_rule_with_the_family_default():
    """The sweep records the radius that `word_sensitivity` searches: the family's radius_scale, not the generic one."""
    sweep = WordSensitivitySweep(GridSettings(["half_ball_rf", "rf"], [16], [4], trials=1))
    assert sweep.radius("half_ball_rf", 16) == 2.0 and sweep.radius("rf", 16) == 4.0
    X = unit_rows(3, 4, 16)
    res = word_sensitivity(HalfBallRF(n=4, d=16, seed=1), X, max_steps=20)
    assert (res.delta_norm <= 2.0 * (1 + 1e-6)).all() and (res.delta_norm > 1.9).all()  # the family's ball, reached


def test_a_call_is_refused_before_any_search():
    X = unit_rows(2, 4, 8)
    with pytest.raises(ValueError, match=BELOW):
        word_sensitivity(MAPS["raf"](n=4, d=8), X, chains_per_round=12, max_chains=4)


def test_a_sweep_is_refused_when_it_is_built_naming_the_map_whose_default_it_contradicts():
    with pytest.raises(ValueError, match=r"search\.max_chains 4 is below search\.chains_per_round 6 \(the map "):
        WordSensitivitySweep(GridSettings(["rf", "raf"], [8], [4], trials=1), search=SearchSettings(max_chains=4))
    with pytest.raises(ValueError, match=r"\(map raf\)"):
        WordSensitivitySweep(GridSettings(["rf", "raf"], [8], [4], trials=1), search=SearchSettings(max_chains=4))


def test_every_shipped_default_and_config_satisfies_the_rule():
    """The defaults and configs keep their numbers: none of them asks for fewer chains than a round."""
    assert GENERIC_DEFAULTS.max_chains >= GENERIC_DEFAULTS.chains_per_round
    for cls in MAPS.values():
        SearchSettings().resolved(family_defaults(cls))
    configs = [*ROOT.glob("configs/**/*.yaml"), *ROOT.glob("tests/conf/**/*.yaml")]
    checked = 0
    for path in configs:
        init_args = ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("init_args") or {}
        if "search" not in init_args:
            continue
        search = SearchSettings(**init_args["search"])
        for entry in resolve_maps((init_args.get("grid") or {}).get("maps") or ["raf"]):
            search.resolved(family_defaults(entry.cls))
            checked += 1
    assert checked >= 5
