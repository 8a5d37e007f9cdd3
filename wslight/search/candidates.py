"""The substitutes a one-word attack may try at a word: the field's threat models as candidate sets.

- `vocabulary`: every word of the vocabulary that is one token (`wslight.data.word_positions.word_vocabulary`); on
  a CPU screened: per position the `screen` words a first-order expansion of the margin ranks lowest are checked
  exactly, the others not (every flip found is real; the screen's recall is measured against the whole set).
- `neighbours`: the k words nearest to the original in the model's input-embedding space (cosine similarity; the
  word itself, special tokens and word pieces excluded), as TextAttack's embedding word-swap recipes restrict them.
- `file`: a user's JSON object mapping a word to its substitutes (e.g. a synonym list), looked up as written and
  lower-cased.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

CANDIDATE_SETS = ("neighbours", "vocabulary", "file")


class NeighbourIndex:
    """The k nearest vocabulary words of a token by cosine similarity of input embeddings.

    Args:
        embeddings: (V, H) the model's input embedding table.
        vocab_ids: (W,) the ids of the candidate words.
    """

    def __init__(self, embeddings: Tensor, vocab_ids: Tensor) -> None:
        table = embeddings.detach().float().cpu()
        self.table = table / table.norm(dim=1, keepdim=True).clamp_min(1e-12)  # (V, H) unit rows
        self.vocab_ids = vocab_ids

    def nearest(self, token_id: int, k: int) -> Tensor:
        """(k,) ids of the k words nearest to `token_id` (itself excluded), nearest first."""
        cos = self.table[self.vocab_ids] @ self.table[token_id]  # (W, H) @ (H,) -> (W,)
        cos = cos.masked_fill(self.vocab_ids == token_id, -torch.inf)
        top = cos.topk(min(k, len(cos) - 1)).indices
        return self.vocab_ids[top]


def read_substitutes(path: str | Path) -> dict[str, list[str]]:
    """A user's substitutes: a JSON object {word: [substitute, ...]}.

    Raises:
        ValueError: not a file, not JSON, or not an object of lists of strings; naming the key at fault.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"substitutes: {str(path)!r} is not a file (a JSON object {{word: [substitutes]}})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"substitutes: {path} is not JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(
            f"substitutes: {path} must hold a JSON object {{word: [substitutes]}}, got {type(data).__name__}"
        )
    for word, subs in data.items():
        if not isinstance(subs, list) or not all(isinstance(s, str) for s in subs):
            raise ValueError(f"substitutes: {path}: the value of {word!r} must be a list of strings, got {subs!r}")
    return data


def file_substitutes(table: dict[str, list[str]], word: str) -> list[str]:
    """The substitutes of `word` in a user's table (as written, else lower-cased), the word itself left out."""
    subs = table.get(word, table.get(word.lower(), []))
    return [s for s in dict.fromkeys(subs) if s != word and s.lower() != word.lower()]


def first_order_ranking(embeddings: Tensor, token_id: int, gradient: Tensor, vocab_ids: Tensor, k: int) -> Tensor:
    """(k,) the ids whose first-order change of the margin, (E_w - E_x) . grad, is lowest (most likely to flip).

    Args:
        embeddings: (V, H) input embedding table.
        token_id: the original token.
        gradient: (H,) the margin's gradient with respect to that position's input embedding.
        vocab_ids: (W,) candidate ids.
        k: how many to keep.
    """
    rows = embeddings[vocab_ids].to(gradient)  # (W, H)
    change = (rows - embeddings[token_id].to(gradient)) @ gradient  # (W, H) @ (H,) -> (W,)
    change = change.masked_fill(vocab_ids == token_id, torch.inf)
    return vocab_ids[change.topk(min(k, len(change) - 1), largest=False).indices]
