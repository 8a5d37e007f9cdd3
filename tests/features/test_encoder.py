"""The pre-trained encoder as a map (`pretrained_encoder`, docs/theory/maps.md §12.5).

On the encoder's own hidden_states[0] of bundled reviews it is the encoder: its hidden_states[L] per token, their mean
and the sentence embedding; its first layer's attention part is `pretrained_attn`; bad arguments are named.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from wslight.features import MAPS, PretrainedEncoder, make_map, map_dims, resolve_map
from wslight.features.transformer import ACTIVATIONS
from wslight.plots.ws import TITLES

pytestmark = pytest.mark.usefixtures("one_thread")

N, D = 16, 384
LAYERS_RANGE = r"^layers must be an integer in \[1, 6\] or None"


@pytest.fixture(scope="module")
def encoder64():
    """A float64 copy of the bundled encoder (the cached model is shared: never cast in place)."""
    from wslight.data.encoders import load_encoder

    model, _, _ = load_encoder("bundled-minilm")
    return copy.deepcopy(model).double()


@pytest.fixture(scope="module")
def hidden_states(encoder64):
    """The encoder's hidden_states (float64) of the first N tokens of 3 bundled reviews with no padding among them."""
    from wslight.data import EmbeddingSpec, load_token_embeddings

    reviews = load_token_embeddings(EmbeddingSpec(num_samples=40))
    ids = reviews.input_ids(list(range(40)))[:, :N]
    ids = ids[(ids != 0).all(dim=1)][:3]  # [PAD] is id 0
    assert ids.shape == (3, N)
    with torch.no_grad():
        return encoder64(input_ids=ids, output_hidden_states=True).hidden_states  # no mask: every token attended


@pytest.mark.parametrize("layers", [1, 2, 6])
def test_tokens_are_the_encoders_hidden_states(hidden_states, layers):
    """On unrescaled hidden_states[0] the map is the encoder: its output is hidden_states[L], to 1e-6 in float64."""
    fmap = make_map("pretrained_encoder", N, D, dtype="float64", layers=layers)
    out = fmap(hidden_states[0])
    assert out.shape == (3, fmap.out_dim(N)) == (3, N * D)
    assert (out.reshape(3, N, D) - hidden_states[layers]).abs().max() < 1e-6
    if layers < 6:  # and not a later or earlier layer's
        assert (out.reshape(3, N, D) - hidden_states[layers + 1]).abs().max() > 1e-2
        assert (out.reshape(3, N, D) - hidden_states[layers - 1]).abs().max() > 1e-2


@pytest.mark.parametrize("layers", [1, 6])
def test_pooled_outputs_are_the_mean_and_the_sentence_embedding(hidden_states, layers):
    """Pooling 'mean' is the mean of hidden_states[L] over the tokens, 'sentence' that mean at norm 1."""
    mean = make_map("pretrained_encoder", N, D, dtype="float64", layers=layers, pooling="mean")
    sentence = make_map("pretrained_encoder", N, D, dtype="float64", layers=layers, pooling="sentence")
    want = hidden_states[layers].mean(dim=1)
    got = mean(hidden_states[0])
    assert got.shape == (3, mean.out_dim(N)) == (3, D) and mean.out_dim(5) == D
    assert (got - want).abs().max() < 1e-6
    unit = sentence(hidden_states[0])
    assert (unit - want / want.norm(dim=-1, keepdim=True)).abs().max() < 1e-12
    assert want.norm(dim=-1).min() > 1.5  # the normalisation is no identity on these reviews
    torch.testing.assert_close(unit.norm(dim=-1), torch.ones(3, dtype=torch.float64))


