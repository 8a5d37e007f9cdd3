"""Frozen random feature maps of a text sample X (B, n, d): plain nn.Modules, no Lightning import."""

from .attention import RandomAttentionFeatures, ReLUAttentionFeatures
from .deep_rf import DeepRandomFeatures
from .rf import RandomFeatures

MAPS = {
    "rf": RandomFeatures,
    "deep_rf": DeepRandomFeatures,
    "raf": RandomAttentionFeatures,
    "relu_raf": ReLUAttentionFeatures,
}


def map_name(feature_map: object) -> str:
    """The short name ('rf', 'deep_rf', 'raf', 'relu_raf') of a feature map instance."""
    for name, cls in MAPS.items():
        if type(feature_map) is cls:
            return name
    raise ValueError(f"feature_map must be one of {sorted(MAPS)}, got {type(feature_map).__name__}")


def output_dim(feature_map: object, n: int) -> int:
    """Size p of phi(X) for n tokens."""
    name = map_name(feature_map)
    if name in ("raf", "relu_raf"):
        if feature_map.n is not None and feature_map.n != n:  # type: ignore[attr-defined]
            raise ValueError(f"n: the map was built for n={feature_map.n} tokens, got n={n}")  # type: ignore[attr-defined]
        return n * feature_map.d  # type: ignore[attr-defined]
    return feature_map.out_dim  # type: ignore[attr-defined]


__all__ = [
    "MAPS",
    "DeepRandomFeatures",
    "RandomAttentionFeatures",
    "RandomFeatures",
    "ReLUAttentionFeatures",
    "map_name",
    "output_dim",
]
