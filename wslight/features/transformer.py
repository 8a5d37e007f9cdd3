"""A random transformer block at initialisation (docs/theory/maps.md §12.3), and the forward of one BERT layer.

Multi-head softmax attention with query, key, value and output projections, a residual connection and LayerNorm
(post-LN, as BERT), optionally followed by a feed-forward sublayer. `attention_sublayer`, `feed_forward_sublayer` and
`bert_layer` are the one forward of these sublayers, shared with the pre-trained attention layer (`pretrained.py`) and
the pre-trained encoder (`encoder.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import torch
import torch.nn.functional as F

from ..base import validate
from ..base.seeding import generator
from .base import TokenwiseMap, register_map


def attention_sublayer(
    X: torch.Tensor,
    Wq: torch.Tensor,
    Wk: torch.Tensor,
    Wv: torch.Tensor,
    Wo: torch.Tensor,
    heads: int,
    eps: float,
    bq: torch.Tensor | None = None,
    bk: torch.Tensor | None = None,
    bv: torch.Tensor | None = None,
    bo: torch.Tensor | None = None,
    ln_weight: torch.Tensor | None = None,
    ln_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """LayerNorm(X + MHA(X)) with nn.Linear's convention (weights (out, in)): (B, n, d) -> (B, n, d).

    MHA(X) = concat_h softmax(Q_h K_h^T / sqrt(d_h)) V_h  Wo^T + bo, Q = X Wq^T + bq (likewise K, V), split into
    `heads` column blocks of d_h = d / heads; BERT's BertAttention without dropout and without a mask.
    """
    B, n, d = X.shape
    dh = d // heads

    def proj(W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:  # (B, n, d) -> (B, H, n, d_h)
        return F.linear(X, W, b).reshape(B, n, heads, dh).transpose(1, 2)

    Q, K, V = proj(Wq, bq), proj(Wk, bk), proj(Wv, bv)
    A = torch.softmax(Q @ K.transpose(-1, -2) / dh**0.5, dim=-1)  # (B, H, n, n)
    ctx = (A @ V).transpose(1, 2).reshape(B, n, d)  # (B, H, n, d_h) -> (B, n, d), heads concatenated
    return F.layer_norm(X + F.linear(ctx, Wo, bo), (d,), ln_weight, ln_bias, eps)


class OneTokenAttention:
    """`attention_sublayer` of samples with one token moved, at O(n d + d^2) a move (docs/theory/maps.md §12.4).

    Moving token i changes its query, key and value only. Row r != i of head h keeps its scores against the other
    tokens, so with e_rj = exp(s_rj - m_r) over j != i (m_r their max), Z_r = sum_j e_rj and A_r = sum_j e_rj v_j,
    its context with the moved token's score s' and value v' is (A_r c + w v') / (Z_r c + w), where m' = max(m_r, s'),
    c = exp(m_r - m') and w = exp(s' - m'). The output projection is linear: Wo_h A_r is computed once per sample
    and position, Wo_h v' once per move (d^2), and each row costs H d. Row i attends afresh (n d), then every row
    takes the residual and the LayerNorm (n d). A module with this algebra offers it as `token_moves(X, positions)`,
    which the generic path uses instead of the full forward (`wslight.features.generic_move.GenericMove`).

    Built from the clean samples X (B, n, d), in the weights' dtype, the tokens that move (`positions`, P of them),
    the head count and LayerNorm eps, and `weights`: the keyword arguments of `attention_sublayer` (Wq, Wk, Wv, Wo,
    and optionally their biases and the LayerNorm's weight and bias), as `bert_layer` takes them.
    """

    @torch.no_grad()
    def __init__(
        self, X: torch.Tensor, positions: list[int], weights: Mapping[str, torch.Tensor], heads: int, eps: float
    ) -> None:
        B, n, d = X.shape
        self.heads, self.dh, self.eps, self.positions = heads, d // heads, eps, list(positions)
        Wq, Wk, Wv, Wo = (weights[k] for k in ("Wq", "Wk", "Wv", "Wo"))
        bq, bk, bv, bo = (weights.get(k) for k in ("bq", "bk", "bv", "bo"))
        self.Wq, self.Wk, self.Wv, self.Wo = Wq, Wk, Wv, Wo
        self.bq, self.bk, self.bv = bq, bk, bv
        self.ln_weight, self.ln_bias = weights.get("ln_weight"), weights.get("ln_bias")
        self.X = X
        self.residual = X if bo is None else X + bo  # (B, n, d): what every row adds to its attention output
        split = (B, n, heads, self.dh)
        self.Q, self.K, self.V = (
            F.linear(X, W, b).reshape(split).transpose(1, 2) for W, b in ((Wq, bq), (Wk, bk), (Wv, bv))
        )
        self.Wo_h = Wo.T.reshape(heads, self.dh, d)  # (H, d_h, d): head h's block of Wo^T
        S = self.Q @ self.K.transpose(-1, -2) / self.dh**0.5  # (B, H, n, n)
        self.m, self.Z, self.PA = [], [], []  # per position: (B, H, n), (B, H, n), (B, n, H, d)
        for i in self.positions:
            others = S.clone()
            others[..., i] = -torch.inf
            m = others.amax(-1)  # (B, H, n)
            E = torch.exp(others - m[..., None])  # column i is 0
            self.m.append(m)
            self.Z.append(E.sum(-1))
            # Wo_h A_r, row-major over (r, h): a row's heads side by side (ghnd would make einsum copy it per call)
            self.PA.append(((E @ self.V) @ self.Wo_h[None]).transpose(1, 2).contiguous())

    def __call__(self, b: torch.Tensor, j: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Rows of the sublayer, flattened, of sample b[k] with token positions[j[k]] moved by x[k]: (k, n d).

        The moves of one position go in one batch when each of its samples moves as often (a search's chains, copies of
        a sample that move one token each), else sample by sample.
        """
        P, every = len(self.positions), torch.arange(len(x), device=x.device)
        pieces, order = [], []
        for jj in [0] if P == 1 else torch.unique(j).tolist():
            mine = every if P == 1 else (j == jj).nonzero()[:, 0]
            if len(self.X) == 1:  # one sample (a search's trial): every move in one batch, in order
                batches = [(b[:1], mine)]
            else:
                samples, counts = torch.unique(b[mine], return_counts=True)
                if bool((counts == counts[0]).all()):
                    batches = [(samples, mine[torch.argsort(b[mine], stable=True)])]
                else:
                    batches = [(samples[g : g + 1], mine[b[mine] == s]) for g, s in enumerate(samples.tolist())]
            for bs, sel in batches:
                pieces.append(self._moved(bs, jj, x[sel].reshape(len(bs), -1, x.shape[-1])).flatten(0, 1))
                order.append(sel)
        if len(pieces) == 1 and (order[0] is every or torch.equal(order[0], every)):
            return pieces[0]
        return torch.cat(pieces)[torch.argsort(torch.cat(order))]

    def _moved(self, bs: torch.Tensor, j: int, x: torch.Tensor) -> torch.Tensor:
        """Samples bs (G,) with token positions[j] moved by each of their k rows of x (G, k, d): (G, k, n d)."""
        i, H, dh = self.positions[j], self.heads, self.dh
        whole = len(bs) == len(self.X) and bool((bs == torch.arange(len(bs), device=bs.device)).all())
        pick = (lambda t: t) if whole else (lambda t: t[bs])  # every sample in order: no gathered copy
        Xb = pick(self.X)  # (G, n, d)
        G, n, d = Xb.shape
        k = x.shape[1]
        xi = Xb[:, i, None] + x  # (G, k, d)
        q, key, v = (
            F.linear(xi, W, bias).reshape(G, k, H, dh)
            for W, bias in ((self.Wq, self.bq), (self.Wk, self.bk), (self.Wv, self.bv))
        )
        Qb, Kb, Vb = pick(self.Q), pick(self.K), pick(self.V)  # (G, H, n, d_h)
        # rows r != i: one new score and one new value each
        s_new = torch.einsum("ghnd,gkhd->gkhn", Qb, key) / dh**0.5  # (G, k, H, n)
        m0, Z0 = pick(self.m[j])[:, None], pick(self.Z[j])[:, None]  # (G, 1, H, n)
        m1 = torch.maximum(m0, s_new)
        c, w = torch.exp(m0 - m1), torch.exp(s_new - m1)
        g = 1.0 / (Z0 * c + w)
        u = torch.einsum("gkhe,hed->gkhd", v, self.Wo_h)  # (G, k, H, d): Wo_h v'
        rows = torch.einsum("gkhn,gnhd->gknd", c * g, pick(self.PA[j])) + torch.einsum("gkhn,gkhd->gknd", w * g, u)
        # row i: the moved query against every key, the moved one in place of key i
        s_i = torch.einsum("gkhd,ghnd->gkhn", q, Kb) / dh**0.5
        s_ii = (q * key).sum(-1, keepdim=True) / dh**0.5  # (G, k, H, 1)
        a = torch.softmax(torch.cat([s_i[..., :i], s_ii, s_i[..., i + 1 :]], dim=-1), dim=-1)  # (G, k, H, n)
        ctx = torch.einsum(
            "gkhn,ghne->gkhe", torch.cat([a[..., :i], torch.zeros_like(a[..., :1]), a[..., i + 1 :]], -1), Vb
        )
        ctx = ctx + a[..., i : i + 1] * v  # (G, k, H, d_h)
        residual = pick(self.residual)[:, None]  # (G, 1, n, d)
        rows = rows + residual  # row i's entry is replaced below
        row_i = F.linear(ctx.reshape(G, k, d), self.Wo) + (residual[:, :, i] + x)  # the moved token's own residual
        Y = torch.cat([rows[:, :, :i], row_i[:, :, None], rows[:, :, i + 1 :]], dim=2)  # (G, k, n, d)
        Y = F.layer_norm(Y, (d,), self.ln_weight, self.ln_bias, self.eps)
        return Y.reshape(G, k, n * d)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# an encoder config's `hidden_act` -> the function (Hugging Face's ACT2FN of the same name, up to rounding)
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # the exact erf form (BERT, MiniLM)
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "relu": F.relu,
}


def feed_forward_sublayer(
    Y: torch.Tensor,
    W1: torch.Tensor,
    W2: torch.Tensor,
    eps: float,
    b1: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    ln_weight: torch.Tensor | None = None,
    ln_bias: torch.Tensor | None = None,
    activation: str = "gelu",
) -> torch.Tensor:
    """LayerNorm(Y + act(Y W1^T + b1) W2^T + b2) with nn.Linear's convention: (B, n, d) -> (B, n, d).

    BERT's BertIntermediate and BertOutput without dropout; `activation` names an entry of ACTIVATIONS.
    """
    hidden = ACTIVATIONS[activation](F.linear(Y, W1, b1))  # (B, n, w)
    return F.layer_norm(Y + F.linear(hidden, W2, b2), (Y.shape[-1],), ln_weight, ln_bias, eps)


def bert_layer(
    X: torch.Tensor,
    attention: Mapping[str, torch.Tensor],
    ffn: Mapping[str, torch.Tensor],
    heads: int,
    eps: float,
    activation: str = "gelu",
) -> torch.Tensor:
    """One post-LN BERT layer, the attention sublayer then the feed-forward sublayer: (B, n, d) -> (B, n, d).

    BertLayer without dropout and without a mask. `attention` holds the keyword arguments of `attention_sublayer`
    (Wq, Wk, Wv, Wo, and optionally their biases and the LayerNorm's weight and bias), `ffn` those of
    `feed_forward_sublayer` (W1, W2, and optionally b1, b2, ln_weight, ln_bias); both LayerNorms take `eps`.
    """
    Y = attention_sublayer(X, heads=heads, eps=eps, **attention)
    return feed_forward_sublayer(Y, eps=eps, activation=activation, **ffn)


@register_map("transformer")
class RandomTransformerBlock(TokenwiseMap):
    """A transformer block at initialisation: Y = LayerNorm(X + MHA(X)), output flat(Y) (B, n, d) -> (B, n d).

    MHA has H heads of dimension d_h = d / H with query, key, value and output projections Wq, Wk, Wv, Wo (d, d),
    entries N(0, 1/d) iid, biases 0 and LayerNorm weight 1, bias 0 (their values at initialisation). Under the input
    assumption (rows of norm sqrt(d)) a query or key coordinate has unit variance, so a score q_h . k_h / sqrt(d_h) has
    about unit variance, as RAF's. With `ffn_ratio` r > 0 a feed-forward sublayer follows,
    Y' = LayerNorm(Y + gelu(Y W1^T) W2^T) with W1 (r d, d) ~ N(0, 1/d), W2 (d, r d) ~ N(0, 1/(r d)); the default 0
    is the attention sublayer alone, the part of a block the pre-trained layer (`pretrained_attn`) is.
    Buffers `W` (4, d, d) = Wq, Wk, Wv, Wo from generator(seed, "transformer.W") (and `W1`, `W2` from
    generator(seed, "transformer.ffn")). Any n.

    Args:
        d: embedding dimension.
        heads: number of heads H; must divide d.
        seed: seed of the map's own generator.
        dtype: "float32" or "float64".
        n: number of tokens, checked on input when given; None accepts any n.
        ffn_ratio: hidden width of the feed-forward sublayer over d (0: none).
        eps: LayerNorm epsilon (BERT's 1e-12).
    """

    W: torch.Tensor  # buffer (4, d, d): Wq, Wk, Wv, Wo
    W1: torch.Tensor  # buffer (r d, d), with a feed-forward sublayer only
    W2: torch.Tensor  # buffer (d, r d), likewise

    def __init__(
        self,
        d: int,
        heads: int = 12,
        seed: int = 0,
        dtype: Literal["float32", "float64"] = "float32",
        n: int | None = None,
        ffn_ratio: int = 0,
        eps: float = 1e-12,
    ) -> None:
        super().__init__()
        self.set_dims(d, n)
        self.heads = validate.heads(heads, self.d)
        self.ffn_ratio = validate.integer("ffn_ratio", ffn_ratio, low=0)
        self.eps = validate.number("eps", eps, low=0, strict=True)
        self.seed = validate.integer("seed", seed, low=0)  # as every map and sweep: a seed is >= 0
        dt = validate.dtype("dtype", dtype)
        g = generator(self.seed, "transformer.W")
        self.register_buffer("W", (torch.randn(4, d, d, generator=g) / d**0.5).to(dt))  # Wq, Wk, Wv, Wo
        if self.ffn_ratio:
            g = generator(self.seed, "transformer.ffn")
            w = self.ffn_ratio * d
            self.register_buffer("W1", (torch.randn(w, d, generator=g) / d**0.5).to(dt))  # (r d, d)
            self.register_buffer("W2", (torch.randn(d, w, generator=g) / w**0.5).to(dt))  # (d, r d)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """(B, n, d) -> (B, n d)."""
        validate.samples("X", X, self.d, self.n)
        Wq, Wk, Wv, Wo = self.W
        Y = attention_sublayer(X.to(self.W.dtype), Wq, Wk, Wv, Wo, self.heads, self.eps)
        if self.ffn_ratio:
            Y = feed_forward_sublayer(Y, self.W1, self.W2, self.eps)
        return Y.reshape(X.shape[0], -1)

    def token_moves(self, X: torch.Tensor, positions: list[int]) -> OneTokenAttention | None:
        """The block with one token of X (B, n, d) moved, without the full forward.

        None with a feed-forward sublayer (its every row changes) or for n < 2.
        """
        if self.ffn_ratio or X.shape[1] < 2:
            return None
        Wq, Wk, Wv, Wo = self.W
        weights = {"Wq": Wq, "Wk": Wk, "Wv": Wv, "Wo": Wo}
        return OneTokenAttention(X.to(self.W.dtype), positions, weights, self.heads, self.eps)

    def extra_repr(self) -> str:
        """The block's sizes and seed for its repr."""
        return f"d={self.d}, heads={self.heads}, ffn_ratio={self.ffn_ratio}, seed={self.seed}"
