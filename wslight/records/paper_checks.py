"""The paper's checks (docs/theory.md §8) and this package's hypotheses beyond the paper (docs/theory.md §13).

Computed from the records of a run's results.jsonl files (never written by hand).

Each check returns a `Check` row: what is tested, the measured value, the expectation and a status, and declares its
kind. A claim of the paper (or a sanity check of a faithful reproduction of it) reads PASS / FAIL; a hypothesis this
package tests beyond the paper reads as a finding, supported / not supported: its being wrong is a result, not a
failed reproduction. Either reads N/A / not measured, with the reason, when the run holds no records it could be
computed from. `checks_report` renders the two kinds as two parts of the report.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .summary import attack_stats, cell_means, confirmed_counts
from .words import words_table

Kind = Literal["claim", "hypothesis"]
CLAIM: Kind = "claim"  # a claim of the paper, or a sanity check of a faithful reproduction of it
HYPOTHESIS: Kind = "hypothesis"  # a hypothesis this package tests beyond the paper

# the statuses of each kind: holds, does not hold, no records to compute it from
STATUSES: dict[Kind, tuple[str, str, str]] = {
    CLAIM: ("PASS", "FAIL", "N/A"),
    HYPOTHESIS: ("supported", "not supported", "not measured"),
}


@dataclass
class Check:
    """One row of the checks: what is tested, the measured value, the expectation and the status.

    `kind` is `CLAIM` (status PASS, FAIL or N/A) or `HYPOTHESIS` (status supported, not supported or not measured:
    a verdict worded as a finding, never a FAIL).
    """

    id: str
    what: str
    measured: str
    expected: str
    status: str
    kind: Kind = CLAIM

    def __post_init__(self) -> None:
        """Reject a status that is not one of its kind's (a hypothesis never reads PASS or FAIL)."""
        if self.status not in STATUSES[self.kind]:
            raise ValueError(
                f"check {self.id}: a {self.kind}'s status is one of {STATUSES[self.kind]}, not {self.status!r}"
            )


def _status(ok: bool, kind: Kind = CLAIM) -> str:
    return STATUSES[kind][0 if ok else 1]


def _na(id: str, what: str, expected: str, why: str, kind: Kind = CLAIM) -> Check:
    return Check(id, what, why, expected, STATUSES[kind][2], kind)


def ws_of(records: list[dict], m: str) -> list[dict]:
    """The word-sensitivity records of map `m`."""
    return [r for r in records if r.get("experiment") == "ws" and r.get("map") == m]


def check_rf_feature_norm(ws: list[dict]) -> Check:
    """Check 1: ReLU-RF's ||phi(X)||^2 / k is 0.5 within 5% (k = D >= 1e4)."""
    what, expected = "1. ReLU-RF: ||phi(X)||^2 / k", "0.5 +/- 5% (k = D >= 1e4)"
    recs = [r for r in ws_of(ws, "rf") if r["n"] * r["d"] >= 10_000]
    if not recs:
        return _na("1", what, expected, "no RF trial with k >= 1e4")
    ratios = [r["phi_norm"] ** 2 / (r["n"] * r["d"]) for r in recs]
    lo, hi = min(ratios), max(ratios)
    return Check(
        "1",
        what,
        f"{lo:.3f} .. {hi:.3f} over {len(ratios)} trials",
        expected,
        _status(abs(lo - 0.5) <= 0.025 and abs(hi - 0.5) <= 0.025),
    )


def check_rf_sqrt_n_flat(ws: list[dict]) -> Check:
    """Check 2: RF's S * sqrt(n) is flat in n per d (max/min of the cell means < 1.2)."""
    what, expected = "2. RF: S * sqrt(n) flat in n, per d", "max/min of the cell means < 1.2"
    means = cell_means(ws_of(ws, "rf"), ("d", "n"), "ws_sqrt_n")
    if len({n for _, n in means}) < 2:
        return _na("2", what, expected, "fewer than two RF context lengths")
    parts, ok = [], True
    for d in sorted({d for d, _ in means}):
        vals = [v for (dd, _), v in means.items() if dd == d]
        ratio = max(vals) / min(vals)
        ok &= ratio < 1.2
        parts.append(f"d={d}: {min(vals):.2f}..{max(vals):.2f} (ratio {ratio:.3f})")
    return Check("2", what, "; ".join(parts), expected, _status(ok))


