"""The encoder probes as evaluations for `evaluate.py`.

One trial each, records to results.jsonl, a summary.md table, figures saved.

The maths of the probes and their figures live in `wslight.probes`, their tables in `wslight.records.summary`; these
classes only run them as evaluations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from ..base.paths import user_path
from ..probes import (
    DEFAULT_POSITION,
    DEFAULT_SENTENCES,
    PAPER_TITLE,
    attention_edit,
    attention_under_delta,
    figure_attention_edit,
    figure_attention_under_delta,
    figure_layerwise,
    layerwise_change,
)
from ..records.summary import attention_edit_table, attention_under_delta_table, layerwise_table, write_summary
from .evaluation import Evaluation


class _Probe(Evaluation):
    """A probe is one trial: compute, keep the figure for the summary, return the records (each with a record_key).

    The summary writes the probe's table (`table`) to summary.md and its figure.
    """

    name = "probe"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(trials_per_step=1, output_dir=kwargs.pop("output_dir", None))
        self.kwargs = kwargs
        self._figure = None

    def trial_specs(self) -> list[dict]:
        return [{"trial_key": self.name}]

    def compute(self) -> tuple[dict, Any]:
        """(result dict with `records`, its figure)."""
        raise NotImplementedError

    def run_trials(self, specs: list[dict]) -> list[dict]:
        result, self._figure = self.compute()
        return [
            {**r, "trial_key": self.name, "record_key": f"{self.name}/{i}", "probe": r.get("probe", self.name)}
            for i, r in enumerate(result["records"])
        ]

    def table(self, records: list[dict]) -> tuple[str, list[dict]]:
        """(caption, rows) of summary.md from the probe's records (`wslight.records.summary`)."""
        raise NotImplementedError

    def summarize(self, records: list[dict], out_dir: Path) -> None:
        if self.trainer.is_global_zero and records:
            caption, rows = self.table(records)
            write_summary(out_dir, rows, caption)
        if self._figure is not None:
            self.add_figure(f"probes/{self.name}", self._figure, self.name)
            self._figure = None


