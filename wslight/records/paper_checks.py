"""Every check of a run: the paper's claims (docs/theory/checks.md §8), then this package's hypotheses.

See docs/theory/words.md §13.

Computed from the records of a run's results.jsonl files (never written by hand): the claims in
`wslight.records.paper_claims`, the hypotheses in `wslight.records.hypotheses`, the row and the report's two parts in
`wslight.records.checks`.
"""

from __future__ import annotations

from .checks import Check
from .hypotheses import hypotheses
from .paper_claims import paper_claims


def all_checks(
    ws: list[dict], doubled: list[dict], attack: list[dict], probes: list[dict], words: list[dict] | None = None
) -> list[Check]:
    """Every check the records allow: the paper's claims (1-15, in the paper's order), then the hypotheses (16-17)."""
    return paper_claims(ws, doubled, attack, probes) + hypotheses(words or [])
