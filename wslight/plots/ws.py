"""Word-sensitivity curves S against n.

One curve per d or per depth L (the paper's Figures 2-3), and every map of a sweep on one log-log figure
(`plot_ws_maps`).

Importing the package wslight.plots first sets the Agg backend, so no screen is needed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Literal

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from .style import LEGEND_FONTSIZE, line_look, set_error_scale, styled

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
    "pretrained_encoder": "pre-trained encoder",
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


def embeddings_label(spec: Any) -> str:
    """What the tokens of a sweep are, for a figure title: "bundled-minilm, layer 0" or "synthetic tokens".

    Args:
        spec: an EmbeddingSpec (or anything with its `source`, `encoder` and `layer` attributes).
    """
    if getattr(spec, "source", None) == "synthetic":
        return "synthetic tokens"
    return f"{spec.encoder}, layer {spec.layer}"


def trials_label(records: list[dict]) -> str:
    """The trials of a figure: "10 trials" (records per (map, d, n, L) cell), "8-10 trials" when cells lost some."""
    cells: dict[tuple, int] = defaultdict(int)
    for r in records:
        cells[(r.get("map"), r.get("d"), r.get("n"), r.get("L", 1))] += 1
    lo, hi = min(cells.values(), default=0), max(cells.values(), default=0)
    count = str(hi) if lo == hi else f"{lo}-{hi}"
    return f"{count} trial" + ("" if count == "1" else "s")


def _title_tail(records: list[dict], encoder: str | None) -> str:
    """The tokens (when known) and the trials of a figure's records: " (bundled-minilm, layer 0; 10 trials)"."""
    if encoder is None:  # records that name their encoder (probe records do; sweep records leave it to the caller)
        named = {r.get("encoder") for r in records}
        encoder = named.pop() if len(named) == 1 else None
    return f" ({encoder}; {trials_label(records)})" if encoder else f" ({trials_label(records)})"


@styled
def plot_ws_curves(
    records: list[dict], map_name: str, group: Literal["d", "L"], scaled: bool = False, encoder: str | None = None
) -> Figure:
    """S against n, one curve per d (or per L), mean over trials with a 1-sd band (as in the paper's Figures 2-3).

    The legend title says what the band is (mean +- 1 sample sd over the trials); the title names the tokens and the
    number of trials.

    Args:
        records: results.jsonl rows with keys map, d, n, L, trial, ws.
        map_name: 'rf', 'deep_rf', 'raf' or 'relu_raf'.
        group: 'd' or 'L'.
        scaled: plot S sqrt(n) instead of S (the panel for RF and DeepRF).
        encoder: the tokens' encoder for the title (e.g. `embeddings_label(spec)`); None: the records' `encoder`
            field when they share one, else left out.

    Returns:
        A matplotlib Figure with one line (and one band) per group value; close it after use.
    """
    curves = ws_curves(records, map_name, group, scaled)
    mine = [r for r in records if r.get("map") == map_name]
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
    name = TITLES.get(map_name, map_name) + (r", $\mathcal{S}\sqrt{n}$" if scaled else "")
    ax.set_title(name + _title_tail(mine, encoder))
    # ws_curves' sd is the sample sd over the trials of a cell
    ax.legend(fontsize=LEGEND_FONTSIZE, title=f"band: mean $\\pm$ 1 sd over {trials_label(mine)}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


@styled
def plot_ws_maps(records: list[dict], encoder: str | None = None) -> Figure:
    """S against n for every map of a sweep on the same log-log axes, with the 1/sqrt(n) reference line.

    One line per map (and per d and depth when a sweep has several): the mean S over trials per n, with markers; every
    line has its own (colour, marker) pair (`line_look`), so a map stays identifiable in print without colour.
    The reference c/sqrt(n) (dashed, black) passes through the geometric mean of the curves' values at the smallest
    n, so a curve parallel to it decays as 1/sqrt(n) and a flat one keeps order-1 word sensitivity.

    Args:
        records: results.jsonl rows with keys map, d, n, L, ws.
        encoder: the tokens' encoder for the title (as in `plot_ws_curves`).

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
    for i, (m, d, L) in enumerate(sorted(cells)):
        ns = sorted(cells[(m, d, L)])
        means = [sum(v) / len(v) for v in (cells[(m, d, L)][n] for n in ns)]
        label = TITLES.get(m, m) + (f", d = {d}" if several_d else "") + (f", L = {L}" if several_L else "")
        c, marker = line_look(i)
        ax.plot(ns, means, color=c, marker=marker, ms=4, label=label)
        firsts.append((ns[0], means[0]))
    n0 = min(n for n, _ in firsts)
    at_n0 = [s for n, s in firsts if n == n0]
    level = math.exp(sum(math.log(s) for s in at_n0) / len(at_n0)) * math.sqrt(n0)
    n_all = sorted({n for key in cells for n in cells[key]})
    ax.plot(n_all, [level / math.sqrt(n) for n in n_all], "k--", lw=1, label=r"$\propto 1/\sqrt{n}$")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(n_all, [str(n) for n in n_all])  # the grid's n as plain numbers
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("n (tokens)")
    ax.set_ylabel(r"$\mathcal{S}$ (word sensitivity)")
    drawn = [r for r in records if r.get("ws") is not None and float(r["ws"]) > 0]
    ax.set_title("Word sensitivity of every map, mean" + _title_tail(drawn, encoder))
    ax.legend(fontsize=LEGEND_FONTSIZE, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
