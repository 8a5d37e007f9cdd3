"""The base of the callbacks that evaluate a fitted head: run once, after `trainer.fit` or after `trainer.test`."""

from __future__ import annotations

from typing import Literal

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback

from ..base import validate

Hook = Literal["fit_end", "test_end"]
HOOKS: tuple[Hook, ...] = ("fit_end", "test_end")


class AfterFitOrTest(Callback):
    """A callback whose `run` is called at the end of the fit or of the test, as its `hook` says."""

    hook: Literal["fit_end", "test_end"]

    def set_hook(self, hook: Literal["fit_end", "test_end"]) -> None:
        """Check and keep when the callback runs: "fit_end" (after `trainer.fit`) or "test_end" (after `.test`)."""
        self.hook = validate.choice("hook", hook, HOOKS)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Run on the fitted model when `hook` is "fit_end"."""
        if self.hook == "fit_end":
            self.run(trainer, pl_module)

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Run after testing when `hook` is "test_end"."""
        if self.hook == "test_end":
            self.run(trainer, pl_module)

    def run(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The callback's work (every rank calls it)."""
        raise NotImplementedError
