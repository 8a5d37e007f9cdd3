"""Figures legible at column width.

Legends >= 8 pt, no pale markers, log error axes where values span decades, probe titles that name the configured
(0-based) layer and head, S(n) figures that say what their band is, legends that cover no point, and PNGs sharp enough
to zoom.
"""

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pytest
import torch

from wslight.plots.attack import plot_attack_scatter, plot_penalized
from wslight.plots.style import LEGEND_FONTSIZE, PALETTE, error_scale
from wslight.plots.ws import plot_ws_curves, plot_ws_maps
from wslight.probes.figures import figure_attention_edit, figure_attention_under_delta, figure_layerwise


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


def ws_records(trials=3, encoder=None):
    return [
        {"map": "raf", "d": d, "n": n, "L": 1, "trial": t, "ws": (1 + t) / n**0.5}
        | ({"encoder": encoder} if encoder else {})
        for d in (8, 16)
        for n in (4, 16)
        for t in range(trials)
    ]


def test_ws_curves_say_what_the_band_is_and_name_the_trials_and_the_encoder():
    ax = plot_ws_curves(ws_records(trials=3), "raf", "d", encoder="bundled-minilm, layer 0").axes[0]
    assert "bundled-minilm, layer 0" in ax.get_title() and "3 trials" in ax.get_title()
    assert "band: mean $\\pm$ 1 sd over 3 trials" == ax.get_legend().get_title().get_text()
    # records that name their encoder title it themselves; a cell that lost a trial shows as a range
    recs = ws_records(trials=2, encoder="bert-base-uncased")[1:]
    title = plot_ws_maps(recs + [{**r, "map": "rf"} for r in recs]).axes[0].get_title()
    assert "bert-base-uncased" in title and "1-2 trials" in title


def layerwise_result(layers=7):
    """A layer-wise probe result whose points fill every corner of the axes (where an inside legend would sit)."""
    up = torch.logspace(-3, 0, layers)
    zigzag = torch.tensor([1e-3 if i % 2 else 1.0 for i in range(layers)])
    gaussian = torch.stack([up.flip(0) * 0.5, up.flip(0) * 1.5])  # (draws, layers)
    return {
        "rel_change": {
            "optimised": up,
            "closed_form": up.flip(0),
            "gaussian": gaussian,
            "gaussian_mean": gaussian.mean(0),
            "gaussian_sd": gaussian.std(0),
            "replacement_best": zigzag,
        },
        "replacement": {"tokens": ["film", "movie"], "best": 1},
        "encoder": "bundled-minilm",
        "position": 2,
        "token": "movie",
        "tokens": ["[CLS]", "the", "movie", "[SEP]"],
        "delta_norm": 1.0,
        "n_draws": 2,
    }


def test_layerwise_legend_covers_no_point():
    fig = figure_layerwise(layerwise_result())
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    legends = [lg for lg in (ax.get_legend(), *fig.legends) if lg is not None]
    assert legends and 'best real word: "movie"' in [t.get_text() for t in legends[0].get_texts()]
    boxes = [lg.get_window_extent(renderer) for lg in legends]
    points = [p for line in ax.get_lines() for p in ax.transData.transform(line.get_xydata())]
    assert len(points) == 4 * 7
    assert not [p for p in points for box in boxes if box.contains(*p)]
    assert all(fig.bbox.contains(*box.p0) and fig.bbox.contains(*box.p1) for box in boxes)  # not cut off


def test_saved_pngs_are_at_least_1000_px_wide(tmp_path):
    import matplotlib.image as mpimg

    from wslight.tasks import save_figure

    fig, ax = plt.subplots()  # the default figure size, 6.4 x 4.8 in
    ax.plot([0, 1], [0, 1])
    png, _ = save_figure(fig, tmp_path, "f")
    height, width = mpimg.imread(png).shape[:2]
    assert width >= 1000 and height >= 700


def test_a_sweep_titles_its_figures_with_its_tokens(tmp_path, monkeypatch):
    """The sweep hands its embeddings to the figures: the S(n) title says which tokens the trials read."""
    from pathlib import Path

    from wslight.app.cli import main
    from wslight.tasks.evaluation import Evaluation

    titles = {}

    def keep_title(self, tag, fig, stem):
        suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
        titles[stem] = " ".join([suptitle, *(ax.get_title() for ax in fig.axes)])
        plt.close(fig)

    monkeypatch.setattr(Evaluation, "add_figure", keep_title)
    conf = Path(__file__).resolve().parents[1] / "conf" / "ws" / "raf.yaml"
    main(
        [
            "test",
            "--config",
            str(conf),
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--model.init_args.grid.d_values",
            "[8]",
            "--model.init_args.grid.trials",
            "1",
        ],
        evaluate=True,
    )
    assert "synthetic tokens" in titles["ws_raf"]


def test_a_trained_heads_flips_are_drawn_against_the_clean_margin_one_point_per_position():
    from wslight.plots.words import plot_head_word_flips

    records = [
        {"map": "raf", "n": 40, "margin": m, "flips": f, "flipped": f > 0, "screen": 32}
        for m, f in ((-0.2, 900), (0.1, 40), (0.8, 0), (1.5, 0), (0.3, 1))
    ]
    ax = plot_head_word_flips(records).axes[0]
    drawn = {tuple(map(float, xy)) for c in ax.collections for xy in c.get_offsets()}
    assert drawn == {(r["margin"], r["flips"] + 1.0) for r in records}  # flips + 1 on a log axis: 1 is none
    assert ax.get_yscale() == "log" and "32 words checked" in ax.get_title()
    assert [c.get_label() for c in ax.collections] == ["some word flips the head", "no word flips it"]
    with pytest.raises(ValueError, match="records: no trained-head words record to draw"):
        plot_head_word_flips([])


def test_a_trained_head_with_no_flip_shows_every_position_not_one_dot_per_review():
    """The positions of a review share its margin: 4 reviews x 8 positions without a flip are 32 markers, not 4."""
    from wslight.plots.words import plot_head_word_flips

    records = [
        {"map": "raf", "n": 9, "margin": m, "flips": 0, "flipped": False, "position": p}
        for m in (0.4, 0.9, 1.3, 2.0)
        for p in range(1, 9)
    ]
    ax = plot_head_word_flips(records).axes[0]
    drawn = [tuple(map(float, xy)) for c in ax.collections for xy in c.get_offsets()]
    assert len(drawn) == len(set(drawn)) == 32  # one marker per position, none on top of another
    assert all(1.0 <= y < 2.0 for _, y in drawn)  # nearer "none" (1) than "one flipping word" (2)
    for m in (0.4, 0.9, 1.3, 2.0):  # each review's markers stay around its margin
        assert sum(abs(x - m) < 0.1 for x, _ in drawn) == 8
    assert any("no position flips" in t.get_text() and "32 positions" in t.get_text() for t in ax.texts)
    screened = [r | {"screen": 100000, "admissible": 20, "checked": 20} for r in records]
    title = plot_head_word_flips(screened).axes[0].get_title()
    assert "every admissible word checked" in title and "100000" not in title
