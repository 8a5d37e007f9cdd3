"""The exact one-word substitution (docs/theory/words.md §13) against a brute-force loop through the full forward.

For every map family the maximum over the words equals the brute force, and so do the best word, its distance and the
heads' flip counts.
"""

import copy

import pytest
import torch
from conftest import unit_rows

from wslight.features import make_map
from wslight.search.substitution import word_substitution

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ["rf", "deep_rf", "raf", "relu_raf", "raf_mh", "linear_raf", "sigmoid_raf", "transformer", "plain"]
B, N, D, V = 2, 6, 12, 40
POSITIONS = [0, 4]


class _Plain(torch.nn.Module):
    """A module with no token-move algebra of its own: the generic path."""

    def __init__(self) -> None:
        super().__init__()
        self.n, self.d = N, D
        g = torch.Generator().manual_seed(3)
        self.W = torch.nn.Parameter(torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5)

    def forward(self, X):
        return torch.tanh(X @ self.W).flatten(1)


def build(kind, seed=1):
    if kind == "plain":
        return _Plain()
    if kind == "transformer":
        return make_map(kind, N, D, seed=seed).double()
    return make_map(kind, N, D, seed=seed, dtype="float64", **({"heads": 3} if kind == "raf_mh" else {}))


def brute_force(m, X, cand, allowed, heads=None, bias=0.0):
    """Every (sample, position, word) through the full forward; a head's output is phi^T theta + bias."""
    phi0 = m(X)
    out = torch.full((B, len(POSITIONS), V), float("-inf"), dtype=torch.float64)
    flips = torch.zeros(B, len(POSITIONS), heads.shape[1] if heads is not None else 0, dtype=torch.long)
    for j, i in enumerate(POSITIONS):
        Xp = X[:, None].repeat(1, V, 1, 1)  # (B, V, n, d)
        Xp[:, :, i] = cand[j][None]
        phi = m(Xp.flatten(0, 1)).reshape(B, V, -1)
        rel = (phi - phi0[:, None]).norm(dim=-1) / phi0.norm(dim=-1, keepdim=True)
        out[:, j] = torch.where(allowed[:, j], rel, float("-inf"))
        if heads is not None:
            flipped = torch.sign(phi @ heads + bias) != torch.sign(phi0 @ heads + bias)[:, None]  # (B, V, C)
            flips[:, j] = (flipped & allowed[:, j, :, None]).sum(1)
    return out, flips


