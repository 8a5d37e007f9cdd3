"""Any map's own forward in the dtype asked for: its features in float64, exact float64 copies, its weights' dtype.

What the engines need of a map as a plain module, whatever its family: the features the heads are fitted on, the
honest float64 value of an estimate, and the dtype a module computes in.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


def forward_in(m: nn.Module, X: Tensor, dtype: torch.dtype) -> Tensor:
    """m(X) computed in the map's own dtype, returned in `dtype`."""
    return m(X.to(weight_dtype(m, X.dtype))).to(dtype)


def weight_dtype(m: nn.Module, default: torch.dtype) -> torch.dtype:
    """The dtype a module computes in: its `weight_dtype`, else its first floating parameter or buffer, or `default`."""
    w = getattr(m, "weight_dtype", None)
    if isinstance(w, torch.dtype):
        return w
    t: Tensor | None = next((t for t in m.parameters() if t.is_floating_point()), None)
    t = t if t is not None else next((t for t in m.buffers() if t.is_floating_point()), None)
    return t.dtype if t is not None else default


@torch.no_grad()
def map_features(
    feature_map: nn.Module, X: Tensor, exact: bool = False, chunk: int = 256, out: Tensor | None = None
) -> Tensor:
    """phi(X) in float64, (M, n, d) -> (M, p), in chunks of samples.

    Args:
        feature_map: any map.
        X: (M, n, d) samples.
        exact: False: the map's own forward in its dtype, cast to float64 (the features the heads are fitted on);
            True: computed in float64 with the map's weights cast to float64 (the map's own `forward64` where it has
            one; the honest final value of an estimate).
        chunk: samples per forward pass.
        out: (M, p) float64 to write into (e.g. one trial's slice of a (T, M, p) stack: no second copy).
    """
    if exact:
        forward = getattr(feature_map, "forward64", None) or float64_forward(feature_map)
    else:
        forward = lambda x: forward_in(feature_map, x, torch.float64)  # noqa: E731
    if out is None:
        return torch.cat([forward(X[s : s + chunk]) for s in range(0, X.shape[0], chunk)])
    for s in range(0, X.shape[0], chunk):
        out[s : s + chunk] = forward(X[s : s + chunk])
    return out


def trial_features(maps: Sequence[nn.Module], X: Tensor) -> Tensor:
    """phi(X[t]) by map t, float64 as `map_features`: (T, M, n, d) -> (T, M, p).

    Written in place (no stacking copy of what can be hundreds of MB).
    """
    first = map_features(maps[0], X[0])
    out = first.new_empty(len(maps), *first.shape)
    out[0] = first
    for t in range(1, len(maps)):
        map_features(maps[t], X[t], out=out[t])
    return out


def float64_forward(feature_map: nn.Module) -> Callable[[Tensor], Tensor]:
    """The forward of a float64 copy of the map (its weights cast): x -> phi(x) in float64."""
    return double_forward(copy.deepcopy(feature_map).to(torch.float64))


def double_forward(double: nn.Module) -> Callable[[Tensor], Tensor]:
    """The forward of a map already cast to float64: x -> double(x) in float64."""
    return lambda x: double(x.to(torch.float64))
