"""EmbeddingDataModule: serves (X, y, sample_id) from the memory-mapped embedding cache, DDP- and worker-safe."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from wslight.base.notes import note
from wslight.base.seeding import generator
from wslight.base.validate import integer, number, positive_int
from wslight.data.build import load_token_embeddings
from wslight.data.spec import EmbeddingSpec, validate_spec
from wslight.data.store import TokenEmbeddings


class EmbeddingDataset(Dataset):
    """Items `(X (n, d) float32, y () float32, sample_id () int64)` for a subset of a TokenEmbeddings.

    Batched fetches (`__getitems__`, used by DataLoader) read all rows of a batch from the memory map at once.

    Args:
        embeddings: the opened embeddings.
        indices: (N,) int64 positions into `embeddings`.
        n: first n token positions.
        d: first d coordinates.
        normalize: rescale each row to norm sqrt(d).
    """

    def __init__(self, embeddings: TokenEmbeddings, indices: Tensor, n: int, d: int, normalize: bool = True):
        self.embeddings = embeddings
        self.indices = torch.as_tensor(indices, dtype=torch.int64)
        self.n, self.d, self.normalize = n, d, normalize

    def __len__(self) -> int:
        return int(self.indices.numel())

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, Tensor]:
        return self.__getitems__([i])[0]

    def __getitems__(self, items: list[int]) -> list[tuple[Tensor, Tensor, Tensor]]:
        rows = self.indices[torch.as_tensor(items, dtype=torch.int64)]  # (B,)
        X, y = self.embeddings.samples(rows, self.n, self.d, self.normalize)  # (B, n, d), (B,)
        ids = self.embeddings.sample_ids[rows]  # (B,)
        return [(X[b], y[b], ids[b]) for b in range(len(rows))]


def split_indices(
    labels: Tensor, val_fraction: float, test_fraction: float, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded split of positions 0..M-1 into (train, val, test), stratified by label, each sorted, (N_*,) int64.

    Per class, round(fraction * class size) samples go to val and to test; the rest to train.
    """
    parts: list[list[Tensor]] = [[], [], []]
    for c, lab in enumerate((1.0, -1.0)):
        idx = torch.nonzero(labels == lab).flatten()
        idx = idx[torch.randperm(len(idx), generator=generator(seed, "data/split", c))]
        n_val = int(round(val_fraction * len(idx)))
        n_test = int(round(test_fraction * len(idx)))
        parts[1].append(idx[:n_val])
        parts[2].append(idx[n_val : n_val + n_test])
        parts[0].append(idx[n_val + n_test :])
    train, val, test = (torch.sort(torch.cat(part)).values for part in parts)
    return train, val, test


