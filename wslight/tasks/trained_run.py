"""A `train.py fit` run read back: its config, its fitted head (with its bias) and its test split.

`TrainedRun.load(run)` rebuilds what the run trained from the files it wrote, the saved `config.yaml` (the map's class
and arguments, the data's embeddings, n, d and split) and a checkpoint (the map's buffers, the head theta and the
bias), so an evaluation can ask questions of the model a user trained (docs/theory.md §13.4).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from ..data import EmbeddingSpec
from ..features import make_map, resolve_map
from .classifier import FeatureMapClassifier
from .datamodule import EmbeddingDataModule

CONFIG_NAME = "config.yaml"  # what LightningCLI saves in a run's log folder


@dataclass
class TrainedRun:
    """What a train.py run fitted, and where its held-out reviews are.

    Attributes:
        folder: the run's log folder (config.yaml, checkpoints/).
        checkpoint: the checkpoint the head was read from.
        model: the classifier, its map rebuilt and its weights loaded, in eval mode on the CPU.
        embeddings: the run's embedding spec (the reviews and their encoder).
        n: tokens per sample; d: embedding coordinates.
        test_indices: (N_test,) int64 positions of the run's test split in the embedding store, in its order.
        normalize: whether the run read its rows rescaled to norm sqrt(d) (data.init_args.normalize).
    """

    folder: Path
    checkpoint: Path
    model: FeatureMapClassifier
    embeddings: EmbeddingSpec
    n: int
    d: int
    test_indices: torch.Tensor
    normalize: bool = True

    @property
    def theta(self) -> torch.Tensor:
        """The fitted head, (p,) float64."""
        return self.model.theta.detach().double()

    @property
    def bias(self) -> float:
        """The fitted bias (0 for a head without one, the paper's)."""
        return 0.0 if self.model.bias is None else float(self.model.bias.detach())

    @classmethod
    def load(cls, run: str | Path, checkpoint: str = "last.ckpt") -> TrainedRun:
        """Read the run in folder `run` (or the run of the checkpoint file `run`) back.

        Args:
            run: the log folder train.py printed (`logs: ...`), holding config.yaml and checkpoints/; or a
                checkpoint file inside it.
            checkpoint: the file under `<run>/checkpoints/` to read when `run` is a folder.

        Raises:
            ValueError: naming the missing file or the setting this reading does not support.
        """
        path = Path(run)
        folder = path.parent.parent if path.is_file() else path
        ckpt = path if path.is_file() else folder / "checkpoints" / checkpoint
        config_file = folder / CONFIG_NAME
        if not config_file.is_file():
            raise ValueError(f"run: {folder} holds no {CONFIG_NAME}: give the log folder train.py printed (`logs:`)")
        if not ckpt.is_file():
            found = sorted(p.name for p in (folder / "checkpoints").glob("*.ckpt"))
            hint = (
                f"; it has {', '.join(found)} (choose one with checkpoint)"
                if found
                else (" (trainer.enable_checkpointing was false?): train with checkpoints on")
            )
            raise ValueError(f"checkpoint: {ckpt} does not exist{hint}")
        config = yaml.safe_load(config_file.read_text())
        data_args = dict(config["data"]["init_args"])
        spec = EmbeddingSpec(**data_args.pop("embeddings"))
        n, d = int(data_args["n"]), int(data_args["d"])
        model = FeatureMapClassifier.load_from_checkpoint(
            ckpt, feature_map=_rebuilt_map(config["model"]["init_args"]["feature_map"], n, d), map_location="cpu"
        ).eval()
        datamodule = EmbeddingDataModule(spec, **_split_args(data_args))
        datamodule.setup("test")
        return cls(folder, ckpt, model, spec, n, d, datamodule.test_indices, bool(data_args.get("normalize", True)))


def _rebuilt_map(entry: dict[str, Any], n: int, d: int) -> torch.nn.Module:
    """The run's map from its `{class_path, init_args}` (n and d were linked from the data by the command line)."""
    init_args = dict(entry.get("init_args") or {})
    seed = int(init_args.pop("seed", 0))
    for linked in ("n", "d"):
        init_args.pop(linked, None)
    cls = resolve_map(entry["class_path"], "model.feature_map").cls
    return make_map(cls, n, d, seed, **init_args)


def _split_args(data_args: dict[str, Any]) -> dict[str, Any]:
    """The data module's arguments that decide its samples and split (not its loaders)."""
    keep = ("n", "d", "normalize", "val_fraction", "test_fraction", "split_seed")
    return {k: data_args[k] for k in keep if k in data_args} | {"progress": False}
