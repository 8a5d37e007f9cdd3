"""The chain engine both searches on a moved token run on, and the ball they move in (docs/theory/search.md §4.2).

A floor of its own below the maps, so that the word-sensitivity search (`wslight.search`) and the Delta attack
(`wslight.attack`) are siblings over it and the maps' own starts (`wslight.features`) can project onto the ball:
- `engine`: `run_chains` and its step rules (`MonotoneAscent`, `MomentumDescent`, `FixedStep`), `near_best` and
  `more_chains`, the tightness rule;
- `ball`: the projection onto the ball of Delta and the ascent direction within it.
"""

from .ball import project_ball, tangent, tangent_unit
from .engine import FixedStep, MomentumDescent, MonotoneAscent, more_chains, near_best, run_chains

__all__ = [
    "FixedStep",
    "MomentumDescent",
    "MonotoneAscent",
    "more_chains",
    "near_best",
    "project_ball",
    "run_chains",
    "tangent",
    "tangent_unit",
]
