"""The results pages a reproduction writes beside its report, in the documentation's form.

`reports/<run-id>/reproduction.md`: the wall time per stage (stage_times.json), the checks in their two parts and the
paper's stages (figures, summaries); `reports/<run-id>/beyond_paper.md`, when the run holds one-real-word records: the
hypotheses beyond the paper and their stages. Each page starts with the header of wslight.records.pages (date,
machine, commit, command) and links the report's figures relatively (`figures/...`), so `make results-pages` copies
the pages and the figures they show into docs/results/. Written from the records on disk: re-running over a finished
run rewrites them without recomputing a trial.
"""

from __future__ import annotations

from pathlib import Path

from ...records.checks import HYPOTHESIS, checks_report
from ...records.pages import PageHeader, write_page
from .plan import Stage
from .report import RunRecords, stage_section

REPRODUCTION_PAGE = "reproduction.md"
BEYOND_PAGE = "beyond_paper.md"


def beyond_the_paper(stage: Stage) -> bool:
    """True for a stage that tests this package's hypotheses beyond the paper (one real word: `words_*`)."""
    return stage.name.startswith("words")


def duration(seconds: float) -> str:
    """A wall time as a reader takes it in: `52 s`, `18 min 52 s`."""
    whole = round(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


def times_table(plan: list[Stage], run: RunRecords, times: dict[str, float]) -> list[str]:
    """The wall time per stage (summed over resumed runs) and its records, one row per stage with results."""
    lines = [
        "## Wall time per stage",
        "",
        "Each stage's wall time as `wslight reproduce` measured it (`stage_times.json`, summed over resumed runs; a "
        "stage run alone with evaluate.py adds none).",
        "",
        "| stage | what | records | wall time |",
        "|---|---|---|---|",
    ]
    shown = [s for s in plan if s.name in run.results]
    for stage in shown:
        seconds = times.get(stage.name)
        wall = duration(seconds) if seconds is not None else "not timed"
        lines.append(f"| {stage.name} | {stage.title} | {len(run.records[stage.name])} | {wall} |")
    total = sum(times.get(s.name, 0.0) for s in shown)
    return [*lines, f"| **all** | | {sum(len(run.records[s.name]) for s in shown)} | **{duration(total)}** |", ""]


def write_pages(
    report_dir: Path,
    plan: list[Stage],
    ran: dict[str, Path],
    times: dict[str, float],
    command: list[str],
    full: bool = False,
) -> list[Path]:
    """Write reproduction.md (and beyond_paper.md when a one-word stage has results) into `report_dir`.

    Args:
        report_dir: the run's folder, reports/<run-id>/, where report.md and its figures are.
        plan: the plan's stages; the pages describe those with results on disk.
        ran: the results.jsonl of the stages this run ran.
        times: each stage's wall time (stage_times.json).
        command: the command that ran, for the pages' header.
        full: the paper-size plan (`--full 1`), named in the titles.

    Returns:
        The pages written.
    """
    run = RunRecords.read(report_dir, plan, ran)
    header = PageHeader.collect(command)
    size = " (paper-size)" if full else ""
    beyond = [s for s in plan if beyond_the_paper(s) and s.name in run.results]
    body = [
        "The reproduction of `make reproduce`, stage by stage: every number is read from the stages' `results.jsonl`"
        " files; the run's full report, with its provenance, is `report.md` beside this page.",
        "",
        *run.missing_line(plan),
        *times_table(plan, run, times),
        *checks_report(run.checks),
    ]
    if beyond:
        body += [f"The hypotheses' stages: [beyond the paper]({BEYOND_PAGE}).", ""]
    for stage in plan:
        if stage.name in run.results and not beyond_the_paper(stage):
            body += stage_section(stage, run.results[stage.name], len(run.records[stage.name]), times, report_dir)
    pages = [write_page(report_dir / REPRODUCTION_PAGE, f"Reproduction{size}", header, body)]
    if beyond:
        body = [
            "What this package tests beyond the paper on the reproduction's one-real-word stages "
            "(docs/theory/words.md §13),"
            f" from their `results.jsonl` files; the paper's claims are on the [reproduction]({REPRODUCTION_PAGE})"
            " page.",
            "",
            *checks_report([c for c in run.checks if c.kind == HYPOTHESIS]),
        ]
        for stage in beyond:
            body += stage_section(stage, run.results[stage.name], len(run.records[stage.name]), times, report_dir)
        pages.append(write_page(report_dir / BEYOND_PAGE, f"Beyond the paper{size}", header, body))
    return pages
