"""The pre-trained encoder map (`pretrained_encoder`) in the searches: exact words and the continuous S.

`word_substitution` through its layers equals a loop through its forward one word at a time (per token and pooled, a
linear head with a bias), and `word_sensitivity` on its generic path returns a value its own forward reproduces, above
random moves of the radius and below the cap its last LayerNorm puts on every output.
"""

import math

import pytest
import torch

from wslight.features import make_map
from wslight.search import word_sensitivity
from wslight.search.substitution import word_substitution

pytestmark = pytest.mark.usefixtures("one_thread")

N, D, POSITION, WORDS = 16, 384, 2, 300


@pytest.fixture(scope="module")
def review_words():
    """Two bundled reviews at n = N (rows as a sweep gives them), 300 vocabulary rows at POSITION and their mask.

    The 300 words: each review's own word at POSITION (admissible in the other review only) and 298 drawn among the
    words admissible in either; `allowed` (2, 1, 300) is each review's own admissible set.
    """
    from wslight.data import EmbeddingSpec, load_token_embeddings
    from wslight.data.vocabulary import EncoderWords

    words = EncoderWords("bundled-minilm")
    reviews = load_token_embeddings(EmbeddingSpec(num_samples=40))
    index = [3, 8]
    ids = reviews.input_ids(index)
    masks = torch.stack([words.admissible(ids[b], POSITION)[0] for b in range(2)])  # (2, V)
    own = ids[:, POSITION]  # 'movie' and 'has'
    either = (masks[0] | masks[1]).nonzero()[:, 0]
    either = either[(either != own[0]) & (either != own[1])]
    drawn = either[torch.randperm(len(either), generator=torch.Generator().manual_seed(0))[: WORDS - 2]]
    subset = torch.cat([own, drawn])
    X, _ = reviews.samples(index, N, D, dtype=torch.float64)
    allowed = masks[:, subset][:, None]  # (2, 1, 300)
    assert not allowed[0, 0, 0] and allowed[1, 0, 0] and allowed[0, 0, 1] and not allowed[1, 0, 1]
    return X, words.rows(POSITION, D)[subset].double(), allowed


def brute_force(fmap, X, rows, allowed, theta, bias):
    """One word at a time through the map's forward: the relative changes and every head's flips, (B, V), (B, V, C)."""
    B, V = X.shape[0], rows.shape[0]
    rel = torch.full((B, V), -math.inf, dtype=torch.float64)
    out = torch.zeros(B, V, theta.shape[1], dtype=torch.float64)
    with torch.no_grad():
        phi0 = fmap(X)
        for b in range(B):
            for w in range(V):
                Xp = X[b : b + 1].clone()
                Xp[0, POSITION] = rows[w]
                phi = fmap(Xp)[0]
                out[b, w] = phi @ theta + bias
                if allowed[b, 0, w]:
                    rel[b, w] = float((phi - phi0[b]).norm() / phi0[b].norm())
    sign0 = torch.sign(phi0 @ theta + bias)  # (B, C)
    flipped = (torch.sign(out) != sign0[:, None]) & allowed[:, 0, :, None]  # (B, V, C)
    return rel, out, sign0, flipped


@pytest.mark.parametrize(("pooling", "layers"), [("tokens", 2), ("mean", 2), ("sentence", 1)])
def test_substitution_through_the_encoder_equals_a_loop_through_its_forward(review_words, pooling, layers):
    """300 real words, 2 reviews, float64, a linear head with a bias: the same S_words, best word and flipping words.

    The bias puts head 0's clean output just above zero on the first review, so some words flip it and others do not.
    """
    X, rows, allowed = review_words
    fmap = make_map("pretrained_encoder", N, D, dtype="float64", layers=layers, pooling=pooling)
    with torch.no_grad():
        phi0 = fmap(X)
    theta = torch.randn(phi0.shape[1], 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    bias = torch.stack([-(phi0[0] @ theta[:, 0]) + 1e-3 * phi0[0].norm(), torch.tensor(0.1, dtype=torch.float64)])
    res = word_substitution(fmap, X, [POSITION], rows, allowed, heads=theta, bias=bias, chunk_elements=2**22)
    rel, out, sign0, flipped = brute_force(fmap, X, rows, allowed, theta, bias)
    best, word = rel.max(dim=1)
    torch.testing.assert_close(res.ws[:, 0], best, rtol=1e-6, atol=1e-9)
    assert torch.equal(res.word[:, 0], word)
    moved = rows[word] - X[:, POSITION]
    torch.testing.assert_close(res.distance[:, 0], moved.norm(dim=-1) / D**0.5, rtol=1e-9, atol=1e-12)
    assert torch.equal(res.flips[:, 0], flipped.sum(dim=1))
    opposite = torch.where(flipped, -out * sign0[:, None], -math.inf)  # (B, V, C)
    want = torch.where(flipped.any(dim=1), opposite.argmax(dim=1), -1)
    assert torch.equal(res.flip_word[:, 0], want)
    assert torch.equal(res.admissible[:, 0], allowed[:, 0].sum(-1))
    assert 0 < int(res.flips[0, 0, 0]) < int(allowed[0].sum())  # the check can tell words that flip from others


def layer_norm_cap(fmap):
    """The largest norm an output row of the last LayerNorm can have: max |gamma| sqrt(d) + ||beta||."""
    gamma, beta = fmap.ffn_ln_weight[-1], fmap.ffn_ln_bias[-1]
    return float(gamma.abs().max() * fmap.d**0.5 + beta.norm())


@pytest.mark.parametrize("layers", [1, 2])
def test_word_sensitivity_on_the_generic_path_bounds_random_moves(rows, layers):
    """S of the encoder map (n = 8, per token): the forward at its Delta gives it, inside the ball.

    And it is >= the change of random moves of the radius, and <= 1 + max ||phi(X')|| / ||phi(X)||, with every
    output row capped by the last LayerNorm.
    """
    n, position = 8, 1
    X = rows(1, n, D, seed=5, dtype=torch.float64)
    fmap = make_map("pretrained_encoder", n, D, dtype="float64", layers=layers)
    search = {"chains_per_round": 4, "max_chains": 4, "max_steps": 20, "window": 5}  # short: a property of any search
    f32 = make_map("pretrained_encoder", n, D, layers=layers)  # searched in float32, S recomputed in float64
    res = word_sensitivity(f32, X.float(), positions=[position], **search)
    ws, delta = float(res.ws[0]), res.delta[0]
    assert float(delta.norm()) <= D**0.5 * (1 + 1e-9) and int(res.position[0]) == position
    with torch.no_grad():
        phi0 = fmap(X)[0]
        moved = X.clone()
        moved[0, position] += delta
        assert float((fmap(moved)[0] - phi0).norm() / phi0.norm()) == pytest.approx(ws, rel=1e-6)
        g = torch.Generator().manual_seed(2)
        noise = torch.randn(16, D, generator=g, dtype=torch.float64)
        Xr = X.repeat(16, 1, 1)
        Xr[:, position] += noise / noise.norm(dim=-1, keepdim=True) * D**0.5
        random_changes = (fmap(Xr) - phi0).norm(dim=-1) / phi0.norm()
    assert ws >= float(random_changes.max())
    cap = 1 + math.sqrt(n) * layer_norm_cap(fmap) / float(phi0.norm())
    assert ws <= cap
