"""Frozen random feature maps of a text sample X (B, n, d): plain nn.Modules, no Lightning import.

`make_map(name, n, d, seed, ...)` builds a registered map by name; `register_map` adds one (see the README's example).
"""

from .attention import RandomAttentionFeatures, ReLUAttentionFeatures
from .base import MAPS, FeatureMap, make_map, map_dims, map_name, output_dim, register_map
from .deep_rf import DeepRandomFeatures
from .fresh import FreshMaps
from .rf import RandomFeatures

__all__ = [
    "MAPS",
    "DeepRandomFeatures",
    "FeatureMap",
    "FreshMaps",
    "RandomAttentionFeatures",
    "RandomFeatures",
    "ReLUAttentionFeatures",
    "make_map",
    "map_dims",
    "map_name",
    "output_dim",
    "register_map",
]
