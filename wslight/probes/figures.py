"""Figures of the encoder probes (matplotlib, Agg backend): each takes a probe's result dict and returns a Figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from ..plots.style import LEGEND_FONTSIZE, colour, styled


def _annotate(ax, M: np.ndarray, fmt: str = "{:.2f}", threshold: float | None = None) -> None:
    thr = (np.nanmax(M) + np.nanmin(M)) / 2 if threshold is None else threshold
    for (q, k), v in np.ndenumerate(M):
        ax.text(k, q, fmt.format(v), ha="center", va="center", fontsize=8, color="black" if v > thr else "white")


@styled
def figure_attention_edit(res: dict, vlim: tuple[float, float] | None = None, annotate: bool = True) -> Figure:
    """Figure 1 left: the two attention maps with a shared colour scale, and their difference (b - a).

    Args:
        res: output of `attention_edit`.
        vlim: colour limits of the two maps; None = the range of both. The authors used (0.10, 0.25) for BERT-Base.
        annotate: write each cell's value.
    """
    A, B, D = (res[k].detach().cpu().numpy() for k in ("attn_a", "attn_b", "diff"))
    lo, hi = (min(A.min(), B.min()), max(A.max(), B.max())) if vlim is None else vlim
    m = float(np.abs(D).max()) or 1.0
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.8), constrained_layout=True)
    head = "mean over heads" if res["head"] is None else f"head {res['head']}, 0-based"
    for ax, M, sent in zip(axes[:2], (A, B), res["sentences"], strict=True):
        im = ax.matshow(M, cmap="viridis", vmin=lo, vmax=hi)
        ax.set_title(f'"{sent}"', fontsize=10)
        if annotate:
            _annotate(ax, M, threshold=(lo + hi) / 2)
    fig.colorbar(im, ax=axes[:2], orientation="horizontal", shrink=0.6, label="attention")
    imd = axes[2].matshow(D, cmap="RdBu_r", vmin=-m, vmax=m)
    axes[2].set_title("difference (second - first)", fontsize=10)
    if annotate:
        for (q, k), v in np.ndenumerate(D):
            axes[2].text(k, q, f"{v:+.2f}", ha="center", va="center", fontsize=8)
    fig.colorbar(imd, ax=axes[2], orientation="horizontal", shrink=0.9, label="change")
    labels = [
        res["tokens_a"],
        res["tokens_b"],
        [f"{a}/{b}" if a != b else a for a, b in zip(res["tokens_a"], res["tokens_b"], strict=True)],
    ]
    for ax, toks in zip(axes, labels, strict=True):
        ax.set_xticks(range(len(toks)), toks, rotation=45, ha="left")
        ax.set_yticks(range(len(toks)), toks)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.xaxis.set_label_position("top")
    # layer and head as configured (0-based), so the title names what the config says
    fig.suptitle(f"{res['encoder']}: attention of layer {res['layer']} ({head}), without [CLS] and [SEP]")
    return fig


@styled
def figure_layerwise(res: dict, log: bool = True) -> Figure:
    """Figure 3 panel 3: relative change per layer: Delta (two variants), Gaussian (mean, 1-sd band), best real word."""
    rc = {k: v.detach().cpu().numpy() for k, v in res["rel_change"].items()}
    layers = np.arange(len(rc["closed_form"]))
    fig, ax = plt.subplots(figsize=(6.2, 4.4), constrained_layout=True)
    ax.plot(layers, rc["optimised"], "o-", color=colour(1), label=r"$\Delta$ (optimised)")
    ax.plot(layers, rc["closed_form"], "s--", color=colour(4), label=r"$\Delta$ (closed form)")
    mu, sd = rc["gaussian_mean"], rc["gaussian_sd"]
    ax.plot(layers, mu, "o-", color=colour(0), label=f"Gaussian, same norm ({res['n_draws']} draws)")
    # On a log axis the band is clipped below at the smallest draw (mean - sd can be <= 0 for a heavy-tailed layer).
    lo = np.maximum(mu - sd, rc["gaussian"].min(0)) if log else mu - sd
    ax.fill_between(layers, lo, mu + sd, color=colour(0), alpha=0.25, label="Gaussian mean $\\pm$ 1 sd")
    rep = res.get("replacement")
    if rep is not None:
        word = rep["tokens"][rep["best"]]
        ax.plot(layers, rc["replacement_best"], "^:", color=colour(2), label=f'best real word: "{word}"')
    if log:
        ax.set_yscale("log")
    ax.set_xticks(layers)
    ax.set_xlabel("layer (0 = input of the first attention layer)")
    ax.set_ylabel(r"$\|H_\ell(X') - H_\ell(X)\|_F \,/\, \|H_\ell(X)\|_F$")
    ax.set_title(
        f'{res["encoder"]}: token {res["position"]} ("{res["token"]}") of {len(res["tokens"])}, '
        f"$\\|\\Delta\\|$={res['delta_norm']:.2f}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    # Below the axes (constrained layout makes room): inside, it covers points whatever corner it takes.
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=LEGEND_FONTSIZE)
    return fig


@styled
def figure_attention_under_delta(res: dict) -> Figure:
    """Figure 3 panel 4: one head's attention before and after Delta, tokens as tick labels, perturbed key boxed."""
    before, after = (res[k].detach().cpu().numpy() for k in ("before", "after"))
    toks, i = res["tokens"], res["position"]
    n = len(toks)
    size = max(4.0, 0.32 * n + 2.0)
    fig, axes = plt.subplots(1, 2, figsize=(2 * size, size * 0.95), constrained_layout=True)
    hi = float(max(before.max(), after.max()))
    for ax, M, title in zip(
        axes, (before, after), ("before", f'after $\\Delta$ on token {i} ("{toks[i]}")'), strict=True
    ):
        im = ax.matshow(M, cmap="viridis", vmin=0.0, vmax=hi)
        ax.set_xticks(range(n), toks, rotation=90, fontsize=8)
        ax.set_yticks(range(n), toks, fontsize=8)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.xaxis.set_label_position("top")
        ax.set_title(title, fontsize=10)
        ax.add_patch(Rectangle((i - 0.5, -0.5), 1, n, fill=False, edgecolor="red", lw=1.2))
    fig.colorbar(im, ax=axes, shrink=0.7, label="attention")
    fig.suptitle(f"{res['encoder']}: layer {res['layer']}, head {res['head']} ({res['method']} $\\Delta$, 0-based)")
    return fig
