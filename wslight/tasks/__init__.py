"""The Lightning floor: every LightningModule, callback and evaluation of the package, and the DataModule.

- `classifier`: `FeatureMapClassifier`, a frozen map with a trainable linear head (`train.py fit`);
- `datamodule`: `EmbeddingDataModule`, token embeddings of reviews for training;
- `attack_callback`: `DeltaAttackCallback`, the Delta attack run on a fitted head after `fit`/`test`;
- `evaluation`: the `Evaluation` base of `evaluate.py` (trials sharded over devices, gathered, appended to
  results.jsonl, resumable); `embeddings_evaluation`: `EmbeddingsEvaluation`, its base for token embeddings;
- `grid_settings`: `GridSettings`, the map x d x n x L grid both word-sensitivity sweeps walk, and its trials;
- `grid`: `MapGridEvaluation`, the evaluation over that grid with the search's settings;
- `sensitivity_sweep`: `WordSensitivitySweep`, S over the grid (Figures 2-3);
- `substitution_sweep`: `WordSubstitutionSweep`, the exact best real word against the continuous S, and the heads it
  flips;
- `trained_run`, `trained_head_words`: a train.py run read back (`TrainedRun`), and `TrainedHeadWords`, the words
  that flip its trained head; `head_word_flips`: `HeadWordFlips`, the same after `fit`/`test`;
- `attack_sweep`: `DeltaAttackSweep` (Figures 4-5) and the attack records shared with `DeltaAttackCallback`;
- `probes`: the encoder probes (Figures 1 and 3) as evaluations;
- `figures`: the attack figures and `save_figure`;
- `finetune`: `SequenceClassifierFineTune`, a pre-trained encoder fine-tuned end to end, and `ReviewTextDataModule`.
"""

from .attack_callback import DeltaAttackCallback
from .attack_sweep import AttackCase, DeltaAttackSweep, attack_objectives, attack_records, run_attacks
from .classifier import FeatureMapClassifier, TrainingDiverged
from .classifier_words import ClassifierWords
from .datamodule import EmbeddingDataModule, EmbeddingDataset, split_indices
from .embeddings_evaluation import EmbeddingsEvaluation
from .evaluation import Evaluation
from .figures import save_figure
from .finetune import ReviewTextDataModule, SequenceClassifierFineTune
from .grid_settings import GridSettings
from .head_word_flips import HeadWordFlips
from .probes import AttentionEditProbe, AttentionUnderDeltaProbe, LayerwiseChangeProbe
from .sensitivity_sweep import WordSensitivitySweep
from .steps import gather_records
from .substitution_sweep import WordSubstitutionSweep
from .trained_head_words import TrainedHeadWords
from .trained_run import TrainedRun

__all__ = [
    "DeltaAttackCallback",
    "EmbeddingDataModule",
    "EmbeddingDataset",
    "FeatureMapClassifier",
    "ReviewTextDataModule",
    "SequenceClassifierFineTune",
    "TrainingDiverged",
    "split_indices",
    "AttackCase",
    "ClassifierWords",
    "AttentionEditProbe",
    "AttentionUnderDeltaProbe",
    "DeltaAttackSweep",
    "EmbeddingsEvaluation",
    "GridSettings",
    "Evaluation",
    "LayerwiseChangeProbe",
    "WordSensitivitySweep",
    "TrainedHeadWords",
    "HeadWordFlips",
    "TrainedRun",
    "WordSubstitutionSweep",
    "attack_objectives",
    "attack_records",
    "gather_records",
    "run_attacks",
    "save_figure",
]