class AttentionEditProbe(_Probe):
    """Attention of two sentences that differ in one word, without [CLS] and [SEP].

    Figure 1 left, docs/theory/probes.md §7.1.

    Args:
        encoder: 'bundled-minilm' (offline), 'bert-base-uncased' (the paper) or a local folder.
        sentence_a: the first sentence.
        sentence_b: the second; it must tokenise to as many tokens as the first.
        layer: attention layer, 0-based (0 = the first, the paper's).
        head: one head (0-based) or None for the mean over heads (the paper's).
        vmin: lower colour limit (the authors: 0.10); None: shared limits from the data.
        vmax: upper colour limit (the authors: 0.25).
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    name = "attention_edit"

    def __init__(
        self,
        encoder: str = "bundled-minilm",
        sentence_a: str = DEFAULT_SENTENCES[0],
        sentence_b: str = DEFAULT_SENTENCES[1],
        layer: int = 0,
        head: int | None = None,
        vmin: float | None = None,
        vmax: float | None = None,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(
            encoder=encoder, sentence_a=sentence_a, sentence_b=sentence_b, layer=layer, head=head, output_dir=output_dir
        )
        self.vlim = None if vmin is None or vmax is None else (vmin, vmax)

    def compute(self):
        """The attention-edit result and its figure."""
        res = attention_edit(**self.kwargs)
        return res, figure_attention_edit(res, vlim=self.vlim)

    def table(self, records: list[dict]) -> tuple[str, list[dict]]:
        """(caption, rows) of the attention-edit table."""
        return attention_edit_table(records)


class LayerwiseChangeProbe(_Probe):
    """Relative change of every layer when one token moves by the attention-attracting Delta.

    Against Gaussian noise of the same norm and the best real replacement word (Figure 3, panel 3,
    docs/theory/probes.md §7.2 and §7.4).

    Args:
        encoder: 'bundled-minilm' (offline), 'bert-base-uncased' (the paper) or a local folder.
        text: the input text; None: `text_file` if given, else the bundled ~200-token text.
        text_file: a file to read the text from (e.g. the paper's abstract, to match the figure).
        position: perturbed token in the tokenised sequence ([CLS] at 0); the paper: 42.
        heads: first-layer heads Delta targets: None = all (summed), or a list.
        delta_norm: ||Delta|| and the Gaussian norm; None = the norm of the clean token (sqrt(d) under the assumption).
        n_draws: Gaussian draws (mean and 1 sd).
        seed: seed of the Gaussian draws.
        steps: projected gradient-ascent steps of the optimised Delta.
        lr: their step size.
        replacement_k: candidate words per pool for the nearest real edit.
        log_scale: log y axis in the figure.
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    name = "layerwise_change"

    def __init__(
        self,
        encoder: str = "bundled-minilm",
        text: str | None = None,
        text_file: str | None = None,
        position: int = DEFAULT_POSITION,
        heads: list[int] | None = None,
        delta_norm: float | None = None,
        n_draws: int = 10,
        seed: int = 0,
        steps: int = 100,
        lr: float = 0.1,
        replacement_k: int = 8,
        log_scale: bool = True,
        output_dir: str | None = None,
    ) -> None:
        if text is None and text_file is not None:
            path = Path(user_path(text_file))
            if not path.is_file():
                raise ValueError(f"text_file: no such file {text_file!r}")
            text = path.read_text(encoding="utf-8")
        super().__init__(
            encoder=encoder,
            text=text,
            position=position,
            heads=heads,
            delta_norm=delta_norm,
            n_draws=n_draws,
            seed=seed,
            steps=steps,
            lr=lr,
            replacement_k=replacement_k,
            output_dir=output_dir,
        )
        self.log_scale = log_scale

    def compute(self):
        """The layer-wise change result and its figure."""
        res = layerwise_change(**self.kwargs)
        return res, figure_layerwise(res, log=self.log_scale)

    def table(self, records: list[dict]) -> tuple[str, list[dict]]:
        """(caption, rows) of the layer-wise change table."""
        return layerwise_table(records)


class AttentionUnderDeltaProbe(_Probe):
    """Attention of one head before and after one token moves by the attention-attracting Delta (Figure 3, panel 4).

    Args:
        encoder: 'bundled-minilm' (offline), 'bert-base-uncased' (the paper) or a local folder.
        text: the input text (default: the paper's title).
        position: perturbed token in the tokenised sequence ([CLS] at 0); the paper: 6.
        layer: layer shown, 0-based (the paper: the first).
        head: head shown, 0-based (the paper: the first).
        delta_heads: heads Delta targets: "shown", "all" or a list.
        method: "optimised" (projected gradient ascent on the attention mass) or "closed_form"
            (docs/theory/probes.md §7.4).
        delta_norm: ||Delta||; None = the norm of the clean token.
        steps: ascent steps of the optimised Delta.
        lr: their step size.
        output_dir: where results.jsonl and figures go (None: the logger's directory).
    """

    name = "attention_under_delta"

    def __init__(
        self,
        encoder: str = "bundled-minilm",
        text: str = PAPER_TITLE,
        position: int = 6,
        layer: int = 0,
        head: int = 0,
        delta_heads: Literal["shown", "all"] | list[int] = "shown",
        method: Literal["optimised", "closed_form"] = "optimised",
        delta_norm: float | None = None,
        steps: int = 100,
        lr: float = 0.1,
        output_dir: str | None = None,
    ) -> None:
        super().__init__(
            encoder=encoder,
            text=text,
            position=position,
            layer=layer,
            head=head,
            delta_heads=delta_heads,
            method=method,
            delta_norm=delta_norm,
            steps=steps,
            lr=lr,
            output_dir=output_dir,
        )

    def compute(self):
        """The attention-under-Delta result and its figure."""
        res = attention_under_delta(**self.kwargs)
        return res, figure_attention_under_delta(res)

    def table(self, records: list[dict]) -> tuple[str, list[dict]]:
        """(caption, rows) of the attention-under-Delta table."""
        return attention_under_delta_table(records)
