"""The word-sensitivity search, over the chain engine it shares with the attack (`wslight.chains`).

See docs/theory/search.md §4.

Modules, from the top down:
- `sensitivity`: `word_sensitivity(map, X)`, the estimator of S (closed-form token moves or autograd);
- `substitution`: `word_substitution`, the exact best real word at a position, over a whole vocabulary;
- `best_words`: its exact pass over chunks of candidate words, with the words that flip linear heads;
- `screening`: the first-order ranking that chooses which words a costly map checks exactly;
- `estimator`: `estimate`, the chunks of positions, their candidates and the reported value;
- `first_round`: the first round's starting points (curvature, the map's own, random; the generic path's more);
- `rounds`: `Rounds`, the rounds of chains after the first and their stop rule;
- `start_plan`: `StartPlan`, the start policy beyond a map's own starts, frozen, with its measured defaults;
- `radius_split`: the radius shared out among the heads of a separable change (multi-head RAF);
- `starts`: the top-curvature direction and the seeded Gaussian draws the chains start from;
- `result`: `WSResult` and `SubstitutionResult`, what the searches return.

Its settings (`SearchSettings`) live with the chain engine (`wslight.chains.settings`) so that a map family can
declare its defaults; they are exported here too.
"""

from ..chains.settings import GENERIC_DEFAULTS, SearchSettings
from .result import SubstitutionResult, WSResult
from .sensitivity import moved_token_objective, word_sensitivity, working_dtype, ws_bound_rf
from .start_plan import StartPlan
from .substitution import word_substitution

__all__ = [
    "GENERIC_DEFAULTS",
    "SearchSettings",
    "StartPlan",
    "SubstitutionResult",
    "WSResult",
    "moved_token_objective",
    "word_sensitivity",
    "word_substitution",
    "working_dtype",
    "ws_bound_rf",
]
