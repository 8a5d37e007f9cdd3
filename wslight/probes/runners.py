"""Runners: compute a probe, save its figure (PNG and PDF) in `out_dir`, return its flat records for results.jsonl."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from .attention import attention_edit, attention_under_delta
from .figures import figure_attention_edit, figure_attention_under_delta, figure_layerwise
from .layerwise import layerwise_change


def _save(fig, out_dir: str | Path, stem: str) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.{ext}" for ext in ("png", "pdf")]
    for p in paths:
        fig.savefig(p, dpi=150 if p.suffix == ".png" else None)
    plt.close(fig)
    return paths


def run_attention_edit(
    out_dir: str | Path, encoder: str = "bundled-minilm", vlim: tuple[float, float] | None = None, **kwargs
) -> list[dict]:
    """`attention_edit(encoder, **kwargs)`, figure saved as `attention_edit.{png,pdf}`; returns the records."""
    res = attention_edit(encoder, **kwargs)
    _save(figure_attention_edit(res, vlim=vlim), out_dir, "attention_edit")
    return res["records"]


def run_layerwise(out_dir: str | Path, encoder: str = "bundled-minilm", log: bool = True, **kwargs) -> list[dict]:
    """`layerwise_change(encoder, **kwargs)`, figure saved as `layerwise_change.{png,pdf}`; returns the records."""
    res = layerwise_change(encoder, **kwargs)
    _save(figure_layerwise(res, log=log), out_dir, "layerwise_change")
    return res["records"]


def run_attention_under_delta(out_dir: str | Path, encoder: str = "bundled-minilm", **kwargs) -> list[dict]:
    """`attention_under_delta(encoder, **kwargs)`, figure saved as `attention_under_delta.{png,pdf}`."""
    res = attention_under_delta(encoder, **kwargs)
    _save(figure_attention_under_delta(res), out_dir, "attention_under_delta")
    return res["records"]
