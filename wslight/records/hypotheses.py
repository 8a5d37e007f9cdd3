"""This package's hypotheses beyond the paper (docs/theory/words.md §13), checked on a run's one-real-word records.

Checks 16-17: each returns a `Check` row of kind HYPOTHESIS, a verdict worded as a finding (supported, not supported,
or not measured when the run has no one-word records): its being wrong is a result, not a failed reproduction.
"""

from __future__ import annotations

import math

from .attack_claims import PAPER_MAX_N_OVER_D
from .checks import HYPOTHESIS, Check, unmeasured, verdict
from .words import words_table

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
        return unmeasured("16", what, expected, "fewer than two RAF context lengths with one-word records", HYPOTHESIS)
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
    return Check("16", what, "; ".join(parts), expected, verdict(ok, HYPOTHESIS), HYPOTHESIS)


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
        return unmeasured("17", what, expected, "fewer than two RF context lengths with one-word records", HYPOTHESIS)
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
    return Check("17", what, "; ".join(parts), expected, verdict(ok, HYPOTHESIS), HYPOTHESIS)


def hypotheses(words: list[dict]) -> list[Check]:
    """Every hypothesis beyond the paper, one real word (16-17, docs/theory/words.md §13), from the one-word records."""
    return [check_words_raf(words), check_words_rf(words)]
