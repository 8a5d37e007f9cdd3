"""Summaries of one-word substitution records (experiment="words", docs/theory/words.md §13).

The per-cell table and the words themselves. Plain Python on dicts: no torch, no Lightning.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable

from .summary import evidence, evidence_columns, slope_table

WORDS_KEYS = ("map", "d", "n", "L")  # one row of the table per such cell
TOP_WORDS = 5  # words listed per map in summary.md


def with_heads(records: list[dict], training: str) -> list[dict]:
    """The records with a flip result for `training` whose heads can be trusted (no ill-conditioned Gram)."""
    return [r for r in records if r.get(f"flipped_{training}") is not None and not r.get("gram_ill_conditioned")]


def words_table(records: list[dict], trainings: Iterable[str]) -> list[dict]:
    """One row per (map, d, n, L) of one-word substitution records.

    The mean discrete S_words, the mean continuous S of the same reviews and maps, the mean of their per-trial ratio
    (None where the records have no continuous S: a sweep with `continuous: false`),
    the mean distance of the best words (in units of sqrt(d)), the continuous search's evidence and, per training with
    heads, the flip rate: the share of reviews where some admissible word flips the head (`with_heads`: trials whose
    Gram was ill-conditioned left out).
    """
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        cells[tuple(r[k] for k in WORDS_KEYS)].append(r)
    columns = evidence_columns(records)
    rows = []
    for cell in sorted(cells):
        recs = cells[cell]
        searched = [r for r in recs if r.get("ws") is not None]
        row = {
            **dict(zip(WORDS_KEYS, cell, strict=True)),
            "count": len(recs),
            "ws_words": statistics.fmean(r["ws_words"] for r in recs),
            "ws": statistics.fmean(r["ws"] for r in searched) if searched else None,
            "ratio": statistics.fmean(r["ws_words"] / r["ws"] for r in searched) if searched else None,
            "distance": statistics.fmean(r["distance"] for r in recs),
            **evidence(recs, columns),
        }
        for training in trainings:
            flipped = [r[f"flipped_{training}"] for r in with_heads(recs, training)]
            row[f"flip_rate_{training}"] = statistics.fmean(map(float, flipped)) if flipped else None
        rows.append(row)
    return rows


def words_slopes(records: list[dict]) -> list[dict]:
    """Per (map, d): the slope of log S and of log S_words against log n, side by side ("-": no fit, e.g. no S).

    `slope_table`: least squares over every trial, 95% interval; -0.5 is the 1/sqrt(n) law, 0 order-1 sensitivity.
    """
    fmt = lambda row: f"{row['slope']:+.2f} [{row['ci_low']:+.2f}, {row['ci_high']:+.2f}]" if row else "-"  # noqa: E731
    cont = {(r["map"], r["d"]): r for r in slope_table(records)}
    disc = {(r["map"], r["d"]): r for r in slope_table([{**r, "ws": r["ws_words"]} for r in records])}
    return [
        {"map": m, "d": d, "slope of S": fmt(cont.get((m, d))), "slope of S_words": fmt(disc.get((m, d)))}
        for m, d in sorted(set(cont) | set(disc))
    ]


def top_words(records: list[dict], field: str, k: int = TOP_WORDS) -> dict[str, list[tuple[str, int]]]:
    """{map: the k most frequent non-empty values of `field` (a word) with their counts}, most frequent first."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        if r.get(field):
            counts[r["map"]][r[field]] += 1
    return {m: c.most_common(k) for m, c in sorted(counts.items())}


def top_words_markdown(records: list[dict], trainings: Iterable[str]) -> str:
    """The words themselves.

    Per map, the most frequent best words and, per training, flipping words (with counts over the map's records).
    """
    fields = [("word", "best word (largest change of phi)")]
    fields += [(f"flip_word_{t}", f"flipping word of the {t} head") for t in trainings]
    lines = ["Most frequent words per map, over its records (count in brackets):", ""]
    lines += ["| map | " + " | ".join(label for _, label in fields) + " |", "|---|" + "---|" * len(fields)]
    tops = [top_words(records, f) for f, _ in fields]
    for m in sorted({r["map"] for r in records}):
        cells = [", ".join(f"`{w}` ({c})" for w, c in top.get(m, [])) or "-" for top in tops]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
