"""Building blocks of the word-sensitivity search's starting points (docs/theory/search.md §4.2-4.3).

The top curvature direction at the clean token and seeded Gaussian draws (one stream per trial seed and position). The
row, removal and self-capture helpers of maps with one output row per token sit beside the maps, in
`wslight.features.rows`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..base.seeding import generator


def top_curvature(
    objective: Callable[[Tensor], Tensor],
    v: Tensor,
    iters: int,
    product: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Top eigenvector of the Hessian of f at Delta = 0 by power iteration, for every (sample, position).

    f(0) = 0 and grad f(0) = 0, so the Hessian there is 2 J^T J with J the Jacobian of phi(X^i(Delta)) in Delta: its top
    eigenvector is the direction in which the features move fastest, and the one a small-step ascent from a point near
    the clean token (the authors' procedure) drifts to.

    Args:
        objective: (B, P, R, d) -> (B, P, R).
        v: (B, P, 1, d) start vectors.
        iters: power iterations (one Hessian-vector product each).
        product: v -> H v in closed form (the token's `curvature_product`); None: by double backward of `objective`.

    Returns:
        (B, P, 1, d) unit vectors.
    """
    zero = torch.zeros_like(v)
    v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    for _ in range(iters):
        if product is not None:
            hv = product(v)
        else:
            with torch.enable_grad():
                x = zero.clone().requires_grad_(True)
                (g,) = torch.autograd.grad(objective(x).sum(), x, create_graph=True)
                (hv,) = torch.autograd.grad((g * v).sum(), x)
        norm = hv.norm(dim=-1, keepdim=True)
        v = torch.where(norm > 0, hv / norm.clamp_min(1e-300), v)
    return v.detach()


def seeded_draws(seeds: list[int], pos: list[int], B: int, count: int, d: int, *round_: int | str) -> Tensor:
    """(T, B, P, count, d) Gaussian draws, one stream per trial seed and position (and round after the first).

    So a chain does not depend on the chunking, the other positions or the other trials.
    """
    return torch.stack(
        [
            torch.stack([torch.randn(B, count, d, generator=generator(s, "ws.init", p, *round_)) for p in pos], dim=1)
            for s in seeds
        ]
    )
