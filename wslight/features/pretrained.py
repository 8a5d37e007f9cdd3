"""The self-attention sublayer of a pre-trained BERT-family encoder as a frozen map (docs/theory/maps.md §12.4).

Its real query, key, value and output weights and its LayerNorm, copied from the encoder into buffers, applied to
token embeddings as the other maps are (by default the bundled all-MiniLM-L6-v2's first layer, offline).
`open_encoder` and the weight tables are shared with the whole pre-trained encoder (`encoder.py`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from ..base import validate
from ..data.encoders import BUNDLED_MINILM, EncoderInfo, encoder_info, load_encoder
from .base import TokenwiseMap, register_map
from .transformer import OneTokenAttention, attention_sublayer

# buffer name -> the parameter of BertAttention it copies (the keyword arguments of `attention_sublayer`)
ATTENTION_WEIGHTS = {
    "Wq": "self.query.weight",
    "bq": "self.query.bias",
    "Wk": "self.key.weight",
    "bk": "self.key.bias",
    "Wv": "self.value.weight",
    "bv": "self.value.bias",
    "Wo": "output.dense.weight",
    "bo": "output.dense.bias",
    "ln_weight": "output.LayerNorm.weight",
    "ln_bias": "output.LayerNorm.bias",
}
# buffer name -> the parameter of BertLayer it copies: its feed-forward sublayer (BertIntermediate, BertOutput)
FFN_WEIGHTS = {
    "W1": "intermediate.dense.weight",
    "b1": "intermediate.dense.bias",
    "W2": "output.dense.weight",
    "b2": "output.dense.bias",
    "ffn_ln_weight": "output.LayerNorm.weight",
    "ffn_ln_bias": "output.LayerNorm.bias",
}


def open_encoder(m: TokenwiseMap, d: int, n: int | None, encoder: Any, seed: int) -> tuple[Any, EncoderInfo]:
    """Set a pre-trained map's dimensions, encoder and seed; the loaded encoder (model, EncoderInfo), or a clear error.

    `encoder` None is the map's `default_encoder`; the seed is checked (>= 0, as every map's) and unused.

    Raises:
        ValueError: `encoder` is not a name or path, d is not the encoder's hidden size, or the seed is negative.
    """
    m.set_dims(d, n)
    m.encoder = encoder or m.default_encoder
    m.seed = validate.integer("seed", seed, low=0)  # as every map and sweep: a seed is >= 0
    if not isinstance(m.encoder, str):
        raise ValueError(f"encoder must be a name or path, got {m.encoder!r}")
    model, _, info = load_encoder(m.encoder)
    checked_width(m.encoder, d, info.hidden_size)
    return model, info


def checked_width(encoder: str, d: int, hidden_size: int) -> None:
    """Refuse a token width d other than the encoder's hidden size: `d must equal the hidden size of ...`."""
    if d != hidden_size:
        raise ValueError(f"d must equal the hidden size of encoder {encoder!r} ({hidden_size}), got {d}")


def check_encoder_width(default_encoder: str, init_args: dict[str, Any], d: int) -> None:
    """A pre-trained map's `check_width`: d against its encoder's hidden size (its config.json read, no weights)."""
    encoder = init_args.get("encoder") or default_encoder
    if isinstance(encoder, str):
        checked_width(encoder, d, encoder_info(encoder).hidden_size)


def checked_layers(key: str, value: Any, encoder: str, num_layers: int) -> int | None:
    """`layers` (1..num_layers, or None: all) of a map of `encoder`; `layer` (an index, 0..num_layers - 1) likewise.

    Raises:
        ValueError: `<key> must be an integer in [...] (encoder '<name>' has <L> layers), got <value>`.
    """
    why = f"encoder {encoder!r} has {num_layers} layers"
    if key == "layer":
        return validate.integer(key, value, low=0, high=num_layers - 1, why=why)
    return validate.integer(key, value, low=1, high=num_layers, allow_none=True, why=why)


