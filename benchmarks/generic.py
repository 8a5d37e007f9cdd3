"""A user's own map against the closed form: each map family as a plain module, side by side, on the bundled reviews.

A map handed to `word_sensitivity` as a plain `nn.Module` that only forwards (`Plain`) has no token-move algebra:
the search takes the generic path (autograd through the full forward, the generic starts: row, removal and homotopy
starts, a polishing round; docs/theory/search.md §4.3). For each (map, d, n) row: `trials` bundled reviews (IMDb token
embeddings of the bundled MiniLM, rows of norm sqrt(d)), a map each (the same built weights on both sides), token 0,
float32, the family's shipped search settings (configs/ws/<map>.yaml, or zoo.yaml's for the zoo's attention
sublayers; the family's defaults) on both sides, maps built outside the timed calls, one call per side over all
trials, the closed form first, then the plain module, in the same process. For the attention sublayers
(`transformer`, `pretrained_attn`) the first side is their single-token forward on the generic path (`token_moves`).
The best known value of a review is the largest S of the two runs and of a closed-form search with 64 chains a round
(at most 256); tightness is the share of reviews within 1% of it (S >= 0.99 S_best).

Columns: seconds per trial of the closed form and of the plain module, their ratio (target: at most 3), and each
side's share within 1% of the best known value (target: >= 95%) with its worst ratio S / S_best. The attention
sublayers' rows have no target (their first side is no closed form: the larger the ratio, the more it gains); a run
of those alone names its sides "single-token forward" and "full forward".

    python -m benchmarks.generic --threads 1                                  # RAF and ReLU-RAF, d = 384, n = 10, 50
    python -m benchmarks.generic --maps rf deep_rf --threads 1                # RF at d = 384, DeepRF at its config's d
    python -m benchmarks.generic --maps raf --n 10 --trials 6 --threads 1     # one quick row
    python -m benchmarks.generic --threads 1 --page docs/results              # also write generic_speed.md there
    python -m benchmarks.generic --maps rf deep_rf --n-for rf=10 --page reports/bench --page-name generic_rf.md
    python -m benchmarks.generic --maps pretrained_attn --n 16 64 --trials 6  # the single-token forward against the
                                                                              # full one (configs/ws/zoo.yaml's search)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks.common import command_line
from benchmarks.ws import WS_CONFIGS, map_seeds, samples, shipped_search, start_seeds
from wslight.features import make_map
from wslight.records.pages import PageHeader, write_page
from wslight.search import SearchSettings
from wslight.search.sensitivity import word_sensitivity
from wslight.search.start_plan import StartPlan

# (map, d): RAF, ReLU-RAF and RF at the bundled MiniLM's width, DeepRF at its config's d (configs/ws/deep_rf.yaml); the
# attention sublayers of the zoo, whose own side is their single-token forward on the generic path (`token_moves`)
DIMS = {"rf": 384, "deep_rf": 64, "raf": 384, "relu_raf": 384, "transformer": 384, "pretrained_attn": 384}
SINGLE_TOKEN = ("transformer", "pretrained_attn")  # no closed form: their first side is their `token_moves`


def columns(maps: list[str]) -> list[str]:
    """The table's header: the two sides named as they are for these maps (a closed form, or a single-token forward)."""
    first = "single-token forward" if all(m in SINGLE_TOKEN for m in maps) else "closed form"
    second = "full forward" if first == "single-token forward" else "plain module"
    sides = [f"{first} s/trial", f"{second} s/trial", "ratio", f"{first} within 1% (worst)"]
    return ["map", "d", "n", *sides, f"{second} within 1% (worst)", "target"]


