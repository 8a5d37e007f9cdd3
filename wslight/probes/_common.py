"""Shared helpers of the encoder probes: tokenising with checks, validating indices, the perturbed forward pass.

Indexing convention used by every probe: a position is an index into the tokenised sequence, with [CLS] at 0 and
[SEP] at n - 1 (so for the paper's title, position 6 is the word "of").
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources

import torch
from torch import nn

from ..base import validate

DEFAULT_TEXT_ASSET = "probe_text.txt"


def default_probe_text() -> str:
    """The bundled probe text (about 200 WordPiece tokens, `wslight/assets/probe_text.txt`)."""
    return resources.files("wslight").joinpath("assets", DEFAULT_TEXT_ASSET).read_text(encoding="utf-8").strip()


@dataclass(frozen=True)
class Tokenised:
    """A tokenised text: `input_ids` and `token_type_ids`/`attention_mask` of shape (1, n), and its tokens."""

    text: str
    inputs: dict
    tokens: list[str]

    @property
    def n(self) -> int:
        return len(self.tokens)


def tokenise(tokenizer, text: str, max_len: int | None = None, key: str = "text") -> Tokenised:
    """Tokenise one text (with [CLS]/[SEP]), raising ValueError for an empty or too long text."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{key} must be a non-empty string, got {text!r}")
    inputs = dict(tokenizer(text, return_tensors="pt"))
    ids = inputs["input_ids"][0]
    if max_len is not None and ids.numel() > max_len:
        raise ValueError(f"{key} tokenises to {ids.numel()} tokens; the encoder accepts 1..{max_len}")
    return Tokenised(text, inputs, tokenizer.convert_ids_to_tokens(ids.tolist()))


def check_index(key: str, value: int, size: int, what: str) -> int:
    """`validate.integer(key, value, 0, size - 1)`, the message also saying what the range counts (`what`)."""
    try:
        return validate.integer(key, value, low=0, high=size - 1)
    except ValueError as e:
        raise ValueError(f"{e} ({what})") from None


def check_heads(heads, num_heads: int, key: str = "heads") -> list[int]:
    """Normalise `heads` (None = all, an int, or a sequence of ints) to a sorted list of valid head indices."""
    if heads is None:
        return list(range(num_heads))
    if isinstance(heads, int):
        heads = [heads]
    heads = list(heads)
    if not heads:
        raise ValueError(f"{key} must name at least one head in [0, {num_heads - 1}], got []")
    for h in heads:
        check_index(key, h, num_heads, f"{num_heads} attention heads")
    return sorted(set(heads))


def max_positions(model) -> int:
    return int(getattr(model.config, "max_position_embeddings", 512))


def first_self_attention(model) -> nn.Module:
    """The first encoder layer's self-attention module (BERT family: `encoder.layer[0].attention.self`)."""
    try:
        sa = model.encoder.layer[0].attention.self
        sa.query, sa.key  # noqa: B018
    except AttributeError as e:
        raise ValueError(
            f"the probes need a BERT-family encoder (encoder.layer[0].attention.self.query/key), "
            f"got {type(model).__name__}"
        ) from e
    return sa


def embeddings_module(model) -> nn.Module:
    if not hasattr(model, "embeddings"):
        raise ValueError(f"the probes need an encoder with an `embeddings` module, got {type(model).__name__}")
    return model.embeddings


@contextmanager
def perturbed_embeddings(model, perturbation: torch.Tensor | None):
    """Add `perturbation` (B, n, d) to the output of the embedding layer, i.e. to hidden_states[0], inside the block.

    BERT is post-LN, so hidden_states[0] (after the embedding LayerNorm) feeds the first attention layer directly:
    layer 0 of the hidden states shows the injected change itself.
    """
    if perturbation is None:
        yield
        return
    handle = embeddings_module(model).register_forward_hook(lambda _m, _inp, out: out + perturbation.to(out.dtype))
    try:
        yield
    finally:
        handle.remove()


def batch_inputs(inputs: dict, batch: int) -> dict:
    """Repeat (1, n) tokenizer outputs to (batch, n)."""
    return {k: v.expand(batch, -1).contiguous() for k, v in inputs.items()}


@torch.no_grad()
def encoder_forward(model, inputs: dict, perturbation: torch.Tensor | None = None, attentions: bool = False):
    """Run the encoder on `inputs` (B, n) with an optional hidden_states[0] perturbation (B, n, d).

    Returns:
        (hidden, attn): hidden (L + 1, B, n, d) stacked hidden states; attn (L, B, heads, n, n) or None.
    """
    with perturbed_embeddings(model, perturbation):
        out = model(**inputs, output_hidden_states=True, output_attentions=attentions)
    hidden = torch.stack(out.hidden_states)  # (L + 1, B, n, d)
    attn = torch.stack(out.attentions) if attentions else None  # (L, B, heads, n, n)
    return hidden, attn


def relative_change(hidden: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """||H_l(X') - H_l(X)||_F / ||H_l(X)||_F per layer and batch element.

    Args:
        hidden: (L + 1, B, n, d) perturbed hidden states.
        clean: (L + 1, 1, n, d) or (L + 1, n, d) clean hidden states.

    Returns:
        (L + 1, B).
    """
    if clean.dim() == 3:
        clean = clean.unsqueeze(1)
    num = (hidden - clean).flatten(2).norm(dim=-1)  # (L + 1, B)
    den = clean.flatten(2).norm(dim=-1)  # (L + 1, 1)
    return num / den