def check_rf_bound(ws: list[dict]) -> Check:
    """Check 3: RF's S stays below its bound ||V^(i)||_op ||Delta|| / ||phi(X)|| in every trial."""
    what, expected = "3. RF: S <= ||V^(i)||_op ||Delta|| / ||phi(X)|| per trial", "every trial below its bound"
    recs = [r for r in ws_of(ws, "rf") if r.get("bound") is not None]
    if not recs:
        return _na("3", what, expected, "no RF trial")
    worst = max(r["ws"] / r["bound"] for r in recs)
    return Check(
        "3", what, f"max S / bound = {worst:.3f} over {len(recs)} trials", expected, _status(worst <= 1 + 1e-9)
    )


def check_deep_rf_decays(ws: list[dict]) -> Check:
    """Check 4: DeepRF's S decays in n and stays below 0.5, per depth L."""
    what, expected = "4. DeepRF: S decays in n and stays small, per L", "S(n_max) < S(n_min) and every S < 0.5"
    means = cell_means(ws_of(ws, "deep_rf"), ("L", "n"), "ws")
    if len({n for _, n in means}) < 2:
        return _na("4", what, expected, "fewer than two DeepRF context lengths")
    parts, ok = [], True
    for L in sorted({L for L, _ in means}):
        ns = sorted(n for LL, n in means if LL == L)
        first, last = means[(L, ns[0])], means[(L, ns[-1])]
        ok &= last < first and max(means[(L, n)] for n in ns) < 0.5
        parts.append(f"L={L}: {first:.3f} (n={ns[0]}) -> {last:.3f} (n={ns[-1]})")
    return Check("4", what, "; ".join(parts), expected, _status(ok))


def check_raf_flat(ws: list[dict]) -> Check:
    """Check 5: RAF's S is of order 1 and flat in n, and at least 5x RF's at matched n."""
    what = "5. RAF: S of order 1 and flat in n; >= 5x RF at matched n"
    expected = "S(n_max)/S(n_min) >= 0.5 per d (1/sqrt(n) would give sqrt(n_min/n_max)); RAF/RF >= 5"
    raf = cell_means(ws_of(ws, "raf"), ("d", "n"), "ws")
    if len({n for _, n in raf}) < 2:
        return _na("5", what, expected, "fewer than two RAF context lengths")
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
    return Check("5", what, "; ".join(parts), expected, _status(ok))


def check_relu_raf(ws: list[dict]) -> Check:
    """Check 6: ReLU-RAF's S decays in n per d and is below RAF's at n >= 100."""
    what, expected = "6. ReLU-RAF: S decays in n, below RAF at n >= 100", "S(n_max) < S(n_min) per d; ReLU-RAF < RAF"
    relu = cell_means(ws_of(ws, "relu_raf"), ("d", "n"), "ws")
    raf = cell_means(ws_of(ws, "raf"), ("d", "n"), "ws")
    if len({n for _, n in relu}) < 2:
        return _na("6", what, expected, "fewer than two ReLU-RAF context lengths")
    parts, ok = [], True
    for d in sorted({d for d, _ in relu}):
        ns = sorted(n for dd, n in relu if dd == d)
        ok &= relu[(d, ns[-1])] < relu[(d, ns[0])]
        parts.append(f"d={d}: {relu[(d, ns[0])]:.2f} (n={ns[0]}) -> {relu[(d, ns[-1])]:.2f} (n={ns[-1]})")
    large = [c for c in relu if c in raf and c[1] >= 100]
    if large:
        ok &= all(relu[c] < raf[c] for c in large)
        parts.append(f"max ReLU-RAF/RAF at n>=100: {max(relu[c] / raf[c] for c in large):.2f}")
    return Check("6", what, "; ".join(parts), expected, _status(ok))


