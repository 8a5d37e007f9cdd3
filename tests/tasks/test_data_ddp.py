"""Two-process CPU DDP (slow): every rank opens the cache built once by prepare_data and sees distinct samples."""

import json

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer

from wslight.data import EmbeddingSpec
from wslight.tasks import EmbeddingDataModule


class RecordIds(LightningModule):
    """Records the sample_ids each rank trains on and writes them to `<out>/rank<r>.json`."""

    def __init__(self, out: str):
        super().__init__()
        self.out = out
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.ids: list[int] = []

    def training_step(self, batch, batch_idx):
        X, y, sid = batch
        self.ids += sid.tolist()
        return (self.w * X.sum() - y.sum()).pow(2)

    def on_train_epoch_end(self):
        with open(f"{self.out}/rank{self.global_rank}.json", "w") as f:
            json.dump(self.ids, f)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.slow  # two spawned CPU DDP processes (gloo), each opening the cache
def test_ddp_two_ranks_get_distinct_samples(tmp_path):
    dm = EmbeddingDataModule(
        EmbeddingSpec(num_samples=16, cache_dir=str(tmp_path / "cache")),
        n=8,
        d=16,
        val_fraction=0.0,
        test_fraction=0.0,
        batch_size=2,
        progress=False,
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(RecordIds(str(tmp_path)), datamodule=dm)
    ranks = [set(json.loads((tmp_path / f"rank{r}.json").read_text())) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 8 and not (ranks[0] & ranks[1])
    dm.setup("fit")
    assert ranks[0] | ranks[1] == set(dm.embeddings.sample_ids.tolist())
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 1
