"""The pre-trained layers of a BERT-family encoder as one frozen map (docs/theory/maps.md §12.5).

Layers 1..L of the encoder (by default all six of the bundled all-MiniLM-L6-v2, offline), each its attention sublayer
then its feed-forward sublayer with the encoder's own weights, applied to the layer-0 rows of a review; the output per
token or pooled as the encoder's sentence embedding.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

from ..base import validate
from ..data.encoders import BUNDLED_MINILM, encoder_info
from .base import TokenwiseMap, register_map
from .pretrained import ATTENTION_WEIGHTS, FFN_WEIGHTS, check_encoder_width, checked_layers, open_encoder
from .transformer import ACTIVATIONS, bert_layer

POOLINGS = ("tokens", "mean", "sentence")


@register_map("pretrained_encoder")
class PretrainedEncoder(TokenwiseMap):
    """Layers 1..L of a pre-trained encoder on the layer-0 rows X: BertLayer L o ... o BertLayer 1, frozen.

    Each layer is BERT's (`bert_layer`): Y = LayerNorm(H + MHA(H)) (the attention sublayer, as `pretrained_attn`), then
    LayerNorm(Y + W2 act(W1 Y + b1) + b2), with the encoder's own weights, biases, LayerNorm weights and eps, its head
    count and its activation (`hidden_act`: the exact erf gelu for BERT and MiniLM), no dropout and no attention mask.
    The weights are copied into buffers of shape (L, ...), one slice per layer; they do not depend on `seed` (the map
    is not random).

    Working definition: the map reads the rows as a sweep gives them, by default the layer-0 embeddings rescaled to
    norm sqrt(d) (docs/theory/index.md §1.2). With `data.normalize: false`
    (`TokenEmbeddings.samples(..., normalize=False)`) the rows are the encoder's hidden_states[0] of the review's first
    n tokens, and then the map is the encoder: pooling "tokens" gives its hidden_states[L] (tested to 1e-6 in float64
    against the Hugging Face model), and on the rescaled rows it is the same layers applied to the rescaled input. No
    mask: the n rows are all attended to, so [SEP] and [PAD] rows within the first n tokens count as tokens, as the
    encoder run on those n tokens alone would.

    Pooling:
        "tokens": flat(hidden_states[L]), (B, n d), like the other maps.
        "mean": the mean of hidden_states[L] over the n tokens, (B, d): the sentence-transformers mean pooling of
            all-MiniLM-L6-v2 (its 1_Pooling, pooling_mode_mean_tokens) with every token attended to.
        "sentence": that mean scaled to norm 1, (B, d): the model's whole sentence embedding. The bundled
            pipeline (modules.json: Transformer, Pooling, Normalize) L2-normalises after the pooling; "mean" leaves
            the normalisation out because it changes what S measures: every output has norm 1, so S <= 2 is the
            change of direction alone, and a head's bias then acts on a unit vector. A head without a bias flips on
            the same words under both poolings (a positive rescaling keeps every sign).

    Cost of one forward: about 2 L n (12 d^2 + 2 n d) FLOP per sample (a multiply-add counts 2), with BERT's
    intermediate width 4 d: per token and layer, the projections take 4 d^2 multiply-adds, the feed-forward 8 d^2, the
    scores and the mixing 2 n d. About 0.69 GFLOP for the bundled encoder at n = 32, L = 6.

    Args:
        d: embedding dimension; must equal the encoder's hidden size.
        encoder: 'bundled-minilm' (offline, d = 384, 6 layers, 12 heads), a hub id such as 'bert-base-uncased' (where
            the hub is reachable or the model cached), or a local folder.
        layers: L, how many of the encoder's layers, from the first (1..num_layers); None: all of them.
        pooling: "tokens", "mean" or "sentence" (above).
        seed: accepted for the sweeps' interface; unused.
        dtype: "float32" or "float64".
        n: number of tokens, checked on input when given; None accepts any n.
    """

    default_encoder = BUNDLED_MINILM
    Wq: torch.Tensor  # buffer (L, d, d); the other buffers of ATTENTION_WEIGHTS and FFN_WEIGHTS are read by name

    def __init__(
        self,
        d: int,
        encoder: str | None = None,
        layers: int | None = None,
        pooling: Literal["tokens", "mean", "sentence"] = "tokens",
        seed: int = 0,
        dtype: Literal["float32", "float64"] = "float32",
        n: int | None = None,
    ) -> None:
        super().__init__()
        model, info = open_encoder(self, d, n, encoder, seed)
        self.pooling = validate.choice("pooling", pooling, POOLINGS)
        checked = checked_layers("layers", layers, str(self.encoder), info.num_layers)
        self.layers = info.num_layers if checked is None else checked
        self.activation = str(model.config.hidden_act)
        if self.activation not in ACTIVATIONS:
            supported = sorted(ACTIVATIONS)
            raise ValueError(f"encoder {self.encoder!r}: hidden_act {self.activation!r} is not one of {supported}")
        self.heads = int(model.config.num_attention_heads)
        self.eps = float(model.config.layer_norm_eps)
        dt = validate.dtype("dtype", dtype)
        blocks = model.encoder.layer[: self.layers]
        for table, part in ((ATTENTION_WEIGHTS, lambda b: b.attention), (FFN_WEIGHTS, lambda b: b)):
            params = [dict(part(block).named_parameters()) for block in blocks]
            for name, key in table.items():
                self.register_buffer(name, torch.stack([p[key].detach() for p in params]).to(dt).clone())

    @classmethod
    def check_init_args(cls, init_args: dict[str, Any]) -> None:
        """`layers` against the encoder's number of layers (its config.json read, no weights), before any cell."""
        encoder = init_args.get("encoder") or cls.default_encoder
        if init_args.get("layers") is not None and isinstance(encoder, str):
            checked_layers("layers", init_args["layers"], encoder, encoder_info(encoder).num_layers)

    @classmethod
    def check_width(cls, init_args: dict[str, Any], d: int) -> None:
        """D against the encoder's hidden size, before any cell (`check_encoder_width`)."""
        check_encoder_width(cls.default_encoder, init_args, d)

    def out_dim(self, n: int | None = None) -> int:
        """Size p of phi(X): n d for pooling "tokens" (n: the map's own when None), d when pooled."""
        return super().out_dim(n) if self.pooling == "tokens" else self.d

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """(B, n, d) -> (B, n d) for pooling "tokens", (B, d) pooled."""
        validate.samples("X", X, self.d, self.n)
        H = X.to(self.Wq.dtype)
        for layer in range(self.layers):
            attention = {name: getattr(self, name)[layer] for name in ATTENTION_WEIGHTS}
            ffn = {name.removeprefix("ffn_"): getattr(self, name)[layer] for name in FFN_WEIGHTS}
            H = bert_layer(H, attention, ffn, self.heads, self.eps, self.activation)
        if self.pooling == "tokens":
            return H.reshape(X.shape[0], -1)
        pooled = H.mean(dim=1)  # (B, d)
        return pooled if self.pooling == "mean" else F.normalize(pooled, dim=-1)

    def extra_repr(self) -> str:
        """The encoder, layers, pooling and heads for its repr."""
        where = f"encoder={self.encoder!r}, layers={self.layers}, pooling={self.pooling!r}"
        return f"d={self.d}, {where}, heads={self.heads}"
