"""What the generic path's starts cost and buy: a plain module's search with some of its starts left out.

A map handed to `word_sensitivity` as a plain `nn.Module` (`generic.Plain`) is searched structure-blind: each chain
step is a forward and backward of the whole sample, and its first round adds starts that the closed forms do not
need (docs/theory/search.md §4.3): the row starts read off the module's Jacobians (8 plus the removal starts), the
homotopy starts (16 chains on each of 5 larger balls) and 3 x `chains_per_round` more random chains. This benchmark runs
the same plain modules on the same bundled reviews and maps with:

- shipped: the search as a user gets it;
- no homotopy: without the homotopy starts;
- rows only: without the homotopy starts and the extra random chains (the row starts kept);
- bare: none of the three, the first round of a closed form's size (+- the top curvature direction, random chains),
  later rounds as usual;
- bare, 4x random: bare with the extra random chains back (as many chains, no structure).

Each variant is a `StartPlan` handed to `word_sensitivity` (the homotopy scales, the first round's width, the row
starts). Columns: seconds per trial, the ratio to the closed form's (the first row of each cell) and the share of
reviews within 1% of the best known value (the largest S of every run here and of a closed-form search with 64 chains
a round), with the worst ratio S / S_best. It answers a question the generic benchmark leaves open: how tight a
structure-blind search is when it runs in about 3x the closed form's time.

    python -m benchmarks.generic_starts --threads 1                      # RAF and ReLU-RAF, d = 384, n = 10, 50
    python -m benchmarks.generic_starts --maps raf --n 10 --trials 6     # one quick cell
    python -m benchmarks.generic_starts --page docs/results              # also write generic_starts.md there
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from benchmarks.common import command_line
from benchmarks.generic import DIMS, Plain, best_known, cell_inputs, tightness, timed, warm_up
from wslight.records.pages import PageHeader, write_page
from wslight.search.start_plan import StartPlan

# variant -> (homotopy starts, extra random chains, row starts)
VARIANTS = {
    "shipped": (True, True, True),
    "no homotopy": (False, True, True),
    "rows only": (False, False, True),
    "bare": (False, False, False),
    "bare, 4x random": (False, True, False),
}
COLUMNS = ["map", "n", "search", "s/trial", "ratio to closed form", "within 1% (worst)"]


def start_plan(homotopy: bool, extra: bool, rows: bool) -> StartPlan:
    """The shipped `StartPlan` less the homotopy starts, the wider first round or the row starts (each when False)."""
    plan = StartPlan(row_starts=rows)
    if not homotopy:
        plan = dataclasses.replace(plan, homotopy_scales=())
    if not extra:
        plan = dataclasses.replace(plan, generic_first_round=1)
    return plan


def cell(name: str, n: int, a: argparse.Namespace) -> list[list[str]]:
    """The rows of one (map, n): the closed form, then each variant of the plain module's search."""
    X, maps, seeds, settings = cell_inputs(name, DIMS[name], n, a)
    runs = {"closed form": timed(maps, X, seeds, settings)}
    for label, (homotopy, extra, rows) in VARIANTS.items():
        runs[label] = timed([Plain(m) for m in maps], X, seeds, settings, start_plan(homotopy, extra, rows))
    best = best_known([S for S, _ in runs.values()], maps, X, seeds, settings)
    closed_sec = runs["closed form"][1]
    return [
        [name, str(n), label, f"{sec:.3f}", f"{sec / closed_sec:.1f}x", tightness(S, best)]
        for label, (S, sec) in runs.items()
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--maps", nargs="+", default=["raf", "relu_raf"], choices=["raf", "relu_raf", "rf", "deep_rf"])
    p.add_argument("--n", type=int, nargs="+", default=[10, 50])
    p.add_argument("--trials", type=int, default=20, help="reviews per cell, each with its own map")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--page", type=Path, default=None, help="a folder to write generic_starts.md into")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    lines = [
        f"torch {torch.__version__}, {a.threads} thread(s), {a.trials} bundled reviews per cell (a map each), "
        "token 0, float32, the family's shipped search settings on every row",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    print("\n".join(lines), flush=True)
    for name in a.maps:
        warm_up(name, DIMS[name])
        for n in a.n:
            for cells in cell(name, n, a):
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    if a.page is not None:
        command = command_line(__file__, argv)
        title = "What a plain module's starts cost and buy"
        print(write_page(a.page / "generic_starts.md", title, PageHeader.collect(command), [__doc__, "", *lines]))


if __name__ == "__main__":
    main()
