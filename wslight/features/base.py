"""The FeatureMap base, the registry of named maps and `make_map`, the one factory of sweeps, callbacks and benchmarks.

A map is any `nn.Module` that takes token embeddings X (B, n, d) to features (B, p) and exposes `d` (and `n` when it is
built for one length). Subclassing `FeatureMap` and registering a name (`@register_map("name")`) makes a map buildable
by name from a config; a subclass may also provide its own single-token algebra (`token_class`) and a float64
forward (`forward64`), otherwise the estimators differentiate its full forward
(`wslight.features.single_token.GenericToken`) and recompute final values on a float64 copy.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from .. import validate

MAPS: dict[str, type[FeatureMap]] = {}


def register_map(name: str) -> Callable[[type[FeatureMap]], type[FeatureMap]]:
    """Class decorator: make the map buildable as `make_map(name, ...)` and in the sweeps' `maps:` lists."""

    def register(cls: type[FeatureMap]) -> type[FeatureMap]:
        old = MAPS.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            # the same class defined again (a notebook cell re-run) replaces itself; another class is refused
            raise ValueError(f"map name {name!r} is already registered to {old.__qualname__}")
        cls.map_name = name
        MAPS[name] = cls
        return cls

    return register


class FeatureMap(nn.Module):
    """Base of the maps phi: (B, n, d) -> (B, p), with frozen random weights held as buffers.

    Attributes:
        d: embedding dimension.
        n: number of tokens the map is built for, or None when it accepts any n.
        map_name: the registered name ("" for an unregistered subclass).
    """

    map_name: ClassVar[str] = ""
    d: int
    n: int | None = None

    def out_dim(self, n: int | None = None) -> int:
        """Size p of phi(X) for n tokens (None: the map's own n)."""
        raise NotImplementedError

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype of the map's weights (the dtype its forward computes in)."""
        for t in self.buffers():
            if t.is_floating_point():
                return t.dtype
        return torch.float32

    @property
    def weight_device(self) -> torch.device:
        for t in self.buffers():
            return t.device
        return torch.device("cpu")

    # the map family's single-token algebra (a wslight.features.single_token.SingleToken subclass); None: the
    # generic autograd path through the full forward
    token_class: ClassVar[type | None] = None

    @classmethod
    def for_cell(
        cls,
        n: int,
        d: int,
        seed: int,
        depth: int = 2,
        width_ratio: float = 1.0,
        dtype: Literal["float32", "float64"] = "float32",
        **options: Any,
    ) -> FeatureMap:
        """The map of one sweep cell; the default passes on the arguments the constructor takes."""
        given = {"n": n, "d": d, "seed": seed, "depth": depth, "dtype": dtype, **options}
        params = inspect.signature(cls.__init__).parameters
        return cls(**{k: v for k, v in given.items() if k in params})


class TokenwiseMap(FeatureMap):
    """A map with one d-dimensional output row per token (p = n d) that accepts any number of tokens (attention
    layers): `n` is None unless fixed, and a sweep's map serves every n of its grid."""

    def set_dims(self, d: int, n: int | None) -> None:
        """Check and keep d and the optional fixed n (None: any number of tokens)."""
        self.d = validate.positive_int("d", d)
        self.n = None if n is None else validate.positive_int("n", n)

    def out_dim(self, n: int | None = None) -> int:
        n = self.n if n is None else n
        if n is None:
            raise ValueError("n: this map accepts any number of tokens; give n to out_dim")
        return n * self.d

    @classmethod
    def for_cell(
        cls, n, d, seed, depth=2, width_ratio=1.0, dtype: Literal["float32", "float64"] = "float32", **options: Any
    ) -> FeatureMap:
        """A sweep cell's map: built for d alone (any number of tokens), so one map serves every n of a grid."""
        return cls(d, seed=seed, dtype=dtype, **options)


def make_map(
    name: str,
    n: int,
    d: int,
    seed: int = 0,
    depth: int = 2,
    width_ratio: float = 1.0,
    dtype: Literal["float32", "float64"] = "float32",
    device: str | torch.device | None = None,
    **options: Any,
) -> FeatureMap:
    """Build the registered map `name` for n tokens of dimension d, on `device`.

    Args:
        name: a registered map ("rf", "deep_rf", "raf", "relu_raf", or one added with `register_map`).
        n: context length.
        d: embedding dimension.
        seed: seed of the map's own generator.
        depth: depth L of deep maps.
        width_ratio: RF neurons (and DeepRF widths) = max(1, round(width_ratio * n d)); the paper: 1.
        dtype: "float32" or "float64".
        device: where the map's weights live; a map whose constructor takes `device` draws them there (too large to
            pass through the CPU), any other is built on the CPU and moved.
        options: further constructor arguments of that map.
    """
    cls = MAPS[validate.choice("map", name, sorted(MAPS))]
    if device is not None and "device" in inspect.signature(cls.__init__).parameters:
        options["device"] = device
    fmap = cls.for_cell(n=n, d=d, seed=seed, depth=depth, width_ratio=width_ratio, dtype=dtype, **options)
    return fmap if device is None else fmap.to(device)


def map_name(feature_map: nn.Module) -> str:
    """The registered name of a map, or its class name for any other module."""
    name = getattr(type(feature_map), "map_name", "")
    return name or type(feature_map).__name__


def map_dims(feature_map: nn.Module) -> tuple[int, int | None]:
    """(d, n or None) of any map; a module without an int `d` is refused with a clear error."""
    d = getattr(feature_map, "d", None)
    if not isinstance(feature_map, nn.Module) or not isinstance(d, int):
        raise ValueError(
            "feature_map must be an nn.Module mapping (B, n, d) to (B, p) with an int attribute `d` (and `n` when it "
            f"is built for one length), got {type(feature_map).__name__}"
        )
    n = getattr(feature_map, "n", None)
    return d, n if isinstance(n, int) else None


def output_dim(feature_map: nn.Module, n: int) -> int:
    """Size p of phi(X) for n tokens; for a plain module, from one forward pass on zeros."""
    d, n_map = map_dims(feature_map)
    if n_map is not None and n_map != n:
        raise ValueError(f"n: the map was built for n={n_map} tokens, got n={n}")
    if isinstance(feature_map, FeatureMap):
        return feature_map.out_dim(n)
    p = next(iter(feature_map.buffers()), None)
    dev, dt = (p.device, p.dtype) if p is not None and p.is_floating_point() else ("cpu", torch.float32)
    with torch.no_grad():
        return int(feature_map(torch.zeros(1, n, d, device=dev, dtype=dt)).shape[-1])
