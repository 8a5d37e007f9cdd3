"""LightningModules: a frozen random feature map injected into a module with a trainable linear head."""

from __future__ import annotations

import math
from typing import Literal, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torchmetrics import MeanSquaredError, Metric
from torchmetrics.classification import BinaryAccuracy

from ..attack.heads import ridge_head
from ..base.validate import choice, integer, number
from ..features import FeatureMap, output_dim


class TrainingDiverged(RuntimeError):
    """A `fit_mode: gradient` fit whose loss became non-finite or exploded; the message says what to change."""


class FeatureMapClassifier(pl.LightningModule):
    """A linear head theta on a frozen feature map: f(X) = phi(X)^T theta, trained on +/-1 labels.

    See docs/theory/attack.md §5.2.

    Batches are `(X (B, n, d), y (B,), sample_id (B,))`. The map's random weights are frozen buffers (they land in the
    checkpoint); only `theta` is trainable.

    Args:
        feature_map: the frozen map: a `wslight.features.FeatureMap` (RandomFeatures, DeepRandomFeatures,
            RandomAttentionFeatures, ReLUAttentionFeatures or a registered map). From Python any `nn.Module` mapping
            (B, n, d) to (B, p) with an int attribute `d` (and `n` or `out_dim`) works too; the type is what the
            command line offers and checks.
        n: number of tokens per sample (linked from the data in the CLI); sets the head's size for attention maps.
        fit_mode: "gradient": square loss against the labels, optimiser from the config (plain GD from the zero head
            converges to the minimum-norm interpolator); "closed_form": theta* = Phi^+ Y on the whole training set in
            N x N space, as a one-epoch fit (no p x p matrix); with `ridge` or `bias`, the ridge least-squares head
            and its bias in closed form (`wslight.attack.heads.ridge_head`).
        lr: learning rate of the default optimiser (SGD without momentum); a config `optimizer:` block overrides it.
        bias: add a trainable bias (the paper has none); a closed-form fit solves it with the head.
        ridge: closed_form only: the penalty on ||theta||^2 of the least-squares head (0: the paper's interpolator).
            For a gradient fit, an optimiser's weight_decay plays this part.

    Validation and test metrics count every held-out sample once: under DDP the predictions of all ranks are gathered
    and de-duplicated by sample id (Lightning's DistributedSampler pads uneven splits with repeated samples).
    A gradient fit stops with `TrainingDiverged` when its training loss becomes non-finite or exceeds
    `DIVERGENCE_RATIO` times the loss of the zero head.
    """

    DIVERGENCE_RATIO = 1e3

    def __init__(
        self,
        feature_map: FeatureMap,
        n: int | None = None,
        fit_mode: Literal["gradient", "closed_form"] = "gradient",
        lr: float = 1e-3,
        bias: bool = False,
        ridge: float = 0.0,
    ) -> None:
        super().__init__()
        choice("fit_mode", fit_mode, ("gradient", "closed_form"))
        number("ridge", ridge, low=0.0)
        if ridge > 0 and fit_mode != "closed_form":
            raise ValueError(f"ridge: {ridge} applies to fit_mode closed_form; a gradient fit uses weight_decay")
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
            {f"train_{m}": cls() for m, cls in (("acc", BinaryAccuracy), ("mse", MeanSquaredError))}
        )
        self._phi_parts: list[torch.Tensor] = []
        self._y_parts: list[torch.Tensor] = []
        self._id_parts: list[torch.Tensor] = []
        self._eval_parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (pred, y, ids) per batch
        self._first_loss: float | None = None

    @property
    def feature_map_dtype(self) -> torch.dtype:
        """The dtype the map computes in (float32 for a map that does not say)."""
        return getattr(self.feature_map, "weight_dtype", torch.float32)

    def check_data(self, n: int, d: int) -> None:
        """Raise when the map was built for other n or d than the data serves (before training starts)."""
        map_n, map_d = getattr(self.feature_map, "n", None), self.feature_map.d
        if map_d != d:
            raise ValueError(f"d: the feature map was built for d={map_d} but the data serves d={d}")
        if (map_n is not None and map_n != n) or self.n != n:
            raise ValueError(f"n: the feature map was built for n={map_n or self.n} but the data serves n={n}")

    def setup(self, stage: str) -> None:
        """Check the map against the data's n and d when a datamodule is attached."""
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "n") and hasattr(dm, "d"):
            self.check_data(dm.n, dm.d)

    def on_fit_start(self) -> None:
        """Reset the first loss; warn when a gradient fit would make a single pass."""
        self._first_loss = None
        if self.fit_mode == "gradient" and self.trainer.max_epochs == 1:
            rank_zero_warn(
                "fit_mode gradient with trainer.max_epochs=1 makes one pass of the optimiser (the closed-form configs'"
                " setting): raise trainer.max_epochs, or start from configs/raf_gradient.yaml"
            )

    def features(self, X: torch.Tensor) -> torch.Tensor:
        """phi(X): (B, n, d) -> (B, p), no gradient to the frozen map."""
        with torch.no_grad():
            return self.feature_map(X.to(self.feature_map_dtype))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Predictions f(X) = phi(X)^T theta (+ bias): (B, n, d) -> (B,)."""
        return self._head(self.features(X))

    def _head(self, Phi: torch.Tensor) -> torch.Tensor:
        """phi^T theta (+ bias) of features (B, p) -> (B,)."""
        out = Phi @ self.theta
        return out + self.bias if self.bias is not None else out

    def _log_stage(self, stage: str, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.mean((pred - y) ** 2)
        acc, mse = (cast(Metric, self.metrics[f"{stage}_{m}"]) for m in ("acc", "mse"))
        acc(pred > 0, y > 0)
        mse(pred.float(), y.float())
        self.log(f"{stage}/loss", loss, prog_bar=stage != "test", sync_dist=True, batch_size=len(y))
        self.log(f"{stage}/acc", acc, prog_bar=True, on_epoch=True, on_step=False)
        self.log(f"{stage}/mse", mse, on_epoch=True, on_step=False)
        return loss

    def training_step(self, batch, batch_idx):
        """Collect the batch's features for the closed-form solve, or take a gradient step on the head."""
        X, y, ids = batch
        y = y.to(self.feature_map_dtype)
        if self.fit_mode == "closed_form":
            # collect Phi; the head is solved at the end of the epoch from every rank's samples
            self._phi_parts.append(self.features(X))
            self._y_parts.append(y)
            self._id_parts.append(ids)
            if batch_idx + 1 >= self.trainer.num_training_batches:
                # solve in the last step (not at epoch end) so that the solve counts as an optimiser step
                self._solve_closed_form()
            return None
        loss = self._log_stage("train", self(X), y)
        self._check_divergence(loss)
        return loss

    def _check_divergence(self, loss: torch.Tensor) -> None:
        """Stop a gradient fit whose loss is non-finite or more than DIVERGENCE_RATIO times its first value."""
        value = float(loss.detach())
        if self._first_loss is None:
            self._first_loss = value
        if math.isfinite(value) and value <= self.DIVERGENCE_RATIO * max(self._first_loss, 1e-12):
            return
        opt = self.trainer.optimizers[0] if self._trainer is not None and self.trainer.optimizers else None
        lr = opt.param_groups[0]["lr"] if opt is not None else self.hparams["lr"]
        raise TrainingDiverged(
            f"fit_mode gradient diverged: train/loss = {value:.3g} at epoch {self.current_epoch}, step "
            f"{self.global_step} (first loss {self._first_loss:.3g}); the learning rate {lr:g} is too large for "
            f"these features: lower it (model.init_args.lr, or the optimizer's lr) about tenfold, or use an adaptive "
            f"optimizer with a schedule and more trainer.max_epochs (configs/raf_gradient.yaml), or fit_mode "
            f"closed_form"
        )

    def on_train_epoch_end(self) -> None:
        """Solve the closed-form head from every rank's collected features."""
        self._solve_closed_form()

    def _solve_closed_form(self) -> None:
        """theta* = Phi^+ Y from the features collected this epoch (every rank, de-duplicated by sample id)."""
        if self.fit_mode != "closed_form" or not self._phi_parts:
            return
        Phi, Y, ids = torch.cat(self._phi_parts), torch.cat(self._y_parts), torch.cat(self._id_parts)
        self._phi_parts, self._y_parts, self._id_parts = [], [], []
        if self.trainer.world_size > 1:
            # every rank holds the same number of rows (the sampler pads), so all_gather stacks them
            Phi, Y, ids = (self._all_gather(t).flatten(0, 1) for t in (Phi, Y, ids))
        # Lightning pads DDP sets with duplicates: keep one row per sample, ordered by id, so 1 and 2 devices agree
        ids, order = torch.sort(ids)
        keep = torch.ones_like(ids, dtype=torch.bool)
        keep[1:] = ids[1:] != ids[:-1]
        Phi, Y = Phi[order][keep], Y[order][keep]
        theta, b = ridge_head(Phi.double(), Y.double(), self.hparams["ridge"], self.bias is not None)
        with torch.no_grad():
            self.theta.copy_(theta.to(self.theta.dtype))
            if self.bias is not None:
                self.bias.copy_(b.to(self.bias.dtype))
        self._count_solve_as_step()
        self._log_stage("train", self._head(Phi), Y)

    def _count_solve_as_step(self) -> None:
        """Step the no-op optimiser of `configure_optimizers`: the solve counts as one training step.

        Without a step `trainer.global_step` stays 0 and ModelCheckpoint, which saves only when the step has moved,
        never writes a checkpoint of a closed-form fit. Lightning counts manual steps only inside training_step, so
        the solve runs in the epoch's last training step (the epoch-end calls are then no-ops).
        """
        if self._trainer is not None and self.trainer.training and self.trainer.optimizers:
            # one optimiser (configure_optimizers), so a LightningOptimizer, not a list; no gradients: no change
            cast(LightningOptimizer, self.optimizers()).step()

    def validation_step(self, batch, batch_idx):
        """Collect the batch's predictions for the epoch's metrics."""
        self._collect_eval(batch)

    def test_step(self, batch, batch_idx):
        """Collect the batch's predictions for the epoch's metrics."""
        self._collect_eval(batch)

    def on_validation_epoch_start(self) -> None:
        """Solve the closed-form head first and reset the collected predictions.

        Lightning validates before on_train_epoch_end.
        """
        self._solve_closed_form()  # Lightning validates before on_train_epoch_end: solve first
        self._eval_parts = []

    def on_test_epoch_start(self) -> None:
        """Reset the collected predictions."""
        self._eval_parts = []

    def on_validation_epoch_end(self) -> None:
        """Log the validation metrics (`val/...`)."""
        self._log_eval("val")

    def on_test_epoch_end(self) -> None:
        """Log the test metrics (`test/...`)."""
        self._log_eval("test")

    def _collect_eval(self, batch) -> None:
        X, y, ids = batch
        self._eval_parts.append((self(X).detach(), y.to(self.feature_map_dtype), ids))

    def _all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """One tensor gathered from every rank: (...) -> (world_size, ...)."""
        return cast(torch.Tensor, self.all_gather(t))  # a tensor in, a tensor out

    def _gather_unique(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(pred, y) of every held-out sample once: all ranks' rows gathered, duplicates (DDP padding) dropped."""
        dtype = self.feature_map_dtype
        if self._eval_parts:
            pred, y, ids = (torch.cat(t) for t in zip(*self._eval_parts))
        else:
            pred, y = torch.zeros(0, dtype=dtype, device=self.device), torch.zeros(0, dtype=dtype, device=self.device)
            ids = torch.zeros(0, dtype=torch.long, device=self.device)
        self._eval_parts = []
        if self._trainer is not None and self.trainer.world_size > 1:
            # ranks may hold different counts (a sampler without padding): pad to the largest with id -1
            count = torch.tensor([len(ids)], device=self.device)
            size = int(self._all_gather(count).max())
            pad = size - len(ids)
            pred = torch.cat([pred, pred.new_zeros(pad)])
            y = torch.cat([y, y.new_zeros(pad)])
            ids = torch.cat([ids.long(), ids.new_full((pad,), -1).long()])
            pred, y, ids = (self._all_gather(t).flatten(0, 1) for t in (pred, y, ids))
            real = ids >= 0
            pred, y, ids = pred[real], y[real], ids[real]
        ids, order = torch.sort(ids, stable=True)
        keep = torch.ones_like(ids, dtype=torch.bool)
        keep[1:] = ids[1:] != ids[:-1]
        return pred[order][keep], y[order][keep]

    def _log_eval(self, stage: str) -> None:
        """`<stage>/loss`, `/acc`, `/mse` over the unique held-out samples (the same value on every rank)."""
        pred, y = self._gather_unique()
        if len(y) == 0:
            return
        loss = torch.mean((pred - y) ** 2)
        acc = ((pred > 0) == (y > 0)).float().mean()
        mse = torch.mean((pred.float() - y.float()) ** 2)
        self.log(f"{stage}/loss", loss, prog_bar=stage != "test")
        self.log(f"{stage}/acc", acc, prog_bar=True)
        self.log(f"{stage}/mse", mse)

    def configure_optimizers(self):
        """SGD on the head (lr 0 for the closed-form fit: it only steps to count the solve as a training step)."""
        if self.fit_mode == "closed_form":
            # lr 0 and no gradients: only stepped to count the solve as a training step (_count_solve_as_step)
            return torch.optim.SGD(self.parameters(), lr=0.0)
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])
