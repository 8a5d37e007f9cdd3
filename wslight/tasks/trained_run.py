"""A `train.py fit` run read back: its config, its fitted head (with its bias) and its test split.

`TrainedRun.load(run)` rebuilds what the run trained from the files it wrote, the saved `config.yaml` (the map's class
and arguments, the data's embeddings, n, d and split) and a checkpoint (the map's buffers, the head theta and the
bias), so an evaluation can ask questions of the model a user trained (docs/theory/words.md §13.4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from ..data import EmbeddingSpec
from ..features import make_map, resolve_map
from ..records.shards import results_files
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
        if not folder.exists():
            raise ValueError(
                f"run={run}: no such folder; give the log folder train.py fit printed (`logs: <folder>`) or a "
                "checkpoint file inside it"
            )
        if not config_file.is_file():
            raise ValueError(f"run: {folder} holds no {CONFIG_NAME}: give the log folder train.py printed (`logs:`)")
        config = yaml.safe_load(config_file.read_text()) or {}
        _check_train_run(folder, config)
        data_args = dict(config["data"]["init_args"])
        _check_test_split(folder, data_args.get("test_fraction"), None)
        found = sorted(p.name for p in (folder / "checkpoints").glob("*.ckpt"))
        if not ckpt.is_file():
            hint = (
                f"; it has {', '.join(found)} (choose one with checkpoint)"
                if found
                else (" (trainer.enable_checkpointing was false?): train with checkpoints on")
            )
            raise ValueError(f"checkpoint: {ckpt} does not exist{hint}")
        spec = EmbeddingSpec(**data_args.pop("embeddings"))
        n, d = int(data_args["n"]), int(data_args["d"])
        key = "run" if path.is_file() else "checkpoint"  # the setting that names the checkpoint
        others = [name for name in found if name != ckpt.name]
        advice = f"choose another with checkpoint (it has {', '.join(others)})" if others else "train the run again"
        model = _load_head(ckpt, config, config_file, n, d, f"{key}={ckpt}", advice)
        datamodule = EmbeddingDataModule(spec, **_split_args(data_args))
        datamodule.setup("test")
        _check_test_split(folder, data_args.get("test_fraction"), len(datamodule.test_indices))
        return cls(folder, ckpt, model, spec, n, d, datamodule.test_indices, bool(data_args.get("normalize", True)))


def _load_head(ckpt: Path, config: dict, config_file: Path, n: int, d: int, given: str, advice: str) -> Any:
    """The run's classifier from `ckpt`, its map rebuilt from the run's config.

    A checkpoint that does not fit it (unreadable, trained for other sizes or another map) is refused as
    `<given>: <why>; <advice>`.
    """
    problem = checkpoint_problem(ckpt, {"n": (n, str(config_file)), "d": (d, str(config_file))})
    if problem is not None:
        raise ValueError(f"{given}: {problem}; {advice}")
    try:
        return FeatureMapClassifier.load_from_checkpoint(
            ckpt, feature_map=_rebuilt_map(config["model"]["init_args"]["feature_map"], n, d), map_location="cpu"
        ).eval()
    except RuntimeError as err:
        mismatch = state_dict_mismatch(err)
        if mismatch is None:
            raise
        raise ValueError(f"{given}: {mismatch} ({config_file}); {advice}") from err


def _check_train_run(folder: Path, config: Any) -> None:
    """Refuse a run folder that is not a train.py run (an evaluate.py run has no data block), naming what it is."""
    if isinstance(config, dict) and isinstance(config.get("data"), dict):
        return
    model = config.get("model") if isinstance(config, dict) else None
    class_path = model.get("class_path") if isinstance(model, dict) else None
    signs = [f"its model is {class_path}" if class_path else "", f"its {CONFIG_NAME} has no data: block"]
    held = results_files(folder)  # results.jsonl, or a shard's file (wslight.records.shards)
    if held:
        signs.append(f"it holds {held[0].name}")
    raise ValueError(
        f"run={folder}: an evaluate.py run ({', '.join(s for s in signs if s)}), not a train.py run; give the log "
        "folder `python train.py fit --config <training config>` printed (`logs: <folder>`)"
    )


def _check_test_split(folder: Path, test_fraction: Any, size: int | None) -> None:
    """Refuse a run whose test split is empty (`size` 0, or test_fraction 0 before the split is read)."""
    if size is None and test_fraction not in (0, 0.0):
        return
    if size is not None and size > 0:
        return
    raise ValueError(
        f"run={folder}: the run's test split is empty (data.init_args.test_fraction: {test_fraction} in "
        f"{folder / CONFIG_NAME}), and the evaluation reads the run's held-out reviews; train again with a test "
        "split (e.g. --data.init_args.test_fraction 0.2)"
    )


def checkpoint_problem(path: Path, sizes: dict[str, tuple[Any, str]]) -> str | None:
    """Why the file `path` is no checkpoint of a head for data of these `sizes`, else None.

    `not a readable checkpoint (truncated?): ...` for a file torch cannot open; `trained with data.init_args.d = 192,
    <where> says 384` when the data sizes the checkpoint was trained on (its `datamodule_hyper_parameters`) differ from
    `sizes`, which maps "n" and "d" to (the value, where it is given), e.g. `{"d": (384, "the command line")}`. The
    tensors are memory-mapped, not read; a checkpoint that loads only with `weights_only=False` is left to the loader.
    """
    import zipfile

    archive = zipfile.is_zipfile(path)  # what torch.save writes: its directory is at the end, lost when cut short
    try:
        if archive:  # its tensors memory-mapped, not read
            checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        else:  # cut short, not a checkpoint, or torch's legacy format (which loads)
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, EOFError, pickle's errors... for a damaged file
        if "weights_only" in str(err) or "Weights only" in str(err):
            return None  # a readable file holding other objects: the loader reports it
        if path.stat().st_size == 0:
            reason = "the file is empty"
        elif not archive:
            reason = "it is not the zip archive torch.save writes, or its end is missing"
        else:
            reason = str(err).split(". ")[0] or type(err).__name__
        return f"not a readable checkpoint (truncated?): {reason}"
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        return "not a Lightning checkpoint (it holds no state_dict)"
    trained = checkpoint.get("datamodule_hyper_parameters") or {}
    for name, (value, where) in sizes.items():
        if value is not None and trained.get(name) is not None and str(trained[name]) != str(value):
            return f"trained with data.init_args.{name} = {trained[name]}, {where} says {value}"
    return None


def state_dict_mismatch(err: BaseException) -> str | None:
    """The first difference torch's `load_state_dict` reports between a checkpoint and the model, else None.

    `feature_map.W is [16, 16] in the checkpoint, [8, 8] in the model ...`, or the keys the checkpoint holds beyond the
    model's and those it lacks.
    """
    msg = str(err)
    if "Error(s) in loading state_dict" not in msg:
        return None
    m = re.search(
        r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from "
        r"checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)",
        msg,
    )
    if m:
        return f"{m.group(1)} is {m.group(2)} in the checkpoint, {m.group(3)} in the model the config builds"
    found = dict(re.findall(r"(Missing|Unexpected) key\(s\) in state_dict: (.*?)\.?[ \t]*$", msg, re.MULTILINE))
    if found:
        parts = [f"it holds {found['Unexpected']}, which the model lacks" if "Unexpected" in found else ""]
        parts.append(f"it lacks the model's {found['Missing']}" if "Missing" in found else "")
        what = ", and ".join(p for p in parts if p)
        return f"the checkpoint is not of the model the config builds (another map?): {what}"
    return msg.splitlines()[0]


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
