"""The result of a word-sensitivity estimate (`word_sensitivity`).

S per sample, its maximiser and the search's evidence (docs/theory.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class WSResult:
    """Per-sample word sensitivity and its maximiser (all tensors on the CPU).

    Fields are (B,) for one map and (T, B) for T trials (`FreshMaps`, or a list of maps).

    Attributes:
        ws: (B,) float64, S_phi(X) recomputed in float64 with the full map at the returned Delta.
        position: (B,) long, the token index i whose perturbation attains `ws`.
        delta: (B, d) float64, the maximising Delta (added to the clean token `position`).
        delta_norm: (B,) float64, ||delta|| (<= radius).
        phi_norm: (B,) float64, ||phi(X)|| of the clean sample.
        steps: (B,) long, the most ascent steps any chain of that sample ran.
        chains: (B,) long, chains run for that sample (every position and round): the search's evidence
            (docs/theory.md §4.3).
        near_best: (B,) long, how many of them ended within 1% of the best (in S); 1 means a lone best chain.
        bound: (B,) float64 upper bound on S at the realised ||Delta|| (RF: Lip ||V^(i)||_op ||Delta|| / ||phi||,
            docs/theory.md §3.2), or None for maps without one.
    """

    ws: Tensor
    position: Tensor
    delta: Tensor
    delta_norm: Tensor
    phi_norm: Tensor
    steps: Tensor
    chains: Tensor
    near_best: Tensor
    bound: Tensor | None = None

    def records(self) -> list[dict]:
        """One dict per sample (trial-major) with the results.jsonl fields of the search.

        The fields are position, ws, delta_norm, phi_norm, steps, chains, near_best.
        """
        return [
            {
                "position": int(position),
                "ws": float(ws),
                "delta_norm": float(delta_norm),
                "phi_norm": float(phi_norm),
                "steps": int(steps),
                "chains": int(chains),
                "near_best": int(near),
            }
            for position, ws, delta_norm, phi_norm, steps, chains, near in zip(
                self.position.flatten(),
                self.ws.flatten(),
                self.delta_norm.flatten(),
                self.phi_norm.flatten(),
                self.steps.flatten(),
                self.chains.flatten(),
                self.near_best.flatten(),
            )
        ]
