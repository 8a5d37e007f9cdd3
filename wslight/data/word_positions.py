"""Which words of a text one-word substitutions may replace, and with which words, for any fast tokenizer.

A position is a word of the text (the tokenizer's own word split: whitespace and punctuation for BERT's WordPiece)
that is exactly one token and all letters; the others are skipped and counted: pieces of a longer word (replacing
one piece is no word substitution), punctuation and numbers, and words cut off by `max_length`.

A candidate is a word of the vocabulary that is one token (`word_vocabulary`). It is checked at a position by the
definition itself (`retokenised`): the edited text, tokenised again, must give the review's ids with only that
position's id changed. So a flip found on the ids is a flip of the edited text, for BERT's tokenizer and for any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch
from torch import Tensor


@dataclass(frozen=True)
class WordPosition:
    """A word of a text that a substitution may replace.

    Attributes:
        token: its index among the input's tokens.
        start: its first character in the input string.
        end: one past its last character.
        word: the word as the text writes it.
    """

    token: int
    start: int
    end: int
    word: str


@dataclass
class TokenisedText:
    """An input string, its ids as the classifier reads them, and the words a substitution may replace.

    Attributes:
        text: the input string (a prompt classifier's prompt with the review inside).
        ids: (T,) int64 input ids.
        positions: the replaceable words, in text order.
        skipped: how many words were not positions, by reason ('pieces', 'not letters', 'cut off').
    """

    text: str
    ids: Tensor
    positions: list[WordPosition]
    skipped: dict[str, int] = field(default_factory=dict)


def tokenise(
    tokenizer, text: str, max_length: int | None, span: tuple[int, int] | None = None, add_special_tokens: bool = True
) -> TokenisedText:
    """The ids of `text` and its replaceable words (those inside `span`, the review within a prompt; None: all).

    Raises:
        ValueError: a tokenizer without offsets (a slow, Python tokenizer): the words cannot be located.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"model: its tokenizer {type(tokenizer).__name__} is not a fast tokenizer; word positions need the "
            "character offsets only a fast (Rust) tokenizer gives"
        )
    enc = tokenizer(
        text,
        truncation=max_length is not None,
        max_length=max_length,
        add_special_tokens=add_special_tokens,
        return_offsets_mapping=True,
    )
    full = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True, verbose=False)
    a, b = span if span is not None else (0, len(text))
    kept_words = _word_tokens(enc.word_ids(), enc["offset_mapping"], a, b)
    all_words = _word_tokens(full.word_ids(), full["offset_mapping"], a, b)
    positions: list[WordPosition] = []
    skipped = {"pieces": 0, "not letters": 0, "cut off": 0}
    for word, tokens in all_words.items():
        if word not in kept_words or len(kept_words[word]) != len(tokens):
            skipped["cut off"] += 1
            continue
        if len(tokens) != 1:
            skipped["pieces"] += 1
            continue
        t, s, e = tokens[0]
        if not text[s:e].isalpha():
            skipped["not letters"] += 1
            continue
        positions.append(WordPosition(t, s, e, text[s:e]))
    return TokenisedText(text, torch.tensor(enc["input_ids"], dtype=torch.int64), positions, skipped)


def _word_tokens(word_ids: list, offsets: list, a: int, b: int) -> dict[int, list[tuple[int, int, int]]]:
    """Per word (the tokenizer's word index) inside characters [a, b): its tokens as (index, start, end)."""
    words: dict[int, list[tuple[int, int, int]]] = {}
    for t, (w, (s, e)) in enumerate(zip(word_ids, offsets, strict=True)):
        if w is not None and e > s and a <= s and e <= b:
            words.setdefault(w, []).append((t, s, e))
    return words


def token_word(tokenizer, token_id: int) -> str:
    """The word a token stands for when it stands alone ('' for a piece that continues a word, `##ing`)."""
    token = tokenizer.convert_ids_to_tokens(token_id)
    if token.startswith("##"):
        return ""
    return tokenizer.decode([token_id]).strip()


@lru_cache(maxsize=4)
def _vocabulary(tokenizer) -> tuple[Tensor, tuple[str, ...]]:
    special = set(tokenizer.all_special_ids)
    pairs = [(i, token_word(tokenizer, i)) for i in range(len(tokenizer)) if i not in special]
    pairs = [(i, w) for i, w in pairs if w.isalpha()]
    alone = tokenizer([w for _, w in pairs], add_special_tokens=False)["input_ids"]  # one batched call
    kept = [(i, w) for (i, w), again in zip(pairs, alone, strict=True) if again == [i]]
    return torch.tensor([i for i, _ in kept], dtype=torch.int64), tuple(w for _, w in kept)


def word_vocabulary(tokenizer) -> tuple[Tensor, tuple[str, ...]]:
    """(W,) int64 ids and their words: every token that is a whole word of letters and tokenises alone back to itself.

    No special token, no continuation piece (`##ing`), no punctuation or number. Computed once per tokenizer.
    """
    return _vocabulary(tokenizer)


def retokenised(
    tokenizer,
    tokens: TokenisedText,
    position: WordPosition,
    words: list[str],
    max_length: int | None,
    add_special_tokens: bool = True,
    candidate_ids: Tensor | None = None,
) -> Tensor:
    """(K,) bool: which words, written into the text at `position`, give the text's ids with that one id changed.

    `candidate_ids` (K,): the id each word must become (None: its own single token, which must exist).
    """
    if not words:
        return torch.zeros(0, dtype=torch.bool)
    text = tokens.text
    edited = [text[: position.start] + w + text[position.end :] for w in words]
    again = tokenizer(
        edited, truncation=max_length is not None, max_length=max_length, add_special_tokens=add_special_tokens
    )["input_ids"]
    ids = tokens.ids.tolist()
    t = position.token
    ok = []
    for k, row in enumerate(again):
        want = None if candidate_ids is None else int(candidate_ids[k])
        good = len(row) == len(ids) and row[:t] == ids[:t] and row[t + 1 :] == ids[t + 1 :] and row[t] != ids[t]
        ok.append(good and (want is None or row[t] == want))
    return torch.tensor(ok, dtype=torch.bool)
