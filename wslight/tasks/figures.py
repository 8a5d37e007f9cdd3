"""The figures of the evaluations and the callbacks.

`attack_figures` (the attack's scatter and penalized panels) and `save_figure`, which writes a figure as PNG and PDF,
adds it to TensorBoard when the logger is a TensorBoardLogger and closes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def attack_figures(records: list[dict]) -> list[tuple[str, Any, str]]:
    """(TensorBoard tag, figure, file stem) of the attack: the Err-vs-gamma scatter and the penalized panel."""
    from ..plots.attack import plot_attack_scatter, plot_penalized

    figures = []
    plain = [r for r in records if r["loss"] != "penalized"]
    if plain:
        figures.append(("attack/scatter", plot_attack_scatter(plain), "attack_scatter"))
    penalized = [r for r in records if r["loss"] == "penalized"]
    if penalized:
        figures.append(("attack/penalized", plot_penalized(penalized), "attack_penalized"))
    return figures


# --- figures ----------------------------------------------------------------------------------------------------------
def save_figure(
    fig: Any, out_dir: str | Path, stem: str, logger: Any = None, tag: str | None = None, step: int | None = None
) -> list[Path]:
    """Save a figure as `<stem>.png` (at `PNG_DPI`) and `<stem>.pdf` in `out_dir`, add it to TensorBoard, close it.

    Args:
        fig: a matplotlib Figure.
        out_dir: the folder (created if missing).
        stem: the file name without its suffix.
        logger: a Lightning logger; the figure goes to TensorBoard only when it is a TensorBoardLogger.
        tag: the TensorBoard tag (default: the stem).
        step: the TensorBoard global step.

    Returns:
        The two paths written.
    """
    import matplotlib.pyplot as plt

    from ..plots.style import PNG_DPI

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    try:
        fig.savefig(paths[0], dpi=PNG_DPI, bbox_inches="tight")
        fig.savefig(paths[1], bbox_inches="tight")
        if logger is not None:
            from lightning.pytorch.loggers import TensorBoardLogger

            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(tag or stem, fig, global_step=step)
    finally:
        plt.close(fig)
    return paths
