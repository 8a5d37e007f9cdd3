"""Frozen random feature maps of a text sample X (B, n, d): plain nn.Modules, no Lightning import.

`make_map(name, n, d, seed, ...)` builds a registered map by name; `register_map` adds one (see the README's example).
`resolve_map` turns a sweep's `maps` entry (a name, a dotted path `module.Class` or a class_path dict) into its class.
"""

from .attention import RandomAttentionFeatures, ReLUAttentionFeatures
from .base import (
    MAPS,
    FeatureMap,
    TokenwiseMap,
    family_defaults,
    make_map,
    map_dims,
    map_name,
    output_dim,
    register_map,
)
from .deep_rf import DeepRandomFeatures
from .elementwise import LinearAttentionFeatures as LinearAttentionFeatures
from .elementwise import SigmoidAttentionFeatures as SigmoidAttentionFeatures
from .encoder import PretrainedEncoder as PretrainedEncoder
from .entries import MapEntry, resolve_map, resolve_maps
from .fresh import FreshMaps, trial_maps
from .multihead import MultiHeadRAF as MultiHeadRAF
from .multihead import MultiHeadRAF12 as MultiHeadRAF12
from .pretrained import PretrainedAttention as PretrainedAttention
from .pretrained import PretrainedAttentionBERT as PretrainedAttentionBERT
from .rf import RandomFeatures
from .transformer import RandomTransformerBlock as RandomTransformerBlock

__all__ = [
    "family_defaults",
    "MAPS",
    "DeepRandomFeatures",
    "FeatureMap",
    "MapEntry",
    "TokenwiseMap",
    "FreshMaps",
    "trial_maps",
    "RandomAttentionFeatures",
    "RandomFeatures",
    "ReLUAttentionFeatures",
    "make_map",
    "map_dims",
    "map_name",
    "output_dim",
    "register_map",
    "resolve_map",
    "resolve_maps",
]
