"""Words the whole package shares: the attack's trainings (base floor: imports nothing of the package)."""

from typing import Literal

# The two heads of the attack (docs/theory/attack.md §5.2): fine-tuned on the moved sample, or re-trained on the
# training set and the moved sample.
Training = Literal["finetune", "retrain"]
TRAININGS: tuple[Training, ...] = ("finetune", "retrain")