def test_first_layers_attention_part_is_pretrained_attn(encoder64, rows):
    """L = 1 is pretrained_attn followed by the encoder's own feed-forward sublayer, on rows as a sweep gives them."""
    X = rows(2, 7, D, seed=3, dtype=torch.float64)  # norm sqrt(d): not hidden_states[0], the same layers
    enc = make_map("pretrained_encoder", 7, D, dtype="float64", layers=1)
    attn = make_map("pretrained_attn", 7, D, dtype="float64")
    assert torch.equal(enc.Wq[0], attn.Wq) and torch.equal(enc.ln_bias[0], attn.ln_bias)
    Y = attn(X).reshape(2, 7, D)
    block = encoder64.encoder.layer[0]
    with torch.no_grad():
        want = block.output(block.intermediate(Y), Y)  # BertIntermediate, BertOutput (eval: no dropout)
    assert (enc(X).reshape(2, 7, D) - want).abs().max() < 1e-10
    assert (Y - want).abs().max() > 0.1  # the feed-forward sublayer does move the rows


def test_weights_are_the_encoders_whatever_the_seed_and_float32_agrees(hidden_states, encoder64):
    a = PretrainedEncoder(D, layers=2, seed=0)
    b = make_map("pretrained_encoder", N, D, seed=7, layers=2)
    for (name, x), y in zip(a.named_buffers(), b.buffers(), strict=True):
        assert torch.equal(x, y), name
    assert a.W1.shape == (2, 4 * D, D) and a.ffn_ln_weight.shape == (2, D) and a.W1.dtype == torch.float32
    assert torch.equal(a.W2[1], encoder64.encoder.layer[1].output.dense.weight.float())
    assert a.heads == 12 and a.activation == "gelu" and ACTIVATIONS[a.activation] is F.gelu
    f32 = a(hidden_states[0].float()).reshape(3, N, D)
    assert f32.dtype == torch.float32 and (f32.double() - hidden_states[2]).abs().max() < 1e-4
    assert PretrainedEncoder(D).layers == 6  # all of the encoder's layers by default


def test_any_n_unless_fixed(rows):
    fmap = PretrainedEncoder(D, layers=1)
    assert map_dims(fmap) == (D, None)
    for n in (1, 3):
        assert fmap(rows(2, n, D)).shape == (2, n * D)
    fixed = PretrainedEncoder(D, layers=1, n=3, pooling="mean")
    assert map_dims(fixed) == (D, 3) and fixed.out_dim() == D
    with pytest.raises(ValueError, match="X"):
        fixed(rows(2, 4, D))
    with pytest.raises(ValueError, match="X"):
        fmap(rows(2, 3, D - 1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layers": 0}, LAYERS_RANGE + r" \(encoder 'bundled-minilm' has 6 layers\), got 0$"),
        ({"layers": 7}, LAYERS_RANGE + r" .*got 7$"),
        ({"layers": 2.0}, r"^layers must be an integer .*got 2\.0$"),
        ({"pooling": "max"}, r"^pooling must be one of .*'tokens', 'mean', 'sentence'.*got 'max'$"),
        ({"d": 24}, r"^d must equal the hidden size of encoder 'bundled-minilm' \(384\), got 24$"),
        ({"dtype": "float16"}, r"^dtype must be one of .*got 'float16'$"),
        ({"encoder": 3}, r"^encoder must be a name or path, got 3$"),
        ({"seed": -1}, r"^seed must be an integer >= 0, got -1$"),
    ],
)
def test_bad_arguments_name_the_key_and_the_value(kwargs, message):
    args = {"d": D} | kwargs
    with pytest.raises(ValueError, match=message):
        make_map("pretrained_encoder", 5, **args)


def test_registered_buildable_from_a_config_entry_and_titled():
    assert MAPS["pretrained_encoder"] is PretrainedEncoder and "pretrained_encoder" in TITLES
    entry = resolve_map({"class_path": "pretrained_encoder", "init_args": {"layers": 2, "pooling": "mean"}})
    fmap = entry.build(8, D, seed=3)
    assert isinstance(fmap, PretrainedEncoder) and (fmap.layers, fmap.pooling) == (2, "mean")
    assert entry.name == "pretrained_encoder" and entry.record_fields == {"map_args": {"layers": 2, "pooling": "mean"}}
    assert "layers=2, pooling='mean'" in repr(fmap)
