"""Tiny randomly initialised Hugging Face models with the bundled tokenizer, saved as folders (offline, seconds)."""

from __future__ import annotations

from pathlib import Path

import torch


def bundled_tokenizer():
    """The bundled MiniLM's WordPiece tokenizer (the bert-base-uncased vocabulary)."""
    from transformers import AutoTokenizer

    from wslight.data.encoders import bundled_minilm_path

    return AutoTokenizer.from_pretrained(bundled_minilm_path())


def tiny_bert_classifier(folder: Path, num_labels: int = 2, seed: int = 0, bias: list[float] | None = None) -> Path:
    """A 2-layer BERT sequence classifier (hidden size 32) and the bundled tokenizer, written by save_pretrained.

    `bias`: the classification head's bias (to put reviews near the decision boundary, where words flip them).
    """
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = bundled_tokenizer()
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=num_labels,
    )
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(50.0)  # logits that vary from word to word by more than rounding
        if bias is not None:
            model.classifier.bias.copy_(torch.tensor(bias))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_causal_lm(folder: Path, seed: int = 0) -> Path:
    """A 2-layer Llama causal LM (hidden size 32) over the bundled tokenizer's vocabulary, saved by save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = bundled_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
