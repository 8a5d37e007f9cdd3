"""LightningModules: a frozen random feature map injected into a module with a trainable linear head."""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
from torch import nn
from torchmetrics import MeanSquaredError
from torchmetrics.classification import BinaryAccuracy

from .features import output_dim
from .interpolation import min_norm_interpolator
from .validate import choice, integer, number


class FeatureMapClassifier(pl.LightningModule):
    """A linear head theta on a frozen feature map: f(X) = phi(X)^T theta, trained on +/-1 labels (docs/theory.md §5.2).

    Batches are `(X (B, n, d), y (B,), sample_id (B,))`. The map's random weights are frozen buffers (they land in the
    checkpoint); only `theta` is trainable.

    Args:
        feature_map: the frozen map (RandomFeatures, DeepRandomFeatures, RandomAttentionFeatures or
            ReLUAttentionFeatures).
        n: number of tokens per sample (linked from the data in the CLI); sets the head's size for attention maps.
        fit_mode: "gradient": square loss against the labels, optimiser from the config (plain GD from the zero head
            converges to the minimum-norm interpolator); "closed_form": theta* = Phi^+ Y on the whole training set in
            N x N space, as a one-epoch fit (no p x p matrix).
        lr: learning rate of the default optimiser (SGD without momentum); a config `optimizer:` block overrides it.
        bias: add a trainable bias (the paper has none).
    """

    def __init__(
        self,
        feature_map: nn.Module,
        n: int | None = None,
        fit_mode: Literal["gradient", "closed_form"] = "gradient",
        lr: float = 1e-3,
        bias: bool = False,
    ) -> None:
        super().__init__()
        choice("fit_mode", fit_mode, ("gradient", "closed_form"))
        integer("n", n, low=1, allow_none=True)
        number("lr", lr, low=0.0, strict=True)
        self.save_hyperparameters(ignore=["feature_map"])
        self.feature_map = feature_map.requires_grad_(False)
        n = n if n is not None else getattr(feature_map, "n", None)
        if n is None:
            raise ValueError("n: the number of tokens is needed to size the head of an attention map, got None")
        self.n = n
        self.p = output_dim(feature_map, n)
        # Paper: f(X) = phi(X)^T theta, zero start (gradient descent from 0 stays in the row span of Phi)
        self.theta = nn.Parameter(torch.zeros(self.p, dtype=self.feature_map_dtype))
        self.bias = nn.Parameter(torch.zeros((), dtype=self.feature_map_dtype)) if bias else None
        self.fit_mode = fit_mode
        self.automatic_optimization = fit_mode == "gradient"
        self.metrics = nn.ModuleDict(
            {
                f"{s}_{m}": cls()
                for s in ("train", "val", "test")
                for m, cls in (("acc", BinaryAccuracy), ("mse", MeanSquaredError))
            }
        )
        self._phi_parts: list[torch.Tensor] = []
        self._y_parts: list[torch.Tensor] = []
        self._id_parts: list[torch.Tensor] = []

    @property
    def feature_map_dtype(self) -> torch.dtype:
        return getattr(self.feature_map, "weight_dtype", torch.float32)

    def check_data(self, n: int, d: int) -> None:
        """Raise when the map was built for other n or d than the data serves (before training starts)."""
        map_n, map_d = getattr(self.feature_map, "n", None), self.feature_map.d
        if map_d != d:
            raise ValueError(f"d: the feature map was built for d={map_d} but the data serves d={d}")
        if (map_n is not None and map_n != n) or self.n != n:
            raise ValueError(f"n: the feature map was built for n={map_n or self.n} but the data serves n={n}")

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "n") and hasattr(dm, "d"):
            self.check_data(dm.n, dm.d)

    def features(self, X: torch.Tensor) -> torch.Tensor:
        """phi(X): (B, n, d) -> (B, p), no gradient to the frozen map."""
        with torch.no_grad():
            return self.feature_map(X.to(self.feature_map_dtype))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Predictions f(X) = phi(X)^T theta (+ bias): (B, n, d) -> (B,)."""
        out = self.features(X) @ self.theta  # (B, p) @ (p,) -> (B,)
        return out + self.bias if self.bias is not None else out

    def _log_stage(self, stage: str, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.mean((pred - y) ** 2)
        self.metrics[f"{stage}_acc"](pred > 0, y > 0)
        self.metrics[f"{stage}_mse"](pred.float(), y.float())
        self.log(f"{stage}/loss", loss, prog_bar=stage != "test", sync_dist=True, batch_size=len(y))
        self.log(f"{stage}/acc", self.metrics[f"{stage}_acc"], prog_bar=True, on_epoch=True, on_step=False)
        self.log(f"{stage}/mse", self.metrics[f"{stage}_mse"], on_epoch=True, on_step=False)
        return loss

    def training_step(self, batch, batch_idx):
        X, y, ids = batch
        y = y.to(self.feature_map_dtype)
        if self.fit_mode == "closed_form":
            # collect Phi; the head is solved at the end of the epoch from every rank's samples
            self._phi_parts.append(self.features(X))
            self._y_parts.append(y)
            self._id_parts.append(ids)
            return None
        return self._log_stage("train", self(X), y)

    def on_validation_epoch_start(self) -> None:
        self._solve_closed_form()  # Lightning validates before on_train_epoch_end: solve first

    def on_train_epoch_end(self) -> None:
        self._solve_closed_form()

    def _solve_closed_form(self) -> None:
        """theta* = Phi^+ Y from the features collected this epoch (every rank, de-duplicated by sample id)."""
        if self.fit_mode != "closed_form" or not self._phi_parts:
            return
        Phi, Y, ids = torch.cat(self._phi_parts), torch.cat(self._y_parts), torch.cat(self._id_parts)
        self._phi_parts, self._y_parts, self._id_parts = [], [], []
        if self.trainer.world_size > 1:
            # every rank holds the same number of rows (the sampler pads), so all_gather stacks them
            Phi, Y, ids = (self.all_gather(t).flatten(0, 1) for t in (Phi, Y, ids))
        # Lightning pads DDP sets with duplicates: keep one row per sample, ordered by id, so 1 and 2 devices agree
        ids, order = torch.sort(ids)
        keep = torch.ones_like(ids, dtype=torch.bool)
        keep[1:] = ids[1:] != ids[:-1]
        Phi, Y = Phi[order][keep], Y[order][keep]
        theta = min_norm_interpolator(Phi.double(), Y.double())
        with torch.no_grad():
            self.theta.copy_(theta.to(self.theta.dtype))
        self._log_stage("train", Phi @ self.theta, Y)

    def validation_step(self, batch, batch_idx):
        X, y, _ = batch
        self._log_stage("val", self(X), y.to(self.feature_map_dtype))

    def test_step(self, batch, batch_idx):
        X, y, _ = batch
        self._log_stage("test", self(X), y.to(self.feature_map_dtype))

    def configure_optimizers(self):
        if self.fit_mode == "closed_form":
            return None
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
