"""The one-word substitution against n (docs/theory/words.md §13).

The continuous S and the exact best real word per map (`plot_words_vs_n`), the share of reviews where one real word
flips a head (`plot_flip_rates`), and for a trained head the flipping words against the clean margin
(`plot_head_word_flips`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator

from .style import LEGEND_FONTSIZE, colour, line_look, styled
from .ws import TITLES, trials_label


def _curves(records: list[dict], field: str, positive: bool = False) -> dict[tuple, tuple[list[int], list[float]]]:
    """{(map, d, L): (n ascending, mean of `field` per n)} over the records where it is set.

    And > 0 if `positive`: a log axis.
    """
    cells: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        v = r.get(field)
        if v is not None and (float(v) > 0 or not positive):
            cells[(r["map"], int(r["d"]), int(r.get("L", 1)))][int(r["n"])].append(float(v))
    return {
        key: (sorted(per_n), [sum(per_n[n]) / len(per_n[n]) for n in sorted(per_n)]) for key, per_n in cells.items()
    }


def _label(key: tuple, several_d: bool, several_L: bool) -> str:
    m, d, L = key
    return TITLES.get(m, m) + (f", d = {d}" if several_d else "") + (f", L = {L}" if several_L else "")


def _members_label(members: list[tuple[tuple, str]], several_d: bool, several_L: bool) -> str:
    """The legend entry of one flip-rate line standing for the series `members` with equal rates.

    `members` is [(map key, training)]; entries read "RAF, retrain", "RAF, retrain = finetune", "RF, retrain = RAF,
    retrain".
    """
    if len({key for key, _ in members}) == 1:
        return f"{_label(members[0][0], several_d, several_L)}, {' = '.join(t for _, t in members)}"
    return " = ".join(f"{_label(key, several_d, several_L)}, {t}" for key, t in members)


def _finish(fig: Figure, ax, ns: list[int], ylabel: str, title: str) -> Figure:
    """The shared frame of both figures.

    n on a log axis with the grid's values as ticks, labels, the legend on the right, a grid.
    """
    ax.set_xscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("n (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=LEGEND_FONTSIZE, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


@styled
def plot_words_vs_n(records: list[dict]) -> Figure:
    """Mean continuous S (solid) and mean exact best-word sensitivity S_words (dashed) against n, per map, log-log.

    A map whose records have no continuous S (a sweep with `continuous: false`) gets its dashed line alone.

    Args:
        records: words records with keys map, d, n, L, ws_words (and ws where searched).

    Returns:
        A matplotlib Figure; close it after use.
    """
    cont = _curves(records, "ws", positive=True)
    disc = _curves(records, "ws_words", positive=True)
    if not cont and not disc:
        raise ValueError("records: no record with a positive ws or ws_words")
    keys = sorted(set(cont) | set(disc))
    several_d, several_L = len({k[1] for k in keys}) > 1, len({k[2] for k in keys}) > 1
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, key in enumerate(keys):
        c, marker = line_look(i)
        label = _label(key, several_d, several_L)
        if key in cont:
            ax.plot(*cont[key], color=c, marker=marker, ms=4, label=label + r": $\mathcal{S}$")
        if key in disc:
            word_label = "  best real word" if key in cont else label + ": best real word"
            ax.plot(*disc[key], color=c, marker=marker, ms=4, ls="--", mfc="white", label=word_label)
    ax.set_yscale("log")
    ns = sorted({n for ns, _ in [*cont.values(), *disc.values()] for n in ns})
    title = f"Continuous Delta (solid) vs the exact best real word (dashed), mean ({trials_label(records)})"
    return _finish(fig, ax, ns, "relative change of phi(X)", title)


@styled
def plot_flip_rates(records: list[dict], trainings: Iterable[str]) -> Figure:
    """Share of reviews where some admissible real word flips the head, against n.

    One line per map and training (re-trained solid, fine-tuned dashed, min-norm dotted); series with equal rates at
    every n share one line, whose legend entry names them all ("RAF, retrain = finetune").

    Args:
        records: words records with keys map, d, n, L and flipped_<training>.
        trainings: the trainings to draw ("finetune", "retrain").

    Returns:
        A matplotlib Figure; close it after use.
    """
    trainings = list(trainings)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    keys = sorted({(r["map"], int(r["d"]), int(r.get("L", 1))) for r in records})
    several_d, several_L = len({k[1] for k in keys}) > 1, len({k[2] for k in keys}) > 1
    # Series with the same rates at the same n (e.g. both trainings flip every review) would be drawn on top of each
    # other, the last one hiding the others: each such group is one line, its legend entry naming every series in it.
    groups: dict[tuple, list[tuple[tuple, str]]] = {}
    for training in trainings:
        for key, (ns, means) in sorted(_curves(records, f"flipped_{training}").items()):
            groups.setdefault((tuple(ns), tuple(means)), []).append((key, training))
    for (ns, means), members in groups.items():
        key, training = members[0]
        c, marker = line_look(keys.index(key))
        style = {"retrain": "-", "finetune": "--"}.get(training, ":")
        ax.plot(ns, means, color=c, marker=marker, ms=4, ls=style, label=_members_label(members, several_d, several_L))
    ns_all = {n for ns, _ in groups for n in ns}
    if not ns_all:
        raise ValueError("records: no record with a flipped_<training> field")
    ax.set_ylim(-0.03, 1.03)
    title = f"One real word flips the head ({trials_label(records)})"
    return _finish(fig, ax, sorted(ns_all), "share of reviews with a flipping word", title)


# Positions that share a review's margin and a flip count would be one marker: they are spread in a small grid around
# it instead, DODGE_X of the margins' span apart across and a factor DODGE_Y apart up the log axis (6 rows stay below
# 1.07^6 = 1.5: a position without a flip stays nearer 1 than 2, the mark of one flipping word)
DODGE_X = 0.006
DODGE_Y = 1.07


def _dodged(points: list[tuple[float, float]], span: float) -> list[tuple[float, float]]:
    """The points with each group of equal ones spread in a near-square grid centred on them (one stays put)."""
    groups: dict[tuple[float, float], list[int]] = defaultdict(list)
    for k, xy in enumerate(points):
        groups[xy].append(k)
    out = list(points)
    for (x, y), members in groups.items():
        cols = max(1, round(len(members) ** 0.5))
        for j, k in enumerate(members):
            row, col = divmod(j, cols)
            width = min(cols, len(members) - row * cols)
            out[k] = (x + (col - (width - 1) / 2) * DODGE_X * span, y * DODGE_Y**row)
    return out


def _checked_label(records: list[dict]) -> str:
    """How many words a screened run checked at a position, for the title ("" without a screen)."""
    screen = records[0].get("screen")
    if not screen:
        return ""
    if all("admissible" in r and r.get("checked", 0) >= r["admissible"] for r in records):
        return ", every admissible word checked"
    return f", up to {screen} words checked a position"


@styled
def plot_head_word_flips(records: list[dict]) -> Figure:
    """The admissible words that flip a trained head at each position, against its clean margin y f(X).

    One marker per (review, position): flipping words + 1 on a log axis (1: none), the margin on the other (< 0: the
    model got the review wrong); positions with a flip in the first colour. Where the head is sure of its answer, one
    word rarely flips it; near the boundary, many do. The positions of a review share its margin: those with the same
    count are spread in a small grid around their point (`DODGE_X`, `DODGE_Y`), so every position is a marker of its
    own; where no position flips, a note says so.

    Args:
        records: records of `TrainedHeadWords` (keys margin, flips, flipped, map, n).

    Returns:
        A matplotlib Figure; close it after use.
    """
    if not records:
        raise ValueError("records: no trained-head words record to draw")
    margins = [float(r["margin"]) for r in records]
    span = (max(margins) - min(margins)) or max(1.0, abs(margins[0]))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for flipped, label, c in ((True, "some word flips the head", colour(0)), (False, "no word flips it", colour(1))):
        chosen = [r for r in records if bool(r["flipped"]) == flipped]
        xy = _dodged([(float(r["margin"]), float(r["flips"]) + 1.0) for r in chosen], span)
        ax.scatter([x for x, _ in xy], [y for _, y in xy], s=12, color=c, label=label)
    ax.set_yscale("log")
    if not any(r["flipped"] for r in records):  # the strip at 1 with room above it, and a note saying why
        ax.set_ylim(0.85, 4.0)
        ax.yaxis.set_major_locator(FixedLocator([1, 2, 3, 4]))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%d"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.text(
            0.5,
            0.95,
            f"no position flips: all {len(records)} positions at 1, one marker each",
            transform=ax.transAxes,
            ha="center",
            va="top",
            fontsize=LEGEND_FONTSIZE,
        )
    ax.axvline(0.0, color="0.5", lw=0.8)
    ax.set_xlabel("clean margin y f(X) (< 0: misclassified)")
    ax.set_ylabel("flipping words + 1")
    checked = _checked_label(records)
    ax.set_title(f"One word flips the trained head: {records[0]['map']}, n = {records[0]['n']}{checked}")
    ax.legend(fontsize=LEGEND_FONTSIZE)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


@styled
def plot_classifier_flips(records: list[dict]) -> Figure:
    """Per review of a classifier's words evaluation: its clean margin against the share of its positions flipped.

    The margin is the predicted label's logit minus the largest other, drawn negative where the prediction is wrong;
    colours give the review's status (robust, attacked, wrong). A review the model is sure of resists one word
    better: the share falls as the margin grows.

    Args:
        records: records of `ClassifierWords` (the "review" ones are drawn).

    Returns:
        A matplotlib Figure; close it after use.
    """
    reviews = [r for r in records if r["kind"] == "review"]
    if not reviews:
        raise ValueError("records: no classifier review record to draw")
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, state in enumerate(("attacked", "robust", "wrong")):
        chosen = [r for r in reviews if r["status"] == state]
        if not chosen:
            continue
        x = [float(r["clean_margin"]) * (1 if r["status"] != "wrong" else -1) for r in chosen]
        y = [r["flipped_positions"] / max(1, r["positions"]) for r in chosen]
        ax.scatter(x, y, s=14, color=colour(i), label=f"{state} ({len(chosen)})")
    ax.axvline(0.0, color="0.5", lw=0.8)
    ax.set_xlabel("clean margin of the predicted label (< 0: misclassified)")
    ax.set_ylabel("share of positions one word flips")
    ax.set_title(f"One-word flips of {reviews[0].get('model', 'the classifier')}", fontsize=9)
    ax.legend(fontsize=LEGEND_FONTSIZE)
    fig.tight_layout()
    return fig
