"""Words the whole package shares: the attack's trainings (base floor: imports nothing)."""

# The two heads of the attack (docs/theory.md §5.2): fine-tuned on the moved sample, or re-trained on the training set
# and the moved sample.
TRAININGS = ("finetune", "retrain")