@pytest.mark.parametrize("kind", FAMILIES)
def test_equals_brute_force_through_the_full_forward(kind):
    m = build(kind)
    X = unit_rows(B, N, D, seed=2, dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    cand = torch.randn(len(POSITIONS), V, D, generator=g, dtype=torch.float64)
    cand = cand / cand.norm(dim=-1, keepdim=True) * D**0.5  # the words' rows at the rows' norm
    allowed = torch.rand(B, len(POSITIONS), V, generator=g) > 0.3
    heads = torch.randn(m(X).shape[1], 3, generator=g, dtype=torch.float64)
    res = word_substitution(m, X, POSITIONS, cand, allowed, heads=heads, chunk_elements=4000)  # several chunks
    ref, ref_flips = brute_force(m, X, cand, allowed, heads)
    best, word = ref.max(dim=-1)
    torch.testing.assert_close(res.ws, best, rtol=1e-6, atol=1e-9)
    assert torch.equal(res.word, word)
    moved = cand[torch.arange(len(POSITIONS)), word] - X[:, POSITIONS]  # (B, P, d)
    torch.testing.assert_close(res.distance, moved.norm(dim=-1) / D**0.5, rtol=1e-9, atol=1e-12)
    assert torch.equal(res.flips, ref_flips)
    assert torch.equal(res.admissible, allowed.sum(-1))
    if kind in ("raf", "relu_raf", "sigmoid_raf"):  # attention: some word flips some head on these draws
        assert res.flips.sum() > 0


@pytest.mark.parametrize("kind", ["rf", "raf", "relu_raf", "transformer", "plain"])
def test_a_trained_heads_bias_moves_its_flips_as_in_the_full_forward(kind):
    """Heads with a bias (a trained head's): the flips are those of sign(phi^T theta + b), word by word.

    The biases put each head's clean output near zero on one sample, so words flip it that would not flip it without.
    """
    m = build(kind)
    X = unit_rows(B, N, D, seed=2, dtype=torch.float64)
    g = torch.Generator().manual_seed(7)
    cand = torch.randn(len(POSITIONS), V, D, generator=g, dtype=torch.float64)
    cand = cand / cand.norm(dim=-1, keepdim=True) * D**0.5
    allowed = torch.rand(B, len(POSITIONS), V, generator=g) > 0.3
    heads = torch.randn(m(X).shape[1], 3, generator=g, dtype=torch.float64)
    bias = -(m(X)[0] @ heads) + torch.tensor([1e-3, -1e-3, 0.5], dtype=torch.float64)
    res = word_substitution(m, X, POSITIONS, cand, allowed, heads=heads, bias=bias, chunk_elements=4000)
    _, ref_flips = brute_force(m, X, cand, allowed, heads, bias)
    _, no_bias = brute_force(m, X, cand, allowed, heads)
    assert torch.equal(res.flips, ref_flips)
    assert not torch.equal(ref_flips, no_bias)  # the bias matters on these draws
    with pytest.raises(ValueError, match=r"bias: expected \(3,\) or \(1, 3\), one per head, got \(2,\)"):
        word_substitution(m, X, POSITIONS, cand, allowed, heads=heads, bias=bias[:2])
    with pytest.raises(ValueError, match="bias: a bias needs heads"):
        word_substitution(m, X, POSITIONS, cand, allowed, bias=bias)


def test_trials_shared_rows_and_the_best_flipping_word():
    """T maps with their own heads, the same rows at every position: each trial's result is its map's alone.

    And the best flipping word has the largest opposite output among the flipping ones.
    """
    maps = [build("raf", seed=s) for s in (1, 2)]
    X = unit_rows(2 * B, N, D, seed=4, dtype=torch.float64).reshape(2, B, N, D)
    g = torch.Generator().manual_seed(6)
    rows = torch.randn(V, D, generator=g, dtype=torch.float64)
    heads = torch.randn(2, N * D, 2, generator=g, dtype=torch.float64)
    both = word_substitution(maps, X, POSITIONS, rows, heads=heads)
    for t in range(2):
        one = word_substitution(maps[t], X[t], POSITIONS, rows, heads=heads[t])
        torch.testing.assert_close(both.ws[t], one.ws, rtol=1e-12, atol=0)
        assert torch.equal(both.flip_word[t], one.flip_word)
        for b in range(B):
            for j, i in enumerate(POSITIONS):
                Xp = X[t, b][None].repeat(V, 1, 1)
                Xp[:, i] = rows
                out = maps[t](Xp) @ heads[t]  # (V, C)
                sign0 = torch.sign(maps[t](X[t, b : b + 1]) @ heads[t])[0]
                opposite = torch.where(torch.sign(out) != sign0, -out * sign0, float("-inf"))
                want = torch.where(opposite.isfinite().any(0), opposite.argmax(0), -1)
                assert torch.equal(one.flip_word[b, j], want)


def test_a_mask_per_trial_is_each_trials_own():
    """A mask `allowed` (T, B, P, V) per trial: trial t's maximum runs over its own words only.

    A review per trial has its own.
    """
    maps = [build("raf", seed=s) for s in (1, 2)]
    X = unit_rows(2 * B, N, D, seed=4, dtype=torch.float64).reshape(2, B, N, D)
    rows = torch.randn(V, D, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    masks = torch.rand(2, B, len(POSITIONS), V, generator=torch.Generator().manual_seed(8)) > 0.5
    both = word_substitution(maps, X, POSITIONS, rows, masks)
    for t in range(2):
        one = word_substitution(maps[t], X[t], POSITIONS, rows, masks[t])
        assert torch.equal(both.word[t], one.word) and torch.equal(both.admissible[t], masks[t].sum(-1))
        assert bool(masks[t].gather(-1, one.word[..., None]).all())  # the best word is one of the trial's own


def test_a_narrow_mask_gives_the_words_of_the_narrowed_candidates_in_the_whole_lists_numbering():
    """Only the words some sample may take are evaluated; the indices returned still number the whole candidate list."""
    m = build("raf", seed=3)
    X = unit_rows(B, N, D, seed=4, dtype=torch.float64)
    g = torch.Generator().manual_seed(9)
    rows = torch.randn(V, D, generator=g, dtype=torch.float64)
    heads = torch.randn(N * D, 2, generator=g, dtype=torch.float64)
    few = torch.tensor([3, 11, V - 1])
    allowed = torch.zeros(B, len(POSITIONS), V, dtype=torch.bool)
    allowed[..., few] = True
    narrow = word_substitution(m, X, POSITIONS, rows, allowed, heads=heads)
    alone = word_substitution(m, X, POSITIONS, rows[few], heads=heads)  # the three words as the whole list
    assert torch.equal(narrow.word, few[alone.word]) and torch.equal(narrow.ws, alone.ws)
    assert torch.equal(narrow.flips, alone.flips)
    assert torch.equal(narrow.flip_word, torch.where(alone.flip_word >= 0, few[alone.flip_word.clamp_min(0)], -1))
    none = word_substitution(m, X, POSITIONS, rows, torch.zeros_like(allowed), heads=heads)
    assert (none.word == -1).all() and none.ws.isnan().all() and (none.flip_word == -1).all()


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"candidates": torch.zeros(5, 7)}, "candidates"),
        ({"candidates": torch.zeros(3, 5, D)}, "candidates"),
        ({"allowed": torch.ones(B, 2, 5)}, "allowed"),
        ({"heads": torch.zeros(N * D)}, "heads"),
        ({"heads": torch.zeros(7, 2)}, "heads"),
        ({"positions": [N]}, "positions"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, key):
    m = build("raf")
    args = {"positions": POSITIONS, "candidates": torch.zeros(5, D, dtype=torch.float64)} | kwargs
    with pytest.raises(ValueError, match=key):
        word_substitution(m, unit_rows(B, N, D, dtype=torch.float64), **args)


