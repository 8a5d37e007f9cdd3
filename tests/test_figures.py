"""Figures legible at column width: legends >= 8 pt, no pale markers, log error axes where values span decades, and
probe titles that name the configured (0-based) layer and head."""

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pytest
import torch

from wslight.plots.attack import plot_attack_scatter, plot_penalized
from wslight.plots.style import LEGEND_FONTSIZE, PALETTE, error_scale
from wslight.plots.ws import plot_ws_maps
from wslight.probes.figures import figure_attention_edit, figure_attention_under_delta


@pytest.fixture(autouse=True)
def close_figures():
    """Every figure drawn here is closed after its test (other tests count the open ones)."""
    yield
    plt.close("all")


def attack_records(errs, loss="err"):
    return [
        {"map": "raf", "n": 6, "N": N, "training": "finetune", "loss": loss, "p": 0.5, "gamma": 0.1 * (i + 1), "err": e}
        for i, e in enumerate(errs)
        for N in (10, 20)
    ]


def luminance(c) -> float:
    r, g, b = mcolors.to_rgb(c)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.parametrize(
    "values, scale",
    [
        ([1e-12, 3e-12, 0.5, 1.2], "log"),  # twelve decades
        ([2e-12, 2.1e-12], "log"),  # all at rounding level: a linear axis would show noise as spread
        ([0.2, 0.5, 0.9, 1.4], "linear"),
        ([0.0, 0.3, 1.0], "linear"),  # a zero does not count as a decade
        ([], "linear"),
    ],
)
def test_error_scale_is_log_when_values_span_decades(values, scale):
    assert error_scale(values) == scale


def test_palette_has_no_pale_colour():
    assert all(luminance(c) < 0.75 for c in PALETTE)


@pytest.mark.parametrize("plot, loss", [(plot_attack_scatter, "err"), (plot_penalized, "penalized")])
def test_attack_figures_use_a_log_error_axis_legible_legends_and_visible_markers(plot, loss):
    ax = plot(attack_records([1e-12, 2e-12, 0.8], loss)).axes[0]
    assert ax.get_yscale() == "log"
    assert ax.get_legend() is not None
    assert all(t.get_fontsize() >= LEGEND_FONTSIZE >= 8 for t in ax.get_legend().get_texts())
    for coll in ax.collections:
        colours = list(coll.get_edgecolors()) + list(coll.get_facecolors())
        assert colours and all(luminance(c[:3]) < 0.75 for c in colours if c[3] > 0)
    fig = plot(attack_records([0.3, 0.6, 0.9], loss))
    assert fig.axes[0].get_yscale() == "linear"


def test_ws_maps_legend_is_8_pt():
    recs = [{"map": m, "d": 8, "n": n, "L": 1, "ws": 1 / n**0.5} for m in ("rf", "raf") for n in (4, 16)]
    fig = plot_ws_maps(recs)
    assert all(t.get_fontsize() >= 8 for t in fig.axes[0].get_legend().get_texts())


def test_probe_titles_name_the_configured_layer_and_head():
    tokens = ["the", "movie", "was"]
    edit = {
        "attn_a": torch.rand(3, 3),
        "attn_b": torch.rand(3, 3),
        "diff": torch.rand(3, 3),
        "sentences": ["a", "b"],
        "tokens_a": tokens,
        "tokens_b": tokens,
        "head": None,
        "layer": 0,
        "encoder": "bundled-minilm",
    }
    assert "attention of layer 0 (mean over heads)" in figure_attention_edit(edit)._suptitle.get_text()
    under = {
        "before": torch.rand(3, 3),
        "after": torch.rand(3, 3),
        "tokens": tokens,
        "position": 1,
        "layer": 0,
        "head": 2,
        "method": "closed-form",
        "encoder": "bundled-minilm",
    }
    assert "layer 0, head 2" in figure_attention_under_delta(under)._suptitle.get_text()
