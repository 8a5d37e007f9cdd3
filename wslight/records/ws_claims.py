"""The paper's claims on word sensitivity (checks 1-7, docs/theory/checks.md §8), checked on the `ws` records of a run.

Each check returns a `Check` row of kind CLAIM (PASS, FAIL, or N/A with the reason when the run holds no records it
could be computed from); `wslight.records.paper_claims` lists them in the paper's order.
"""

from __future__ import annotations

from .checks import Check, combined, ordered, tie_note, unmeasured, verdict
from .summary import cell_means

# What the compared quantities are known to (`wslight.records.checks.ordered`): two sides closer than this are not
# distinguishable at the run's grid, and the check says so instead of a verdict that rounding would decide.
WS_RESOLUTION = 1e-6  # relative, on cell means of S: the float64 searches agree to far better, S is printed to 4 digits


def _ws_ordered(larger: float, smaller: float) -> str:
    """`ordered` on two cell means of S, at WS_RESOLUTION relative to the larger."""
    return ordered(larger, smaller, WS_RESOLUTION * max(abs(larger), abs(smaller)))


def ws_of(records: list[dict], m: str) -> list[dict]:
    """The word-sensitivity records of map `m`."""
    return [r for r in records if r.get("experiment") == "ws" and r.get("map") == m]


def check_rf_feature_norm(ws: list[dict]) -> Check:
    """Check 1: ReLU-RF's ||phi(X)||^2 / k is 0.5 within 5% (k = D >= 1e4)."""
    what, expected = "1. ReLU-RF: ||phi(X)||^2 / k", "0.5 +/- 5% (k = D >= 1e4)"
    recs = [r for r in ws_of(ws, "rf") if r["n"] * r["d"] >= 10_000]
    if not recs:
        return unmeasured("1", what, expected, "no RF trial with k >= 1e4")
    ratios = [r["phi_norm"] ** 2 / (r["n"] * r["d"]) for r in recs]
    lo, hi = min(ratios), max(ratios)
    return Check(
        "1",
        what,
        f"{lo:.3f} .. {hi:.3f} over {len(ratios)} trials",
        expected,
        verdict(abs(lo - 0.5) <= 0.025 and abs(hi - 0.5) <= 0.025),
    )


def check_rf_sqrt_n_flat(ws: list[dict]) -> Check:
    """Check 2: RF's S * sqrt(n) is flat in n per d (max/min of the cell means < 1.2)."""
    what, expected = "2. RF: S * sqrt(n) flat in n, per d", "max/min of the cell means < 1.2"
    means = cell_means(ws_of(ws, "rf"), ("d", "n"), "ws_sqrt_n")
    if len({n for _, n in means}) < 2:
        return unmeasured("2", what, expected, "fewer than two RF context lengths")
    parts, ok = [], True
    for d in sorted({d for d, _ in means}):
        vals = [v for (dd, _), v in means.items() if dd == d]
        ratio = max(vals) / min(vals)
        ok &= ratio < 1.2
        parts.append(f"d={d}: {min(vals):.2f}..{max(vals):.2f} (ratio {ratio:.3f})")
    return Check("2", what, "; ".join(parts), expected, verdict(ok))


def check_rf_bound(ws: list[dict]) -> Check:
    """Check 3: RF's S stays below its bound ||V^(i)||_op ||Delta|| / ||phi(X)|| in every trial."""
    what, expected = "3. RF: S <= ||V^(i)||_op ||Delta|| / ||phi(X)|| per trial", "every trial below its bound"
    recs = [r for r in ws_of(ws, "rf") if r.get("bound") is not None]
    if not recs:
        return unmeasured("3", what, expected, "no RF trial")
    worst = max(r["ws"] / r["bound"] for r in recs)
    return Check(
        "3", what, f"max S / bound = {worst:.3f} over {len(recs)} trials", expected, verdict(worst <= 1 + 1e-9)
    )


def check_deep_rf_decays(ws: list[dict]) -> Check:
    """Check 4: DeepRF's S decays in n and stays below 0.5, per depth L."""
    what, expected = "4. DeepRF: S decays in n and stays small, per L", "S(n_max) < S(n_min) and every S < 0.5"
    means = cell_means(ws_of(ws, "deep_rf"), ("L", "n"), "ws")
    if len({n for _, n in means}) < 2:
        return unmeasured("4", what, expected, "fewer than two DeepRF context lengths")
    parts, statuses = [], []
    for L in sorted({L for L, _ in means}):
        ns = sorted(n for LL, n in means if LL == L)
        first, last = means[(L, ns[0])], means[(L, ns[-1])]
        statuses += [_ws_ordered(first, last), verdict(max(means[(L, n)] for n in ns) < 0.5)]
        parts.append(f"L={L}: {first:.3f} (n={ns[0]}) -> {last:.3f} (n={ns[-1]}){tie_note(statuses[-2])}")
    return Check("4", what, "; ".join(parts), expected, combined(statuses))