REAL_FAMILIES = ["rf", "deep_rf", "raf", "relu_raf", "raf_mh12", "linear_raf", "sigmoid_raf", "transformer"]


@pytest.fixture(scope="module")
def real_words():
    """The rows of 500 admissible words of the bundled vocabulary at position 2 of a bundled review, and the review."""
    from wslight.data import EmbeddingSpec, load_token_embeddings
    from wslight.data.vocabulary import EncoderWords

    words = EncoderWords("bundled-minilm")
    reviews = load_token_embeddings(EmbeddingSpec(num_samples=40))
    ids = reviews.input_ids([3])[0]
    mask, _ = words.admissible(ids, 2)
    subset = mask.nonzero()[:, 0][torch.randperm(int(mask.sum()), generator=torch.Generator().manual_seed(0))[:500]]
    X, _ = reviews.samples([3], 6, 384)
    return words.rows(2, 384)[subset].double(), X.double()


@pytest.mark.parametrize("kind", REAL_FAMILIES + ["pretrained_attn"])
def test_real_vocabulary_subset_equals_the_brute_force(real_words, kind):
    """The issue's exactness target: 500 real words, every map family, float64, 1e-6 and the same best word."""
    rows, X = real_words
    if kind in ("transformer", "pretrained_attn"):
        m = make_map(kind, 6, 384, seed=1).double()
    else:
        m = make_map(kind, 6, 384, seed=1, dtype="float64")
    res = word_substitution(m, X, [2], rows)
    with torch.no_grad():
        phi0 = m(X)
        Xp = X.repeat(len(rows), 1, 1)
        Xp[:, 2] = rows
        rel = (m(Xp) - phi0).norm(dim=-1) / phi0.norm()
    assert float(res.ws[0, 0]) == pytest.approx(float(rel.max()), rel=1e-6)
    assert int(res.word[0, 0]) == int(rel.argmax())


@pytest.mark.parametrize("kind", ["raf", "plain"])
def test_a_float32_enumeration_rechecks_in_float64_the_words_rounding_could_decide(kind):
    """Words whose output sits on a head's boundary: float32 alone decides some of them wrongly, the recheck does not.

    Each of 8 heads gets the bias that puts one word's float64 output 1e-12 (relative) past zero, and a second word
    nearly ties the best change. With the recheck, a float32 map (or the float32 working dtype of a closed form) gives
    the float64 enumeration's best word, flip counts and strongest flipping words; without it, not everywhere.
    """
    m64 = build(kind, seed=2)
    if kind == "plain":  # a module with float32 weights: the map is those weights, the reference their float64 copy
        m32, dtype = copy.deepcopy(m64).float(), "float64"  # float64 asked, the module computes in float32
        m64 = copy.deepcopy(m32).double()
    else:  # a closed form asked to work in float32
        m32, dtype = m64, "float32"
    X = unit_rows(B, N, D, seed=5, dtype=torch.float64)
    g = torch.Generator().manual_seed(11)
    rows = torch.randn(V, D, generator=g, dtype=torch.float64) * D**0.5 / 2
    heads = torch.randn(m64(X).shape[1], 8, generator=g, dtype=torch.float64)
    i = POSITIONS[0]
    Xw = X[:1].repeat(V, 1, 1)
    Xw[:, i] = rows
    outputs = m64(Xw) @ heads  # (V, 8): sample 0's output with each word at position i
    scale = heads.norm(dim=0) * m64(Xw).norm(dim=1).max()
    bias = -outputs[torch.arange(8) * 3, torch.arange(8)] + 1e-12 * scale  # word 3c on head c's boundary
    reference = word_substitution(m64, X, [i], rows, heads=heads, bias=bias)
    rechecked = word_substitution(m32, X, [i], rows, heads=heads, bias=bias, dtype=dtype)
    assert torch.equal(rechecked.word, reference.word) and torch.equal(rechecked.flips, reference.flips)
    assert torch.equal(rechecked.flip_word, reference.flip_word)
    torch.testing.assert_close(rechecked.ws, reference.ws, rtol=1e-12, atol=0)
    alone = word_substitution(m32, X, [i], rows, heads=heads, bias=bias, dtype=dtype, recheck=False)
    assert not torch.equal(alone.flips, reference.flips)  # the float32 pass alone misjudges some boundary word
