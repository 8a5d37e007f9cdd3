"""Running the plan's stages, and finding every stage's results on disk.

Each stage is one evaluate.py run (in this process, or as its own command when it runs several processes), resumed
after an interruption; its wall time and results path are kept beside the report.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ...records.results import RESULTS_NAME
from ...records.shards import shard_of_file
from ..errors import EXIT_BUSY, EXIT_FAILED, EXIT_SIGNAL_BASE, EXIT_USAGE
from .plan import Stage
from .signals import STOP_SIGNALS, Interrupted, run_passing_signals

TIMES_FILE = "stage_times.json"  # in reports/<run-id>/: each stage's wall time, summed over resumed runs
RESULTS_FILE = "stage_results.json"  # in reports/<run-id>/: the results.jsonl each stage's last run wrote

PASSED_ON = frozenset({EXIT_USAGE, EXIT_BUSY, *(EXIT_SIGNAL_BASE + s for s in STOP_SIGNALS)})


def stage_args(stage: Stage, log_dir: Path) -> list[str]:
    """evaluate.py's arguments for a stage: its config; only the log location is set here (not part of the run key)."""
    return [
        "test",
        "--config",
        str(stage.path),
        "--trainer.logger.init_args.save_dir",
        str(log_dir),
        "--trainer.logger.init_args.name",
        stage.name,
    ]


def stage_command(stage: Stage, log_dir: Path) -> list[str]:
    """The command line of a stage of several processes: `python -m wslight evaluate` with the stage's arguments."""
    return [sys.executable, "-m", "wslight", "evaluate", *stage_args(stage, log_dir)[1:]]


class StageStopped(Exception):
    """A stage ended without its results: the one line that names it, and the exit status of `wslight reproduce`."""

    def __init__(self, line: str, status: int) -> None:
        super().__init__(line)
        self.status = status


def stage_status(code: object) -> int:
    """The exit status of `wslight reproduce` for a stage's.

    0, 2, 75, 130 and 143 unchanged (see EXIT_STATUSES), a stage killed by SIGINT or SIGTERM (a negative return code) as
    the shell reports it, anything else 1.
    """
    if code is None or code == 0:
        return 0
    if isinstance(code, int) and code < 0 and -code in STOP_SIGNALS:
        return EXIT_SIGNAL_BASE - code
    return code if isinstance(code, int) and code in PASSED_ON else EXIT_FAILED


def stop_line(stage: Stage, status: int) -> str:
    """The one line that says why a stage stopped and what to do."""
    if status - EXIT_SIGNAL_BASE in STOP_SIGNALS:
        return (
            f"stage {stage.name} interrupted ({signal.Signals(status - EXIT_SIGNAL_BASE).name}): its finished trials "
            "are saved; run the same command again to resume"
        )
    if status == EXIT_BUSY:
        return (
            f"error: stage {stage.name}: its run folder is being written by another process (see above); run the "
            "same command again once that run has finished"
        )
    if status == EXIT_USAGE:
        return f"error: stage {stage.name}: a mistake in its config {stage.config} (see above)"
    return (
        f"error: stage {stage.name} failed (its message is above); the finished stages and trials are kept: run the "
        "same command again to resume"
    )


# What a launcher of processes leaves in the environment (Lightning's own, torchrun's): a stage that inherited them
# would take itself for one process of a run started elsewhere, start no other process and wait for them forever
LAUNCHER_VARIABLES = (
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "NODE_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


def stage_environment(environ: Mapping[str, str], threads: int) -> dict[str, str]:
    """The environment of a stage's own command: this wslight first on PYTHONPATH, no launcher's variables.

    `threads` > 0 sets the stage's OMP_NUM_THREADS. A stage is a run of its own that starts its own processes, also
    when this process is one of another run's (an earlier in-process run left LOCAL_RANK and MASTER_PORT behind).
    """
    root = str(Path(__file__).resolve().parents[3])  # this wslight, also where it is not installed
    env = {k: v for k, v in environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, environ.get("PYTHONPATH")) if p)
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_stage(stage: Stage, log_dir: Path, threads: int = 0) -> Path:
    """Run (or resume) one stage; return its results.jsonl.

    A stage of several processes (`devices: auto` on a CPU of several cores: wslight.app.placement) runs as its own
    command (`stage_command`), its output passed through, because Lightning starts the other processes by running
    the stage's command line again; a stage of one process (the probes) runs in this process. `threads` > 0 sets the
    stage's torch threads (the searches themselves run on one thread per process).

    Raises:
        SystemExit: with the stage's exit status when it fails (its message is on stderr already) or is interrupted.
        Interrupted: SIGINT or SIGTERM reached this process while the stage's command ran (the stage got it too and
            stopped; see `run_passing_signals`).
    """
    if stage.processes() == 1:
        return _run_in_process(stage, log_dir, threads)
    from ..cli import RESULTS_PATH_ENV

    env = stage_environment(os.environ, threads)
    with tempfile.TemporaryDirectory() as tmp:  # the stage's output goes to the terminal; its results path here
        env[RESULTS_PATH_ENV] = str(Path(tmp) / "results_path")
        code, signum = run_passing_signals(stage_command(stage, log_dir), env)
        written = Path(env[RESULTS_PATH_ENV])
        path = written.read_text() if written.exists() else None
    if signum is not None:
        raise Interrupted(signum)
    if code != 0 or not path:
        raise SystemExit(stage_status(code) or EXIT_FAILED)
    return Path(path)


