"""What a run records in TensorBoard beside its scalars: hparams (the HPARAMS tab) and its resolved config (TEXT tab).

The HPARAMS tab gets one row per run: the map, n, d, N and seed first, then every plain value of the model and data
blocks of the config (`model/...`, `data/...`), against the run's final metrics (test/acc, ws/..., attack/...).
Runs write no experiment summary, so TensorBoard infers the columns from every run in the log folder (training and
evaluation runs side by side).
`hparams.yaml` in the log directory holds the same parameters (LightningCLI's internal `_instantiator` left out).
Logged by rank 0 after the run (`wslight.app.cli.WSLightCLI.after_fit` / `after_test`); the config text before it.

Event files: an evaluation adds at most one to its run folder per invocation, and none when it had nothing left to
run (every trial in its results file). The config text is written once per folder (a resumed evaluation has the same
run key, so the same config); the HPARAMS row, logged after Lightning has closed the run's event file, is appended to
that file rather than opening a new one (`_write_events`); the empty file Lightning opens for a run with nothing to
do is removed (`drop_empty_event_file`).
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only

# TensorBoard's name of an event file: events.out.tfevents.<time>.<host>.<pid>.<n>, n counting the process's files
EVENT_FILE = re.compile(r"events\.out\.tfevents\.\d+\.(?P<host>.+)\.(?P<pid>\d+)\.(?P<n>\d+)")

# The sizes of a sweep under the names a training run uses (a list of values joins into one string).
SIZE_KEYS = {"maps": "map", "d_values": "d", "n_values": "n", "N_values": "N", "d": "d", "N": "N", "encoder": "map"}


def flatten(tree: Any, prefix: str) -> dict[str, Any]:
    """{"model/fit_mode": ..., "model/feature_map": "RandomAttentionFeatures", ...}: class paths by class name."""
    if isinstance(tree, dict) and isinstance(tree.get("class_path"), str):
        out = {prefix: tree["class_path"].rpartition(".")[2]}
        return {**out, **flatten(tree.get("init_args") or {}, prefix)}
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}/{k}"))
        return out
    if isinstance(tree, list | tuple):
        return {prefix: ", ".join(str(v) for v in tree)}
    return {prefix: tree}


def _join(values: list) -> Any:
    values = [v.get("class_path", str(v)) if isinstance(v, dict) else v for v in values]  # a {class_path, ...} map
    values = list(dict.fromkeys(values))  # unique, in order
    return values[0] if len(values) == 1 else ", ".join(str(v) for v in values)


def sweep_sizes(init_args: dict) -> dict[str, Any]:
    """map, n, d, N of an evaluation config (`maps`, `cases: [{map, n}]`, `d_values`, `N_values`...)."""
    out: dict[str, Any] = {}
    grid = init_args.get("grid")  # the word-sensitivity sweeps' grid block (maps, d_values, n_values)
    init_args = {**init_args, **grid} if isinstance(grid, dict) else init_args
    for key, name in SIZE_KEYS.items():
        value = init_args.get(key)
        if value is not None and name not in out:
            out[name] = _join(value) if isinstance(value, list) else value
    cases = init_args.get("cases")
    if isinstance(cases, list) and cases and all(isinstance(c, dict) for c in cases):
        for name in ("map", "n"):
            if name not in out and any(name in c for c in cases):
                out[name] = _join([c[name] for c in cases if name in c])
    return out


def run_hparams(config: dict, model: Any = None, datamodule: Any = None) -> dict[str, Any]:
    """The map, n, d, N and seed of a run, then the flattened model and data blocks of the config.

    The first five come from the built model and data when it trains, else from the config.
    """
    init_args = (config.get("model") or {}).get("init_args") or {}
    params: dict[str, Any] = sweep_sizes(init_args)
    fmap = getattr(model, "feature_map", None)
    if fmap is not None:
        from ..features import map_name

        params.update(map=map_name(fmap), n=getattr(model, "n", None), d=getattr(fmap, "d", None))
        params["feature_dim"] = getattr(model, "p", None)  # p is the penalty weight in every record
    train = getattr(datamodule, "train_indices", None)
    if train is not None and len(train):
        params["N"] = len(train)
    params["seed"] = config.get("seed_everything", init_args.get("seed"))
    params.update(flatten(config.get("model"), "model"))
    if config.get("data") is not None:
        params.update(flatten(config.get("data"), "data"))
    return {k: v for k, v in params.items() if v is not None}


def final_metrics(*sources: dict) -> dict[str, float]:
    """The scalar metrics of a run (later sources win), as floats."""
    out: dict[str, float] = {}
    for source in sources:
        for k, v in source.items():
            try:
                out[k] = float(v)
            except (TypeError, ValueError):
                continue
    return out


def record_metrics(records: list[dict]) -> dict[str, float]:
    """Final numbers read from an evaluation's results.

    `results/records` and, for word sensitivity, the fitted slope of log S against log n per map and d
    (`ws/slope/<map>/d<d>`: -1/2 for 1/sqrt(n) decay, 0 for order 1).
    """
    from ..records.summary import slope_table

    metrics = {"results/records": float(len(records))}
    ws = [r for r in records if r.get("experiment") == "ws"]
    for row in slope_table(ws) if ws else []:
        metrics[f"ws/slope/{row['map']}/d{row['d']}"] = row["slope"]
    return metrics


def tensorboard_loggers(trainer: Any) -> list[TensorBoardLogger]:
    """The trainer's TensorBoard loggers."""
    return [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


def event_files(log_dir: str | Path) -> list[Path]:
    """The TensorBoard event files of a log folder (none when it does not exist)."""
    return sorted(Path(log_dir).glob("events.out.tfevents.*"))


@rank_zero_only
def log_config_text(trainer: Any, config_yaml: str) -> None:
    """The resolved config as the TEXT tab's `config` entry (indented: a code block in TensorBoard's markdown).

    Written once per log folder: a folder that holds event files already is a resumed evaluation's (the same run key,
    the same config), whose first invocation wrote it; writing it again would add an event file to the folder.
    """
    text = "\n".join("    " + line for line in config_yaml.splitlines())
    for logger in tensorboard_loggers(trainer):
        if event_files(logger.log_dir):
            continue
        logger.experiment.add_text("config", text, global_step=0)
        logger.experiment.flush()  # on disk now: a run killed before the writer's next flush still shows its config


def ran_nothing(trainer: Any) -> bool:
    """True after an evaluation that had nothing left to run.

    Every trial was in its results file, Lightning skipped the test loop (no step, no epoch hook) and the run logged
    nothing new.
    """
    state = getattr(trainer, "state", None)
    if state is None or state.fn != TrainerFn.TESTING or trainer.global_step != 0:
        return False  # a fit (its steps), or not a Lightning trainer
    batches = getattr(trainer, "num_test_batches", None)
    return batches is not None and not any(batches)


def own_event_file(log_dir: str | Path) -> Path | None:
    """The newest event file this process wrote in `log_dir` (by TensorBoard's name, `EVENT_FILE`), or None."""
    host, pid = socket.gethostname(), os.getpid()
    own = []
    for path in event_files(log_dir):
        m = EVENT_FILE.fullmatch(path.name)
        if m and m["host"] == host and int(m["pid"]) == pid:
            own.append((int(m["n"]), path))
    return max(own)[1] if own else None


def drop_empty_event_file(log_dir: str | Path) -> Path | None:
    """Remove this process's newest event file in `log_dir` when it holds no event but its header; return its path.

    Lightning opens a run's event file when the run starts (its setup hook makes the logger's writer), before it
    knows that an evaluation has nothing left to run; such a run writes nothing, and would leave a file of no data.
    """
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    path = own_event_file(log_dir)
    if path is None or any(event.WhichOneof("what") != "file_version" for event in EventFileLoader(str(path)).Load()):
        return None
    path.unlink()
    return path


def _write_events(logger: TensorBoardLogger, summaries: Iterable[Any], step: int) -> None:
    """Write TensorBoard summaries to the run's event file, opening no other one where it can.

    Lightning closes the logger's writer when `trainer.fit`/`test` returns (`finalize`), and a closed SummaryWriter
    opens a new event file at its next write: every HPARAMS row would add a file to the run folder. So when this
    process has written an event file in the folder, the summaries are appended to it (records in TensorBoard's
    format); a writer still open (a call within a run) writes them itself.
    """
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    writer = logger.experiment  # opened now (with its event file) when nothing was logged yet
    closed = writer.file_writer is None  # by Lightning, at the end of the run
    if closed and (path := own_event_file(logger.log_dir)) is not None:
        with path.open("ab") as f:
            records = RecordWriter(f)
            for summary in summaries:
                records.write(Event(wall_time=time.time(), step=step, summary=summary).SerializeToString())
        return
    file_writer = writer._get_file_writer()  # the open writer's file (or, none of ours found, a new one)
    for summary in summaries:
        file_writer.add_summary(summary, step)
    writer.flush()
    if closed:
        writer.close()  # as Lightning left it


def log_run_hparams(
    trainer: Any, params: dict[str, Any], metrics: dict[str, float], new: dict[str, float] | None = None
) -> None:
    """Fill the HPARAMS tab (params against metrics) and write hparams.yaml with the same params, on rank 0.

    An evaluation that had nothing left to run (`ran_nothing`) writes hparams.yaml only (its folder holds the row),
    and removes the empty event file Lightning opened for it (`drop_empty_event_file`).

    Args:
        trainer: the run's Lightning trainer (its loggers receive the row).
        params: flat {name: int, float, str or bool}.
        metrics: scalars the run has already logged (not written again; the tab lists every scalar of the run).
        new: scalars to log now (e.g. `results/records`).
    """
    if not trainer.is_global_zero:
        return
    from torch.utils.tensorboard.summary import hparams, scalar

    new = new or {}
    nothing = ran_nothing(trainer)
    for logger in tensorboard_loggers(trainer):
        if nothing:
            drop_empty_event_file(logger.log_dir)
        elif metrics or new:
            # not logger.log_hyperparams(params, metrics): it logs every metric again, one more point per curve.
            # No experiment summary: TensorBoard shows the one experiment it finds in any run (that run's columns
            # only), while without one it takes the hparams of every run's session start and, as metrics, the
            # scalars of those runs, so training and evaluation runs in one log folder share the tab.
            _, session_start, session_end = hparams(params, {**metrics, **new})
            scalars = [scalar(name, value) for name, value in new.items()]
            _write_events(logger, [*scalars, session_start, session_end], trainer.global_step)
        os.makedirs(logger.log_dir, exist_ok=True)
        save_hparams_to_yaml(os.path.join(logger.log_dir, logger.NAME_HPARAMS_FILE), params)
