"""Where the search's chains start beyond a map's own starts: a frozen plan, measured defaults.

See docs/theory/search.md §4.3.

A map on the generic path (a structure-blind move: each evaluation is its whole forward) gets a wider first round,
homotopy starts and a polishing round; every map's lone best chain gets a confirmation round. `StartPlan()` is what
the package ships; a benchmark or a user passes another one to `word_sensitivity(..., start_plan=...)` to vary it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import validate


@dataclass(frozen=True)
class StartPlan:
    """The start policy of the word-sensitivity search, each value checked here with a ValueError naming it.

    Args:
        generic_first_round: the first round of a map on the generic path runs this many times `chains_per_round`
            chains (>= 1). ReLU-RAF as a plain module at d = 32, n = 12, 20 reviews within 1% of the best value any
            run found: 80% with 12 chains a round, 90% with this larger first round, 95% (two draws) with the
            polishing round too.
        polish_jitter: the generic path's last round is a polishing one, started this far (relative to the radius)
            from the best point (>= 0; a jitter of 0.05 or 0.1 gave 90-95% in the measurement above).
        homotopy_scales: the generic path's homotopy starts: `homotopy_chains` random chains climb the same objective
            on the ball of radius s r for each scale s, and the best point of each ball, scaled back to radius r,
            starts a chain of the first round (each > 0; empty: none). RAF and ReLU-RAF as plain modules at d = 384,
            n = 10, 20 bundled reviews, against the best value of every run: RAF 55% -> 90-100% within 1% on two draws
            of reviews and maps (mean ratio 0.979 -> 0.998), ReLU-RAF 70% -> 90% (0.990 -> 0.998); the balls 1.5, 2,
            3 r alone gave 85-95%. These chains search other balls: a record's `chains` does not count them.
        homotopy_chains: random chains per homotopy ball (>= 1; 32 a ball did no better; 4 kept 100% within 1% on
            one draw of 20 reviews and maps but not on a second).
        confirm_jitter: the confirmation round's chains start this far (relative to the radius) from where a lone
            best chain started (>= 0).
        row_starts: the generic path's starts read off the Jacobian of a map with one d-row per token (attracting
            mixes and captured points; `GenericMove.row_starts`). False: none (an ablation).
        removal_starts: among the row starts, those near the removed token leaning toward the rows' top singular
            vectors. False: none (an ablation).
    """

    generic_first_round: int = 4
    polish_jitter: float = 0.02
    homotopy_scales: tuple[float, ...] = (1.25, 1.5, 2.0, 3.0, 4.0)
    homotopy_chains: int = 16
    confirm_jitter: float = 0.3
    row_starts: bool = True
    removal_starts: bool = True

    def __post_init__(self) -> None:
        validate.integer("start_plan.generic_first_round", self.generic_first_round, 1)
        validate.number("start_plan.polish_jitter", self.polish_jitter, 0.0)
        validate.integer("start_plan.homotopy_chains", self.homotopy_chains, 1)
        validate.number("start_plan.confirm_jitter", self.confirm_jitter, 0.0)
        validate.boolean("start_plan.row_starts", self.row_starts)
        validate.boolean("start_plan.removal_starts", self.removal_starts)
        scales = tuple(validate.number("start_plan.homotopy_scales", s, 0.0, strict=True) for s in self.homotopy_scales)
        object.__setattr__(self, "homotopy_scales", scales)
