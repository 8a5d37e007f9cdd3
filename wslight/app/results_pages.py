"""`make results-pages`: copy the results pages of the latest runs into docs/results/, with the figures they show.

The pages come from `make reproduce` (reports/offline/: reproduction.md, and beyond_paper.md when the run has its
one-word stages), `make bench` (reports/bench/: ws_speed.md, attack_speed.md), `make classifier`
(reports/classifier/: real_classifier.md), `make finetuned`
(reports/finetuned/: finetuned_classifier.md), `python -m benchmarks.textattack_side` (reports/textattack/:
textattack_side.md), `make encoder-words` (reports/encoder_words/: encoder_words.md), `make
encoder-continuous` (reports/encoder_continuous/: encoder_continuous.md), `make generic-speed` (reports/generic/:
generic_speed.md, generic_rf.md, generic_attention.md, generic_starts.md) and, on a GPU machine, `make gpu-words`
(reports/gpu_words/: gpu_words.md) and `make gpu-results` (reports/gpu_results/: gpu.md, gpu_words.md,
gpu_finetuned.md); each page already carries its header (date, machine, commit, command:
wslight.records.pages). A run whose pages are missing stops the copy before any file is
written: one line naming the command that writes them, exit status 2. So does a page that covers less than the one it
would replace in docs/results/ (a section of the committed page missing, or fewer records: a run of a few stages, as
`wslight reproduce --only ...`), unless `--replace` asks for it.

    python -m wslight.app.results_pages                     # make reproduce and make bench (= make results-pages)
    python -m wslight.app.results_pages --runs bench        # only the benchmarks' pages
    python -m wslight.app.results_pages --replace           # also where a page covers less (make ... REPLACE=1)
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import EXIT_USAGE

# a page's relative image links, `![...](figures/<name>.png)`, as the report links its figures
FIGURE_LINK = re.compile(r"!\[[^\]]*\]\((figures/[^)\s]+)\)")
SECTION = re.compile(r"^## (.+?)\s*$", re.MULTILINE)  # a page's sections: a reproduction's stages, a benchmark's cells
ALL_RECORDS = re.compile(r"^\| \*\*all\*\* \|[^|]*\| (\d+) \|", re.MULTILINE)  # the stage table's total row


@dataclass(frozen=True)
class Run:
    """The pages one command writes, in its folder under the reports folder.

    Attributes:
        command: the command that writes them (`make reproduce`).
        folder: its folder under the reports folder (`offline`).
        pages: the pages every run of it writes.
        optional: the pages it writes only when its data are there (beyond_paper.md: the one-word stages).
    """

    command: str
    folder: str
    pages: tuple[str, ...]
    optional: tuple[str, ...] = ()


RUNS = {
    "reproduce": Run("make reproduce", "offline", ("reproduction.md",), ("beyond_paper.md",)),
    "bench": Run("make bench", "bench", ("ws_speed.md", "attack_speed.md")),
    "classifier": Run("make classifier", "classifier", ("real_classifier.md",)),
    "finetuned": Run("make finetuned", "finetuned", ("finetuned_classifier.md",)),
    "textattack": Run(
        "python -m benchmarks.textattack_side --page reports/textattack", "textattack", ("textattack_side.md",)
    ),
    "encoder_words": Run("make encoder-words", "encoder_words", ("encoder_words.md",)),
    "encoder_continuous": Run("make encoder-continuous", "encoder_continuous", ("encoder_continuous.md",)),
    "gpu_words": Run("make gpu-words", "gpu_words", ("gpu_words.md",)),
    "gpu_results": Run("make gpu-results", "gpu_results", ("gpu.md", "gpu_words.md", "gpu_finetuned.md")),
    "generic": Run(
        "make generic-speed",
        "generic",
        ("generic_speed.md", "generic_rf.md", "generic_attention.md", "generic_starts.md"),
    ),
}

DEFAULT_RUNS = ("reproduce", "bench")  # as `make results-pages`; the other runs' pages are copied when asked for


class MissingRun(Exception):
    """A run whose pages are not on disk: the line that names it and the command that writes them."""


class NarrowerPage(Exception):
    """A page that covers less than the one it would replace: the line that says what each covers."""


@dataclass(frozen=True)
class Coverage:
    """What a results page covers: its sections (`## ...`) and, for a reproduction, the records of its stage table."""

    sections: tuple[str, ...]
    records: int | None

    @classmethod
    def of(cls, text: str) -> Coverage:
        """The coverage of a page's markdown."""
        total = ALL_RECORDS.search(text)
        return cls(tuple(SECTION.findall(text)), int(total.group(1)) if total else None)

    def describe(self) -> str:
        """E.g. "13 sections, 1,973 records"."""
        records = f", {self.records:,} records" if self.records is not None else ""
        return f"{len(self.sections)} section{'s' * (len(self.sections) != 1)}{records}"

    def shortfall(self, old: Coverage) -> str | None:
        """What `old` covers that this page does not (its missing sections, fewer records), or None."""
        missing = [s for s in old.sections if s not in self.sections]
        fewer = self.records is not None and old.records is not None and self.records < old.records
        if not missing and not fewer:
            return None
        lacking = ", ".join(f"'{s}'" for s in missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        return f"lacks {lacking}" if missing else "has fewer records"


def check_coverage(pages: list[Path], docs: Path) -> None:
    """Refuse to replace a page of `docs` by one that covers less (a partial run), before anything is copied.

    Raises:
        NarrowerPage: the first such page, with what each covers and what to do.
    """
    for page in pages:
        current = docs / page.name
        if not current.is_file():
            continue
        new, old = Coverage.of(page.read_text()), Coverage.of(current.read_text())
        shortfall = new.shortfall(old)
        if shortfall:
            raise NarrowerPage(
                f"{page} covers {new.describe()} where {current} covers {old.describe()}: it {shortfall}; "
                "finish the run that wrote it (a reproduction resumes its finished stages), or replace the page "
                "anyway with --replace (make results-pages REPLACE=1)"
            )


def pages_to_copy(reports: Path, runs: list[str]) -> list[Path]:
    """The pages of `runs` under `reports`, in order.

    Raises:
        MissingRun: a page every run of its command writes is missing (the first such run is named).
    """
    found: list[Path] = []
    for name in runs:
        run = RUNS[name]
        folder = reports / run.folder
        missing = [p for p in run.pages if not (folder / p).is_file()]
        if missing:
            raise MissingRun(
                f"no `{run.command}` run to copy: {', '.join(str(folder / p) for p in missing)} "
                f"{'does' if len(missing) == 1 else 'do'} not exist; run `{run.command}` first, or copy the other "
                f'runs\' pages only (`make results-pages RUNS="{" ".join(r for r in runs if r != name)}"`)'
            )
        found += [folder / p for p in (*run.pages, *run.optional) if (folder / p).is_file()]
    return found


def copy_pages(pages: list[Path], docs: Path) -> list[Path]:
    """Copy each page into `docs`, and the figures it links (`figures/...`, relative to it) beside it; return them."""
    docs.mkdir(parents=True, exist_ok=True)
    copied = []
    for page in pages:
        for link in sorted(set(FIGURE_LINK.findall(page.read_text()))):
            target = docs / link
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(page.parent / link, target)
            copied.append(target)
        copied.append(Path(shutil.copyfile(page, docs / page.name)))
    return copied


def main(argv: list[str] | None = None) -> list[Path]:
    """Copy the pages of the runs asked for; return the files written.

    Raises:
        SystemExit: 2, after one line on stderr, when a run's pages are missing or one covers less than the page it
            would replace without --replace (nothing is copied then).
    """
    parser = argparse.ArgumentParser(
        prog="make results-pages",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(DEFAULT_RUNS), help="whose pages to copy")
    parser.add_argument("--reports", default="reports", help="the reports folder the runs wrote into")
    parser.add_argument("--docs", default="docs/results", help="where the pages go")
    parser.add_argument(
        "--replace", action="store_true", help="replace a page even where it covers less than the one in --docs"
    )
    args = parser.parse_args(argv)
    try:
        pages = pages_to_copy(Path(args.reports), args.runs)
        if not args.replace:
            check_coverage(pages, Path(args.docs))
    except (MissingRun, NarrowerPage) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    copied = copy_pages(pages, Path(args.docs))
    for path in copied:
        print(f"copied: {path}")
    return copied


if __name__ == "__main__":
    main()
