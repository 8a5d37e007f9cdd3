"""The one style of every figure: legible at column width, colour-blind safe, visible in print.

Okabe-Ito colours without its pale yellow (markers must show on white paper), legends and ticks at 8 pt or more, and
`error_scale` choosing a log axis for errors that span decades (or sit at rounding level, where a linear autoscaled
axis would show float noise as spread), `line_look` for figures with more lines than colours, and `PNG_DPI`, the one
resolution of saved PNGs. Figure functions take the style with the `styled` decorator.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import matplotlib.pyplot as plt
from cycler import cycler

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

# Okabe & Ito (2008), "Color Universal Design": blue, vermillion, bluish green, reddish purple, orange, sky blue, black
# (their yellow #F0E442 left out: too pale for markers on white).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
# Lines of one figure that need more looks than the palette has colours (the zoo of maps) pair a colour with a marker:
# 6 colours (black is left to reference lines) and 7 markers, coprime, give 42 distinct (colour, marker) pairs.
LINE_COLOURS = PALETTE[:-1]
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LEGEND_FONTSIZE = 8
# Resolution of every saved PNG: a 6.4 in wide figure is 1280 px (legible when zoomed, sharp on a slide).
PNG_DPI = 200
STYLE: dict[RcKeyType, Any] = {
    "axes.prop_cycle": cycler(color=PALETTE),
    "legend.fontsize": LEGEND_FONTSIZE,
    "legend.title_fontsize": LEGEND_FONTSIZE,
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "lines.markersize": 5,
}
# Positive values whose max/min reaches this ratio (two decades) get a log axis.
DECADES_RATIO = 100.0
# Below this every value is rounding noise around zero for the errors drawn here: a log axis shows its true size.
ROUNDING_LEVEL = 1e-6

F = TypeVar("F", bound=Callable[..., Any])


def colour(i: int) -> str:
    """The i-th colour of the palette (cycling)."""
    return PALETTE[i % len(PALETTE)]


def line_look(i: int) -> tuple[str, str]:
    """(colour, marker) of the i-th line: pairwise distinct for the first len(LINE_COLOURS) * len(MARKERS) lines."""
    return LINE_COLOURS[i % len(LINE_COLOURS)], MARKERS[i % len(MARKERS)]


def error_scale(values: Iterable[float]) -> Literal["log", "linear"]:
    """The scale of an error axis, "log" or "linear".

    "log" when the positive finite values span two decades or more, or all lie below ROUNDING_LEVEL.
    """
    pos = [v for v in (float(x) for x in values) if v > 0 and math.isfinite(v)]
    if not pos:
        return "linear"
    lo, hi = min(pos), max(pos)
    return "log" if hi / lo >= DECADES_RATIO or hi < ROUNDING_LEVEL else "linear"


def set_error_scale(axes: Iterable[Any], values: Iterable[float]) -> None:
    """Give every axis the y scale `error_scale` chooses (zeros drawn at the bottom edge of a log axis)."""
    scale = error_scale(values)
    for ax in axes:
        if scale == "log":
            ax.set_yscale("log", nonpositive="clip")


def styled(fn: F) -> F:
    """Draw a figure function's artists under STYLE (rcParams are read when the artists are made)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with plt.rc_context(STYLE):
            return fn(*args, **kwargs)

    return cast(F, wrapper)  # functools.wraps keeps fn's signature
