"""Scatter figures of the Delta attack: test error against gamma (paper Figures 4 and 5).

Records are the results.jsonl dicts (README, "Evaluations"; experiment, map, training, loss, p, d, n, N, trial, y, t0,
t1, D0, D1, err, sign_err, gamma, proj_ratio, seed). Working definitions (docs/theory/attack.md §6.1): err = (D1 + y)^2
against the flipped label, gamma = max(|t0|, |D0|).
"""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib.pyplot as plt  # wslight.plots (imported first, as the parent package) selects Agg
from matplotlib.figure import Figure

from ..base.names import TRAININGS
from .style import LEGEND_FONTSIZE, colour, set_error_scale, styled

MAP_TITLES = {"rf": "RF", "deep_rf": "DRF", "raf": "RAF", "relu_raf": "ReLU-RAF"}
ALIGN_LOSSES = ("align", "align_proj")
# (marker, legend label) of each loss of the scatter: hollow markers for the alignment losses, so that a cross of
# `err` at the same point still shows; each loss its own legend entry
SCATTER_LOSSES = {
    "err": ("x", "loss = Err"),
    "align": ("o", "alignment loss"),  # Paper: Eq. (24a)
    "align_proj": ("s", "projected alignment loss"),  # Paper: Eq. (24b)
}
ROW_TITLES = {"finetune": "fine-tuned", "retrain": "re-trained"}


def _panels(records: list[dict]) -> list[tuple[str, int]]:
    """Columns: one per (map, n), maps in the paper's order (RF, DRF, RAF, ReLU-RAF), then n ascending."""
    order = list(MAP_TITLES)
    keys = {(r["map"], int(r["n"])) for r in records}
    return sorted(keys, key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[0], k[1]))


def _grid(records: list[dict], rows: list[str]) -> tuple[Figure, dict]:
    cols = _panels(records)
    fig, axes = plt.subplots(
        len(rows), len(cols), figsize=(3.6 * len(cols), 3.0 * len(rows)), squeeze=False, sharey="row"
    )
    where = {}
    for i, tr in enumerate(rows):
        for j, (m, n) in enumerate(cols):
            ax = axes[i, j]
            where[(tr, m, n)] = ax
            ax.set_title(f"{MAP_TITLES.get(m, m)}, n = {n} ({ROW_TITLES.get(tr, tr)})")
            ax.set_xlabel(r"$\gamma = \max(|t_0|, |D_0|)$")
            if j == 0:
                ax.set_ylabel(r"Err $= (D_1 + y)^2$")
            ax.grid(alpha=0.3)
    return fig, where


def _rows(records: Iterable[dict]) -> list[str]:
    present = {r["training"] for r in records}
    return [t for t in TRAININGS if t in present] + sorted(present - set(TRAININGS))


@styled
def plot_attack_scatter(records: list[dict]) -> Figure:
    """Figure 4 style: Err against gamma, one colour per N, one marker per loss.

    Crosses for `err`, hollow circles for `align`, hollow squares for `align_proj` (each (N, loss) its own legend
    entry).

    Rows: fine-tuned / re-trained; columns: one per (map, n). Records with loss "penalized" are left to
    `plot_penalized`.

    Args:
        records: attack result dicts (see the module docstring).

    Returns:
        The matplotlib Figure (the caller closes it).
    """
    recs = [r for r in records if r.get("loss") in SCATTER_LOSSES]
    if not recs:
        raise ValueError(f"records: expected attack records with loss in {list(SCATTER_LOSSES)}, got none")
    fig, where = _grid(recs, _rows(recs))
    Ns = sorted({int(r["N"]) for r in recs})
    colours = {N: colour(i) for i, N in enumerate(Ns)}
    for (tr, m, n), ax in where.items():
        for N in Ns:
            for loss in ("align", "align_proj", "err"):  # the crosses drawn last, on top
                marker, label = SCATTER_LOSSES[loss]
                pts = [
                    r
                    for r in recs
                    if r["training"] == tr
                    and r["map"] == m
                    and int(r["n"]) == n
                    and int(r["N"]) == N
                    and r["loss"] == loss
                ]
                if not pts:
                    continue
                hollow = loss in ALIGN_LOSSES
                style = {"facecolors": "none", "edgecolors": [colours[N]]} if hollow else {"c": [colours[N]]}
                ax.scatter(
                    [r["gamma"] for r in pts],
                    [r["err"] for r in pts],
                    marker=marker,
                    s=28,
                    label=f"N = {N}, {label}",
                    **style,
                )
        if ax.collections:
            ax.legend(fontsize=LEGEND_FONTSIZE)
    set_error_scale(where.values(), [r["err"] for r in recs])  # Err spans decades (1e-12 when the attack succeeds)
    fig.tight_layout()
    return fig


@styled
def plot_penalized(records: list[dict]) -> Figure:
    """Figure 5 style: Err against gamma for the penalized loss, one colour per penalty weight (the field `p`).

    Rows: fine-tuned / re-trained (those present); columns: one per (map, n).

    Args:
        records: attack result dicts; only loss == "penalized" is drawn.

    Returns:
        The matplotlib Figure (the caller closes it).
    """
    recs = [r for r in records if r.get("loss") == "penalized"]
    if not recs:
        raise ValueError("records: expected attack records with loss 'penalized', got none")
    fig, where = _grid(recs, _rows(recs))
    penalties = sorted({float(r["p"]) for r in recs})
    colours = {w: colour(i) for i, w in enumerate(penalties)}
    for (tr, m, n), ax in where.items():
        for w in penalties:
            pts = [r for r in recs if r["training"] == tr and r["map"] == m and int(r["n"]) == n and float(r["p"]) == w]
            if pts:
                ax.scatter(
                    [r["gamma"] for r in pts], [r["err"] for r in pts], s=24, c=[colours[w]], label=f"penalty {w:g}"
                )
        if ax.collections:
            ax.legend(fontsize=LEGEND_FONTSIZE)
    set_error_scale(where.values(), [r["err"] for r in recs])  # Err spans decades (1e-12 when the attack succeeds)
    fig.tight_layout()
    return fig