class Plain(nn.Module):
    """A user's map: only forwards to the wrapped one, so the package sees no closed form and uses autograd."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.n, self.d = inner, inner.n, inner.d

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.inner(X)


def timed(
    maps: list[nn.Module],
    X: torch.Tensor,
    seeds: list[int],
    search: SearchSettings,
    start_plan: StartPlan | None = None,
) -> tuple[torch.Tensor, float]:
    """S of one `word_sensitivity` call over all trials (the shipped starts, or `start_plan`'s), seconds per trial."""
    t0 = time.perf_counter()
    res = word_sensitivity(maps, X, seed=seeds, search=search, start_plan=start_plan)
    return res.ws.flatten(), (time.perf_counter() - t0) / X.shape[0]


def tightness(S: torch.Tensor, best: torch.Tensor) -> str:
    """The share of samples within 1% of the best known value, and the worst ratio."""
    return f"{(S >= 0.99 * best).double().mean().item():.0%} ({(S / best).min().item():.4f})"


def cell_inputs(
    name: str, d: int, n: int, a: argparse.Namespace
) -> tuple[torch.Tensor, list[nn.Module], list[int], SearchSettings]:
    """The reviews (T, 1, n, d), a map each, the start seeds and the family's shipped search settings of one cell."""
    X = samples("imdb", a.trials, n, d, a.seed)[:, None].float()  # one review per trial
    maps = [make_map(name, n, d, s) for s in map_seeds(a.seed, a.trials)]
    config = WS_CONFIGS / f"{name}.yaml"
    settings = shipped_search(name, config if config.exists() else WS_CONFIGS / "zoo.yaml")
    return X, maps, start_seeds(a.seed, a.trials), settings


def best_known(
    runs: list[torch.Tensor], maps: list[nn.Module], X: torch.Tensor, seeds: list[int], settings: SearchSettings
) -> torch.Tensor:
    """Each review's best known S: the largest of the given runs' and of a closed-form search with 64 chains a round."""
    wide, _ = timed(maps, X, seeds, settings.replace(chains_per_round=64, max_chains=256))
    return torch.stack([*runs, wide]).max(dim=0).values


def row(name: str, d: int, n: int, a: argparse.Namespace) -> list[str]:
    """One table row: the closed form and the plain module on the same maps and reviews."""
    X, maps, seeds, settings = cell_inputs(name, d, n, a)
    closed, closed_sec = timed(maps, X, seeds, settings)
    plain, plain_sec = timed([Plain(m) for m in maps], X, seeds, settings)
    best = best_known([closed, plain], maps, X, seeds, settings)
    ratio = plain_sec / closed_sec
    ok = ratio <= 3 and (plain >= 0.99 * best).double().mean().item() >= 0.95
    target = "-" if name in SINGLE_TOKEN else "PASS" if ok else "FAIL"  # the 3x target is a closed form's
    return [name, str(d), str(n), f"{closed_sec:.3f}", f"{plain_sec:.3f}", f"{ratio:.1f}x"] + [
        tightness(closed, best),
        tightness(plain, best),
        target,
    ]


def warm_up(name: str, d: int) -> None:
    """One tiny estimate on each side, so torch's first-call costs do not land in the first timed row."""
    X = torch.randn(2, 1, 4, d)
    X = X * d**0.5 / X.norm(dim=-1, keepdim=True)
    maps = [make_map(name, 4, d, s) for s in (99991, 99992)]
    for side in (maps, [Plain(m) for m in maps]):
        word_sensitivity(side, X, seed=[99991, 99992], max_steps=5)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--maps", nargs="+", default=["raf", "relu_raf"], choices=sorted(DIMS))
    p.add_argument("--n", type=int, nargs="+", default=[10, 50])
    p.add_argument("--d", type=int, default=None, help="d for every map (default: DIMS, per map)")
    p.add_argument("--trials", type=int, default=20, help="reviews per row, each with its own map")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-for", nargs="+", default=[], metavar="MAP=N,N", help="n of one map, e.g. rf=10")
    p.add_argument("--page", type=Path, default=None, help="a folder to write the page into")
    p.add_argument("--page-name", default="generic_speed.md", help="the page's file name")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    header = columns(a.maps)
    lines = [
        f"torch {torch.__version__}, {a.threads} thread(s), {a.trials} bundled reviews per row (a map each), token 0, "
        "float32, the family's shipped search on both sides; best known: the largest S of both runs and of a "
        "closed-form search with 64 chains a round",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    print("\n".join(lines), flush=True)
    n_for = {m: [int(v) for v in ns.split(",")] for m, ns in (item.split("=", 1) for item in a.n_for)}
    for name in a.maps:
        d = a.d or DIMS[name]
        warm_up(name, d)
        for n in n_for.get(name, a.n):
            lines.append("| " + " | ".join(row(name, d, n, a)) + " |")
            print(lines[-1], flush=True)
    lines += ["", "target: the plain module within 3x the closed form's seconds, >= 95% of reviews within 1%"]
    print(lines[-1])
    if a.page is not None:
        command = command_line(__file__, argv)
        title = "A user's own map against the closed form"
        print(write_page(a.page / a.page_name, title, PageHeader.collect(command), [__doc__, "", *lines]))


if __name__ == "__main__":
    main()
