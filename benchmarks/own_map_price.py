"""What each capability of your own map costs and buys: RAF as a user's module declaring more and more of its structure.

docs/tasks/own_map.md lists what a user's map may declare to the word-sensitivity search. This benchmark hands the
search RAF (`raf`) five ways, on the same bundled reviews and the same built maps, and times each:

- nothing declared: a plain module that only forwards (`generic.Plain`): autograd through the whole forward;
- token_moves: the plain module with a `token_moves(X, positions)` written here as a user would, in plain torch
  (`OneTokenRAF`: a moved token changes only row and column i of the scores, so each move costs d^2 + n d instead of
  a full forward's n d^2 + n^2 d); the run first checks that it equals the full forward to 1e-5;
- search_starts: the plain module with `search_starts(X, positions)`, the attracting direction W^T xbar and the
  steering directions W x_m, m != i (as tests/search/test_chains.py's `_Hinted`, docs/theory/maps.md §3.5);
- both: `token_moves` and `search_starts`;
- move class: the package's own `raf` map, whose `move_class` (`AttentionMove`) gives the closed forms.

For each (n) cell: `trials` bundled reviews (IMDb token embeddings of the bundled MiniLM, rows of norm sqrt(d)), a map
each (a fresh map per review, the same built weights on every row), token 0, float32, the family's shipped search
settings (configs/ws/raf.yaml over `family_defaults`) on every row, one `word_sensitivity` call per row over all
trials, the move class first, on one torch thread. Columns: seconds per trial, the ratio to the move class's, and the
share of reviews within 1% of the best value any run found (the largest S of every row and of a move-class search
with 64 chains a round, at most 256), with the worst ratio S / S_best.

It writes docs/results/own_map_price.md and regenerates the table of docs/tasks/own_map.md between its
`<!-- own-map-price:start -->` and `<!-- own-map-price:end -->` lines, with the line of the run that wrote it.

    python -m benchmarks.own_map_price                          # RAF at d = 384, n = 10 and 50, 20 reviews a cell
    python -m benchmarks.own_map_price --trials 6 --n 10        # one quick cell
    python -m benchmarks.own_map_price --print-only             # print the table, write neither page
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from benchmarks.common import ROOT, command_line
from benchmarks.floor import matmul_rate
from benchmarks.generic import Plain, best_known, cell_inputs, tightness, timed, warm_up
from wslight.records.pages import PageHeader, write_page
from wslight.search.sensitivity import word_sensitivity

MAP, D = "raf", 384
COLUMNS = ["n", "declared", "s/trial", "ratio to move class", "within 1% (worst)"]
START, END = "<!-- own-map-price:start -->", "<!-- own-map-price:end -->"
CHECK_TOL = 1e-5  # the largest difference allowed between `token_moves` and the full forward


class OneTokenRAF:
    """RAF's output with one token moved, at the price of one token: a user's `token_moves` in plain torch.

    RAF is softmax(X W X^T / sqrt(d)) X. Moving token i by x changes row i and column i of the scores only. Every other
    row r keeps its scores s_rm, m != i, so its softmax sums over them are computed once per sample and position,
    shifted by their max mu_r: Z_r = sum_m exp(s_rm - mu_r) and U_r = sum_m exp(s_rm - mu_r) x_m. With the moved
    token's score s' = x_r^T W x_i' / sqrt(d) (x_i' = x_i + x), the row is (c U_r + w x_i') / (c Z_r + w), where
    mu' = max(mu_r, s'), c = exp(mu_r - mu') and w = exp(s' - mu'). Row i attends afresh over its new scores.

    Args:
        W: RAF's (d, d) matrix.
        X: the clean samples (B, n, d), in W's dtype.
        positions: the tokens that move.
    """

    @torch.no_grad()
    def __init__(self, W: torch.Tensor, X: torch.Tensor, positions: list[int]) -> None:
        B, n, d = X.shape
        self.W, self.X, self.positions, self.scale = W, X, list(positions), d**-0.5
        S = (X @ W) @ X.transpose(1, 2) * self.scale  # (B, n, n) the clean scores
        mu, Z, U = [], [], []  # per position: (B, n), (B, n), (B, n, d)
        for i in self.positions:
            others = S.clone()
            others[..., i] = -math.inf  # column i moves: left out of the sums
            mu.append(others.amax(-1))  # (B, n)
            E = torch.exp(others - mu[-1][..., None])  # (B, n, n), column i is 0
            Z.append(E.sum(-1))
            U.append(E @ X)  # (B, n, n) @ (B, n, d) -> (B, n, d)
        self.mu, self.Z, self.U = torch.stack(mu), torch.stack(Z), torch.stack(U)  # (P, B, n), (P, B, n), (P, B, n, d)

    def __call__(self, b: torch.Tensor, j: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The output of sample b[k] with token positions[j[k]] moved by x[k]: (k,), (k,), (k, d) -> (k, n d)."""
        k = len(b)
        i = torch.tensor(self.positions, device=b.device)[j]  # (k,) the moved token of each move
        Xb = self.X[b]  # (k, n, d)
        xi = Xb[torch.arange(k), i] + x  # (k, d) the moved token
        # column i of the other rows: s'_r = x_r^T W x_i' / sqrt(d), (k, n, d) @ (k, d, 1) -> (k, n)
        col = (Xb @ (xi @ self.W.T)[..., None])[..., 0] * self.scale
        mu, Z, U = self.mu[j, b], self.Z[j, b], self.U[j, b]  # (k, n), (k, n), (k, n, d)
        top = torch.maximum(mu, col)
        c, w = torch.exp(mu - top), torch.exp(col - top)  # (k, n)
        rows = (c[..., None] * U + w[..., None] * xi[:, None]) / (c * Z + w)[..., None]  # (k, n, d)
        # row i: the moved query against every key, its own key moved too
        own = torch.where(torch.arange(Xb.shape[1], device=b.device)[None] == i[:, None], 1.0, 0.0)  # (k, n) e_i
        Xm = Xb + own[..., None] * x[:, None]  # (k, n, d) the moved sample
        A = torch.softmax(((xi @ self.W)[:, None] @ Xm.transpose(1, 2))[:, 0] * self.scale, dim=-1)  # (k, n)
        row_i = (A[:, None] @ Xm)[:, 0]  # (k, d)
        out = torch.where(own[..., None] > 0, row_i[:, None], rows)  # (k, n, d)
        return out.reshape(k, -1)


class WithMoves(Plain):
    """RAF as a user's module with its own cheaper forward of a moved sample (`OneTokenRAF`)."""

    def token_moves(self, X: torch.Tensor, positions: list[int]) -> OneTokenRAF | None:
        """One token of X (B, n, d) moved at the price of one token (None for n < 2: no other row to keep)."""
        return OneTokenRAF(self.inner.W, X, positions) if X.shape[1] > 1 else None


def raf_starts(W: torch.Tensor, X: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """RAF's attracting direction W^T xbar, then its steering directions W x_m, m != i: (B, P, n, d)."""
    attract = X.mean(dim=1) @ W  # (B, d) = (W^T xbar)^T
    steer = X @ W.T  # (B, n, d): row m is (W x_m)^T
    keep = [[m for m in range(X.shape[1]) if m != p] for p in positions]
    return torch.cat([attract[:, None, None].expand(-1, len(positions), 1, -1), steer[:, keep]], dim=2)


class WithStarts(Plain):
    """RAF as a user's module that names where its maxima lie (`search_starts`, docs/theory/maps.md §3.5)."""

    def search_starts(self, X: torch.Tensor, positions: list[int]) -> torch.Tensor:
        return raf_starts(self.inner.W, X, positions)


class WithBoth(WithMoves):
    """RAF as a user's module with both `token_moves` and `search_starts`."""

    def search_starts(self, X: torch.Tensor, positions: list[int]) -> torch.Tensor:
        return raf_starts(self.inner.W, X, positions)


# what the map declares -> how a built `raf` map is handed to the search
LEVELS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "move class (`AttentionMove`)": lambda m: m,
    "nothing declared": Plain,
    "`token_moves`": WithMoves,
    "`search_starts`": WithStarts,
    "`token_moves` + `search_starts`": WithBoth,
}


@torch.no_grad()
def moves_error(m: nn.Module, X: torch.Tensor, radius: float, moves: int = 8, seed: int = 0) -> float:
    """The largest difference between `WithMoves`'s `token_moves` and the full forward of the moved samples.

    `moves` random moves of norm `radius` of each token of each sample X (B, n, d), in X's dtype.
    """
    user = WithMoves(m)
    B, n, d = X.shape
    positions = list(range(n))
    one = user.token_moves(X, positions)
    assert one is not None
    g = torch.Generator().manual_seed(seed)
    b = torch.arange(B).repeat_interleave(n * moves)  # (k,) every sample, position and move
    j = torch.arange(n).repeat_interleave(moves).repeat(B)
    x = torch.randn(len(b), d, generator=g, dtype=X.dtype)
    x = x * radius / x.norm(dim=-1, keepdim=True)  # (k, d) on the sphere of the search
    onehot = torch.eye(n, dtype=X.dtype)[j]  # (k, n)
    full = user(X[b] + onehot[..., None] * x[:, None])  # (k, n d)
    return (one(b, j, x) - full).abs().max().item()


def cell(n: int, a: argparse.Namespace) -> list[list[str]]:
    """The rows of one n: the move class, then each capability level of the user's module."""
    X, maps, seeds, settings = cell_inputs(MAP, D, n, a)
    word_sensitivity(maps[:1], X[:1], seed=seeds[:1], search=settings.replace(max_steps=5))  # first-call costs
    runs = {label: timed([wrap(m) for m in maps], X, seeds, settings) for label, wrap in LEVELS.items()}
    best = best_known([S for S, _ in runs.values()], maps, X, seeds, settings)
    base = runs[next(iter(LEVELS))][1]  # the move class's
    return [[str(n), label, f"{sec:.3f}", f"{sec / base:.1f}x", tightness(S, best)] for label, (S, sec) in runs.items()]


def table(rows: list[list[str]]) -> list[str]:
    """The markdown table of the rows."""
    return [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def replace_block(text: str, block: list[str]) -> str:
    """`text` with the lines between its own-map-price markers replaced by `block` (the markers kept).

    Raises:
        ValueError: the markers are missing, repeated or out of order.
    """
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"expected one {START} line followed by one {END} line")
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    return pattern.sub(lambda _: "\n".join([START, *block, END]), text)


def write_table(path: Path, rows: list[list[str]], header: PageHeader, rate: float) -> None:
    """Regenerate the table between the markers of `path` (docs/tasks/own_map.md), with the line of the run below it."""
    load = ", ".join(f"{x:.1f}" for x in header.load)
    busy = bool(header.load) and max(header.load) > header.cores
    where = f"load {load}" + (": other work shared the machine, timings are contended" if busy else "")
    run = (
        f"Written by `{header.command}` on {header.date}, {header.cpu}, {header.cores} cores, torch {header.torch}, "
        f"{rate:.1f} GFLOP/s float32 matmul on one thread, commit `{header.commit}`"
        + (" (dirty)" if header.dirty else "")
        + f", {where}."
    )
    path.write_text(replace_block(path.read_text(), [*table(rows), "", run]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[10, 50])
    p.add_argument("--trials", type=int, default=20, help="reviews per cell, each with its own map")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--page", type=Path, default=ROOT / "docs" / "results", help="the folder of own_map_price.md")
    p.add_argument("--table", type=Path, default=ROOT / "docs" / "tasks" / "own_map.md", help="the page of the table")
    p.add_argument("--print-only", action="store_true", help="print the table, write neither the page nor the table")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rate = matmul_rate(1)
    X, maps, _, settings = cell_inputs(MAP, D, min(a.n), a)  # the first cell's reviews and maps
    error = moves_error(maps[0], X[0], settings.resolved().radius(D))
    print(f"token_moves against the full forward: largest difference {error:.2e}", flush=True)
    if not error <= CHECK_TOL:
        raise SystemExit(f"token_moves differs from the full forward by {error:.2e} > {CHECK_TOL:g}")
    lines = [
        f"torch {torch.__version__}, 1 thread, {a.trials} bundled reviews per cell (a map each), d = {D}, token 0, "
        "float32, the family's shipped search settings on every row; best known: the largest S of every row and of a "
        "move-class search with 64 chains a round",
        "",
        f"Matrix-multiply rate of this machine, measured in this run (float32 (8192, 384) @ (384, 1536)): {rate:.1f} "
        "GFLOP/s on one thread.",
        "",
        f"`token_moves` (`OneTokenRAF`) against the full forward, 8 moves at the search's radius of every token of the "
        f"first review (n = {min(a.n)}): largest difference {error:.1e} (allowed: {CHECK_TOL:g}).",
        "",
    ]
    print("\n".join(lines), flush=True)
    warm_up(MAP, D)
    rows = []
    for n in a.n:
        rows += cell(n, a)
        print("\n".join(table(rows)), flush=True)
    lines += table(rows)
    command = command_line(__file__, argv)
    header = PageHeader.collect(command)
    if a.print_only:
        return
    title = "What each capability of your own map costs"
    print(write_page(a.page / "own_map_price.md", title, header, [__doc__, "", *lines]))
    write_table(a.table, rows, header, rate)
    print(a.table)


if __name__ == "__main__":
    main()
