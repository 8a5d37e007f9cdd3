"""The words of one review that flip a trained head: one record per word position (docs/theory/words.md §13.4).

What `TrainedHeadWords` (a finished train.py run) and the `HeadWordFlips` callback (the model in memory) both record:
the exact one-word substitution (`wslight.search.word_substitution`) against the head theta and its bias, over the
admissible vocabulary or a first-order screen of it (`wslight.search.screening`).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import torch

from ..features import map_name
from ..records.summary import nonfinite
from ..search.screening import SCREEN_CENTROIDS, screened_words
from ..search.substitution import SubstitutionResult, word_substitution
from .classifier import FeatureMapClassifier


def word_positions(words: Any, ids: torch.Tensor, n: int, positions: Literal["all"] | list[int]) -> list[int]:
    """The positions of `ids` (one review's token ids) that are words within its first n tokens and asked for."""
    sep = words.tokenizer.sep_token_id
    length = int((ids == sep).nonzero()[0, 0]) if (ids == sep).any() else ids.shape[0]
    special = set(words.tokenizer.all_special_ids)
    wanted = range(1, n) if positions == "all" else dict.fromkeys(positions)  # a repeated position once
    return [i for i in wanted if 1 <= i < min(length, n) and int(ids[i]) not in special]


def review_word_records(
    model: FeatureMapClassifier,
    store: Any,
    words: Any,
    index: int,
    n: int,
    d: int,
    positions: Literal["all"] | list[int],
    chunk_elements: int,
    device: torch.device,
    normalize: bool = True,
    screen: int | None = None,
    check_exact: bool = False,
    screen_centroids: int = SCREEN_CENTROIDS,
) -> list[dict]:
    """One record per word position of review `index`: the admissible words that flip the trained head there.

    A record: the review's fields (map, d, n, sample_id, position, token, the label y, the clean output f(X) and margin
    y f(X) as the model computes them, `correct`), the words at that position (`position_words`: the words that flip
    the sign of f(X) = phi(X)^T theta + b, S_words...), `nonfinite` and `seconds` (the review's time per position).

    Args:
        model: the trained classifier (its map, theta and bias).
        store: the embedding store (`TokenEmbeddings`) of the run's reviews.
        words: the encoder's vocabulary (`EncoderWords`).
        index: the review's position in the store.
        n: the run's tokens per sample.
        d: the run's embedding coordinates.
        positions: "all" or the token indices asked for (the review's words among them).
        chunk_elements: working elements one chunk of words may hold.
        device: where the map computes.
        normalize: the rows as the run read them: rescaled to norm sqrt(d) (the default) or as the encoder gives them.
        screen: check only this many words per position, the first of a first-order ranking; None: all of them.
        check_exact: with `screen`, also check the whole admissible vocabulary (the recall of the screen).
        screen_centroids: the screen's expansion points besides the clean review (`screened_words`).
    """
    start = time.perf_counter()
    X, y = store.samples([index], n, d, normalize)  # (1, n, d), (1,)
    X, label = X.to(device), float(y[0])
    ids = store.input_ids([index])[0]
    model.to(device)
    theta = model.theta.detach().double()[:, None]  # (p, 1)
    bias = torch.tensor([0.0 if model.bias is None else float(model.bias.detach())], dtype=torch.float64)
    with torch.no_grad():
        output = float(model(X))  # the prediction as the trained model makes it
    records = []
    for i in word_positions(words, ids, n, positions):
        record = {
            "experiment": "head_words",
            "map": map_name(model.feature_map),
            "d": d,
            "n": n,
            "sample_id": int(store.sample_ids[index]),
            "position": i,
            "token": words.text(int(ids[i])),
            "y": label,
            "output": output,
            "margin": label * output,
            "correct": (output > 0) == (label > 0),
            **position_words(
                model,
                X,
                ids,
                i,
                words,
                theta,
                bias,
                d,
                normalize,
                chunk_elements,
                screen,
                check_exact,
                screen_centroids,
            ),
        }
        record["nonfinite"] = nonfinite(record)
        records.append(record)
    seconds = (time.perf_counter() - start) / max(1, len(records))
    return [r | {"seconds": seconds} for r in records]


def position_words(
    model: FeatureMapClassifier,
    X: torch.Tensor,
    ids: torch.Tensor,
    i: int,
    words: Any,
    theta: torch.Tensor,
    bias: torch.Tensor,
    d: int,
    normalize: bool,
    chunk_elements: int,
    screen: int | None,
    check_exact: bool,
    screen_centroids: int,
) -> dict:
    """The words at token i of review X (1, n, d) (token ids `ids`) that flip the head theta (p, 1) with bias (1,).

    Exact over the admissible vocabulary (`word_substitution`, float64): how many words flip the sign of f(X) =
    phi(X)^T theta + b (`flips`, `flipped`), the strongest flipping word and the output the model gives with it
    (`flip_word`, `flip_output`), S_words and its best word (`ws_words`, `word`, `distance`). With `screen`, only the
    `screen` words a first-order score ranks first are checked, each exactly (`wslight.search.screening`): every flip
    is real, `flips` and `ws_words` count the checked words only (lower bounds, exact where `checked` equals
    `admissible`: a screen at least as wide as the admissible vocabulary), and with `check_exact` the whole admissible
    vocabulary is checked too (`exact_flips`, `exact_flipped`, `exact_ws_words`: the screen's recall).

    `admissible` is the number of admissible words at the position and `checked` the number checked exactly: the same
    without `screen`, min(screen, admissible) with it. (Before `checked` was written by every run, a screened record's
    `admissible` held the checked count.) The arguments are those of `review_word_records`.
    """
    allowed, rejected = words.admissible(ids, i)
    rows = words.rows(i, d, normalize)

    def substitute(mask: torch.Tensor) -> SubstitutionResult:
        return word_substitution(
            model.feature_map, X, [i], rows, mask[None, None], heads=theta, bias=bias, chunk_elements=chunk_elements
        )

    checked = allowed
    if screen is not None:
        checked = screened_words(
            model.feature_map, X, i, rows, allowed, theta[:, 0], float(bias[0]), screen, screen_centroids
        )
    sub = substitute(checked)
    flip_id = int(sub.flip_word[0, 0, 0])  # type: ignore[index]
    fields = {
        "ws_words": float(sub.ws[0, 0]),
        "word": words.text(int(sub.word[0, 0])),
        "distance": float(sub.distance[0, 0]),
        "admissible": int(allowed.sum()),  # the admissible words, whether or not a screen checked them all
        "checked": int(sub.admissible[0, 0]),  # the words checked exactly (with `screen`: min(screen, admissible))
        "round_trip_rejected": rejected,
        "flips": int(sub.flips[0, 0, 0]),  # type: ignore[index]
        "flipped": flip_id >= 0,
        "flip_word": words.text(flip_id) if flip_id >= 0 else None,
        "flip_output": _output_with(model, X, i, rows[flip_id]) if flip_id >= 0 else None,
        "phi_norm": float(sub.phi_norm[0]),
    }
    if screen is not None:
        fields |= {"screen": screen, "screen_centroids": screen_centroids}
        if check_exact:
            full = substitute(allowed)
            fields |= {
                "exact_flips": int(full.flips[0, 0, 0]),  # type: ignore[index]
                "exact_flipped": int(full.flip_word[0, 0, 0]) >= 0,  # type: ignore[index]
                "exact_ws_words": float(full.ws[0, 0]),
            }
    return fields


def _output_with(model: FeatureMapClassifier, X: torch.Tensor, position: int, row: torch.Tensor) -> float:
    """The model's output with `row` at `position` (one forward through the trained model)."""
    Xw = X.clone()
    Xw[0, position] = row.to(Xw)
    with torch.no_grad():
        return float(model(Xw))