class EmbeddingDataModule(LightningDataModule):
    """Token embeddings of IMDb reviews (or synthetic tokens) as `(X (n, d), y, sample_id)` batches.

    `prepare_data` (one process) builds the embedding cache once; `setup` (every rank) opens it memory-mapped and
    splits it from the seed. Lightning's DistributedSampler shards the loaders under DDP.

    Args:
        embeddings: what to embed (source, encoder, layer, num_samples, seed, ...), the same `embeddings:` block as
            the evaluations'; default `EmbeddingSpec()`. A dict of its fields (as saved in checkpoints) is accepted.
        n: context length: first n token positions of each review (1..embeddings.max_length).
        d: embedding dimension: first d coordinates (1..hidden size).
        normalize: rescale each token row to norm sqrt(d) (the paper's preprocessing).
        val_fraction: fraction of each class held out for validation.
        test_fraction: fraction of each class held out for testing.
        batch_size: samples per loader batch (the encoder's batch while the cache is built is `embeddings.batch_size`).
        num_workers: DataLoader worker processes.
        split_seed: seed of the train / val / test split and of the training loader's shuffle; default (None)
            `embeddings.seed`.
        progress: show a progress bar while building the cache.

    Attributes:
        spec: the checked EmbeddingSpec.
        embeddings: the opened TokenEmbeddings (None before `setup`).
        train_indices, val_indices, test_indices: (N_*,) int64 positions into `embeddings` (after `setup`).
    """

    def __init__(
        self,
        embeddings: EmbeddingSpec | None = None,
        n: int = 40,
        d: int = 384,
        normalize: bool = True,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 32,
        num_workers: int = 0,
        split_seed: int | None = None,
        progress: bool = True,
    ):
        super().__init__()
        if embeddings is None:
            embeddings = EmbeddingSpec()
        elif isinstance(embeddings, Mapping):
            embeddings = EmbeddingSpec(**embeddings)
        elif not isinstance(embeddings, EmbeddingSpec):
            raise ValueError(f"embeddings must be an EmbeddingSpec or a dict of its fields, got {embeddings!r}")
        info = validate_spec(embeddings)  # bad keys fail here, before any encoder runs
        self.spec = embeddings
        self.hidden_size = embeddings.synthetic_dim if info is None else info.hidden_size
        max_length = embeddings.max_length
        integer(f"n (token positions stored per review, embeddings.max_length={max_length})", n, 1, max_length)
        of = "synthetic" if info is None else repr(embeddings.encoder)
        integer(f"d (hidden size of {of} is {self.hidden_size})", d, 1, self.hidden_size)
        for key, val in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if number(key, val, low=0.0) >= 1.0:
                raise ValueError(f"{key} must be a finite number in [0, 1), got {val!r}")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction} + {test_fraction}")
        positive_int("batch_size", batch_size)
        integer("num_workers", num_workers, low=0)
        integer("split_seed", split_seed, low=0, allow_none=True)
        # The spec is saved as a plain dict: checkpoints then load with torch.load(weights_only=True).
        self.save_hyperparameters(ignore=["embeddings"])
        self.hparams["embeddings"] = asdict(embeddings)
        self.n, self.d = n, d
        self.normalize = normalize
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.batch_size, self.num_workers = batch_size, num_workers
        self.seed = embeddings.seed if split_seed is None else split_seed
        self.progress = progress
        self.embeddings: TokenEmbeddings | None = None
        self.train_indices = self.val_indices = self.test_indices = torch.zeros(0, dtype=torch.int64)
        self._noted_empty_test = False

    def prepare_data(self) -> None:
        """Build the cache (one process per node; other ranks wait and then open it in `setup`)."""
        if self.spec.source != "synthetic":
            load_token_embeddings(self.spec, progress=self.progress)

    def setup(self, stage: str | None = None) -> None:
        """Load the token embeddings and split them into train, validation and test indices (once).

        A fit whose test split is empty (`test_fraction` 0, or too small to hold a review of each class) says so in
        one line: it logs no test metrics.
        """
        if self.embeddings is None:
            self.embeddings = load_token_embeddings(self.spec, progress=self.progress)
            self.train_indices, self.val_indices, self.test_indices = split_indices(
                self.embeddings.labels, self.val_fraction, self.test_fraction, self.seed
            )
        if stage == "fit" and len(self.test_indices) == 0 and not self._noted_empty_test:
            self._noted_empty_test = True
            note(
                f"data.test_fraction {self.test_fraction} leaves the test split empty (of {len(self.embeddings)} "
                "reviews): the fit logs no test/ metrics, and no evaluation of this run has held-out reviews"
            )

    @property
    def manifest(self) -> dict:
        """The embedding cache's manifest (after setup)."""
        return {} if self.embeddings is None else self.embeddings.manifest

    def dataset(self, indices: Tensor) -> EmbeddingDataset:
        """The samples `indices` of the loaded embeddings, cut to n tokens and d dimensions."""
        if self.embeddings is None:
            raise RuntimeError("call setup() before asking for a dataset")
        return EmbeddingDataset(self.embeddings, indices, self.n, self.d, self.normalize)

    def _loader(self, indices: Tensor, shuffle: bool) -> DataLoader:
        return DataLoader(
            self.dataset(indices),
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self._on_gpu(),  # page-locked batches: one asynchronous host -> GPU copy per step
            # Seeded shuffling on one device; under DDP Lightning's DistributedSampler (seeded by seed_everything)
            # takes over.
            generator=generator(self.seed, "data/loader") if shuffle else None,
        )

    def _on_gpu(self) -> bool:
        trainer = getattr(self, "trainer", None)
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        """The training samples, shuffled."""
        return self._loader(self.train_indices, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """The validation samples, in order."""
        return self._loader(self.val_indices, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        """The test samples, in order."""
        return self._loader(self.test_indices, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        """All samples, in cache order."""
        assert self.embeddings is not None, "call setup() first"
        return self._loader(torch.arange(len(self.embeddings)), shuffle=False)