def check_on_boundary(ws: list[dict], doubled: list[dict]) -> Check:
    """Check 7: the maximiser sits on the ball's boundary and S is stable when the step budget doubles."""
    what = "7. Optimiser: the maximiser sits on the ball's boundary; S stable when the step budget doubles"
    expected = "||Delta|| = radius (rel. 1e-3) in every trial; |S(2x) - S| / S < 5%"
    recs = [r for r in ws if r.get("experiment") == "ws"]
    if not recs:
        return _na("7", what, expected, "no word-sensitivity trial")
    gap = max(abs(r["delta_norm"] - r["radius"]) / r["radius"] for r in recs)
    ok, parts = gap <= 1e-3, [f"max |(||Delta|| - r)| / r = {gap:.1e} over {len(recs)} trials"]
    base = {r["trial_key"]: r["ws"] for r in recs}
    pairs = [(base[r["trial_key"]], r["ws"]) for r in doubled if r["trial_key"] in base]
    if pairs:
        change = max(abs(b - a) / a for a, b in pairs)
        ok &= change < 0.05
        parts.append(f"max relative change with 2x steps = {change:.3%} over {len(pairs)} trials")
    return Check("7", what, "; ".join(parts), expected, _status(ok))


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
        return _na("8", what, expected, "no attack trial with a well-conditioned Gram")
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
        _status(gap < 1e-6 and pmin > 0),
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
        return _na("9", what, expected, "no RF attack trial with N / D <= 0.042")
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
    return Check("9", what, observed, expected, _status(flip <= 0.1 and yd1 > 0))


def check_raf_can_flip(att: list[dict]) -> Check:
    """Check 10: RAF can flip with loss err (flip rate >= 0.5 and median err < 1; D0 reported too)."""
    what, expected = "10. RAF can flip with loss err (report D0 too)", "flip rate >= 0.5 and median err < 1"
    recs = [r for r in attack_of(att, "raf") if r["loss"] == "err"]
    if not recs:
        return _na("10", what, expected, "no RAF attack with loss err")
    flip, yd1, err = _flip_summary(recs)
    yd0 = statistics.fmean(r["y"] * r["D0"] for r in recs)
    return Check(
        "10",
        what,
        f"flip rate {flip:.2f}, mean y*D1 {yd1:+.2f}, mean y*D0 {yd0:+.2f}, median err {err:.2f}",
        expected,
        _status(flip >= 0.5 and err < 1),
    )


def check_relu_raf_less_reliable(att: list[dict]) -> Check:
    """Check 11: ReLU-RAF at n = 120 flips less reliably than RAF with loss err (median err ReLU-RAF >= RAF)."""
    what, expected = "11. ReLU-RAF at n = 120 flips less reliably than RAF (loss err)", "median err ReLU-RAF >= RAF"
    relu = [r for r in attack_of(att, "relu_raf") if r["loss"] == "err" and r["n"] == 120]
    raf = [r for r in attack_of(att, "raf") if r["loss"] == "err" and r["n"] == 120]
    if not relu or not raf:
        return _na("11", what, expected, "needs RAF and ReLU-RAF attacks at n = 120")
    (fr, _, er), (fa, _, ea) = _flip_summary(relu), _flip_summary(raf)
    return Check(
        "11",
        what,
        f"ReLU-RAF: flip {fr:.2f}, median err {er:.2f}; RAF: flip {fa:.2f}, median err {ea:.2f}",
        expected,
        _status(er >= ea),
    )


