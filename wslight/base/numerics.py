"""Numerics shared by the maps, the searches and the heads: sums whose last bits do not depend on the thread count.

Base floor: imports torch only.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Elements per chunk of `sum_last`: below torch's parallel grain size (32768), so a chunk is summed by one thread.
_SUM_CHUNK = 1024


def sum_last(x: Tensor) -> Tensor:
    """x.sum(-1) whose value does not depend on the number of CPU threads, (..., p) -> (...).

    On the CPU torch sums a reduction with a single output element and more than 32768 inputs in per-thread partial
    sums, so (phi * theta).sum(-1) for one sample gives different last bits with 1 or 2 threads (a 2-device DDP run
    uses half the threads of a 1-device run). Here the last dim is summed in chunks of 1024 (a reduction with several
    outputs is split over outputs only, each summed by one thread in a fixed order), then the chunk sums serially.
    """
    p = x.shape[-1]
    m = p // _SUM_CHUNK
    if m == 0:
        return x.sum(-1)
    head = x[..., : m * _SUM_CHUNK].unflatten(-1, (m, _SUM_CHUNK)).sum(-1)  # (..., m) chunk sums
    tail = x[..., m * _SUM_CHUNK :]  # (..., p mod 1024)
    return torch.cat([head, tail], dim=-1).sum(-1)  # fewer than 32768 + 1024 elements per output


def gram(Phi: Tensor, block: int = 64) -> Tensor:
    """Phi Phi^T, (..., N, p) -> (..., N, N), from the row blocks on and below the diagonal.

    About half the products of one matmul (the Gram matrix of the heads is the largest product of an attack cell); the
    blocks above the diagonal are the mirror of those below. Blocks of 64 rows: at N = 400, p = 15,360 (the attack
    benchmark's cell) 58% of the full product's multiplications, about 15% faster than blocks of 256 on one thread.
    """
    N = Phi.shape[-2]
    if N <= block:
        return Phi @ Phi.mT
    G = Phi.new_empty(*Phi.shape[:-1], N)
    for i0 in range(0, N, block):
        i1 = min(i0 + block, N)
        lower = Phi[..., i0:i1, :] @ Phi[..., :i1, :].mT  # (..., b, i1): block row i up to its diagonal block
        G[..., i0:i1, :i1] = lower
        G[..., :i0, i0:i1] = lower[..., :i0].mT
    return G.tril() + G.tril(-1).mT  # the diagonal blocks' lower triangles mirrored too: symmetric to the bit
