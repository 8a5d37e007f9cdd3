"""Summaries of evaluation records and the one figure saver, shared by the evaluations, the callbacks and the checks.

Tables: `cell_table` (mean, sd, count per cell), `markdown_table`; filters: `nonfinite`, `trusted`; the attack's
numbers: `attack_stats` (median Err, flip rate, mean y*D1, median gamma), `attack_table`, `attack_scalars` (the logged
`attack/err_<training>` and `attack/flip_rate_<training>`) and `attack_figures`; `save_figure` writes a figure as PNG
and PDF, adds it to TensorBoard when the logger is a TensorBoardLogger and closes it.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def attack_figures(records: list[dict]) -> list[tuple[str, Any, str]]:
    """(TensorBoard tag, figure, file stem) of the attack: the Err-vs-gamma scatter and the penalized panel."""
    from ..plots.attack import plot_attack_scatter, plot_penalized

    figures = []
    plain = [r for r in records if r["loss"] != "penalized"]
    if plain:
        figures.append(("attack/scatter", plot_attack_scatter(plain), "attack_scatter"))
    penalized = [r for r in records if r["loss"] == "penalized"]
    if penalized:
        figures.append(("attack/penalized", plot_penalized(penalized), "attack_penalized"))
    return figures


# --- figures ----------------------------------------------------------------------------------------------------------
def save_figure(
    fig: Any, out_dir: str | Path, stem: str, logger: Any = None, tag: str | None = None, step: int | None = None
) -> list[Path]:
    """Save a figure as `<stem>.png` and `<stem>.pdf` in `out_dir`, add it to TensorBoard, then close it.

    Args:
        fig: a matplotlib Figure.
        out_dir: the folder (created if missing).
        stem: the file name without its suffix.
        logger: a Lightning logger; the figure goes to TensorBoard only when it is a TensorBoardLogger.
        tag: the TensorBoard tag (default: the stem).
        step: the TensorBoard global step.

    Returns:
        The two paths written.
    """
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    try:
        fig.savefig(paths[0], dpi=120, bbox_inches="tight")
        fig.savefig(paths[1], bbox_inches="tight")
        if logger is not None:
            from lightning.pytorch.loggers import TensorBoardLogger

            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(tag or stem, fig, global_step=step)
    finally:
        plt.close(fig)
    return paths
