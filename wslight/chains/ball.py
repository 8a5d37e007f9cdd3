"""The ball of Delta: the projection onto it and the ascent direction within it (docs/theory/search.md §4.2).

Shared by the word-sensitivity search, the maps' own starts and the Delta attack.
"""

from __future__ import annotations

import torch
from torch import Tensor


def project_ball(delta: Tensor, radius: float | Tensor) -> Tensor:
    """Project every Delta (..., d) onto the ball of the given radius around 0 (a tensor: broadcast, (..., 1))."""
    norm = delta.norm(dim=-1, keepdim=True)
    return delta * torch.where(norm > radius, radius / norm.clamp_min(1e-300), torch.ones_like(norm))


def tangent(x: Tensor, g: Tensor, radius: float | Tensor) -> Tensor:
    """The ascent direction of the gradient g (..., d) at x (..., d) in the ball of the given radius.

    g itself, or its tangential part where x sits on the sphere and g points outwards (docs/theory/search.md §4.2).
    """
    norm = x.norm(dim=-1, keepdim=True)
    unit = x / norm.clamp_min(1e-300)
    radial = (g * unit).sum(-1, keepdim=True)
    on_sphere = (norm >= radius * (1 - 1e-6)) & (radial > 0)
    return torch.where(on_sphere, g - radial * unit, g)


def tangent_unit(x: Tensor, g: Tensor, radius: float) -> Tensor:
    """`tangent` scaled to norm 1."""
    direction = tangent(x, g, radius)
    return direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-300)
