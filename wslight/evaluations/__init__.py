"""Evaluations run by `evaluate.py` (LightningModules over a list of trials) and the figures they share.

- `base`: the `Evaluation` base (trials sharded over devices, gathered, appended to results.jsonl, resumable).
- `ws_sweep`: `WordSensitivitySweep`, S over map x d x n x L (Figures 2-3).
- `words_sweep`: `WordSubstitutionSweep`, the exact best real word against the continuous S, and the heads it flips.
- `attack_sweep`: `DeltaAttackSweep` (Figures 4-5) and the attack records shared with `wslight.callbacks.DeltaAttack`.
- `probes`: the encoder probes (Figures 1 and 3) as evaluations.
- `figures`: the attack figures and `save_figure` (the tables and filters they read live in `wslight.records.summary`).
"""

from .attack_sweep import AttackCase, DeltaAttackSweep, attack_objectives, attack_records, run_attacks
from .base import EmbeddingsEvaluation, Evaluation, gather_records
from .figures import save_figure
from .probes import AttentionEditProbe, AttentionUnderDeltaProbe, LayerwiseChangeProbe
from .words_sweep import WordSubstitutionSweep
from .ws_sweep import WordSensitivitySweep

__all__ = [
    "AttackCase",
    "AttentionEditProbe",
    "AttentionUnderDeltaProbe",
    "DeltaAttackSweep",
    "EmbeddingsEvaluation",
    "Evaluation",
    "LayerwiseChangeProbe",
    "WordSensitivitySweep",
    "WordSubstitutionSweep",
    "attack_objectives",
    "attack_records",
    "gather_records",
    "run_attacks",
    "save_figure",
]
