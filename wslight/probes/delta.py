"""The attention-attracting perturbation Delta of one token at the input of a BERT encoder's first layer.

Paper (docs/theory/probes.md §7.4, inferred construction; the paper does not give its exact recipe): the RAF proof idea,
where Delta aligned with W^T sum_l x_l makes key i win every query's softmax, transposed to a real head with
W <-> W_Q^{hT} W_K^h. Two variants:

* `closed_form_delta`: Delta = c * W_K^T sum_l q_l / ||.||, summed over the chosen heads. It maximises, at fixed norm c,
  the total first-order rise of the scores q_l . k_i over all queries l and chosen heads.
* `optimised_delta`: projected gradient ascent of the mean attention mass that the queries put on key i in the first
  layer (chosen heads), on the ball ||Delta|| <= c, started from the closed form.

All tensors live in the space of hidden_states[0] (the embedding layer's output, after its LayerNorm), where the
probes inject Delta.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ..base import validate
from ._common import check_heads, check_index, first_self_attention


def _qk_params(model, heads: list[int]):
    """Per-head query/key weights of the first layer.

    Returns:
        Wq, bq, Wk, bk: (h, dh, d), (h, dh), (h, dh, d), (h, dh) for the chosen heads; and dh.
    """
    sa = first_self_attention(model)
    query, key = cast(nn.Linear, sa.query), cast(nn.Linear, sa.key)  # BERT's projections, with biases
    num_heads = int(model.config.num_attention_heads)
    d = query.weight.shape[1]
    dh = query.weight.shape[0] // num_heads
    idx = torch.tensor(heads)
    Wq = query.weight.detach().view(num_heads, dh, d)[idx]  # (h, dh, d)
    Wk = key.weight.detach().view(num_heads, dh, d)[idx]  # (h, dh, d)
    bq = query.bias.detach().view(num_heads, dh)[idx]  # (h, dh)
    bk = key.bias.detach().view(num_heads, dh)[idx]  # (h, dh)
    return Wq, bq, Wk, bk, dh


def first_layer_attention(model, H0: torch.Tensor, heads=None) -> torch.Tensor:
    """Softmax attention of the first layer's chosen heads computed from hidden_states[0] (no padding mask).

    Args:
        model: BERT-family encoder.
        H0: (B, n, d) input of the first attention layer.
        heads: None (all), an int or a list of head indices.

    Returns:
        (B, h, n, n) attention probabilities, rows = queries, columns = keys (equal to the encoder's
        `attentions[0][:, heads]` for an unpadded input).
    """
    heads = check_heads(heads, int(model.config.num_attention_heads))
    Wq, bq, Wk, bk, dh = _qk_params(model, heads)
    Wq, bq, Wk, bk = (t.to(H0.dtype) for t in (Wq, bq, Wk, bk))
    Q = torch.einsum("bnd,hed->bhne", H0, Wq) + bq[None, :, None]  # (B, n, d) x (h, dh, d) -> (B, h, n, dh)
    K = torch.einsum("bnd,hed->bhne", H0, Wk) + bk[None, :, None]  # (B, h, n, dh)
    S = Q @ K.transpose(-1, -2) / dh**0.5  # (B, h, n, dh) @ (B, h, dh, n) -> (B, h, n, n)
    return torch.softmax(S, dim=-1)


def attention_mass(model, H0: torch.Tensor, position: int, heads=None) -> torch.Tensor:
    """Mean over queries and chosen heads of the attention put on key `position`: (B,) from H0 (B, n, d)."""
    A = first_layer_attention(model, H0, heads)  # (B, h, n, n)
    return A[..., position].mean(dim=(-1, -2))  # (B,)


def _check(model, H0: torch.Tensor, position: int, heads, norm):
    if H0.dim() != 2:
        raise ValueError(f"H0 must be the (n, d) hidden_states[0] of one text, got shape {tuple(H0.shape)}")
    check_index("position", position, H0.shape[0], f"tokenised text of {H0.shape[0]} tokens, [CLS] at 0")
    heads = check_heads(heads, int(model.config.num_attention_heads))
    validate.number("delta_norm", norm, low=0, strict=True, allow_none=True)
    c = float(H0[position].norm()) if norm is None else float(norm)
    return heads, c


@torch.no_grad()
def closed_form_delta(model, H0: torch.Tensor, position: int, heads=None, norm: float | None = None) -> torch.Tensor:
    """Closed-form attention-attracting Delta (docs/theory/probes.md §7.4, inferred).

    Delta = c * u / ||u||, u = sum_{h in heads} W_K^{hT} sum_l q_l^h, with q_l^h = W_Q^h x_l + b_Q^h the clean queries
    of every position l (the perturbed token's own query included, taken at its clean value).

    Args:
        model: BERT-family encoder.
        H0: (n, d) clean hidden_states[0] of one text.
        position: perturbed token (index in the tokenised sequence, [CLS] at 0).
        heads: None (all heads, summed), an int or a list of head indices of the first layer.
        norm: ||Delta||; None = ||x_position|| (the analogue of sqrt(d) under the paper's input assumption).

    Returns:
        (d,) Delta with ||Delta|| = norm.
    """
    heads, c = _check(model, H0, position, heads, norm)
    Wq, bq, Wk, _, _ = _qk_params(model, heads)
    H0 = H0.to(Wq.dtype)
    q_sum = torch.einsum("nd,hed->he", H0, Wq) + H0.shape[0] * bq  # (h, dh): sum over queries l of q_l^h
    # Paper: RAF proof, Delta along W^T sum_l x_l; here W_K^{hT} sum_l q_l^h summed over heads.
    u = torch.einsum("he,hed->d", q_sum, Wk)  # (h, dh) x (h, dh, d) -> (d,)
    return c * u / u.norm()


def optimised_delta(
    model,
    H0: torch.Tensor,
    position: int,
    heads=None,
    norm: float | None = None,
    steps: int = 100,
    lr: float = 0.1,
) -> tuple[torch.Tensor, dict]:
    """Projected gradient ascent of the first layer's attention mass on key `position` over ||Delta|| <= norm.

    Objective: mean over queries l (all n, the perturbed token's own query included, which also moves with Delta)
    and chosen heads h of A^h_{l, position}(X + e_position Delta^T). Normalised gradient steps of length lr * norm,
    projection onto the ball, start from `closed_form_delta`; the best iterate is returned.

    Args:
        model: BERT-family encoder.
        H0: (n, d) clean hidden_states[0].
        position: perturbed token ([CLS] at 0).
        heads: None (all), an int or a list of head indices.
        norm: radius of the ball; None = ||x_position||.
        steps: ascent steps.
        lr: step length as a fraction of the radius.

    Returns:
        (Delta (d,), info dict with `mass_init`, `mass`, `norm`, `steps`).
    """
    heads, c = _check(model, H0, position, heads, norm)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
    validate.number("lr", lr, low=0, strict=True)
    H0 = H0.detach().float()
    e = torch.zeros(H0.shape[0], 1)
    e[position] = 1.0

    def mass(delta):
        return attention_mass(model, (H0 + e * delta)[None], position, heads)[0]  # (n, d) + (n, 1) * (d,)

    delta = closed_form_delta(model, H0, position, heads, c).float().requires_grad_(True)
    with torch.no_grad():
        best_mass = mass(delta).item()
    mass_init, best = best_mass, delta.detach().clone()
    for _ in range(steps):
        m = mass(delta)
        (g,) = torch.autograd.grad(m, delta)
        with torch.no_grad():
            if m.item() > best_mass:
                best_mass, best = m.item(), delta.detach().clone()
            delta += lr * c * g / g.norm().clamp_min(1e-30)
            delta *= (c / delta.norm()).clamp(max=1.0)  # projection onto ||Delta|| <= c
    with torch.no_grad():
        final = mass(delta).item()
        if final > best_mass:
            best_mass, best = final, delta.detach().clone()
    return best, {"mass_init": mass_init, "mass": best_mass, "norm": float(best.norm()), "steps": steps}
