"""The encoder's vocabulary as the maps read it (wslight.data.vocabulary, docs/theory/words.md §13).

The rows of a review's own tokens are its stored rows, and the admissible words are exactly those whose edited review
survives the tokenizer's round trip.
"""

import pytest
import torch

from wslight.data import EmbeddingSpec, load_token_embeddings
from wslight.data.vocabulary import EncoderWords, allowed_tokens


@pytest.fixture(scope="module")
def words():
    return EncoderWords("bundled-minilm")


@pytest.fixture(scope="module")
def reviews():
    return load_token_embeddings(EmbeddingSpec(num_samples=40))


@pytest.mark.parametrize("d", [96, 384])
def test_rows_of_a_reviews_tokens_are_its_stored_rows(words, reviews, d):
    X, _ = reviews.samples([0, 1, 2], 12, d)
    ids = reviews.input_ids([0, 1, 2])
    for position in (1, 5, 11):
        rows = words.rows(position, d)
        assert rows.shape == (words.size, d)
        torch.testing.assert_close(rows.norm(dim=-1), torch.full((words.size,), d**0.5), rtol=1e-5, atol=0)
        # the cache stores float16: the rows agree to its precision, and no other word comes close
        gap = (rows[ids[:, position]] - X[:, position]).norm(dim=-1) / d**0.5
        assert float(gap.max()) < 2e-3
    # unrescaled, as a run with data.normalize false reads its reviews: the encoder's own rows (norms far from sqrt d)
    X, _ = reviews.samples([0, 1, 2], 12, d, normalize=False)
    for position in (1, 5):
        raw = words.rows(position, d, normalize=False)
        gap = (raw[ids[:, position]] - X[:, position]).norm(dim=-1) / X[:, position].norm(dim=-1)
        assert float(gap.max()) < 2e-3 and float(raw.norm(dim=-1).max()) < 0.9 * d**0.5


def test_round_trip_keeps_exactly_the_words_the_tokenizer_gives_back(words, reviews):
    ids = reviews.input_ids([0])[0]
    tok = words.tokenizer
    position = next(i for i in range(2, 60) if words.tokens[int(ids[i])].startswith("##"))
    mask, rejected = words.admissible(ids, position)
    static = allowed_tokens(tok, int(ids[position]))
    assert bool((mask <= static).all()) and rejected == int(static.sum() - mask.sum()) and rejected > 0
    a, b = words.word_span(ids, position)
    pieces = ids[a:b].tolist()
    g = torch.Generator().manual_seed(0)
    for w in static.nonzero()[:, 0][torch.randperm(int(static.sum()), generator=g)[:200]].tolist():
        edited = ids.clone()
        edited[position] = w
        length = int((ids != tok.pad_token_id).sum())
        again = tok(tok.decode(edited[1 : length - 1]), add_special_tokens=True)["input_ids"]
        assert bool(mask[w]) == (again == edited[:length].tolist()), (words.tokens[w], pieces)


def test_positions_that_are_not_words_are_refused(words, reviews):
    ids = reviews.input_ids([0])[0]
    length = int((ids != words.tokenizer.pad_token_id).sum())
    for position in (0, length - 1, length + 3):
        with pytest.raises(ValueError, match="position"):
            words.admissible(ids, position)


def test_round_trips_are_shared_by_words_with_the_same_neighbours(words):
    """The round trip of a word depends only on the other pieces of its word.

    Two reviews whose first word is one piece share it (one tokenizer pass), and each review's mask is still its own
    (its original word left out).
    """
    fresh = EncoderWords("bundled-minilm")
    first = torch.tensor(fresh.tokenizer("great movie")["input_ids"])
    second = torch.tensor(fresh.tokenizer("awful movie")["input_ids"])
    mask_1, rejected_1 = fresh.admissible(first, 1)
    mask_2, rejected_2 = fresh.admissible(second, 1)
    assert len(fresh._trips) == 1  # one pass for both
    assert not mask_1[first[1]] and mask_1[second[1]] and mask_2[first[1]] and not mask_2[second[1]]
    differ = (mask_1 ^ mask_2).nonzero()[:, 0].tolist()  # only the two original words
    assert sorted(differ) == sorted([int(first[1]), int(second[1])]) and rejected_1 == rejected_2
    # the shared pass keeps exactly the words whose one-word text tokenizes back to them
    some = (
        mask_1.nonzero()[:200:20, 0].tolist()
        + (allowed_tokens(fresh.tokenizer, int(first[1])) & ~mask_1).nonzero()[:5, 0].tolist()
    )
    for w in some:
        back = fresh.tokenizer(fresh.tokenizer.decode([w]), add_special_tokens=False)["input_ids"]
        assert (back == [w]) == bool(mask_1[w]), fresh.tokens[w]
