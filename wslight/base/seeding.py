"""Seed derivation: independent, reproducible generator seeds from one user seed plus integer salts.

Every random draw in the package (map weights, synthetic data, trial sampling, restarts) takes its generator seed from
`derive_seed(seed, salt, ...)`, so two streams never coincide by accident (a map with seed 0 and synthetic data with
seed 0 are independent) and no draw depends on the global RNG or on the number of devices.
"""

from __future__ import annotations

import zlib

import torch

from . import validate

_MASK = 2**64 - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def salt(name: str) -> int:
    """A stable integer for a name (crc32; Python's hash of str changes between processes)."""
    return zlib.crc32(name.encode())


def derive_seed(seed: int, *salts: int | str) -> int:
    """Mix `seed` (an int >= 0) with integer or string salts into a 63-bit generator seed.

    Raises:
        ValueError: a negative seed (`seed must be an integer >= 0`, the sweeps' message): every map, data module
            and sweep draws from here, so all of them refuse it alike.
    """
    validate.integer("seed", int(seed), low=0)
    x = _splitmix64(int(seed) & _MASK)
    for s in salts:
        x = _splitmix64(x ^ (salt(s) if isinstance(s, str) else int(s) & _MASK))
    return x >> 1


def generator(seed: int, *salts: int | str) -> torch.Generator:
    """A CPU torch.Generator seeded with derive_seed(seed, *salts)."""
    return torch.Generator().manual_seed(derive_seed(seed, *salts))
