"""Summaries of records, shared by the evaluations, the callbacks, the run summary and the paper's checks.

Tables: `cell_table` (mean, sd, count per cell), `markdown_table`, `slope_table` (the fitted slope of log S against
log n with its confidence interval, per map and d); filters: `nonfinite`, `trusted`; the attack's
numbers: `attack_stats` (median Err, flip rate, mean y*D1, median gamma), `attack_table` and `attack_scalars` (the
logged `attack/err_<training>` and `attack/flip_rate_<training>`). Plain Python on dicts: no torch, no Lightning.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections import defaultdict
from collections.abc import Iterable

ATTACK_KEYS = ("map", "n", "N", "training", "loss", "p")  # one row of the attack table per such cell
ATTACK_REQUIRED = ("y", "D1", "err", "sign_err", "gamma")  # the values every summarised attack record needs


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
    """Mean, sd (n-1) and count of `value` per cell of `keys`, sorted by the keys."""
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        if r.get(value) is not None:
            cells[tuple(r[k] for k in keys)].append(float(r[value]))
    rows = []
    for cell in sorted(cells):
        vals = cells[cell]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        row = dict(zip(keys, cell, strict=True))
        rows.append({**row, "mean": statistics.fmean(vals), "sd": sd, "count": len(vals)})
    return rows


def cell_means(records: list[dict], keys: tuple[str, ...], value: str) -> dict[tuple, float]:
    """{cell of `keys`: mean of `value`} (the `mean` column of `cell_table`)."""
    return {tuple(row[k] for k in keys): row["mean"] for row in cell_table(records, keys, value)}


def markdown_table(rows: list[dict], digits: int = 4) -> str:
    """A markdown table of a list of flat dicts (same keys)."""
    if not rows:
        return "(no rows)\n"
    keys = list(rows[0])
    fmt = lambda v: f"{v:.{digits}g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


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
        Rows {map, d, slope, ci_low, ci_high, points (records), n_min, n_max}, sorted by map and d.
    """
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        if r.get("ws") is not None and float(r["ws"]) > 0 and math.isfinite(float(r["ws"])):
            groups[(r["map"], r["d"])].append((math.log(r["n"]), math.log(float(r["ws"]))))
    rows = []
    for (m, d), pts in sorted(groups.items()):
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
    """One row per (map, n, N, training, loss, p) of trusted attack records: count and `attack_stats`."""
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        cells[tuple(r[k] for k in ATTACK_KEYS)].append(r)
    return [
        {**dict(zip(ATTACK_KEYS, cell, strict=True)), "count": len(cells[cell]), **attack_stats(cells[cell])}
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
