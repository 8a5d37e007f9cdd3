"""Lightning callbacks that run evaluations of the paper on a fitted head and log them.

`DeltaAttackCallback`: after the fit (or the test) of a `FeatureMapClassifier`, the single-token Delta attack
(docs/theory/attack.md §6) on held-out context samples, with the heads theta*, theta_f, theta_r re-derived in closed
form from the training split; records go to `attack_results.jsonl`, scalars and the Figure-4-style scatter to the
logger. The callback only schedules the work: the attacks, their records, the summary and the figures are those of
`wslight.tasks.DeltaAttackSweep`.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from tqdm.auto import tqdm

from ..attack.inputs import draw_samples
from ..attack.losses import LOSSES
from ..attack.settings import AttackSettings
from ..base import validate
from ..base.names import TRAININGS
from ..base.seeding import derive_seed
from ..features import map_name, output_dim
from ..records.results import ResultsFile, config_key
from ..records.summary import ATTACK_REQUIRED, attack_scalars, trusted
from .after_fit import AfterFitOrTest
from .attack_sweep import attack_objectives, checked_penalties, run_attacks
from .figures import attack_figures, save_figure
from .steps import gather_records, one_cpu_thread

ATTACK_RESULTS_NAME = "attack_results.jsonl"


def _attackable(fmap: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The feature map on `device` with ordinary (not inference-mode) buffers; a copy when it has to change.

    After `trainer.fit` the strategy has moved the model to the CPU (on_fit_end runs after its teardown); buffers
    created under inference mode cannot be saved for backward. The model itself is never modified.
    """
    bufs = list(fmap.buffers())
    if all(b.device == device and not b.is_inference() for b in bufs):
        return fmap
    fmap = copy.deepcopy(fmap)
    for m in fmap.modules():
        for name, b in m._buffers.items():
            if b is not None:
                m._buffers[name] = b.to(device).clone()
    return fmap


