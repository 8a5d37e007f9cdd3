"""Attention maps of a BERT encoder: a one-word edit (Figure 1 left) and one token moved by Delta (Figure 3, panel 4).

Indexing: positions are indices in the tokenised sequence with [CLS] at 0 and [SEP] at n - 1; layers and heads are
0-based (the paper's "head 1, layer 1" is head=0, layer=0).
"""

from __future__ import annotations

from typing import Literal

import torch

from ..base import validate
from ..data.encoders import load_encoder
from ._common import check_heads, check_index, encoder_forward, max_positions, tokenise
from .delta import closed_form_delta, optimised_delta
from .layerwise import heads_label

DEFAULT_SENTENCES = ("I love her much", "I love her smile")
PAPER_TITLE = "Towards Understanding the Word Sensitivity of Attention Layers: A Study via Random Features"


def attention_edit(
    encoder: str = "bundled-minilm",
    sentence_a: str = DEFAULT_SENTENCES[0],
    sentence_b: str = DEFAULT_SENTENCES[1],
    layer: int = 0,
    head: int | None = None,
) -> dict:
    """Attention of one layer for two sentences that differ in one word, without [CLS] and [SEP] (Figure 1 left).

    Paper (authors' bert.ipynb, docs/theory/probes.md §7.1): `attentions[layer][0][:, 1:-1, 1:-1]` averaged over the
    heads; rows are not renormalised after the slice.

    Args:
        encoder: encoder name for `wslight.data.encoders.load_encoder`.
        sentence_a: the first sentence; the two must tokenise to the same number of tokens.
        sentence_b: the second sentence, one word changed.
        layer: attention layer, 0-based (0 = the first encoder layer, the paper's choice).
        head: one head (0-based) or None for the mean over all heads.

    Returns:
        dict with `tokens_a`, `tokens_b` (without [CLS]/[SEP]), `attn_a`, `attn_b`, `diff` (= attn_b - attn_a), each
        (n - 2, n - 2) with rows = queries and columns = keys, and `records` (one per (query, key) cell).
    """
    model, tokenizer, info = load_encoder(encoder)
    ta = tokenise(tokenizer, sentence_a, max_positions(model), key="sentence_a")
    tb = tokenise(tokenizer, sentence_b, max_positions(model), key="sentence_b")
    if ta.n != tb.n:
        raise ValueError(
            f"sentence_a and sentence_b must tokenise to the same number of tokens; got {ta.n} ({ta.tokens}) "
            f"and {tb.n} ({tb.tokens})"
        )
    if ta.n < 3:
        raise ValueError(f"the sentences must contain at least one token besides [CLS]/[SEP], got {ta.tokens}")
    check_index("layer", layer, info.num_layers, f"{info.num_layers} encoder layers")
    if head is not None:
        check_index("head", head, info.num_heads, f"{info.num_heads} attention heads")
    inputs = {k: torch.cat([ta.inputs[k], tb.inputs[k]]) for k in ta.inputs}  # (2, n)
    _, attn = encoder_forward(model, inputs, attentions=True)  # (L, 2, heads, n, n)
    A = attn[layer]  # (2, heads, n, n)
    A = A.mean(1) if head is None else A[:, head]  # (2, n, n)
    A = A[:, 1:-1, 1:-1]  # Paper: drop [CLS] and [SEP] rows and columns, no renormalisation
    toks_a, toks_b = ta.tokens[1:-1], tb.tokens[1:-1]
    out = {
        "encoder": encoder,
        "sentences": (sentence_a, sentence_b),
        "tokens_a": toks_a,
        "tokens_b": toks_b,
        "layer": layer,
        "head": head,
        "attn_a": A[0],
        "attn_b": A[1],
        "diff": A[1] - A[0],
    }
    out["records"] = _edit_records(out)
    return out


def _edit_records(res: dict) -> list[dict]:
    """One flat record per (query, key) cell of `attention_edit`'s result."""
    toks_a, toks_b, A_a, A_b, head = res["tokens_a"], res["tokens_b"], res["attn_a"], res["attn_b"], res["head"]
    return [
        {
            "experiment": "probe",
            "probe": "attention_edit",
            "encoder": res["encoder"],
            "layer": res["layer"],
            "head": "mean" if head is None else head,
            "query": q,
            "key": k,
            "query_token_a": toks_a[q],
            "key_token_a": toks_a[k],
            "query_token_b": toks_b[q],
            "key_token_b": toks_b[k],
            "attention_a": float(A_a[q, k]),
            "attention_b": float(A_b[q, k]),
            "diff": float(A_b[q, k] - A_a[q, k]),
        }
        for q in range(len(toks_a))
        for k in range(len(toks_a))
    ]


