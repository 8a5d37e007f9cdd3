"""`wslight reproduce`: its options, `--list` and `--help` (the plan's stages, the exit statuses), and `main`."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import NoReturn

import yaml

from ...base import validate
from ...records.results import unwritable_reason
from ..error_lines import closest, did_you_mean
from ..errors import EXIT_BUSY, EXIT_FAILED, EXIT_USAGE, UsageError
from .pages import write_pages
from .plan import PLAN, PLANS, Stage, load_plan, stage_table
from .report import write_report
from .signals import Interrupted, stop_on_signals
from .stages import TIMES_FILE, StageStopped, read_json, run_stages

DESCRIPTION = """Run (or resume) the reproduction plan and write reports/<offline|full>/report.md: the figures, per-cell
tables, the paper's claims checked (PASS/FAIL), this package's hypotheses beyond the paper (supported or not) and
provenance of every stage whose results are on disk. Each stage is an evaluate.py config that also runs alone and
writes its results as trials finish: after an interruption, run the same command again to resume. `--only <stage> ...`
runs those stages; the report keeps the others. Beside the report go its results pages (reproduction.md and, with
the one-word stages, beyond_paper.md), which `make results-pages` copies into docs/results/."""

# Exit statuses, as every wslight command's (wslight.app.errors); a stage's own 2, 75, 130 or 143 is passed on.
EXIT_STATUSES = {
    0: "done",
    EXIT_FAILED: "a stage failed",
    EXIT_USAGE: "a mistake in the command or a stage's config",
    EXIT_BUSY: "a stage's run folder is being written by another process",
    130: "interrupted by SIGINT (Ctrl-C): run the same command again to resume",
    143: "interrupted by SIGTERM: run the same command again to resume",
}


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
    except (OSError, ValueError, UsageError, yaml.YAMLError) as err:
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
    """The whole plan and the stages to run (`--only`); a mistake exits 2 with one block naming the option.

    Checked before any stage runs: the options' values, the plan, the `--only` names (with the stage meant for a
    misspelt one) and that `--reports` can hold the report's folder.
    """
    try:
        validate.choice("full", args.full, [0, 1])
        validate.integer("threads", args.threads, low=0)
        plan = load_plan(PLANS[args.full], args.plan)
        if args.only:
            _check_only(args.only, plan)
        if not args.list:
            reason = unwritable_reason(Path(args.reports) / PLANS[args.full])
            if reason is not None:
                raise UsageError(f"--reports={args.reports}: {reason}; give a folder (it is created when missing)")
    except (ValueError, UsageError) as err:
        parser.error(str(err))
    except (OSError, yaml.YAMLError) as err:
        parser.error(f"plan={args.plan}: {err}")
    return plan, [s for s in plan if not args.only or s.name in args.only]


def _check_only(only: list[str], plan: list[Stage]) -> None:
    """Refuse `--only` names that are no stage of the plan, with the stages meant when they are misspelt."""
    names = [s.name for s in plan]
    try:
        validate.choices("only", only, names)
    except ValueError as err:
        meant = [name if name in names else closest(name, names) for name in only]
        if all(meant):  # a stage close to every unknown name: the command meant
            hint = f"; did you mean --only {' '.join(dict.fromkeys(m for m in meant if m))}?"
        else:
            hint = "".join(did_you_mean(name, names, before=f"; {name}: ") for name in only if name not in names)
        raise UsageError(f"{err}{hint} (--list shows the stages)") from None


def main(argv: list[str] | None = None, prog: str | None = None) -> Path | None:
    """Run (or resume) the plan's stages, write the report and the results pages; return the report's path.

    None with `--list`.

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
            times = read_json(report_dir / TIMES_FILE)
            report = write_report(report_dir, plan, ran, times, bool(args.full), Path(args.plan))
            command = [*(prog or "wslight reproduce").split(), *argv]
            pages = write_pages(report_dir, plan, ran, times, command, bool(args.full))
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
    print(
        f"\nreport: {report}\nresults pages: {', '.join(map(str, pages))} (`make results-pages` copies them to docs/)"
    )
    return report
