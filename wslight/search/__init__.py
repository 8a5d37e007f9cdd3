"""The word-sensitivity search (docs/theory.md §4), over the chain engine it shares with the attack (`wslight.chains`).

Modules, from the top down:
- `sensitivity`: `word_sensitivity(map, X)`, the estimator of S (closed-form token moves or autograd);
- `substitution`: `word_substitution`, the exact best real word at a position, over a whole vocabulary;
- `screening`: the first-order ranking that chooses which words a costly map checks exactly;
- `ascent`: `Search`, the rounds of chains of the estimator and their stop rule;
- `radius_split`: the radius shared out among the heads of a separable change (multi-head RAF);
- `starts`: the top-curvature direction and the seeded Gaussian draws the chains start from;
- `result`: `WSResult`, what a search returns;
- `settings`: `SearchSettings`, the search's settings, written, checked and documented once.
"""

from .result import WSResult
from .sensitivity import moved_token_objective, word_sensitivity, working_dtype, ws_bound_rf
from .settings import GENERIC_DEFAULTS, SearchSettings
from .substitution import SubstitutionResult, word_substitution

__all__ = [
    "GENERIC_DEFAULTS",
    "SearchSettings",
    "SubstitutionResult",
    "WSResult",
    "moved_token_objective",
    "word_sensitivity",
    "word_substitution",
    "working_dtype",
    "ws_bound_rf",
]
