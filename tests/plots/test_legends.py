"""The figures' legends: one entry per series drawn, no series hidden under another."""


def test_attack_scatter_gives_align_and_align_proj_each_their_own_legend_entry_and_marker():
    import matplotlib.pyplot as plt

    from wslight.plots.attack import plot_attack_scatter

    losses = ("err", "align", "align_proj")
    recs = [
        {"map": "raf", "n": 6, "N": N, "training": "finetune", "loss": loss, "p": 0.0, "gamma": 0.1 * (i + 1), "err": e}
        for N in (10, 20)
        for loss in losses
        for i, e in enumerate((0.2, 0.5))
    ]
    fig = plot_attack_scatter(recs)
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) == 2 * len(losses)  # one entry per (N, loss)
    assert {"N = 10, alignment loss", "N = 10, projected alignment loss", "N = 10, loss = Err"} <= set(labels)
    markers = {}
    for coll in ax.collections:  # one scatter per (N, loss): the same loss has the same marker at every N
        markers.setdefault(coll.get_label().split(", ", 1)[1], set()).add(coll.get_paths()[0].vertices.tobytes())
    assert len(markers) == len(losses) and all(len(m) == 1 for m in markers.values())
    assert len({next(iter(m)) for m in markers.values()}) == len(losses)  # three distinct markers
    plt.close(fig)


def test_words_flip_rate_figure_draws_no_line_on_top_of_another():
    """Series with equal rates (here RAF's two trainings) share one line whose legend entry names both."""
    import matplotlib.pyplot as plt

    from wslight.plots.words import plot_flip_rates

    flips = {  # (map, training) -> flipped per (n, trial)
        ("raf", "retrain"): {4: (1, 1), 16: (1, 0)},
        ("raf", "finetune"): {4: (1, 1), 16: (1, 0)},
        ("rf", "retrain"): {4: (0, 0), 16: (0, 1)},
        ("rf", "finetune"): {4: (1, 0), 16: (0, 0)},
    }
    recs = [
        {"map": m, "d": 8, "n": n, "L": 1, "trial": t}
        | {f"flipped_{tr}": flips[(m, tr)][n][t] for tr in ("retrain", "finetune")}
        for m in ("raf", "rf")
        for n in (4, 16)
        for t in (0, 1)
    ]
    fig = plot_flip_rates(recs, ["retrain", "finetune"])
    (ax,) = fig.axes
    lines = ax.get_lines()
    data = [(tuple(line.get_xdata()), tuple(line.get_ydata())) for line in lines]
    assert len(set(data)) == len(data) == 3  # every line visible: no two with the same points
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) == len(lines)
    assert "RAF, retrain = finetune" in labels
    plt.close(fig)
