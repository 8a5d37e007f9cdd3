"""The paper's claims on the attack (checks 8-11 of docs/theory/checks.md §8), checked on the `attack` records of a run.

Each check returns a `Check` row of kind CLAIM (PASS, FAIL, or N/A with the reason when the run holds no records it
could be computed from); `wslight.records.paper_claims` lists them in the paper's order.
"""

from __future__ import annotations

import statistics

from .checks import Check, ordered, tie_note, unmeasured, verdict
from .summary import attack_stats

# What the compared quantities are known to (`wslight.records.checks.ordered`): two sides closer than this are not
# distinguishable at the run's grid, and the check says so instead of a verdict that rounding would decide.
ERR_RESOLUTION = 1e-6  # absolute, on Err = (D1 + y)^2: the closed forms' own tolerance (check 8, |t1 - y| < 1e-6)


def attack_of(records: list[dict], m: str | None = None) -> list[dict]:
    """The attack records, of map `m` only when given."""
    return [r for r in records if r.get("experiment") == "attack" and (m is None or r.get("map") == m)]


def check_closed_forms(att: list[dict]) -> Check:
    """Check 8: the closed forms give t1 = y for theta_f and theta_r, and ||P phi|| > 0."""
    what, expected = (
        "8. Closed forms: t1 = y for theta_f and theta_r; ||P phi|| > 0",
        "max |t1 - y| < 1e-6; proj_ratio > 0",
    )
    # a singular Gram (e.g. one review drawn twice into a training set) is flagged and jittered: the identities hold
    # only approximately there, so those trials are counted apart, not tested
    every = attack_of(att)
    recs = [r for r in every if not r.get("gram_ill_conditioned")]
    if not recs:
        return unmeasured("8", what, expected, "no attack trial with a well-conditioned Gram")
    gap = max(abs(r["t1"] - r["y"]) for r in recs)
    pmin = min(r["proj_ratio"] for r in recs)
    flagged = len(every) - len(recs)
    return Check(
        "8",
        what,
        f"max |t1 - y| = {gap:.1e}; min proj_ratio = {pmin:.3f} ({len(recs)} records"
        + (f"; {flagged} with an ill-conditioned Gram left out" if flagged else "")
        + ")",
        expected,
        verdict(gap < 1e-6 and pmin > 0),
    )


def _flip_summary(recs: list[dict]) -> tuple[float, float, float]:
    """(flip rate, mean y*D1, median Err) of attack records (`wslight.records.summary.attack_stats`)."""
    stats = attack_stats(recs)
    return stats["flip_rate"], stats["mean_yD1"], stats["median_err"]


# The paper's attack on RF: n = 40, d = 768 (k = D = 30,720) and N up to 1,300 training samples
PAPER_MAX_N_OVER_D = 1300 / (40 * 768)


def check_rf_cannot_flip(att: list[dict]) -> Check:
    """Check 9: RF cannot flip: D1 stays on the side of y (every loss, both trainings) at the paper's N / D <= 0.042."""
    what, expected = (
        "9. RF cannot flip: D1 stays on the side of y (every loss, both trainings), at the paper's N / D <= 0.042",
        "flip rate <= 0.1, mean y*D1 > 0",
    )
    # the negative result needs N << D (docs/theory/checks.md §8.9): the check reads the trials in the paper's range of
    # N / D; with a smaller d the same N lies beyond it, and those trials are reported beside it, not tested
    every = attack_of(att, "rf")
    recs = [r for r in every if r["N"] / (r["n"] * r["d"]) <= PAPER_MAX_N_OVER_D + 1e-12]
    if not recs:
        return unmeasured("9", what, expected, "no RF attack trial with N / D <= 0.042")
    flip, yd1, err = _flip_summary(recs)
    observed = f"flip rate {flip:.2f}, mean y*D1 {yd1:+.2f}, median err {err:.2f} ({len(recs)} records)"
    beyond = [r for r in every if r not in recs]
    if beyond:
        ratios = sorted({round(r["N"] / (r["n"] * r["d"]), 3) for r in beyond})
        b_flip, b_yd1, _ = _flip_summary(beyond)
        observed += (
            f"; beyond the paper's range (N / D {ratios[0]:g}-{ratios[-1]:g}, {len(beyond)} records, not tested): "
            f"flip rate {b_flip:.2f}, mean y*D1 {b_yd1:+.2f}"
        )
    return Check("9", what, observed, expected, verdict(flip <= 0.1 and yd1 > 0))


