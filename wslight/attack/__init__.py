"""The single-token Delta attack (docs/theory/attack.md §5-6): one token moved to change a trained head's answer.

Modules, from the top down:
- `delta`: `delta_attack` and `delta_attacks` (every training and loss of a trial in one search);
- `report`: the best restart per sample and objective, the heads' outputs there, and one record per sample;
- `settings`: `AttackSettings`, the optimiser's settings (steps, lr, restarts, faithful, position, radius, dtype),
  checked once, with their defaults and the authors' schedules;
- `inputs`: `AttackInputs`, the checked training set, context sample and resolved settings of a trial, and
  `draw_samples`, the seeded choice of the training and context samples;
- `losses`: the attack's objectives (`err`, `align`, `align_proj`, `penalized`);
- `heads`: the closed-form heads in N x N space (min-norm interpolator, fine-tuned and re-trained heads).
"""

from .delta import delta_attack, delta_attacks
from .heads import Heads, HeadScalars, fit_heads, min_norm_interpolator
from .inputs import AttackInputs, checked_inputs, draw_samples
from .losses import LOSSES, attack_objective
from .report import output_records
from .settings import AttackSettings

__all__ = [
    "LOSSES",
    "AttackInputs",
    "AttackSettings",
    "HeadScalars",
    "Heads",
    "attack_objective",
    "checked_inputs",
    "delta_attack",
    "delta_attacks",
    "draw_samples",
    "fit_heads",
    "min_norm_interpolator",
    "output_records",
]
