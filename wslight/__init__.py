"""wslight: word sensitivity of random features and random attention features (Bombari & Mondelli, ICML 2024).

Where to start:

- Command line: `wslight fit --config configs/raf.yaml` (= `python train.py fit ...`) trains a linear head on a
  frozen map; `wslight evaluate --config configs/ws/raf.yaml` (= `python evaluate.py ...`) runs a word-sensitivity
  sweep, the Δ attack or a probe and prints `results: <path to results.jsonl>`; `wslight reproduce` runs the offline
  reproduction and writes a report. Add `--help` to any of them; `--debug` shows a traceback for a config error.
- Maps: `wslight.features` (`RandomFeatures`, `DeepRandomFeatures`, `RandomAttentionFeatures`,
  `ReLUAttentionFeatures`, `make_map`, `register_map` for your own).
- Word sensitivity of any map: `wslight.search.word_sensitivity(map, X)`, the exact best word:
  `wslight.search.word_substitution`; the attack: `wslight.attack.delta_attack`, its heads: `wslight.attack.heads`.
- Lightning pieces (`wslight.tasks`): `FeatureMapClassifier`, `EmbeddingDataModule`, `DeltaAttackCallback`, the sweeps
  (`WordSensitivitySweep`, `WordSubstitutionSweep`, `DeltaAttackSweep`) and the probes; `wslight.app.cli.main`.
"""

__version__ = "0.1.0"
