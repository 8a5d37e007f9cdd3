"""One row of a run's checks (`Check`), its two kinds and their statuses, and the checks' part of the report.

A claim of the paper (or a sanity check of a faithful reproduction of it) reads PASS / FAIL; a hypothesis this
package tests beyond the paper reads as a finding, supported / not supported: its being wrong is a result, not a
failed reproduction. Either reads N/A / not measured, with the reason, when the run holds no records it could be
computed from, and TIE / undecided when it compares two quantities that agree within their resolution (`ordered`):
a verdict there would be decided by rounding, and flip from machine to machine. `checks_report` renders the two kinds
as two parts of the report. The checks themselves: `wslight.records.paper_claims` (docs/theory/checks.md §8) and
`wslight.records.hypotheses` (docs/theory/words.md §13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["claim", "hypothesis"]
CLAIM: Kind = "claim"  # a claim of the paper, or a sanity check of a faithful reproduction of it
HYPOTHESIS: Kind = "hypothesis"  # a hypothesis this package tests beyond the paper

# the statuses of each kind: holds, does not hold, no records to compute it from, not distinguishable at this grid
STATUSES: dict[Kind, tuple[str, str, str, str]] = {
    CLAIM: ("PASS", "FAIL", "N/A", "TIE"),
    HYPOTHESIS: ("supported", "not supported", "not measured", "undecided"),
}


@dataclass
class Check:
    """One row of the checks: what is tested, the measured value, the expectation and the status.

    `kind` is `CLAIM` (status PASS, FAIL, N/A or TIE) or `HYPOTHESIS` (status supported, not supported, not measured
    or undecided: a verdict worded as a finding, never a FAIL).
    """

    id: str
    what: str
    measured: str
    expected: str
    status: str
    kind: Kind = CLAIM

    def __post_init__(self) -> None:
        """Reject a status that is not one of its kind's (a hypothesis never reads PASS or FAIL)."""
        if self.status not in STATUSES[self.kind]:
            raise ValueError(
                f"check {self.id}: a {self.kind}'s status is one of {STATUSES[self.kind]}, not {self.status!r}"
            )


def verdict(ok: bool, kind: Kind = CLAIM) -> str:
    """The status of a check of `kind` that holds (`ok`) or does not."""
    return STATUSES[kind][0 if ok else 1]


def ordered(larger: float, smaller: float, resolution: float, kind: Kind = CLAIM) -> str:
    """The status of the claim `larger > smaller`, compared only beyond `resolution`.

    PASS when `larger` exceeds `smaller` by more than `resolution`, FAIL when it falls short by more, TIE (not
    distinguishable at this grid) when the two agree within it. `resolution` is what the two sides are known to:
    their rounding and the precision of the search or identity that produced them, never a statistical margin.
    """
    if abs(larger - smaller) <= resolution:
        return STATUSES[kind][3]
    return verdict(larger > smaller, kind)


def combined(statuses: list[str], kind: Kind = CLAIM) -> str:
    """The status of a check made of several comparisons: FAIL if any fails, else TIE if any ties, else PASS."""
    passed, failed, _, tied = STATUSES[kind]
    if failed in statuses:
        return failed
    return tied if tied in statuses else passed


def tie_note(status: str, kind: Kind = CLAIM) -> str:
    """The words a check's measured column adds when `status` is a tie ("" otherwise)."""
    return " (not distinguishable at this grid: equal within their resolution)" if status == STATUSES[kind][3] else ""


def unmeasured(id: str, what: str, expected: str, why: str, kind: Kind = CLAIM) -> Check:
    """The row of a check the run holds no records for: `why` in the measured column, N/A or not measured."""
    return Check(id, what, why, expected, STATUSES[kind][2], kind)


CHECK_COLUMNS = ("check", "measured", "expected", "status")

# each kind's part of the report: its heading, the one sentence that says what it is, and its table's columns
PARTS: dict[Kind, tuple[str, str, tuple[str, str, str, str]]] = {
    CLAIM: (
        "The paper's claims (docs/theory/checks.md §8)",
        "What the paper claims, and the sanity checks a faithful reproduction of it must pass, each computed from "
        "the results files: PASS or FAIL, N/A where the run holds no records to compute it from, TIE where its two "
        "sides agree within their resolution (a verdict there would be decided by rounding).",
        CHECK_COLUMNS,
    ),
    HYPOTHESIS: (
        "Beyond the paper: this package's hypotheses (docs/theory/words.md §13)",
        "Hypotheses this package tests beyond the paper, each with its measured value and what it found: supported "
        "or not supported (a finding either way, never a failed reproduction), not measured where its stage has no "
        "results, undecided where its two sides agree within their resolution.",
        ("hypothesis", "measured", "supported when", "finding"),
    ),
}


def checks_markdown(rows: list[Check], columns: tuple[str, str, str, str] = CHECK_COLUMNS) -> str:
    """One table of checks as markdown: the check, measured, expected and status columns, headed by `columns`."""
    lines = ["| " + " | ".join(columns) + " |", "|---|---|---|---|"]
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731  pipes (norms) would split the markdown cell
    lines += [f"| {cell(c.what)} | {cell(c.measured)} | {cell(c.expected)} | **{c.status}** |" for c in rows]
    return "\n".join(lines) + "\n"


def tally(rows: list[Check], kind: Kind) -> str:
    """How many checks of `kind` have each of its statuses, e.g. "15 PASS, 0 FAIL, 1 N/A" (and "1 TIE" if any)."""
    counts = {s: sum(c.kind == kind and c.status == s for c in rows) for s in STATUSES[kind]}
    shown = [s for s in STATUSES[kind] if s != STATUSES[kind][3] or counts[s]]  # a tie only where there is one
    return ", ".join(f"{counts[s]} {s}" for s in shown)


def checks_report(rows: list[Check]) -> list[str]:
    """The report's lines for the checks: the paper's claims, then this package's hypotheses.

    Each part under a heading of its own (level 2, as the report's sections), the one sentence that says what it is,
    its table and its tally; a part with no rows is left out. A hypothesis that is not supported counts among the
    hypotheses' findings, never among the claims' FAILs.
    """
    lines: list[str] = []
    for kind, (heading, sentence, columns) in PARTS.items():
        part = [c for c in rows if c.kind == kind]
        if part:
            lines += [f"## {heading}", "", sentence, "", checks_markdown(part, columns), tally(rows, kind) + ".", ""]
    return lines
