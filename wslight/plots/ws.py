"""Word-sensitivity curves S against n, one curve per d or per depth L (the paper's Figures 2-3), and every map of a
sweep on one log-log figure (`plot_ws_maps`).

Importing the package wslight.plots first sets the Agg backend, so no screen is needed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Literal

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from .style import LEGEND_FONTSIZE, set_error_scale, styled

TITLES = {
    "rf": "RF",
    "deep_rf": "DeepRF",
    "raf": "RAF",
    "relu_raf": "ReLU-RAF",
    "raf_mh": "RAF, 4 heads",
    "raf_mh12": "RAF, 12 heads",
    "linear_raf": "linear attention",
    "sigmoid_raf": "sigmoid attention",
    "transformer": "random transformer block",
    "pretrained_attn": "pre-trained attention layer",
    "pretrained_attn_bert": "BERT attention layer",
}


def ws_curves(
    records: list[dict], map_name: str, group: Literal["d", "L"], scaled: bool = False
) -> dict[int, tuple[list[int], list[float], list[float]]]:
    """Mean and standard deviation of S (or S sqrt(n)) over trials, per group value and n.

    Args:
        records: results.jsonl rows with keys map, d, n, L, trial, ws (other keys are ignored).
        map_name: the map to keep ('rf', 'deep_rf', 'raf', 'relu_raf').
        group: 'd' (one curve per embedding dimension) or 'L' (one curve per depth).
        scaled: multiply S by sqrt(n) (the RF / DeepRF panel where O(1/sqrt(n)) shows as a flat line).

    Returns:
        {group value: (n values ascending, means, standard deviations)}; sd is the sample sd (0 for one trial).
    """
    if group not in ("d", "L"):
        raise ValueError(f"group must be 'd' or 'L', got {group!r}")
    cells: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("map") != map_name:
            continue
        s = float(r["ws"]) * (math.sqrt(r["n"]) if scaled else 1.0)
        cells[int(r[group])][int(r["n"])].append(s)
    if not cells:
        raise ValueError(f"map_name: no record has map={map_name!r}")
    out = {}
    for g in sorted(cells):
        ns = sorted(cells[g])
        means, sds = [], []
        for n in ns:
            v = cells[g][n]
            mu = sum(v) / len(v)
            means.append(mu)
            sds.append(math.sqrt(sum((x - mu) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0)
        out[g] = (ns, means, sds)
    return out


@styled
def plot_ws_curves(records: list[dict], map_name: str, group: Literal["d", "L"], scaled: bool = False) -> Figure:
    """S against n, one curve per d (or per L), mean over trials with a 1-sd band (as in the paper's Figures 2-3).

    Args:
        records: results.jsonl rows with keys map, d, n, L, trial, ws.
        map_name: 'rf', 'deep_rf', 'raf' or 'relu_raf'.
        group: 'd' or 'L'.
        scaled: plot S sqrt(n) instead of S (the panel for RF and DeepRF).

    Returns:
        A matplotlib Figure with one line (and one band) per group value; close it after use.
    """
    curves = ws_curves(records, map_name, group, scaled)
    fig, ax = plt.subplots(figsize=(4.5, 3.4))
    for g, (ns, means, sds) in curves.items():
        (line,) = ax.plot(ns, means, marker="o", ms=3, label=f"{group} = {g}")
        ax.fill_between(
            ns,
            [m - s for m, s in zip(means, sds)],
            [m + s for m, s in zip(means, sds)],
            color=line.get_color(),
            alpha=0.2,
            linewidth=0,
        )
    set_error_scale([ax], [m for _, means, _ in curves.values() for m in means])
    ax.set_xlabel("n (tokens)")
    ax.set_ylabel(r"$\mathcal{S}\sqrt{n}$" if scaled else r"$\mathcal{S}$ (word sensitivity)")
    ax.set_title(f"{TITLES.get(map_name, map_name)}" + (r", $\mathcal{S}\sqrt{n}$" if scaled else ""))
    ax.legend(fontsize=LEGEND_FONTSIZE)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


@styled
def plot_ws_maps(records: list[dict]) -> Figure:
    """S against n for every map of a sweep on the same log-log axes, with the 1/sqrt(n) reference line.

    One line per map (and per d and depth when a sweep has several): the mean S over trials per n, with markers.
    The reference c/sqrt(n) (dashed, black) passes through the geometric mean of the curves' values at the smallest
    n, so a curve parallel to it decays as 1/sqrt(n) and a flat one keeps order-1 word sensitivity.

    Args:
        records: results.jsonl rows with keys map, d, n, L, ws.

    Returns:
        A matplotlib Figure; close it after use.
    """
    cells: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("ws") is not None and float(r["ws"]) > 0:
            cells[(r["map"], int(r["d"]), int(r.get("L", 1)))][int(r["n"])].append(float(r["ws"]))
    if not cells:
        raise ValueError("records: no record with a positive ws")
    several_d = len({k[1] for k in cells}) > 1
    several_L = len({k[2] for k in cells}) > 1
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    firsts = []
    for m, d, L in sorted(cells):
        ns = sorted(cells[(m, d, L)])
        means = [sum(v) / len(v) for v in (cells[(m, d, L)][n] for n in ns)]
        label = TITLES.get(m, m) + (f", d = {d}" if several_d else "") + (f", L = {L}" if several_L else "")
        ax.plot(ns, means, marker="o", ms=3, label=label)
        firsts.append((ns[0], means[0]))
    n0 = min(n for n, _ in firsts)
    at_n0 = [s for n, s in firsts if n == n0]
    c = math.exp(sum(math.log(s) for s in at_n0) / len(at_n0)) * math.sqrt(n0)
    n_all = sorted({n for key in cells for n in cells[key]})
    ax.plot(n_all, [c / math.sqrt(n) for n in n_all], "k--", lw=1, label=r"$\propto 1/\sqrt{n}$")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(n_all, [str(n) for n in n_all])  # the grid's n as plain numbers
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("n (tokens)")
    ax.set_ylabel(r"$\mathcal{S}$ (word sensitivity)")
    ax.set_title("Word sensitivity of every map")
    ax.legend(fontsize=LEGEND_FONTSIZE, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
