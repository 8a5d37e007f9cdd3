"""The chains a word-sensitivity search keeps across its rounds, and their float64 values (docs/theory/search.md §4.3).

A search keeps the FINAL_CANDIDATES best chains of each sample by its working-dtype objective; their S is recomputed in
float64 with the full map and the largest is reported (a float32 objective can be off at a discontinuity of the map).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..chains.engine import near_best

# The best chains (by the working-dtype objective) whose S is recomputed in float64; the largest is reported
FINAL_CANDIDATES = 4


@dataclass
class KeptChains:
    """The best chains of one chunk's rounds so far, per (trial, sample), and what the next round is decided on."""

    f: Tensor  # (T, B, K) float64 the FINAL_CANDIDATES best chains' objectives, best first
    x: Tensor  # (T, B, K, d) float64 their Delta
    j: Tensor  # (T, B, K) their positions' indices
    s: Tensor  # (T, B, K, d) float64 where those chains started
    steps: Tensor  # (T, B) most steps of a chain
    values: list[Tensor]  # per round, (T, B, P R) every chain's best objective (-inf: not run)
    chains: int = 0  # per (sample, position), of the trials still running
    near: Tensor | None = None  # (T, B) chains within NEAR_BEST of the best, after the last round merged

    @classmethod
    def empty(cls, T: int, B: int, d: int) -> KeptChains:
        """No chain kept yet for T trials x B samples of dimension d."""
        K = FINAL_CANDIDATES
        return cls(
            f=torch.full((T, B, K), -math.inf, dtype=torch.float64),
            x=torch.zeros(T, B, K, d, dtype=torch.float64),
            j=torch.zeros(T, B, K, dtype=torch.long),
            s=torch.zeros(T, B, K, d, dtype=torch.float64),
            steps=torch.zeros(T, B, dtype=torch.long),
            values=[],
        )

    def merge(self, f_k: Tensor, x_k: Tensor, steps_k: Tensor, st_k: Tensor, sub_k: Tensor) -> Tensor:
        """Merge a round's chains of the trials sub_k into the kept ones; returns each sample's gain of S, (T, B).

        f_k (T', B, P, R) the chains' best objectives, x_k (T', B, P, R, d) their points, steps_k their steps, st_k
        their starts. The first round gains on nothing (before = -inf), so a second round always follows.
        """
        T, B, K = self.f.shape
        d = self.x.shape[-1]
        P, R = f_k.shape[2], f_k.shape[-1]
        f_round = torch.full((T, B, P * R), -math.inf, dtype=torch.float64)
        f_round[sub_k] = f_k.reshape(len(sub_k), B, P * R)
        self.values.append(f_round)
        before = self.f[..., 0].clone()
        # merge this round's best chains into the kept ones
        f_new, i_new = f_round[sub_k].topk(min(K, P * R), dim=-1)  # (T', B, k)
        x_flat = x_k.reshape(len(sub_k), B, P * R, d)
        pick = i_new[..., None].expand(-1, -1, -1, d).to(x_flat.device)
        x_new = x_flat.gather(2, pick).cpu().to(torch.float64)
        s_new = st_k.reshape(len(sub_k), B, P * R, d).gather(2, pick).cpu().to(torch.float64)
        f_all = torch.cat([self.f[sub_k], f_new], dim=-1)
        self.f[sub_k], order = f_all.topk(K, dim=-1)
        self.x[sub_k] = torch.cat([self.x[sub_k], x_new], dim=2).gather(2, order[..., None].expand(-1, -1, -1, d))
        self.s[sub_k] = torch.cat([self.s[sub_k], s_new], dim=2).gather(2, order[..., None].expand(-1, -1, -1, d))
        self.j[sub_k] = torch.cat([self.j[sub_k], i_new // R], dim=-1).gather(2, order)
        self.steps[sub_k] = torch.maximum(self.steps[sub_k], steps_k.reshape(len(sub_k), B, -1).max(dim=-1).values)
        self.chains += R
        self.near = near_best(torch.cat(self.values, dim=-1), self.f[..., 0], squared=True)
        # on S, not S^2
        return (self.f[..., 0].clamp_min(0) / before.clamp_min(1e-300)).sqrt() - 1


def candidate_values(
    exact: Callable[[Tensor], Tensor] | None, X: Tensor, position: Tensor, delta: Tensor
) -> tuple[Tensor, Tensor]:
    """S and ||phi(X)|| of every candidate with the full maps in float64.

    The clean samples and all the candidates' perturbed ones in one pass per trial: position (T, B, K), delta (T, B,
    K, d) -> (T, B, K) twice.
    """
    assert exact is not None  # only algebras with an exact64 (which fills S) come without it
    T, B, K = position.shape
    X64 = X.to(torch.float64)
    Xp = X64[:, :, None].repeat(1, 1, K, 1, 1)  # (T, B, K, n, d)
    t_idx, b_idx, k_idx = torch.meshgrid(torch.arange(T), torch.arange(B), torch.arange(K), indexing="ij")
    Xp[t_idx, b_idx, k_idx, position.to(X.device)] += delta.to(X.device)
    phi = exact(torch.cat([X64, Xp.flatten(1, 2)], dim=1))  # (T, B + B K, p)
    phi0, phi1 = phi[:, :B].cpu(), phi[:, B:].cpu().reshape(T, B, K, -1)
    phi_norm = phi0.norm(dim=-1)[..., None].expand(T, B, K)
    return (phi1 - phi0[:, :, None]).norm(dim=-1) / phi_norm, phi_norm.contiguous()
