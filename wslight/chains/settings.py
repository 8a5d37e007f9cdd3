"""The settings of the word-sensitivity search's chains, written, checked and documented once.

See docs/theory/search.md §4.3.

`SearchSettings` travels whole from a sweep's YAML (`model.init_args.search: {...}`) or a notebook call
(`word_sensitivity(map, X, search=SearchSettings(chains_per_round=12))`) down to the search. A field left at None takes
the map family's default (a map class's `search_defaults`, itself a `SearchSettings`, stated in its docstring), else the
generic one (`GENERIC_DEFAULTS`): a call at its defaults searches as tightly as the shipped config of its map. What the
search runs on is the `ResolvedSearch` of those three, every field given, with the one rule for the ball's radius.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

from ..base import validate

# Elements (of the working dtype) one chunk of positions/chains may hold; bounds the memory of the search.
DEFAULT_CHUNK_ELEMENTS = 2**25


@dataclass(frozen=True)
class ResolvedSearch:
    """The fields of `SearchSettings`, every one given: what the search reads (each field documented there).

    Its defaults are the generic ones (`GENERIC_DEFAULTS`): the settings of a map with no family defaults (any
    nn.Module on the generic path) and of every field a family leaves out.
    """

    chains_per_round: int = 4
    max_chains: int = 64
    gain_tol: float = 1e-3
    max_steps: int = 500
    tol: float = 1e-4
    window: int = 20
    radius_scale: float = 1.0
    lr: float = 0.25
    power_iters: int = 20
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS

    def radius(self, d: int) -> float:
        """The ball's radius in dimension d: radius_scale sqrt(d) (docs/theory/index.md §1.3; the paper: sqrt(d))."""
        return self.radius_scale * math.sqrt(d)


GENERIC_DEFAULTS = ResolvedSearch()


@dataclass(frozen=True)
class SearchSettings:
    """How the search for S looks: chains per round, rounds, stops, radius and memory (docs/theory/search.md §4.3).

    Every field left at None takes the map family's default (`search_defaults` of the map's class, stated in its
    docstring), else the generic one (`GENERIC_DEFAULTS`). A given value is checked here, once, with a ValueError
    naming the field.

    Args:
        chains_per_round: chains per sample and position in each round (>= 1); the first round's include the map's
            own structured starts (curvature, attraction, capture...). Generic default 4.
        max_chains: no round starts once a sample has run this many chains per position (None in YAML: the
            family's). At least `chains_per_round` (equal: a single round); a smaller value is refused, naming both
            keys, since a round starts its `chains_per_round` chains at once. Rounds of `chains_per_round` more
            chains are added while a round raised S by more than `gain_tol` or no second chain confirmed the best, so
            the last round may end past `max_chains` by less than a round; the generic path's first round is
            `StartPlan.generic_first_round` rounds wide (`wslight.search.start_plan`). Generic 64.
        gain_tol: the relative gain of S below which a round is the last, once the best is confirmed. Generic 1e-3.
        max_steps: most ascent steps per chain. Generic 500.
        tol: a chain stops when its S grew by less than this (relatively) over `window` steps. Generic 1e-4.
        window: the convergence window, in steps. Generic 20.
        radius_scale: the ball's radius is radius_scale * sqrt(d) (the paper: 1; > 0). Generic 1.
        lr: a chain's first step, as a fraction of the radius (adapted per chain afterwards). Generic 0.25.
        power_iters: Hessian-vector products of the curvature starts. Generic 20.
        chunk_elements: memory bound of one chunk of positions and chains, in working-dtype elements. Generic 2**25.
    """

    chains_per_round: int | None = None
    max_chains: int | None = None
    gain_tol: float | None = None
    max_steps: int | None = None
    tol: float | None = None
    window: int | None = None
    radius_scale: float | None = None
    lr: float | None = None
    power_iters: int | None = None
    chunk_elements: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, _check(f.name, value))
        if self.chains_per_round is not None and self.max_chains is not None:
            _check_rounds(self.chains_per_round, self.max_chains, {})

    def replace(self, **changes: Any) -> SearchSettings:
        """These settings with some fields changed (an unknown name is refused, naming the closest field)."""
        validate.known_names("a search setting", changes, [f.name for f in fields(self)])
        return dataclasses.replace(self, **changes)

    def resolved(self, family: SearchSettings | None = None) -> ResolvedSearch:
        """Every field filled: the given value, else the family's default (`search_defaults`), else the generic one."""
        family_given = family.given() if family is not None else {}
        defaults = {**dataclasses.asdict(GENERIC_DEFAULTS), **family_given}
        values = {f.name: _given(getattr(self, f.name), defaults[f.name]) for f in fields(self)}
        whose = {
            name: "the map family's default" if name in family_given else "the generic default"
            for name in ("chains_per_round", "max_chains")
            if getattr(self, name) is None
        }
        _check_rounds(values["chains_per_round"], values["max_chains"], whose)
        return ResolvedSearch(**values)

    def given(self) -> dict[str, Any]:
        """The fields set (not None): what a config changes."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _check_rounds(chains_per_round: int, max_chains: int, whose: dict[str, str]) -> None:
    """Refuse max_chains < chains_per_round: a round runs all its chains, so the search would run more than asked.

    `whose`: for a value not given, where it came from (named in the message).
    """
    if max_chains >= chains_per_round:
        return

    def named(key: str, value: int) -> str:
        return f"search.{key} {value}" + (f" ({whose[key]})" if key in whose else "")

    raise ValueError(
        f"{named('max_chains', max_chains)} is below {named('chains_per_round', chains_per_round)}: a round starts "
        f"its {chains_per_round} chains at once, so the search would run {chains_per_round} chains, not at most "
        f"{max_chains}; give search.max_chains >= {chains_per_round} (equal: one round), or search.chains_per_round "
        f"<= {max_chains}"
    )


def _check(name: str, value: Any) -> Any:
    """One field's value checked, with a ValueError naming it."""
    if name in ("chains_per_round", "max_steps", "window", "max_chains", "chunk_elements"):
        return validate.integer(name, value, 1)
    if name == "power_iters":
        return validate.integer(name, value, 0)
    if name in ("radius_scale", "lr"):
        return validate.number(name, value, 0.0, strict=True)
    return validate.number(name, value, 0.0)  # gain_tol, tol
