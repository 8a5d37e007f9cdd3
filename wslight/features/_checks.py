"""Argument checks shared by the feature maps: clear errors before any allocation."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def positive_int(name: str, value: object) -> int:
    """Return `value` if it is a positive int, else raise a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map 'float32'/'float64' (or the torch dtypes) to a torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")


def check_input(X: torch.Tensor, n: int | None, d: int) -> None:
    """Check that X is (B, n, d); `n=None` accepts any number of tokens."""
    if X.dim() != 3:
        raise ValueError(f"X must have shape (B, n, d), got shape {tuple(X.shape)}")
    if n is not None and X.shape[1] != n:
        raise ValueError(f"n: the map was built for n={n} tokens, got X with n={X.shape[1]}")
    if X.shape[2] != d:
        raise ValueError(f"d: the map was built for d={d}, got X with d={X.shape[2]}")


def check_position(position: int, n: int) -> int:
    """Check a token index in [0, n)."""
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < n:
        raise ValueError(f"position must be an integer in [0, {n - 1}], got {position!r}")
    return position
