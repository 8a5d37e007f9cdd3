"""Summaries of records, shared by the evaluations, the callbacks, the run summary and the paper's checks.

Tables: `cell_table` (mean, sd, count per cell), `markdown_table`, `slope_table` (the fitted slope of log S against
log n with its confidence interval, per map and d); the search's evidence (`chains`, `near_best`:
docs/theory/search.md §4.3) as columns of those tables: `confirmed_share`, `evidence_columns`, `evidence`; filters:
`nonfinite`, `trusted`; the attack's numbers: `attack_stats` (median Err, flip rate, mean y*D1, median gamma),
`attack_table` and `attack_scalars` (the logged `attack/err_<training>` and `attack/flip_rate_<training>`); and
`write_summary`, the one writer of a run's summary.md. The probes' tables are in `wslight.records.probe_tables`. Plain
Python on dicts: no torch, no Lightning.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from .probe_tables import (  # noqa: F401  (re-exported: the probes' tables were here)
    attention_edit_table,
    attention_under_delta_table,
    layerwise_table,
)

SUMMARY_NAME = "summary.md"  # the table of a run, beside its results.jsonl
ATTACK_KEYS = ("map", "n", "N", "training", "loss", "p")  # one row of the attack table per such cell
ATTACK_REQUIRED = ("y", "D1", "err", "sign_err", "gamma")  # the values every summarised attack record needs
EVIDENCE_NOTES = {  # the captions of the search's evidence columns (`evidence_note`)
    "chains": "chains: mean search chains per record (restarts and rounds)",
    "confirmed": "confirmed: share of the records whose best was confirmed by a second chain (near_best >= 2; a lone "
    "best chain is a warning sign)",
}


def nonfinite(record: dict, keys: tuple[str, ...] | None = None) -> bool:
    """True when a float field of a record (all of them, or `keys`) is NaN or infinite: a number not to trust."""
    keys = tuple(record) if keys is None else keys
    return any(isinstance(record.get(k), float) and not math.isfinite(record[k]) for k in keys)


def trusted(records: list[dict], label: str, required: tuple[str, ...]) -> list[dict]:
    """The records without the `nonfinite` flag and with every `required` value present (not null in the file).

    Warns with the count of the records left out of a summary.
    """
    good = [r for r in records if not r.get("nonfinite") and all(r.get(k) is not None for k in required)]
    if len(good) < len(records):
        warnings.warn(
            f"{label}: {len(records) - len(good)} of {len(records)} record(s) have nonfinite=true (a NaN or infinite "
            "value, e.g. phi(X) = 0) and are left out of the summary and figures; they stay in the results file",
            RuntimeWarning,
            stacklevel=2,
        )
    return good


def cell_table(records: list[dict], keys: tuple[str, ...], value: str) -> list[dict]:
    """Mean, sd (n-1) and count of `value` per cell of `keys`, sorted by the keys.

    The search's `evidence` columns (mean `chains`, `confirmed` share) sit before the count when the records carry its
    fields.
    """
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get(value) is not None:
            cells[tuple(r[k] for k in keys)].append(r)
    columns = evidence_columns([r for recs in cells.values() for r in recs])
    rows = []
    for cell in sorted(cells):
        vals = [float(r[value]) for r in cells[cell]]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        row = dict(zip(keys, cell, strict=True))
        stats = {"mean": statistics.fmean(vals), "sd": sd, **evidence(cells[cell], columns), "count": len(vals)}
        rows.append({**row, **stats})
    return rows


def cell_means(records: list[dict], keys: tuple[str, ...], value: str) -> dict[tuple, float]:
    """{cell of `keys`: mean of `value`} (the `mean` column of `cell_table`)."""
    return {tuple(row[k] for k in keys): row["mean"] for row in cell_table(records, keys, value)}


def markdown_table(rows: list[dict], digits: int = 4) -> str:
    """A markdown table of a list of flat dicts (same keys); a None value shows as "-"."""
    if not rows:
        return "(no rows)\n"
    keys = list(rows[0])
    fmt = lambda v: "-" if v is None else f"{v:.{digits}g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_summary(out_dir: str | Path, rows: list[dict], caption: str = "", after: str = "", digits: int = 4) -> Path:
    """Write a run's summary.md.

    `caption`, what the table's evidence columns mean (`evidence_note`), the markdown table of `rows`, then `after`
    (more text or tables).

    Args:
        out_dir: the run's folder (beside results.jsonl).
        rows: the table, flat dicts with the same keys (see `markdown_table`).
        caption: what the table shows (ends with a blank line when given).
        after: appended after the table.
        digits: significant digits of the floats.

    Returns:
        The path written.
    """
    path = Path(out_dir) / SUMMARY_NAME
    path.write_text(caption + evidence_note(rows) + markdown_table(rows, digits) + after)
    return path


# --- the search's evidence -------------------------------------------------------------------------------------------
def confirmed_counts(records: list[dict]) -> tuple[int, int]:
    """(records with near_best >= 2: the best confirmed by a second chain, records that carry `near_best`)."""
    marked = [r["near_best"] for r in records if r.get("near_best") is not None]
    return sum(int(v) >= 2 for v in marked), len(marked)


def confirmed_share(records: list[dict]) -> float | None:
    """Share of the records with near_best >= 2 among those that carry the field; None when none does."""
    confirmed, marked = confirmed_counts(records)
    return confirmed / marked if marked else None


def mean_chains(records: list[dict]) -> float | None:
    """Mean `chains` of the records that carry the field; None when none does."""
    chains = [float(r["chains"]) for r in records if r.get("chains") is not None]
    return statistics.fmean(chains) if chains else None


def evidence_columns(records: list[dict]) -> tuple[str, ...]:
    """The evidence columns a table of `records` gets.

    "chains" and "confirmed" for the fields some record carries (older records carry neither: no columns).
    """
    has = lambda field: any(r.get(field) is not None for r in records)  # noqa: E731
    return tuple(col for col, field in (("chains", "chains"), ("confirmed", "near_best")) if has(field))


def evidence(records: list[dict], columns: tuple[str, ...]) -> dict[str, float | None]:
    """{column: value} of a group of records for the `columns` (of `evidence_columns`).

    Mean `chains`, `confirmed` share; None where no record of the group carries the field.
    """
    values = {"chains": mean_chains, "confirmed": confirmed_share}
    return {col: values[col](records) for col in columns}


def evidence_note(rows: list[dict]) -> str:
    """A caption above a table: what its evidence columns (`EVIDENCE_NOTES`) mean; "" for a table without them."""
    columns = [col for col in EVIDENCE_NOTES if rows and col in rows[0]]
    notes = [EVIDENCE_NOTES[col] for col in columns]
    if any(r[col] is None for r in rows for col in columns):
        notes.append("-: records that predate these fields")
    return "; ".join(notes) + ".\n\n" if notes else ""


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (p in (0.5, 1)) of Student's t with df >= 1 degrees of freedom, by bisection on its CDF.

    The CDF is 1/2 + integral_0^x of the density (composite Simpson, 2000 panels), accurate to about 1e-8 for the
    0.975 quantile; no scipy needed.
    """
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"p must be in (0.5, 1) and df >= 1, got p={p!r}, df={df!r}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:
        m = 2000
        h = x / m
        f = lambda t: math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))  # noqa: E731
        s = f(0.0) + f(x) + sum((4 if k % 2 else 2) * f(k * h) for k in range(1, m))
        return 0.5 + s * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def slope_table(records: list[dict], level: float = 0.95) -> list[dict]:
    """The slope of log S against log n per (map, d), least squares over every trial, with its confidence interval.

    log S_t = a + slope log n_t + noise over all the trusted records of a (map, d) (every trial of every n, so the
    interval reflects the spread across trials); the interval is slope +- t_{(1+level)/2, N-2} se(slope). A map whose
    S decays as 1/sqrt(n) has slope -1/2; a map with order-1 word sensitivity has slope 0. Cells with one n (or two
    records) give no fit and are left out.

    Returns:
        Rows {map, d, slope, ci_low, ci_high, points (records), n_min, n_max}, sorted by map and d, and `confirmed`
        (`confirmed_share` of the fit's records) when the records carry `near_best`.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("ws") is not None and float(r["ws"]) > 0 and math.isfinite(float(r["ws"])):
            groups[(r["map"], r["d"])].append(r)
    fitted = [r for recs in groups.values() for r in recs]
    columns = ("confirmed",) if "confirmed" in evidence_columns(fitted) else ()
    rows = []
    for (m, d), recs in sorted(groups.items()):
        pts = [(math.log(r["n"]), math.log(float(r["ws"]))) for r in recs]
        N = len(pts)
        xs = [x for x, _ in pts]
        if N < 3 or len(set(xs)) < 2:
            continue
        mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in pts)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
        resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in pts)
        se = math.sqrt(resid / (N - 2) / sxx)
        half = t_quantile((1 + level) / 2, N - 2) * se
        rows.append(
            {
                "map": m,
                "d": d,
                "slope": slope,
                "ci_low": slope - half,
                "ci_high": slope + half,
                "points": N,
                "n_min": int(round(math.exp(min(xs)))),
                "n_max": int(round(math.exp(max(xs)))),
                **evidence(recs, columns),
            }
        )
    return rows


# --- the attack -------------------------------------------------------------------------------------------------------
def attack_stats(records: list[dict]) -> dict[str, float]:
    """Median Err, flip rate (sign(D1) = -y: the attack changed the head's decision), mean y*D1 and median gamma.

    Args:
        records: trusted attack records (see `trusted`), at least one.
    """
    return {
        "median_err": statistics.median(r["err"] for r in records),
        "flip_rate": statistics.fmean(1.0 - r["sign_err"] for r in records),
        "mean_yD1": statistics.fmean(r["y"] * r["D1"] for r in records),
        "median_gamma": statistics.median(r["gamma"] for r in records),
    }


def attack_table(records: list[dict]) -> list[dict]:
    """One row per (map, n, N, training, loss, p) of trusted attack records.

    Count, `attack_stats` and the search's `evidence` (mean chains, confirmed share of the objective's best) when the
    records carry its fields.
    """
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        cells[tuple(r[k] for k in ATTACK_KEYS)].append(r)
    columns = evidence_columns(records)
    return [
        {
            **dict(zip(ATTACK_KEYS, cell, strict=True)),
            "count": len(cells[cell]),
            **attack_stats(cells[cell]),
            **evidence(cells[cell], columns),
        }
        for cell in sorted(cells)
    ]


def attack_scalars(records: list[dict], trainings: Iterable[str]) -> dict[str, float]:
    """`attack/err_<training>` (median Err) and `attack/flip_rate_<training>` of trusted attack records."""
    metrics = {}
    for training in trainings:
        recs = [r for r in records if r["training"] == training]
        if recs:
            stats = attack_stats(recs)
            metrics[f"attack/err_{training}"] = stats["median_err"]
            metrics[f"attack/flip_rate_{training}"] = stats["flip_rate"]
    return metrics