@register_map("pretrained_attn")
class PretrainedAttention(TokenwiseMap):
    """LayerNorm(X + MHA(X)) with a pre-trained encoder's weights: BertAttention of encoder layer `layer`.

    phi(X) = flat(LayerNorm(X + concat_h softmax(Q_h K_h^T / sqrt(d_h)) V_h Wo^T + bo)), Q = X Wq^T + bq (K, V
    likewise), with the encoder's own Wq, Wk, Wv, Wo (d, d), biases, LayerNorm weight, bias and eps, its head count,
    no dropout and no attention mask. No scaling of its own: the encoder's weights as trained. Input (B, n, d) for any
    n with d the encoder's hidden size, output (B, n d). Applied to hidden_states[0] (the embedding layer's output)
    it is the encoder's first attention sublayer. The weights do not depend on `seed` (the map is not random).

    Args:
        d: embedding dimension; must equal the encoder's hidden size.
        encoder: 'bundled-minilm' (offline, d = 384, 12 heads), a hub id such as 'bert-base-uncased' (d = 768, where
            the hub is reachable or the model cached), or a local folder.
        layer: which encoder layer's attention sublayer (0: the first).
        seed: accepted for the sweeps' interface; unused.
        dtype: "float32" or "float64".
        n: number of tokens, checked on input when given; None accepts any n.
    """

    default_encoder = BUNDLED_MINILM
    Wq: torch.Tensor  # buffer (d, d); the other buffers of ATTENTION_WEIGHTS are read by name

    def __init__(
        self,
        d: int,
        encoder: str | None = None,
        layer: int = 0,
        seed: int = 0,
        dtype: Literal["float32", "float64"] = "float32",
        n: int | None = None,
    ) -> None:
        super().__init__()
        model, info = open_encoder(self, d, n, encoder, seed)
        self.layer = checked_layers("layer", layer, str(self.encoder), info.num_layers)
        block = model.encoder.layer[self.layer].attention
        params = dict(block.named_parameters())
        dt = validate.dtype("dtype", dtype)
        for name, key in ATTENTION_WEIGHTS.items():
            self.register_buffer(name, params[key].detach().clone().to(dt))
        self.heads = int(block.self.num_attention_heads)
        self.eps = float(block.output.LayerNorm.eps)

    @classmethod
    def check_init_args(cls, init_args: dict[str, Any]) -> None:
        """`layer` against the encoder's number of layers (its config.json read, no weights), before any cell."""
        encoder = init_args.get("encoder") or cls.default_encoder
        if "layer" in init_args and isinstance(encoder, str):
            checked_layers("layer", init_args["layer"], encoder, encoder_info(encoder).num_layers)

    @classmethod
    def check_width(cls, init_args: dict[str, Any], d: int) -> None:
        """D against the encoder's hidden size, before any cell (`check_encoder_width`)."""
        check_encoder_width(cls.default_encoder, init_args, d)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """(B, n, d) -> (B, n d)."""
        validate.samples("X", X, self.d, self.n)
        Y = attention_sublayer(X.to(self.Wq.dtype), heads=self.heads, eps=self.eps, **self.weights())
        return Y.reshape(X.shape[0], -1)

    def token_moves(self, X: torch.Tensor, positions: list[int]) -> OneTokenAttention | None:
        """The sublayer with one token of X (B, n, d) moved, without the full forward (None for n < 2)."""
        if X.shape[1] < 2:
            return None
        return OneTokenAttention(X.to(self.Wq.dtype), positions, self.weights(), self.heads, self.eps)

    def weights(self) -> dict[str, torch.Tensor]:
        """The sublayer's buffers as the keyword arguments of `attention_sublayer`."""
        return {name: getattr(self, name) for name in ATTENTION_WEIGHTS}

    def extra_repr(self) -> str:
        """The layer's encoder, index and heads for its repr."""
        return f"d={self.d}, encoder={self.encoder!r}, layer={self.layer}, heads={self.heads}"


@register_map("pretrained_attn_bert")
class PretrainedAttentionBERT(PretrainedAttention):
    """PretrainedAttention of bert-base-uncased (d = 768): needs the hub or a local cache of the model."""

    default_encoder = "bert-base-uncased"
