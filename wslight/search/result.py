"""What the searches return: a word-sensitivity estimate (`word_sensitivity`) and an exact substitution.

S per sample, its maximiser and the search's evidence (docs/theory/search.md §4); the best real word (§13).
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
            (docs/theory/search.md §4.3).
        near_best: (B,) long, how many of them ended within 1% of the best (in S); 1 means a lone best chain.
        bound: (B,) float64 upper bound on S at the realised ||Delta|| (RF: Lip ||V^(i)||_op ||Delta|| / ||phi||,
            docs/theory/maps.md §3.2), or None for maps without one.
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


@dataclass
class SubstitutionResult:
    """The exact best word per sample and position.

    All tensors on the CPU; a leading trial axis T for a list of maps, none for one map.

    Attributes:
        ws: (B, P) float64, the discrete word sensitivity S_words (NaN where no word is admissible).
        word: (B, P) long, the index (into the candidate rows) of the word that attains it; -1 where none.
        distance: (B, P) float64, ||h_w - x_i|| / sqrt(d) of that word (its realised move, in units of the radius).
        phi_norm: (B,) float64, ||phi(X)|| of the clean sample.
        admissible: (B, P) long, words evaluated (the admissible ones).
        flips: (B, P, C) long, admissible words that flip the sign of head c's output phi^T theta_c; None without
            heads.
        flip_word: (B, P, C) long, among them the one with the largest opposite output; -1 where none flips.
    """

    ws: Tensor
    word: Tensor
    distance: Tensor
    phi_norm: Tensor
    admissible: Tensor
    flips: Tensor | None = None
    flip_word: Tensor | None = None
