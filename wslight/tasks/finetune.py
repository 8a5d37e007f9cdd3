"""A pre-trained encoder fine-tuned end to end as a sequence classifier, and the reviews it reads as text.

`python train.py fit --config configs/finetune/imdb.yaml` (docs/tasks/classifier.md). Unlike the frozen maps of the
paper, every weight of the encoder trains, with a classification head on its pooled output, on IMDb text tokenised
on the fly by the model's own tokenizer. At the end of the fit the best checkpoint's weights (highest val/acc) are
restored, tested on the held-out reviews, and written as a Hugging Face folder (`save_pretrained`: model, tokenizer
and the split) that `transformers.pipeline` and the words evaluation of a classifier load as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor
from torch.utils.data import DataLoader

from ..base import validate
from ..data.review_texts import SPLIT_FILE, TextSplit

# The folder inside the run's log folder that holds the Hugging Face export.
EXPORT_DIR = "huggingface"


class ReviewTextDataModule(pl.LightningDataModule):
    """Reviews as text with their labels, tokenised per batch by the model's tokenizer.

    The split (`wslight.data.review_texts.TextSplit`) is seeded: the held-out reviews are disjoint from training and
    validation, and the words evaluation of the fine-tuned model reads the same ones.

    Args:
        source: 'imdb_offline' (the bundled IMDb train split, 25,000 reviews) or 'imdb_hub' (needs the hub).
        test_size: held-out reviews (tested after the fit, and the words evaluation's reviews).
        val_size: validation reviews (val/acc picks the best checkpoint).
        train_size: training reviews (None: every row left after test and validation).
        seed: the split's seed.
        max_length: tokens per review, [CLS] and [SEP] included (longer reviews are cut; their first tokens kept).
        batch_size: reviews per batch (per device).
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        source: str = "imdb_offline",
        test_size: int = 2500,
        val_size: int = 1000,
        train_size: int | None = None,
        seed: int = 0,
        max_length: int = 128,
        batch_size: int = 16,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.split = TextSplit(source, test_size, val_size, train_size, seed)
        self.max_length = validate.integer("max_length", max_length, low=3)
        self.batch_size = validate.positive_int("batch_size", batch_size)
        self.num_workers = validate.integer("num_workers", num_workers, low=0)
        self._data: dict[str, tuple[list[str], Tensor]] = {}

    def setup(self, stage: str) -> None:
        """Read the splits' texts (the tokenizer is the model's, taken from the LightningModule)."""
        for split in ("train", "val", "test"):
            if split not in self._data:
                texts, labels, _ = self.split.texts(split)
                self._data[split] = (texts, torch.as_tensor(labels))

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        texts, labels = self._data[split]
        tokenizer: Any = self.trainer.lightning_module.tokenizer  # type: ignore[union-attr]  # set by then

        def collate(items: list[int]) -> dict[str, Tensor]:
            batch = tokenizer(
                [texts[i] for i in items],
                truncation=True,
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            )
            return {**batch, "labels": labels[items]}

        return DataLoader(
            range(len(texts)),  # type: ignore[arg-type]  # indices; collate reads and tokenises the texts
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=collate,
            num_workers=self.num_workers,
        )

    def train_dataloader(self) -> DataLoader:
        """Training reviews, reshuffled every epoch (Lightning seeds the sampler from seed_everything)."""
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """Validation reviews, in the split's order."""
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        """Held-out reviews, in the split's order."""
        return self._loader("test", shuffle=False)


class SequenceClassifierFineTune(pl.LightningModule):
    """A Hugging Face `AutoModelForSequenceClassification` trained end to end (cross-entropy, AdamW, linear warm-up).

    Args:
        model: the pre-trained encoder: 'bundled-minilm' (offline), a hub id such as 'bert-base-uncased', or a local
            folder; its classification head starts random.
        labels: the class names, in label order (IMDb: 0 negative, 1 positive); written into the exported config.
        lr: peak learning rate.
        weight_decay: AdamW's decoupled weight decay (not on biases and LayerNorm weights).
        warmup_fraction: share of the optimiser steps over which the learning rate rises linearly from 0; it then
            falls linearly to 0 at the last step.
    """

    def __init__(
        self,
        model: str = "bundled-minilm",
        labels: list[str] | None = None,
        lr: float = 5e-5,
        weight_decay: float = 0.01,
        warmup_fraction: float = 0.1,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from ..data.encoders import encoder_info  # transformers and the encoder folder load only when built

        labels = ["negative", "positive"] if labels is None else list(labels)
        if len(labels) < 2 or len(set(labels)) != len(labels):
            raise ValueError(f"labels must be at least two distinct class names, got {labels!r}")
        self.lr = validate.number("lr", lr, low=0.0, strict=True)
        self.weight_decay = validate.number("weight_decay", weight_decay, low=0.0)
        self.warmup_fraction = validate.number("warmup_fraction", warmup_fraction, low=0.0)
        if self.warmup_fraction >= 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
        path = encoder_info(model).path  # fails within seconds for a hub id while the hub is unreachable
        self.model = AutoModelForSequenceClassification.from_pretrained(
            path,
            num_labels=len(labels),
            id2label=dict(enumerate(labels)),
            label2id={name: i for i, name in enumerate(labels)},
        )
        self.model.train()  # from_pretrained returns eval mode, and Lightning keeps a module's mode: dropout on
        self.tokenizer = AutoTokenizer.from_pretrained(path)

    def forward(self, **batch: Tensor) -> Tensor:
        """(B, C) logits of a tokenised batch (input_ids, attention_mask, ...; labels ignored)."""
        batch = {k: v for k, v in batch.items() if k != "labels"}
        return self.model(**batch).logits

    def _step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        logits = self(**batch)  # (B, C)
        loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
        acc = (logits.argmax(-1) == batch["labels"]).float().mean()
        on_step = stage == "train"
        size = len(batch["labels"])
        self.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=True, sync_dist=not on_step, batch_size=size)
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, sync_dist=True, batch_size=size, prog_bar=True)
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy of a batch; logs train/loss and train/acc."""
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        """Logs val/loss and val/acc (the checkpoint's monitor)."""
        self._step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        """Logs test/loss and test/acc on the held-out reviews."""
        self._step(batch, "test")

    def configure_optimizers(self) -> Any:
        """AdamW with the linear warm-up and decay of BERT fine-tuning, stepped every optimiser step."""
        decay: list[Tensor] = []
        no_decay: list[Tensor] = []
        for p in self.model.parameters():
            (no_decay if p.ndim < 2 else decay).append(p)  # biases and LayerNorm weights are not decayed
        groups = [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW(groups, lr=self.lr)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(self.warmup_fraction * total)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_fit_end(self) -> None:
        """Restore the best checkpoint's weights (highest val/acc), then export them as a Hugging Face folder."""
        checkpoint = self.trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_path and not self.trainer.interrupted:
            state = torch.load(checkpoint.best_model_path, map_location=self.device, weights_only=True)
            self.load_state_dict(state["state_dict"])
        log_dir = self.trainer.log_dir  # every rank: a collective under DDP
        if self.trainer.is_global_zero and log_dir is not None and not self.trainer.interrupted:
            self.export(Path(log_dir) / EXPORT_DIR)

    def export(self, folder: Path) -> Path:
        """Write model, tokenizer and the data split (if a ReviewTextDataModule fed the fit) to `folder`."""
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if isinstance(datamodule, ReviewTextDataModule):
            import json

            split = datamodule.split.to_dict() | {"max_length": datamodule.max_length}
            (folder / SPLIT_FILE).write_text(json.dumps(split, indent=1) + "\n")
        return folder
