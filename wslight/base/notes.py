"""One-line notes on stderr: something a run does that its settings did not say outright, printed once.

A DDP run builds its model and data module in every process: only rank 0 prints (the launcher's rank, read by
Lightning's `rank_zero_only` from the environment, 0 in a run of one process).
"""

from __future__ import annotations

import sys


def note(line: str) -> None:
    """Print `note: <line>` on stderr, on rank 0 only."""
    from lightning.pytorch.utilities import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) == 0:
        print(f"note: {line}", file=sys.stderr)