def check_attention_edit(probes: list[dict]) -> Check:
    """Check 12 (Figure 1 left): the edited word draws more attention from 'love' (love->smile > love->much)."""
    what = "12. Figure 1 left: the edited word draws more attention from 'love' (love->smile > love->much)"
    expected = "contrast > 1 (BERT-Base values +/-0.02 need bert-base-uncased: configs/paper/probes)"
    recs = [r for r in probes if r.get("probe") == "attention_edit" and r.get("query_token_a") == "love"]
    last = [r for r in recs if r["key"] == max(x["key"] for x in recs)] if recs else []
    if not last:
        return _na("12", what, expected, "no attention_edit probe with the default sentences")
    a, b = last[0]["attention_a"], last[0]["attention_b"]
    return Check(
        "12",
        what,
        f"love->{last[0]['key_token_a']} {a:.3f}, love->{last[0]['key_token_b']} {b:.3f}, "
        f"contrast {b / a:.2f} ({last[0].get('encoder', '?')})",
        expected,
        _status(b > a),
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
        return _na("14", what, expected, "no layer-wise probe")
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
    return Check("14", what, "; ".join(parts), expected, _status(ok))


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
        return _na("15", what, expected, "no word-sensitivity records with the search's evidence fields")
    confirmed, total = confirmed_counts(ws)
    measured = f"{_floor_percent(confirmed, total, 1)} of {total:,} records"
    if attack:
        c, t = confirmed_counts(attack)
        measured += f" (attack, not gated: {_floor_percent(c, t, 0)})"
    return Check("15", what, measured, expected, _status(confirmed * 100 >= TIGHT_SHARE * total))


# --- one real word (docs/theory.md §13): hypotheses beyond the paper --------------------------------------------------
WORDS_FLIP_CLEAR = 0.25  # "a clear share" of reviews flipped by one real word
WORDS_FLIP_RARE = 0.10  # "rarely": the bar of check 9 for the continuous attack on RF


def words_of(records: list[dict], m: str) -> list[dict]:
    """The one-word substitution records of map `m` that hold a `ws_words`."""
    return [r for r in records if r.get("experiment") == "words" and r.get("map") == m and r.get("ws_words")]


def _words_cells(recs: list[dict]) -> dict[tuple, dict[str, float]]:
    """The columns of the cell's row of `words_table`, per cell (one depth per map here).

    {(d, n): mean S_words, mean S and the re-trained head's flip rate (NaN without heads)}.
    """
    rows = words_table(recs, ["retrain"])
    flip = lambda row: math.nan if row["flip_rate_retrain"] is None else row["flip_rate_retrain"]  # noqa: E731
    return {(row["d"], row["n"]): {"ws_words": row["ws_words"], "ws": row["ws"], "flip": flip(row)} for row in rows}


def check_words_raf(words: list[dict]) -> Check:
    """Check 16, a hypothesis: RAF's best real word keeps order-1 sensitivity in n and flips the re-trained head often.

    "Often": in a clear share of the reviews (`WORDS_FLIP_CLEAR`) at every n.
    """
    what = (
        "16. One real word, RAF: the best real word keeps order-1 sensitivity in n and flips the re-trained head in a "
        "clear share of reviews"
    )
    expected = (
        f"S_words(n_max)/S_words(n_min) >= 0.5 per d (as check 5 for S); flip rate >= {WORDS_FLIP_CLEAR} at every n"
    )
    cells = _words_cells(words_of(words, "raf"))
    if len({n for _, n in cells}) < 2:
        return _na("16", what, expected, "fewer than two RAF context lengths with one-word records", HYPOTHESIS)
    parts, ok = [], True
    for d in sorted({d for d, _ in cells}):
        ns = sorted(n for dd, n in cells if dd == d)
        first, last = cells[(d, ns[0])], cells[(d, ns[-1])]
        ratio = last["ws_words"] / first["ws_words"]
        flips = [cells[(d, n)]["flip"] for n in ns]
        ok &= ratio >= 0.5 and all(f >= WORDS_FLIP_CLEAR for f in flips)
        parts.append(
            f"d={d}: S_words {first['ws_words']:.2f} (n={ns[0]}) -> {last['ws_words']:.2f} (n={ns[-1]}), ratio "
            f"{ratio:.2f} (S: {first['ws']:.2f} -> {last['ws']:.2f}); flip rate " + ", ".join(f"{f:.1f}" for f in flips)
        )
    return Check("16", what, "; ".join(parts), expected, _status(ok, HYPOTHESIS), HYPOTHESIS)


def check_words_rf(words: list[dict]) -> Check:
    """Check 17, a hypothesis: RF's best real word's sensitivity shrinks like S and rarely flips the re-trained head.

    At the paper's N / D <= 0.042.
    """
    what = (
        "17. One real word, RF: the best real word's sensitivity shrinks like S and rarely flips the re-trained head "
        "(at the paper's N / D <= 0.042)"
    )
    expected = f"S_words / S within a factor 1.5 across n per d; flip rate <= {WORDS_FLIP_RARE} at every n"
    every = words_of(words, "rf")
    cells = _words_cells(every)
    if len({n for _, n in cells}) < 2:
        return _na("17", what, expected, "fewer than two RF context lengths with one-word records", HYPOTHESIS)
    # as check 9: the negative result needs N << D, so the flips are tested in the paper's range of N / D only
    in_range = _words_cells([r for r in every if r.get("N", 0) / (r["n"] * r["d"]) <= PAPER_MAX_N_OVER_D + 1e-12])
    parts, ok = [], True
    for d in sorted({d for d, _ in cells}):
        ns = sorted(n for dd, n in cells if dd == d)
        ratios = [cells[(d, n)]["ws_words"] / cells[(d, n)]["ws"] for n in ns]
        flips = {n: in_range[(d, n)]["flip"] for n in ns if (d, n) in in_range}
        ok &= max(ratios) / min(ratios) <= 1.5 and all(f <= WORDS_FLIP_RARE for f in flips.values())
        part = (
            f"d={d}: S_words {cells[(d, ns[0])]['ws_words']:.3f} (n={ns[0]}) -> {cells[(d, ns[-1])]['ws_words']:.3f} "
            f"(n={ns[-1]}), S_words/S " + ", ".join(f"{x:.2f}" for x in ratios) + "; flip rate "
        )
        part += ", ".join(f"{f:.1f} (n={n})" for n, f in flips.items()) if flips else "none in range"
        beyond = [n for n in ns if n not in flips]
        if beyond:
            part += f" (n = {', '.join(map(str, beyond))}: N / D beyond 0.042, not tested)"
        parts.append(part)
    return Check("17", what, "; ".join(parts), expected, _status(ok, HYPOTHESIS), HYPOTHESIS)


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


def all_checks(
    ws: list[dict], doubled: list[dict], attack: list[dict], probes: list[dict], words: list[dict] | None = None
) -> list[Check]:
    """Every check of docs/theory.md §8 the records allow.

    In the paper's order (13, Llama-2, is never applicable), then the tightness of the ws and attack searches (15):
    the claims; then the hypotheses beyond the paper, one real word (16-17, docs/theory.md §13).
    """
    rows = [c(ws) for c in WS_CHECKS] + [check_on_boundary(ws, doubled)] + [c(attack) for c in ATTACK_CHECKS]
    rows += [check_attention_edit(probes)]
    rows.append(
        _na(
            "13",
            "13. Figure 1 right: Llama-2-7b-chat answers No / Yes",
            "No / Yes",
            "not run: needs Llama-2-7b-chat (gated, GPU)",
        )
    )
    rows.append(check_encoder_delta(probes))
    rows.append(check_tightness(ws + attack))
    rows += [check_words_raf(words or []), check_words_rf(words or [])]
    return rows


CHECK_COLUMNS = ("check", "measured", "expected", "status")

# each kind's part of the report: its heading, the one sentence that says what it is, and its table's columns
PARTS: dict[Kind, tuple[str, str, tuple[str, str, str, str]]] = {
    CLAIM: (
        "The paper's claims (docs/theory.md §8)",
        "What the paper claims, and the sanity checks a faithful reproduction of it must pass, each computed from "
        "the results files: PASS or FAIL, N/A where the run holds no records to compute it from.",
        CHECK_COLUMNS,
    ),
    HYPOTHESIS: (
        "Beyond the paper: this package's hypotheses (docs/theory.md §13)",
        "Hypotheses this package tests beyond the paper, each with its measured value and what it found: supported "
        "or not supported (a finding either way, never a failed reproduction), not measured where its stage has no "
        "results.",
        ("hypothesis", "measured", "supported when", "finding"),
    ),
}


def checks_markdown(rows: list[Check], columns: tuple[str, str, str, str] = CHECK_COLUMNS) -> str:
    """One table of checks as markdown: the check, measured, expected and status columns, headed by `columns`."""
    lines = ["| " + " | ".join(columns) + " |", "|---|---|---|---|"]
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731  pipes (norms) would split the markdown cell
    lines += [f"| {cell(c.what)} | {cell(c.measured)} | {cell(c.expected)} | **{c.status}** |" for c in rows]
    return "\n".join(lines) + "\n"


def tally(rows: list[Check], kind: Kind) -> str:
    """How many checks of `kind` have each of its statuses, e.g. "15 PASS, 0 FAIL, 1 N/A"."""
    return ", ".join(f"{sum(c.kind == kind and c.status == s for c in rows)} {s}" for s in STATUSES[kind])


def checks_report(rows: list[Check]) -> list[str]:
    """The report's lines for the checks: the paper's claims, then this package's hypotheses.

    Each part under a heading of its own (level 2, as the report's sections), the one sentence that says what it is,
    its table and its tally; a part with no rows is left out. A hypothesis that is not supported counts among the
    hypotheses' findings, never among the claims' FAILs.
    """
    lines: list[str] = []
    for kind, (heading, sentence, columns) in PARTS.items():
        part = [c for c in rows if c.kind == kind]
        if part:
            lines += [f"## {heading}", "", sentence, "", checks_markdown(part, columns), tally(rows, kind) + ".", ""]
    return lines
