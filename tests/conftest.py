import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def unit_rows(B: int, n: int, d: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Gaussian tokens rescaled to norm sqrt(d) (the paper's input assumption), (B, n, d)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, n, d, generator=g, dtype=dtype)
    return X / X.norm(dim=-1, keepdim=True) * d**0.5


@pytest.fixture
def rows():
    return unit_rows
