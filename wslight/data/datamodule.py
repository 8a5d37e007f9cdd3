"""EmbeddingDataModule: serves (X, y, sample_id) from the memory-mapped embedding cache, DDP- and worker-safe."""

from __future__ import annotations

from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from wslight.data.embeddings import (
    EmbeddingSpec,
    TokenEmbeddings,
    _check_int,
    load_token_embeddings,
    validate_spec,
)
from wslight.seeding import generator


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
    train, val, test = (torch.sort(torch.cat(p)).values for p in parts)
    return train, val, test


class EmbeddingDataModule(LightningDataModule):
    """Token embeddings of IMDb reviews (or synthetic tokens) as `(X (n, d), y, sample_id)` batches.

    `prepare_data` (one process) builds the embedding cache once; `setup` (every rank) opens it memory-mapped and
    splits it from the seed. Lightning's DistributedSampler shards the loaders under DDP.

    Args:
        source: 'imdb_offline' (bundled IMDb train split), 'imdb_hub' (stanfordnlp/imdb train + test, needs the hub)
            or 'synthetic' (Gaussian tokens, labels from a planted direction).
        encoder: 'bundled-minilm' (offline, hidden size 384), 'bert-base-uncased' (the paper's) or a local folder.
        layer: hidden state kept, 0..num_hidden_layers; 0 (the paper's) is the embedding layer's output.
        max_length: tokenizer padding / truncation length (token positions stored per review).
        max_tokens: keep reviews with fewer WordPiece tokens than this (specials excluded).
        num_samples: number of reviews, even, balanced +1 / -1.
        n: context length: first n token positions of each review (1..max_length).
        d: embedding dimension: first d coordinates (1..hidden size).
        normalize: rescale each token row to norm sqrt(d) (the paper's preprocessing).
        val_fraction: fraction of each class held out for validation.
        test_fraction: fraction of each class held out for testing.
        batch_size: samples per batch.
        num_workers: DataLoader worker processes.
        seed: selection of the reviews and the train / val / test split.
        cache_dir: embedding cache directory; default $WSLIGHT_CACHE, else `.cache/wslight`.
        synthetic_dim: hidden size when source='synthetic'.
        selection: 'random' (seeded random balanced subset) or 'first' (the authors' first short reviews).
        storage_dtype: dtype of the cached embeddings (computation is float32).
        synthetic_unit_rows: for 'synthetic', rescale raw tokens to norm sqrt(H) before labelling.
        encoder_batch_size: reviews per encoder batch while building the cache.
        progress: show a progress bar while building the cache.
    """

    def __init__(
        self,
        source: Literal["imdb_offline", "imdb_hub", "synthetic"] = "imdb_offline",
        encoder: str = "bundled-minilm",
        layer: int = 0,
        max_length: int = 256,
        max_tokens: int = 240,
        num_samples: int = 1000,
        n: int = 40,
        d: int = 384,
        normalize: bool = True,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        cache_dir: str | None = None,
        synthetic_dim: int = 384,
        selection: Literal["random", "first"] = "random",
        storage_dtype: Literal["float16", "float32"] = "float16",
        synthetic_unit_rows: bool = False,
        encoder_batch_size: int = 32,
        progress: bool = True,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.spec = EmbeddingSpec(
            source=source,
            encoder=encoder,
            layer=layer,
            max_length=max_length,
            max_tokens=max_tokens,
            num_samples=num_samples,
            seed=seed,
            cache_dir=cache_dir,
            synthetic_dim=synthetic_dim,
            selection=selection,
            storage_dtype=storage_dtype,
            synthetic_unit_rows=synthetic_unit_rows,
            batch_size=encoder_batch_size,
        )
        cfg = validate_spec(self.spec)  # bad keys fail here, before any encoder runs
        self.hidden_size = self.spec.synthetic_dim if cfg is None else cfg.hidden_size
        _check_int("n", n, 1, max_length, f" (token positions stored per review, max_length={max_length})")
        _check_int("d", d, 1, self.hidden_size, f" (hidden size of {'synthetic' if cfg is None else encoder!r})")
        for key, val in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 <= val < 1.0:
                raise ValueError(f"{key} must be in [0, 1), got {val!r}")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction} + {test_fraction}")
        _check_int("batch_size", batch_size, 1)
        _check_int("num_workers", num_workers, 0)
        self.n, self.d = n, d
        self.normalize = normalize
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.progress = progress
        self.embeddings: TokenEmbeddings | None = None
        self.train_indices = self.val_indices = self.test_indices = torch.zeros(0, dtype=torch.int64)

    def prepare_data(self) -> None:
        """Build the cache (one process per node; other ranks wait and then open it in `setup`)."""
        if self.spec.source != "synthetic":
            load_token_embeddings(self.spec, progress=self.progress)

    def setup(self, stage: str | None = None) -> None:
        if self.embeddings is None:
            self.embeddings = load_token_embeddings(self.spec, progress=self.progress)
            self.train_indices, self.val_indices, self.test_indices = split_indices(
                self.embeddings.labels, self.val_fraction, self.test_fraction, self.seed
            )

    @property
    def manifest(self) -> dict:
        """The embedding cache's manifest (after setup)."""
        return {} if self.embeddings is None else self.embeddings.manifest

    def dataset(self, indices: Tensor) -> EmbeddingDataset:
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
            # Seeded shuffling on one device; under DDP Lightning's DistributedSampler (seeded by seed_everything)
            # takes over.
            generator=generator(self.seed, "data/loader") if shuffle else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_indices, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_indices, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_indices, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        """All samples, in cache order."""
        assert self.embeddings is not None, "call setup() first"
        return self._loader(torch.arange(len(self.embeddings)), shuffle=False)