def check_raf_flat(ws: list[dict]) -> Check:
    """Check 5: RAF's S is of order 1 and flat in n, and at least 5x RF's at matched n."""
    what = "5. RAF: S of order 1 and flat in n; >= 5x RF at matched n"
    expected = "S(n_max)/S(n_min) >= 0.5 per d (1/sqrt(n) would give sqrt(n_min/n_max)); RAF/RF >= 5"
    raf = cell_means(ws_of(ws, "raf"), ("d", "n"), "ws")
    if len({n for _, n in raf}) < 2:
        return unmeasured("5", what, expected, "fewer than two RAF context lengths")
    parts, ok = [], True
    for d in sorted({d for d, _ in raf}):
        ns = sorted(n for dd, n in raf if dd == d)
        ratio = raf[(d, ns[-1])] / raf[(d, ns[0])]
        ok &= ratio >= 0.5 and min(raf[(d, n)] for n in ns) >= 0.5
        parts.append(
            f"d={d}: {raf[(d, ns[0])]:.2f} (n={ns[0]}) -> {raf[(d, ns[-1])]:.2f} (n={ns[-1]}), ratio {ratio:.2f}"
        )
    rf = cell_means(ws_of(ws, "rf"), ("d", "n"), "ws")
    matched = sorted(set(rf) & set(raf))
    if matched:
        factor = min(raf[c] / rf[c] for c in matched)
        ok &= factor >= 5
        parts.append(f"min RAF/RF at matched (d, n) = {factor:.1f}")
    return Check("5", what, "; ".join(parts), expected, verdict(ok))


def check_relu_raf(ws: list[dict]) -> Check:
    """Check 6: ReLU-RAF's S decays in n per d and is below RAF's at n >= 100."""
    what, expected = "6. ReLU-RAF: S decays in n, below RAF at n >= 100", "S(n_max) < S(n_min) per d; ReLU-RAF < RAF"
    relu = cell_means(ws_of(ws, "relu_raf"), ("d", "n"), "ws")
    raf = cell_means(ws_of(ws, "raf"), ("d", "n"), "ws")
    if len({n for _, n in relu}) < 2:
        return unmeasured("6", what, expected, "fewer than two ReLU-RAF context lengths")
    parts, statuses = [], []
    for d in sorted({d for d, _ in relu}):
        ns = sorted(n for dd, n in relu if dd == d)
        statuses.append(_ws_ordered(relu[(d, ns[0])], relu[(d, ns[-1])]))
        parts.append(
            f"d={d}: {relu[(d, ns[0])]:.2f} (n={ns[0]}) -> {relu[(d, ns[-1])]:.2f} (n={ns[-1]}){tie_note(statuses[-1])}"
        )
    large = [c for c in relu if c in raf and c[1] >= 100]
    if large:
        below = [_ws_ordered(raf[c], relu[c]) for c in large]
        statuses += below
        parts.append(
            f"max ReLU-RAF/RAF at n>=100: {max(relu[c] / raf[c] for c in large):.2f}{tie_note(combined(below))}"
        )
    return Check("6", what, "; ".join(parts), expected, combined(statuses))


def check_on_boundary(ws: list[dict], doubled: list[dict]) -> Check:
    """Check 7: the maximiser sits on the ball's boundary and S is stable when the step budget doubles."""
    what = "7. Optimiser: the maximiser sits on the ball's boundary; S stable when the step budget doubles"
    expected = "||Delta|| = radius (rel. 1e-3) in every trial; |S(2x) - S| / S < 5%"
    recs = [r for r in ws if r.get("experiment") == "ws"]
    if not recs:
        return unmeasured("7", what, expected, "no word-sensitivity trial")
    gap = max(abs(r["delta_norm"] - r["radius"]) / r["radius"] for r in recs)
    ok, parts = gap <= 1e-3, [f"max |(||Delta|| - r)| / r = {gap:.1e} over {len(recs)} trials"]
    base = {r["trial_key"]: r["ws"] for r in recs}
    pairs = [(base[r["trial_key"]], r["ws"]) for r in doubled if r["trial_key"] in base]
    if pairs:
        change = max(abs(b - a) / a for a, b in pairs)
        ok &= change < 0.05
        parts.append(f"max relative change with 2x steps = {change:.3%} over {len(pairs)} trials")
    return Check("7", what, "; ".join(parts), expected, verdict(ok))