def _run_in_process(stage: Stage, log_dir: Path, threads: int) -> Path:
    from ..cli import main

    if threads > 0:
        import torch

        torch.set_num_threads(threads)
    handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        return Path(main(stage_args(stage, log_dir), evaluate=True).model.results_path)
    finally:
        for s, handler in handlers.items():  # the evaluation installs its own; the driver's come back after it
            if handler is not None:
                signal.signal(s, handler)


def read_json(path: Path) -> dict:
    """A JSON file's object, or {} when the file does not exist."""
    return json.loads(path.read_text()) if path.exists() else {}


def run_stages(stages: list[Stage], report_dir: Path, threads: int = 0) -> dict[str, Path]:
    """Run (or resume) the stages in order; return each one's results.jsonl.

    Each stage's wall time adds up in stage_times.json (over resumed runs) and its results path goes to
    stage_results.json, where the report of a later run that leaves the stage out finds it.

    Raises:
        StageStopped: a stage failed or was interrupted (the line names it; its status is `stage_status`'s).
    """
    log_dir = report_dir / "tensorboard"
    report_dir.mkdir(parents=True, exist_ok=True)
    ran: dict[str, Path] = {}
    for i, stage in enumerate(stages, 1):
        print(f"\n=== [{i}/{len(stages)}] {stage.name}: {stage.title} ({stage.config}) ===", flush=True)
        start = time.perf_counter()
        try:
            ran[stage.name] = run_stage(stage, log_dir, threads)
        except SystemExit as exc:
            status = stage_status(exc.code) or EXIT_FAILED  # a stage that exits 0 without its results failed too
            raise StageStopped(stop_line(stage, status), status) from None
        except Interrupted as sig:
            raise StageStopped(stop_line(stage, sig.status), sig.status) from None
        times = read_json(report_dir / TIMES_FILE)
        times[stage.name] = times.get(stage.name, 0.0) + time.perf_counter() - start
        (report_dir / TIMES_FILE).write_text(json.dumps(times, indent=1))
        paths = {**read_json(report_dir / RESULTS_FILE), stage.name: os.path.relpath(ran[stage.name], report_dir)}
        (report_dir / RESULTS_FILE).write_text(json.dumps(paths, indent=1))
    return ran


def stage_results(report_dir: Path, plan: list[Stage], ran: dict[str, Path] | None = None) -> dict[str, Path]:
    """The results.jsonl of every stage of the plan that has a non-empty one on disk, in the plan's order.

    For each stage, the first that exists of: the one this run wrote (`ran`), the one its last run by `wslight
    reproduce` wrote (stage_results.json), and the newest results file under its log folder
    `tensorboard/<stage>/run-<run key>/` (where the stage's config writes when it runs alone; a shard's file when only
    shards of it ran there). A stage's records are those of the file's run folder (`records.shards.run_records`).
    """
    ran = ran or {}
    recorded = read_json(report_dir / RESULTS_FILE)
    found = {}
    for stage in plan:
        on_disk = sorted(
            (
                p
                for p in (report_dir / "tensorboard" / stage.name).glob("*/*.jsonl")
                if p.name == RESULTS_NAME or shard_of_file(p) is not None
            ),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        candidates = [ran.get(stage.name), report_dir / recorded[stage.name] if stage.name in recorded else None]
        path = next((p for p in [*candidates, *on_disk] if p is not None and p.is_file() and p.stat().st_size), None)
        if path is not None:
            found[stage.name] = Path(path)
    return found