def attention_under_delta(
    encoder: str = "bundled-minilm",
    text: str = PAPER_TITLE,
    position: int = 6,
    layer: int = 0,
    head: int = 0,
    delta_heads: int | list[int] | Literal["shown", "all"] = "shown",
    method: Literal["optimised", "closed_form"] = "optimised",
    delta_norm: float | None = None,
    steps: int = 100,
    lr: float = 0.1,
) -> dict:
    """Attention matrix of one head before and after token `position` is moved by Delta (Figure 3, panel 4).

    Paper (figure caption, docs/theory/probes.md §7.3): head 1 of layer 1 of BERT-Base on the paper's title, token 6
    perturbed by the Delta that attracts all the attention. Working definition: position 6 is counted in the tokenised
    sequence with [CLS] at 0 (the word "of" in the title); Delta is added to hidden_states[0] and built from the first
    layer's query/key weights of `delta_heads` (default: the head shown), with norm ||x_position|| unless `delta_norm`
    is set.

    Args:
        encoder: encoder name for `wslight.data.encoders.load_encoder`.
        text: input text (default: the paper's title).
        position: perturbed token, index in the tokenised sequence ([CLS] at 0).
        layer: layer shown, 0-based (Delta is always injected before the first layer).
        head: head shown, 0-based.
        delta_heads: first-layer heads that Delta targets: "shown" (= [head]), "all", an int or a list.
        method: "optimised" (projected gradient ascent) or "closed_form" (docs/theory/probes.md §7.4).
        delta_norm: ||Delta||; None = ||x_position||.
        steps: steps of the projected gradient ascent.
        lr: step size of the projected gradient ascent.

    Returns:
        dict with `tokens` (all n, [CLS]/[SEP] included), `before`, `after` ((n, n), rows = queries, columns = keys),
        `column_mean_before`, `column_mean_after` ((n,): mean attention each key receives), `delta` (d,),
        `records` (one per (query, key) cell).
    """
    _check_delta_arguments(text, method, steps, delta_norm, lr)
    model, tokenizer, info = load_encoder(encoder)
    tk = tokenise(tokenizer, text, max_positions(model))
    check_index("position", position, tk.n, f"tokenised text of {tk.n} tokens, [CLS] at 0")
    check_index("layer", layer, info.num_layers, f"{info.num_layers} encoder layers")
    check_index("head", head, info.num_heads, f"{info.num_heads} attention heads")
    dheads = _targeted_heads(delta_heads, head, info.num_heads)

    hidden, attn = encoder_forward(model, tk.inputs, attentions=True)  # (L + 1, 1, n, d), (L, 1, heads, n, n)
    H0 = hidden[0, 0]  # (n, d)
    if method == "closed_form":
        delta = closed_form_delta(model, H0, position, dheads, delta_norm)
    else:
        delta, _ = optimised_delta(model, H0, position, dheads, delta_norm, steps=steps, lr=lr)
    P = torch.zeros(1, tk.n, H0.shape[1], dtype=H0.dtype)
    P[0, position] = delta  # (1, n, d)
    _, attn_p = encoder_forward(model, tk.inputs, P, attentions=True)
    before, after = attn[layer, 0, head], attn_p[layer, 0, head]  # (n, n)
    out = {
        "encoder": encoder,
        "text": text,
        "tokens": tk.tokens,
        "position": position,
        "token": tk.tokens[position],
        "layer": layer,
        "head": head,
        "delta_heads": dheads,
        "method": method,
        "delta": delta,
        "delta_norm": float(delta.norm()),
        "before": before,
        "after": after,
        "column_mean_before": before.mean(0),
        "column_mean_after": after.mean(0),
    }
    out["records"] = _under_delta_records(out, info.num_heads)
    return out


def _check_delta_arguments(text, method: str, steps: int, delta_norm: float | None, lr: float) -> None:
    """Raise ValueError for a bad argument of `attention_under_delta`, naming it (before the encoder is loaded)."""
    if method not in ("optimised", "closed_form"):
        raise ValueError(f"method must be one of ['optimised', 'closed_form'], got {method!r}")
    validate.integer("steps", steps, low=0)
    validate.number("delta_norm", delta_norm, low=0, strict=True, allow_none=True)
    validate.number("lr", lr, low=0, strict=True)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty string, got {text!r}")


def _targeted_heads(delta_heads, head: int, num_heads: int) -> list[int]:
    """The first-layer heads Delta targets: "shown" (= [head]), "all", or the checked int or list."""
    if delta_heads == "shown":
        return [head]
    if delta_heads == "all":
        return list(range(num_heads))
    return check_heads(delta_heads, num_heads, key="delta_heads")


def _under_delta_records(res: dict, num_heads: int) -> list[dict]:
    """One flat record per (query, key) cell of `attention_under_delta`'s result."""
    tokens, before, after = res["tokens"], res["before"], res["after"]
    common = {
        "experiment": "probe",
        "probe": "attention_under_delta",
        "encoder": res["encoder"],
        "layer": res["layer"],
        "head": res["head"],
        "position": res["position"],
        "token": res["token"],
        "delta_heads": heads_label(res["delta_heads"], num_heads),
        "method": res["method"],
        "delta_norm": res["delta_norm"],
    }
    return [
        common
        | {
            "query": q,
            "key": k,
            "query_token": tokens[q],
            "key_token": tokens[k],
            "attention_before": float(before[q, k]),
            "attention_after": float(after[q, k]),
        }
        for q in range(len(tokens))
        for k in range(len(tokens))
    ]
