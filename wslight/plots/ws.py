"""Word-sensitivity curves S against n, one curve per d or per depth L (the paper's Figures 2-3).

Importing the package wslight.plots first sets the Agg backend, so no screen is needed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Literal

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

TITLES = {"rf": "RF", "deep_rf": "DeepRF", "raf": "RAF", "relu_raf": "ReLU-RAF"}


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
    ax.set_xlabel("n (tokens)")
    ax.set_ylabel(r"$\mathcal{S}\sqrt{n}$" if scaled else r"$\mathcal{S}$ (word sensitivity)")
    ax.set_title(f"{TITLES.get(map_name, map_name)}" + (r", $\mathcal{S}\sqrt{n}$" if scaled else ""))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
