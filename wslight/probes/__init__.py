"""Probes of a real pre-trained encoder (BERT family).

Attention of a one-word edit, layer-wise relative change under an attention-attracting Delta, attention under Delta, and
the real one-word edits nearest to Delta.

Pure functions return tensors, dicts and flat JSON-serialisable `records`; figure functions return matplotlib Figures
(saved by `wslight.tasks.save_figure`); `wslight.tasks` runs the probes as evaluations. Positions index
the tokenised sequence with [CLS] at 0; layers and heads are 0-based.
"""

from ._common import default_probe_text, relative_change
from .attention import DEFAULT_SENTENCES, PAPER_TITLE, attention_edit, attention_under_delta
from .delta import attention_mass, closed_form_delta, first_layer_attention, optimised_delta
from .figures import figure_attention_edit, figure_attention_under_delta, figure_layerwise
from .layerwise import DEFAULT_POSITION, layerwise_change
from .replacement import replacement_candidates, vocab_attention_mass, vocab_hidden0

__all__ = [
    "DEFAULT_POSITION",
    "DEFAULT_SENTENCES",
    "PAPER_TITLE",
    "attention_edit",
    "attention_mass",
    "attention_under_delta",
    "closed_form_delta",
    "default_probe_text",
    "figure_attention_edit",
    "figure_attention_under_delta",
    "figure_layerwise",
    "first_layer_attention",
    "layerwise_change",
    "optimised_delta",
    "relative_change",
    "replacement_candidates",
    "vocab_attention_mass",
    "vocab_hidden0",
]
