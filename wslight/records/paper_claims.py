"""The paper's claims (docs/theory.md §8), checked on the records of a run's results.jsonl files.

Checks 1-15: each returns a `Check` row of kind CLAIM (PASS, FAIL, or N/A with the reason when the run holds no records
it could be computed from); `paper_claims` lists them in the paper's order. Never written by hand.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable

from .checks import Check, combined, ordered, tie_note, unmeasured, verdict
from .summary import attack_stats, cell_means, confirmed_counts

# What the compared quantities are known to (`wslight.records.checks.ordered`): two sides closer than this are not
# distinguishable at the run's grid, and the check says so instead of a verdict that rounding would decide.
WS_RESOLUTION = 1e-6  # relative, on cell means of S: the float64 searches agree to far better, S is printed to 4 digits
ERR_RESOLUTION = 1e-6  # absolute, on Err = (D1 + y)^2: the closed forms' own tolerance (check 8, |t1 - y| < 1e-6)
ATTENTION_RESOLUTION = 1e-6  # absolute, on attention weights of the float32 encoder (its rounding is ~1e-7)


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
    # the negative result needs N << D (docs/theory.md §8.9): the check reads the trials in the paper's range of
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
    head's output near 0, leaves the flip to the features' own sensitivity (docs/theory.md §8, check 11).
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


def check_attention_edit(probes: list[dict]) -> Check:
    """Check 12 (Figure 1 left): the edited word draws more attention from 'love' (love->smile > love->much)."""
    what = "12. Figure 1 left: the edited word draws more attention from 'love' (love->smile > love->much)"
    expected = "contrast > 1 (BERT-Base values +/-0.02 need bert-base-uncased: configs/paper/probes)"
    recs = [r for r in probes if r.get("probe") == "attention_edit" and r.get("query_token_a") == "love"]
    last = [r for r in recs if r["key"] == max(x["key"] for x in recs)] if recs else []
    if not last:
        return unmeasured("12", what, expected, "no attention_edit probe with the default sentences")
    a, b = last[0]["attention_a"], last[0]["attention_b"]
    status = ordered(b, a, ATTENTION_RESOLUTION)
    return Check(
        "12",
        what,
        f"love->{last[0]['key_token_a']} {a:.3f}, love->{last[0]['key_token_b']} {b:.3f}, "
        f"contrast {b / a:.2f} ({last[0].get('encoder', '?')}){tie_note(status)}",
        expected,
        status,
    )


def check_encoder_delta(probes: list[dict]) -> Check:
    """Check 14: Delta's relative change of the encoder beats the Gaussian control at every layer >= 1.

    The perturbed key's column is the largest after Delta.
    """
    what = (
        "14. Encoder: Delta's relative change above the Gaussian control at every layer >= 1; perturbed key dominates"
    )
    expected = "Delta / Gaussian >= 2 at every layer >= 1; the perturbed column is the largest after Delta"
    lw = [r for r in probes if r.get("probe") in ("layerwise", "layerwise_change")]
    ad = [r for r in probes if r.get("probe") == "attention_under_delta"]
    if not lw:
        return unmeasured("14", what, expected, "no layer-wise probe")
    delta = {r["layer"]: r["rel_change"] for r in lw if r["kind"] == "delta" and r.get("method") == "optimised"}
    gauss = {r["layer"]: r["rel_change"] for r in lw if r["kind"] == "gaussian"}
    layers = sorted(k for k in delta if k >= 1 and k in gauss)
    factor = min(delta[k] / gauss[k] for k in layers)
    ok, parts = factor >= 2, [f"min Delta/Gaussian over layers 1..{layers[-1]} = {factor:.1f}"]
    if ad:
        pos = ad[0]["position"]
        col: dict[int, list[float]] = defaultdict(list)
        for r in ad:
            col[r["key"]].append(r["attention_after"])
        means = {k: statistics.fmean(v) for k, v in col.items()}
        top = max(means, key=means.__getitem__)
        ok &= top == pos
        parts.append(f"attention column {pos} ('{ad[0]['token']}') after Delta = {means[pos]:.2f} (largest: {top})")
    return Check("14", what, "; ".join(parts), expected, verdict(ok))


def _floor_percent(part: int, whole: int, decimals: int) -> str:
    """The share part / whole as a percent rounded down.

    A share just under a threshold never shows as the threshold.
    """
    scaled = part * 100 * 10**decimals // whole
    return f"{scaled // 10**decimals}" + (f".{scaled % 10**decimals:0{decimals}d}" if decimals else "") + "%"


TIGHT_SHARE = 95  # percent of the records whose best a second chain confirmed


def check_tightness(records: list[dict]) -> Check:
    """Share of word-sensitivity records whose best a second chain confirmed (docs/theory.md §4.3).

    The attack's share is shown beside it, not gated: its restarts descend on a loss whose minimisers are many (any
    Delta that flips the sign ends near 0 loss at its own point), so a lone best restart there is no sign of a loose
    search.
    """
    what = "15. Tightness: share of word-sensitivity records whose best was confirmed by a second chain"
    expected = f">= {TIGHT_SHARE}%"
    # the ws searches and the attack's objectives record `chains` and `near_best` (docs/theory.md §4.3)
    ws = [r for r in records if r.get("experiment") == "ws" and r.get("near_best") is not None]
    attack = [r for r in records if r.get("experiment") == "attack" and r.get("near_best") is not None]
    if not ws:
        return unmeasured("15", what, expected, "no word-sensitivity records with the search's evidence fields")
    confirmed, total = confirmed_counts(ws)
    measured = f"{_floor_percent(confirmed, total, 1)} of {total:,} records"
    if attack:
        c, t = confirmed_counts(attack)
        measured += f" (attack, not gated: {_floor_percent(c, t, 0)})"
    return Check("15", what, measured, expected, verdict(confirmed * 100 >= TIGHT_SHARE * total))


WS_CHECKS: list[Callable[[list[dict]], Check]] = [
    check_rf_feature_norm,
    check_rf_sqrt_n_flat,
    check_rf_bound,
    check_deep_rf_decays,
    check_raf_flat,
    check_relu_raf,
]
ATTACK_CHECKS: list[Callable[[list[dict]], Check]] = [
    check_closed_forms,
    check_rf_cannot_flip,
    check_raf_can_flip,
    check_relu_raf_less_reliable,
]


def paper_claims(ws: list[dict], doubled: list[dict], attack: list[dict], probes: list[dict]) -> list[Check]:
    """Every claim of docs/theory.md §8 the records allow, in the paper's order.

    13 (Llama-2) is never applicable; then the tightness of the ws and attack searches (15).
    """
    rows = [c(ws) for c in WS_CHECKS] + [check_on_boundary(ws, doubled)] + [c(attack) for c in ATTACK_CHECKS]
    rows += [check_attention_edit(probes)]
    rows.append(
        unmeasured(
            "13",
            "13. Figure 1 right: Llama-2-7b-chat answers No / Yes",
            "No / Yes",
            "not run: needs Llama-2-7b-chat (gated, GPU)",
        )
    )
    rows.append(check_encoder_delta(probes))
    rows.append(check_tightness(ws + attack))
    return rows