class DeltaAttackCallback(AfterFitOrTest):
    """Run the single-token Delta attack on the fitted model's feature map and log what it finds.

    See docs/theory/attack.md §6.

    At the chosen hook, the training split of the datamodule (`trainer.datamodule`: an EmbeddingDataModule or any
    datamodule with `embeddings`, `train_indices`, `test_indices`, `n`, `d`) gives the N training samples of the
    closed-form heads (docs/theory/attack.md §5.2: theta* = Phi^+ Y, the minimum-norm interpolator, and its fine-tuned /
    re-trained updates theta_f / theta_r on each context sample); `num_contexts` context samples are drawn from the test
    split (never training samples) and attacked with `wslight.attack.delta_attacks`, all (training, loss) in one search.

    Under DDP every rank attacks its share of the contexts (rank r takes contexts r::world_size), the records are
    gathered on every rank and rank 0 appends them to `<log dir>/attack_results.jsonl`, logs
    `attack/err_<training>` (median Err) and `attack/flip_rate_<training>` (fraction of contexts whose sign flips to
    -y) and saves the Err-vs-gamma scatter (`attack_scatter.png/.pdf`, and TensorBoard when the logger is a
    TensorBoardLogger). Every context is attacked in its own call with a seed derived from its index, so the records do
    not depend on the number of devices.

    With N = the whole training split and a `fit_mode="closed_form"` model, theta* is the head the model itself
    learned: the records' t0 equal the model's outputs on the context samples.

    Args:
        trainings: heads attacked: "finetune" (theta_f) and/or "retrain" (theta_r).
        losses: Delta objectives: "err" (16), "align" (24a), "align_proj" (24b), "penalized" (err + penalty
            (phi^T theta*)^2).
        penalties: penalty weights of the "penalized" loss (each >= 0, recorded as the field `p`); other losses use 0.
        num_contexts: held-out context samples attacked, drawn from the datamodule's test split (seeded).
        N: training samples for the heads; None means the whole training split, else a seeded subset of it. Must be
            smaller than the feature dimension p (so that the heads interpolate).
        attack: the optimiser's settings (`AttackSettings`: steps, lr, restarts, faithful, position, radius, dtype);
            a field left at None takes its default (`wslight.attack.AttackSettings`). None: every field at its default.
        seed: seed of the context draw, the training subset and the restarts.
        hook: when to attack: "fit_end" (after `trainer.fit`) or "test_end" (after `trainer.test`). (Not named `on`:
            YAML 1.1 reads the key `on` as the boolean true.)
    """

    def __init__(
        self,
        trainings: list[Literal["finetune", "retrain"]] = ["finetune", "retrain"],  # noqa: B006 (typed CLI default)
        losses: list[Literal["err", "align", "align_proj", "penalized"]] = ["err"],  # noqa: B006
        penalties: list[float] = [0.0],  # noqa: B006
        num_contexts: int = 8,
        N: int | None = None,
        attack: AttackSettings | None = None,
        seed: int = 0,
        hook: Literal["fit_end", "test_end"] = "fit_end",
    ) -> None:
        super().__init__()
        self.trainings = validate.choices("trainings", trainings, TRAININGS)
        self.losses = validate.choices("losses", losses, LOSSES)
        self.penalties = checked_penalties(penalties)
        self.num_contexts = validate.positive_int("num_contexts", num_contexts)
        self.N = validate.integer("N", N, low=1, allow_none=True)
        self.attack = attack if attack is not None else AttackSettings()  # checked when it was made
        self.seed = validate.integer("seed", seed, low=0)
        self.set_hook(hook)
        self.records: list[dict] = []  # the last attack's de-duplicated records (every rank)
        self.metrics: dict[str, float] = {}  # the last attack's scalars (every rank)
        self.results_path: Path | None = None

    def settings(self) -> dict[str, Any]:
        """The init arguments (they key the results: the same settings at the same step append nothing twice)."""
        keys = ("trainings", "losses", "penalties", "num_contexts", "N")
        return {
            **{k: getattr(self, k) for k in keys},
            "attack": self.attack.given(),
            "seed": self.seed,
            "hook": self.hook,
        }

    def _inputs(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        """Check the model and data against the settings and pick the training / context samples (no heavy work)."""
        fmap = getattr(pl_module, "feature_map", None)
        if fmap is None:
            raise ValueError(
                "DeltaAttackCallback: the model must have a `feature_map` (e.g. FeatureMapClassifier), "
                f"got {type(pl_module)}"
            )
        dm = trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning's data connector, unseen by mypy
        needed = ("embeddings", "train_indices", "test_indices", "n", "d")
        if dm is None or any(getattr(dm, k, None) is None for k in needed):
            raise ValueError(
                f"DeltaAttackCallback: needs trainer.datamodule with {list(needed)} after setup "
                "(an EmbeddingDataModule), "
                f"got {type(dm).__name__}"
            )
        n, d = int(dm.n), int(dm.d)
        p_dim = output_dim(fmap, n)
        train_idx = torch.as_tensor(dm.train_indices, dtype=torch.int64)
        test_idx = torch.as_tensor(dm.test_indices, dtype=torch.int64)
        M = len(train_idx)
        N = M if self.N is None else self.N
        if N > M:
            raise ValueError(f"N must be <= {M} (the size of the training split), got {N}")
        if N >= p_dim:
            raise ValueError(
                f"N must be < {p_dim} (the feature dimension p of the map for n={n}, d={d}, so that the heads "
                f"interpolate), got {N}"
            )
        if self.num_contexts > len(test_idx):
            raise ValueError(
                f"num_contexts must be <= {len(test_idx)} (the size of the test split, where context samples come "
                f"from), got {self.num_contexts}"
            )
        self.attack.check_position(n)
        if N < M:  # a seeded subset of the training split, in split order
            train_idx = torch.sort(draw_samples(train_idx, N, self.seed, "callback.train")).values
        # context i is the i-th draw, the same on every rank
        ctx_idx = draw_samples(test_idx, self.num_contexts, self.seed, "callback.contexts")
        return {"fmap": fmap, "dm": dm, "n": n, "d": d, "N": N, "train_idx": train_idx, "ctx_idx": ctx_idx}

    def attack_contexts(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        rank: int = 0,
        world_size: int = 1,
        inputs: dict[str, Any] | None = None,
    ) -> list[dict]:
        """The records of the contexts `rank::world_size` (no collective, no file)."""
        inp = self._inputs(trainer, pl_module) if inputs is None else inputs
        fmap, dm, n, d, N = inp["fmap"], inp["dm"], inp["n"], inp["d"], inp["N"]
        device = trainer.strategy.root_device
        fmap = _attackable(fmap, device)
        emb, normalize = dm.embeddings, bool(getattr(dm, "normalize", True))
        X_train, Y = emb.samples(inp["train_idx"], n, d, normalize)  # (N, n, d), (N,)
        train_ids = emb.sample_ids[inp["train_idx"]]  # (N,)
        X_train, Y = X_train.to(device), Y.to(device)
        name = map_name(fmap)
        objectives = attack_objectives(self.trainings, self.losses, self.penalties)
        records = []
        for i in self._progress(trainer, range(rank, self.num_contexts, world_size)):
            idx = inp["ctx_idx"][i : i + 1]
            X_ctx, y_ctx = emb.samples(idx, n, d, normalize)  # (1, n, d), (1,)
            attack_seed = derive_seed(self.seed, "callback.attack", i)
            trial = {
                "trial_key": f"ctx{i}",
                "map": name,
                "d": d,
                "n": n,
                "N": N,
                "trial": i,
                "position": self.attack.position,
                "seed": self.seed,
                "map_seed": getattr(fmap, "seed", None),
                "attack_seed": attack_seed,
                "epoch": trainer.current_epoch,
                "global_step": trainer.global_step,
                "rank": rank,  # the process that attacked this context
            }
            records += run_attacks(
                fmap,
                X_train,
                Y,
                X_ctx.to(device),
                y_ctx.to(device),
                trial,
                objectives,
                emb.sample_ids[idx].tolist(),
                settings=self.attack,
                seed=attack_seed,
                train_ids=train_ids,
                ctx_ids=emb.sample_ids[idx],
            )
        return records

    @staticmethod
    def _progress(trainer: Trainer, contexts: range) -> Any:
        """The contexts, with a bar on rank 0 (one update per attacked context) unless the trainer shows none."""
        show = trainer.is_global_zero and trainer.progress_bar_callback is not None
        # mininterval 0: each context takes seconds, so every update is worth a line in a log file
        return tqdm(contexts, desc="Delta attack contexts", disable=not show, mininterval=0, file=sys.stderr)

    def run(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Attack this rank's contexts, gather on every rank, write and log on rank 0.

        Runs with gradients enabled and outside inference mode (the test loop's hooks run under inference mode; the
        attack takes input gradients with torch.autograd.grad through the unwrapped feature map), on one CPU thread
        per process (`one_cpu_thread`: the records do not depend on the number of devices).
        """
        with torch.inference_mode(False), torch.enable_grad(), one_cpu_thread(trainer.strategy.root_device):
            self._run(trainer, pl_module)

    def _run(self, trainer: Trainer, pl_module: LightningModule) -> None:
        out_dir = Path(trainer.log_dir or trainer.default_root_dir)  # log_dir is a collective: every rank calls it
        inputs = self._inputs(trainer, pl_module)  # every check, before any attack
        distributed = trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
        world_size, rank = (trainer.world_size, trainer.global_rank) if distributed else (1, 0)
        records = gather_records(self.attack_contexts(trainer, pl_module, rank, world_size, inputs), world_size)
        # one record per (context, training, loss), in context order (a padded or repeated shard counts once)
        unique: dict[str, dict] = {}
        for r in sorted(records, key=lambda r: (r["trial"], r["training"], r["loss"])):
            unique.setdefault(r["record_key"], r)
        self.records = list(unique.values())
        self.metrics = attack_scalars(trusted(self.records, "attack", ATTACK_REQUIRED), self.trainings)
        if trainer.is_global_zero:
            self.write(trainer, out_dir, self.run_key(trainer, inputs))

    def run_key(self, trainer: Trainer, inputs: dict[str, Any]) -> str:
        """Identity of an attack: settings, step, map (type, seed, a checksum of its weights), sizes, sample ids.

        A re-run of the same attack in the same folder appends nothing; another model or data set never counts as
        done (runs without a logger share `default_root_dir`).
        """
        fmap = inputs["fmap"]
        with torch.no_grad():
            checksum = [float(b.double().sum()) for b in fmap.buffers()]
        ids = inputs["dm"].embeddings.sample_ids
        identity = {
            **self.settings(),
            "global_step": trainer.global_step,
            "map": map_name(fmap),
            "map_seed": getattr(fmap, "seed", None),
            "map_checksum": checksum,
            "n": inputs["n"],
            "d": inputs["d"],
            "train_ids": ids[inputs["train_idx"]].tolist(),
            "ctx_ids": ids[inputs["ctx_idx"]].tolist(),
        }
        return "callback-" + config_key(identity)

    def write(self, trainer: Trainer, out_dir: Path, run_key: str) -> None:
        """Rank 0: append the records, log the scalars, save the figures (those of the attack sweep)."""
        self.results_path = out_dir / ATTACK_RESULTS_NAME
        ResultsFile(self.results_path, run_key).append(self.records)
        for logger in trainer.loggers:
            logger.log_metrics(self.metrics, step=trainer.global_step)
            logger.save()
        records = trusted(self.records, "attack", ATTACK_REQUIRED)
        for tag, fig, stem in attack_figures(records):
            save_figure(fig, out_dir, stem, logger=trainer.logger, tag=tag, step=trainer.global_step)
        experiment = getattr(trainer.logger, "experiment", None)
        if experiment is not None and hasattr(experiment, "flush"):
            experiment.flush()
