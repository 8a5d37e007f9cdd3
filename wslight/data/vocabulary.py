"""An encoder's vocabulary as the maps read it.

Every word's layer-0 row at a position, and which words a tokenizer could put there (docs/theory/words.md §13).

Replacing the word at position i of a review changes only row i of hidden_states[0]: it becomes
h_w = LayerNorm(E_w + P_i + T) (word, position and token-type embeddings, then the embedding LayerNorm), which
`vocab_hidden0` computes for the whole vocabulary at once. `EncoderWords.rows` preprocesses those rows as every
sweep preprocesses a review (first d coordinates, norm sqrt(d)), so a substitution is exactly one single-token move.

A word is admissible at position i of a review when the edited review is one a tokenizer could have produced:
no special or `[unused]` token, not the original token, the original token's WordPiece continuation status (`##`)
kept (`allowed_tokens`), and the round trip holds: the edited word (its pieces from the word's first piece to its
last), detokenised and tokenised again, gives the edited ids (`EncoderWords.admissible`). The round trip fails,
for instance, for a token the tokenizer's normaliser rewrites (accents stripped) and for a piece that merges with
its neighbours into other pieces. BERT's pre-tokeniser splits on whitespace and punctuation, so the pieces of the
edited word are tokenised independently of the other words, and checking that word is checking the whole review.
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor

from .encoders import load_encoder
from .store import preprocess


@torch.no_grad()
def vocab_hidden0(model, position: int, token_type_id: int = 0) -> Tensor:
    """hidden_states[0] of every vocabulary token placed at `position`: (V, d) = LayerNorm(E + P_position + T)."""
    emb = model.embeddings
    V = emb.word_embeddings.num_embeddings
    ids = torch.arange(V)[:, None]  # (V, 1)
    return emb(
        input_ids=ids,
        token_type_ids=torch.full_like(ids, token_type_id),
        position_ids=torch.full_like(ids, position),
    )[:, 0]  # (V, 1, d) -> (V, d)


def _static_allowed(tokens: list[str], special: set[int], original_id: int) -> Tensor:
    cont = tokens[original_id].startswith("##")
    ok = [
        i != original_id
        and i not in special
        and not (t.startswith("[") and t.endswith("]"))
        and t.startswith("##") == cont
        for i, t in enumerate(tokens)
    ]
    return torch.tensor(ok)


def allowed_tokens(tokenizer, original_id: int) -> Tensor:
    """(V,) bool mask of the tokens that may replace `original_id`.

    Not it, no special or `[unused]` token, the same WordPiece continuation status (`##`). No round trip: see
    `EncoderWords.admissible`.
    """
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return _static_allowed(tokens, set(tokenizer.all_special_ids), original_id)


class EncoderWords:
    """The vocabulary of a BERT-family encoder: rows at a position, admissible words, their text.

    Args:
        encoder: 'bundled-minilm', a hub id or a local folder (`wslight.data.encoders.load_encoder`).
    """

    def __init__(self, encoder: str = "bundled-minilm") -> None:
        self.encoder = encoder
        self.model, self.tokenizer, self.info = load_encoder(encoder)
        self._rows: dict[tuple[int, int, bool], Tensor] = {}
        self._trips: dict[tuple[tuple[int, ...], tuple[int, ...]], Tensor] = {}

    @cached_property
    def tokens(self) -> list[str]:
        """The vocabulary's tokens, by id."""
        return self.tokenizer.convert_ids_to_tokens(list(range(self.size)))

    @property
    def size(self) -> int:
        """The number of tokens of the vocabulary."""
        return int(self.model.embeddings.word_embeddings.num_embeddings)

    def rows(self, position: int, d: int, normalize: bool = True) -> Tensor:
        """(V, d) float32: every word at `position` as a sweep reads a review (first d coordinates, norm sqrt(d)).

        With normalize False, the rows as the encoder gives them (a review read with `data.normalize: false`).
        """
        key = (position, d, normalize)
        if key not in self._rows:
            self._rows[key] = preprocess(vocab_hidden0(self.model, position)[:, None], 1, d, normalize)[:, 0]
        return self._rows[key]

    def word_span(self, ids: Tensor, position: int) -> tuple[int, int]:
        """[a, b): the pieces of the word that holds `position` (a: its first piece, b: one past its last).

        Raises:
            ValueError: `position` is not a word of the review ([CLS], [SEP], padding or past the end).
        """
        row = ids.tolist()
        special = set(self.tokenizer.all_special_ids)
        length = next((j for j, t in enumerate(row) if t == self.tokenizer.sep_token_id), len(row))
        if not 1 <= position < length or row[position] in special:
            raise ValueError(f"position: token {position} is not a word of this review (it has {length - 1} tokens)")
        a = position
        while a > 1 and self.tokens[row[a]].startswith("##"):
            a -= 1
        b = position + 1
        while b < length and self.tokens[row[b]].startswith("##"):
            b += 1
        return a, b

    def admissible(self, ids: Tensor, position: int) -> tuple[Tensor, int]:
        """The words that may stand at `position` of the review `ids` (`[CLS] ... [SEP] [PAD]...`).

        Returns:
            (V,) bool mask (the static rules of `allowed_tokens` and the round trip), and how many words passed the
            static rules but failed the round trip (left out).
        """
        original = int(ids[position])
        static = _static_allowed(self.tokens, set(self.tokenizer.all_special_ids), original)
        a, b = self.word_span(ids, position)
        pieces = ids[a:b].tolist()
        # the round trip of a word depends only on the other pieces of its word: reviews whose word at `position` has
        # the same neighbours share it (e.g. every one-piece first word)
        trip = self._round_trip(tuple(pieces[: position - a]), tuple(pieces[position - a + 1 :]))
        mask = static & trip
        return mask, int((static & ~trip).sum())

    def _round_trip(self, before: tuple[int, ...], after: tuple[int, ...]) -> Tensor:
        """(V,) bool: the words w whose pieces before + [w] + after decode to a text that tokenizes back to them.

        Computed for every word once per (before, after), cached.
        """
        key = (before, after)
        if key not in self._trips:
            edited = [[*before, w, *after] for w in range(self.size)]
            texts = self.tokenizer.batch_decode(edited)
            again = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
            self._trips[key] = torch.tensor([list(e) == list(r) for e, r in zip(edited, again, strict=True)])
        return self._trips[key]

    def text(self, word_id: int) -> str:
        """The token of `word_id` as the vocabulary writes it (`##` marks a continuation piece); '' for -1."""
        return self.tokens[word_id] if word_id >= 0 else ""
