"""The main job (`make reproduce`): grows into the full offline reproduction; for now the four maps on a batch."""

from __future__ import annotations

import argparse

import torch

from .features import DeepRandomFeatures, RandomAttentionFeatures, RandomFeatures, ReLUAttentionFeatures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", type=int, default=0, help="1: paper-size configs (GPU machine with hub access)")
    parser.parse_args(argv)
    n, d = 16, 64
    g = torch.Generator().manual_seed(0)
    X = torch.randn(8, n, d, generator=g)
    X = X / X.norm(dim=-1, keepdim=True) * d**0.5
    for m in (
        RandomFeatures(n, d),
        DeepRandomFeatures(n, d, depth=2),
        RandomAttentionFeatures(d),
        ReLUAttentionFeatures(d),
    ):
        phi = m(X)
        print(f"{type(m).__name__:>24}: phi {tuple(phi.shape)}, mean ||phi|| = {phi.norm(dim=1).mean():.3f}")


if __name__ == "__main__":
    main()