def check_raf_can_flip(att: list[dict]) -> Check:
    """Check 10: RAF can flip with loss err (flip rate >= 0.5 and median err < 1; D0 reported too)."""
    what, expected = "10. RAF can flip with loss err (report D0 too)", "flip rate >= 0.5 and median err < 1"
    recs = [r for r in attack_of(att, "raf") if r["loss"] == "err"]
    if not recs:
        return unmeasured("10", what, expected, "no RAF attack with loss err")
    flip, yd1, err = _flip_summary(recs)
    yd0 = statistics.fmean(r["y"] * r["D0"] for r in recs)
    return Check(
        "10",
        what,
        f"flip rate {flip:.2f}, mean y*D1 {yd1:+.2f}, mean y*D0 {yd0:+.2f}, median err {err:.2f}",
        expected,
        verdict(flip >= 0.5 and err < 1),
    )


def _attack_setting(r: dict) -> tuple[str, float]:
    """An attack record's loss and penalty, e.g. ("err", 0.0) or ("penalized", 1.0)."""
    return r["loss"], float(r.get("p") or 0.0)


def _setting_name(setting: tuple[str, float]) -> str:
    loss, p = setting
    return f"{loss} p={p:g}" if loss == "penalized" else loss


def decisive_setting(settings: set[tuple[str, float]]) -> tuple[str, float] | None:
    """The attack setting check 11 is decided on: the penalized loss at its largest p, else loss err, else None.

    The paper's claim can only show where RAF's attack does not already reach Err = 0 for every map: with loss err at
    d = 384 both maps flip every head (both medians are 0 to rounding); the penalty, which keeps the pre-trained
    head's output near 0, leaves the flip to the features' own sensitivity (docs/theory/checks.md §8, check 11).
    """
    penalized = sorted(p for loss, p in settings if loss == "penalized" and p > 0)
    if penalized:
        return "penalized", penalized[-1]
    return ("err", 0.0) if ("err", 0.0) in settings else None


def check_relu_raf_less_reliable(att: list[dict]) -> Check:
    """Check 11: ReLU-RAF at n = 120 flips less reliably than RAF (median Err ReLU-RAF > RAF).

    Decided on `decisive_setting` (the penalized loss at its largest p where the run has it, else loss err), beyond
    ERR_RESOLUTION: two medians that agree within it (both 0 to rounding, as with loss err at d = 384) read TIE,
    not a verdict. Every setting the run holds at n = 120 is reported beside it.
    """
    what = "11. ReLU-RAF at n = 120 flips less reliably than RAF"
    expected = (
        f"median err ReLU-RAF > RAF beyond {ERR_RESOLUTION:g}, on the penalized loss at its largest p (else loss err)"
    )
    at_120 = [r for r in attack_of(att) if r["n"] == 120 and r["loss"] in ("err", "penalized")]
    by_map = {m: [r for r in at_120 if r["map"] == m] for m in ("relu_raf", "raf")}
    settings = {_attack_setting(r) for r in by_map["relu_raf"]} & {_attack_setting(r) for r in by_map["raf"]}
    decisive = decisive_setting(settings)
    if decisive is None:
        return unmeasured("11", what, expected, "needs RAF and ReLU-RAF attacks at n = 120 (loss err or penalized)")
    parts, status = [], ""
    for setting in sorted(settings, key=lambda s: (s != decisive, s)):
        (fr, _, er), (fa, _, ea) = (
            _flip_summary([r for r in by_map[m] if _attack_setting(r) == setting]) for m in ("relu_raf", "raf")
        )
        here = ordered(er, ea, ERR_RESOLUTION)
        if setting == decisive:
            status = here
        parts.append(
            f"{_setting_name(setting)}{' (decides)' if setting == decisive else ''}: ReLU-RAF flip {fr:.2f}, "
            f"median err {er:.3g}; RAF flip {fa:.2f}, median err {ea:.3g}{tie_note(here)}"
        )
    return Check("11", what, "; ".join(parts), expected, status)
