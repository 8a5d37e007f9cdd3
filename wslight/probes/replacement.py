"""Real one-word edits that approach the continuous Delta: snap x_i + Delta to vocabulary tokens.

Beyond the paper. Comparison space (a choice, documented): candidates are compared in the space of hidden_states[0]
at the perturbed position, i.e. each vocabulary token w is embedded as it would enter the first layer at position i,
h_w = LayerNorm(E_w + P_i + T_i) (word + position + token-type embeddings, then the embedding LayerNorm). This is the
space in which Delta is defined and injected, so ||h_w - (x_i + Delta)|| is exactly the distance between the realised
edit h_w - x_i and Delta; comparing raw word-embedding rows would ignore the LayerNorm, which rescales every token to
about the same norm and decides what the first layer sees.

Two candidate pools, each of size k:
* `nearest`: the k tokens whose h_w is nearest to x_i + Delta (Euclidean);
* `attention`: the k tokens whose h_w maximises the first layer's attention mass on key i (chosen heads), computed
  exactly for the whole vocabulary (only row and column i of the score matrix change).
Excluded: the original token, special and [unused] tokens, and tokens whose WordPiece continuation status ("##")
differs from the original token's, so that the edited sequence is one a tokenizer could produce.
"""

from __future__ import annotations

import torch

from ..data.vocabulary import allowed_tokens, vocab_hidden0
from ._common import first_self_attention
from .delta import _qk_params


@torch.no_grad()
def vocab_attention_mass(
    model, H0: torch.Tensor, position: int, hw: torch.Tensor, heads: list[int], chunk: int = 2048
) -> torch.Tensor:
    """First-layer attention mass on key `position` when x_position is replaced by each row of `hw`, exactly.

    Mean over all queries (the replaced token's own query included) and the chosen heads.

    Args:
        model: BERT-family encoder.
        H0: (n, d) clean hidden_states[0].
        position: replaced position.
        hw: (V, d) candidate rows in hidden_states[0] space.
        heads: head indices of the first layer.
        chunk: candidates per block (memory ~ chunk * heads * n floats).

    Returns:
        (V,) attention mass.
    """
    first_self_attention(model)
    Wq, bq, Wk, bk, dh = _qk_params(model, heads)
    n = H0.shape[0]
    Q = torch.einsum("nd,hed->hne", H0, Wq) + bq[:, None]  # (h, n, dh)
    K = torch.einsum("nd,hed->hne", H0, Wk) + bk[:, None]  # (h, n, dh)
    S = Q @ K.transpose(-1, -2) / dh**0.5  # (h, n, n)
    others = torch.ones(n, dtype=torch.bool)
    others[position] = False
    # Rows l != i keep their scores on keys j != i: log-sum-exp over those keys.
    lse_rows = torch.logsumexp(S[:, others][:, :, others], dim=-1)  # (h, n-1)
    K_oth = K[:, others]  # (h, n-1, dh)
    Q_oth = Q[:, others]  # (h, n-1, dh)
    out = []
    for w in torch.split(hw, chunk):
        kw = torch.einsum("vd,hed->vhe", w, Wk) + bk  # (C, h, dh)
        qw = torch.einsum("vd,hed->vhe", w, Wq) + bq  # (C, h, dh)
        s_col = torch.einsum("hle,vhe->vhl", Q_oth, kw) / dh**0.5  # (C, h, n-1): queries l != i on the new key
        a_col = torch.sigmoid(s_col - lse_rows)  # exp(s) / (exp(s) + sum_{j != i} exp(s_lj))
        s_ii = (qw * kw).sum(-1) / dh**0.5  # (C, h): the new query on the new key
        s_row = torch.einsum("vhe,hje->vhj", qw, K_oth) / dh**0.5  # (C, h, n-1): the new query on other keys
        a_ii = torch.sigmoid(s_ii - torch.logsumexp(s_row, dim=-1))  # (C, h)
        mass = (a_col.sum(-1) + a_ii) / n  # (C, h)
        out.append(mass.mean(-1))
    return torch.cat(out)


@torch.no_grad()
def replacement_candidates(
    model,
    tokenizer,
    H0: torch.Tensor,
    input_ids: torch.Tensor,
    position: int,
    delta: torch.Tensor,
    heads,
    k: int,
    token_type_id: int = 0,
) -> dict:
    """Candidate real replacement tokens for the token at `position` (two pools of k, see the module docstring).

    Args:
        model: the encoder.
        tokenizer: the encoder's tokenizer.
        H0: (n, d) clean hidden_states[0].
        input_ids: (n,) token ids of the text.
        position: replaced position ([CLS] at 0).
        delta: (d,) continuous perturbation.
        heads: head indices used for the attention pool.
        k: size of each pool.
        token_type_id: token type at `position` (0 for a single text).

    Returns:
        dict with `ids` (list[int], union of the pools, nearest first), `pool` (list[str]), `dist` (distance of h_w to
        x_i + Delta), `edit_norm` (||h_w - x_i||), `mass` (first-layer attention mass on key i).
    """
    orig = int(input_ids[position])
    hw = vocab_hidden0(model, position, token_type_id).to(H0.dtype)  # (V, d)
    ok = allowed_tokens(tokenizer, orig)[: hw.shape[0]]
    target = H0[position] + delta  # (d,)
    dist = (hw - target).norm(dim=-1)  # (V,)
    mass = vocab_attention_mass(model, H0, position, hw, heads)  # (V,)
    big = torch.finfo(dist.dtype).max
    near = torch.topk(-dist.masked_fill(~ok, big), k).indices.tolist()
    attn = torch.topk(mass.masked_fill(~ok, -1.0), k).indices.tolist()
    ids, pool = list(near), ["nearest"] * len(near)
    for i in attn:
        if i not in ids:
            ids.append(i)
            pool.append("attention")
    idx = torch.tensor(ids)
    return {
        "ids": ids,
        "tokens": tokenizer.convert_ids_to_tokens(ids),
        "pool": pool,
        "dist": dist[idx].tolist(),
        "edit_norm": (hw[idx] - H0[position]).norm(dim=-1).tolist(),
        "mass": mass[idx].tolist(),
    }
