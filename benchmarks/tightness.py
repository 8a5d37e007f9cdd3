"""How tight the word-sensitivity search is: its S against a reference run with many more chains.

For each row (map, d, n): `trials` bundled reviews (IMDb token embeddings of the bundled MiniLM, rows of norm sqrt(d)),
a fresh map per trial (`FreshMaps`, as benchmarks/ws.py), token 0. Three searches on the same maps and samples, side
by side: "before", one round of the chains the configs shipped before the search added rounds (4; 6 for raf /
relu_raf); "shipped", `word_sensitivity` with the settings the map's shipped config runs with (configs/ws/<map>.yaml:
the map family's search defaults; the zoo maps: configs/ws/zoo.yaml's `search:` block; a flag overrides them); and
the "reference", one big round of max(16 x the mean chains of the shipped run, 256 for the attention maps) chains,
float32 like the others ("before" and the reference: the shipped run's max_steps, the generic defaults
`wslight.search.GENERIC_DEFAULTS` for the rest). A search result is a lower bound on S, so the reference is the best
of both runs per sample, and the comparison is a lower-bound one: it shows how much more chains would have found, not
the distance to the true sup.

Columns: the shipped settings, mean chains used, share of samples whose best was confirmed by a second chain
(near_best >= 2), share within 1% of the reference (S >= 0.99 S_ref), the worst ratio S / S_ref, mean S / mean S_ref,
the same share and mean ratio for "before", and seconds per trial of the three runs (maps drawn inside the timed
call). Target: >= 95% within 1% and mean ratio >= 0.995.
`--generic` hands raf / relu_raf over as plain modules that only forward (the same weights), so the search sees no
closed form and differentiates the full forward: the tightness of the path a user's own map takes. Its reference
also takes the closed form's own search on the same weights (shipped settings), whose structured starts find maxima
that random chains on the generic path rarely reach in high dimension (the generic path's row starts read the
attracting and self-capture directions off the map's Jacobian, docs/theory/search.md §4.3); `--own-starts` gives the
plain modules a `search_starts` naming those directions (`WithStarts`), as a user who knows their map can. Timings
need an otherwise idle machine: with other processes on the cores, torch's threads contend (try --threads 1).

    python -m benchmarks.tightness                          # the default grid (minutes)
    python -m benchmarks.tightness --quick --maps rf raf    # 6 trials, smallest n per map
    python -m benchmarks.tightness --maps raf --n 50 --chains-per-round 8 --max-chains 32
    python -m benchmarks.tightness --maps raf relu_raf --generic   # the attention maps as plain modules (autograd)
    python -m benchmarks.tightness --maps raf relu_raf --generic --own-starts   # ... that name their own starts
    python -m benchmarks.tightness --zoo                    # configs/ws/zoo.yaml's maps, its smallest and largest n
    python -m benchmarks.tightness --zoo --maps raf_mh12    # one of them
"""

from __future__ import annotations

import argparse
import time

import torch
import yaml

from benchmarks.generic import Plain
from benchmarks.ws import WS_CONFIGS, every_field, map_seeds, samples, shipped_search, start_seeds, with_flags
from wslight.features import FreshMaps, make_map
from wslight.features.attention import ReLUAttentionFeatures
from wslight.features.generic_move import GenericMove, move_class_for
from wslight.search import SearchSettings
from wslight.search.sensitivity import word_sensitivity
from wslight.search.start_plan import StartPlan

# (map, d, n values): the paper's n values at offline d (d = 384: the bundled MiniLM's width)
GRID = {"rf": (96, [20, 60]), "deep_rf": (64, [50, 80]), "raf": (384, [10, 50, 250]), "relu_raf": (384, [10, 50, 250])}
ATTENTION = ("raf", "relu_raf")
BEFORE_CHAINS = {"raf": 6, "relu_raf": 6}  # the shipped configs' chains before rounds (others: 4), one round
GENERIC = every_field(SearchSettings())  # the settings of "before" and the reference, but for their chains and steps
COLUMNS = ["map", "d", "n", "chains_per_round/max_chains", "mean chains", "confirmed", "within 1%", "worst ratio"]
COLUMNS += ["mean ratio", "before: within 1% / mean ratio", "s/trial before", "s/trial", "s/trial ref", "target"]


def shipped_settings(name: str) -> SearchSettings:
    """The search settings the map's shipped config runs with, every field filled.

    configs/ws/<map>.yaml; the zoo maps: configs/ws/zoo.yaml.
    """
    path = WS_CONFIGS / f"{name}.yaml"
    return shipped_search(name, path if path.exists() else WS_CONFIGS / "zoo.yaml")


def zoo_grid() -> dict[str, tuple[int, list[int]]]:
    """The zoo config's maps other than the paper's, at its d and its smallest and largest n."""
    args = yaml.safe_load((WS_CONFIGS / "zoo.yaml").read_text())["model"]["init_args"]["grid"]
    ns = [min(args["n_values"]), max(args["n_values"])]
    return {m: (args["d_values"][0], ns) for m in args["maps"] if m not in GRID}


class WithStarts(Plain):
    """A user's map that also names its own starting directions (`search_starts`, docs/theory/search.md §4.3).

    As one who knows its structure would: the attracting direction W^T xbar, the steering directions W x_m (m != i) and,
    for ReLU-RAF, mixes m x_i / ||x_i|| + (1 - m) a of the token and the unit attracting direction a, m = 1, 0.7, 0.4
    (docs/theory/maps.md §3.5). Only forwards otherwise: the search still takes the generic path.
    """

    def search_starts(self, X: torch.Tensor, positions: list[int]) -> torch.Tensor:
        W = self.inner.W
        attract = X.mean(dim=1) @ W  # (B, d) = (W^T xbar)^T
        attract = attract / attract.norm(dim=-1, keepdim=True)
        steer = X @ W.T  # (B, n, d): row m is (W x_m)^T
        out = []
        for p in positions:
            dirs = [attract[:, None], steer[:, [m for m in range(X.shape[1]) if m != p]]]
            if isinstance(self.inner, ReLUAttentionFeatures):
                xi = X[:, p] / X[:, p].norm(dim=-1, keepdim=True)
                dirs.append(torch.stack([m * xi + (1 - m) * attract for m in (1.0, 0.7, 0.4)], dim=1))
            out.append(torch.cat(dirs, dim=1))
        return torch.stack(out, dim=1)  # (B, P, k, d)


def maps_for(name: str, n: int, d: int, seeds: list[int], generic: bool, own_starts: bool = False):
    """The T trial maps: FreshMaps, or (--generic, attention maps) a list of plain modules with the same weights.

    With --own-starts, modules that also name their starts; the zoo's maps as built by make_map.
    """
    if generic and name in ATTENTION or name not in GRID:  # the zoo's maps are built in full
        maps = [make_map(name, n, d, s) for s in seeds]
        wrap = WithStarts if own_starts else Plain
        return maps if name not in GRID else [wrap(m) for m in maps]
    return FreshMaps(name, seeds)


def timed(name, n, d, X, a, generic, search: SearchSettings):
    """One word_sensitivity call over all trials (maps built inside the timed part): (result, seconds per trial)."""
    T = X.shape[0]
    t0 = time.perf_counter()
    fm = maps_for(name, n, d, map_seeds(a.seed, T), generic, generic and a.own_starts)
    res = word_sensitivity(fm, X, search=search, seed=start_seeds(a.seed, T))
    return res, (time.perf_counter() - t0) / T


def row(name: str, d: int, n: int, a) -> list[str]:
    X = samples("imdb", a.trials, n, d, a.seed)[:, None].float()  # (T, 1, n, d): one review per trial
    settings = with_flags(shipped_settings(name), a)
    b = BEFORE_CHAINS.get(name, 4)
    steps = GENERIC.replace(max_steps=settings.max_steps)
    before, before_sec = timed(name, n, d, X, a, a.generic, steps.replace(chains_per_round=b, max_chains=b))
    shipped, sec = timed(name, n, d, X, a, a.generic, settings)
    ref_chains = max(16 * round(shipped.chains.double().mean().item()), 256 if name in ATTENTION else 0)
    # one round of ref_chains chains (the generic path's first round runs generic_first_round x chains_per_round)
    one = maps_for(name, n, d, [0], a.generic)
    generic_path = isinstance(one, list) and move_class_for(one) is GenericMove
    first = StartPlan().generic_first_round if generic_path else 1
    reference = steps.replace(chains_per_round=ref_chains // first, max_chains=ref_chains)
    ref, ref_sec = timed(name, n, d, X, a, a.generic, reference)
    S, S_before = shipped.ws.flatten(), before.ws.flatten()
    S_ref = torch.maximum(torch.maximum(S, S_before), ref.ws.flatten())
    if a.generic and name in ATTENTION:  # the closed form's search on the same weights is part of the reference
        S_ref = torch.maximum(S_ref, timed(name, n, d, X, a, False, settings)[0].ws.flatten())
    ratio = S / S_ref
    within = (S >= 0.99 * S_ref).double().mean().item()
    mean_ratio = (S.mean() / S_ref.mean()).item()
    before_within = (S_before >= 0.99 * S_ref).double().mean().item()
    before_ratio = (S_before.mean() / S_ref.mean()).item()
    ok = within >= 0.95 and mean_ratio >= 0.995
    return [
        name + (f" (generic{', own starts' if a.own_starts else ''})" if a.generic and name in ATTENTION else ""),
        str(d),
        str(n),
        f"{settings.chains_per_round}/{settings.max_chains}",
        f"{shipped.chains.double().mean().item():.1f}",
        f"{(shipped.near_best >= 2).double().mean().item():.0%}",
        f"{within:.0%}",
        f"{ratio.min().item():.4f}",
        f"{mean_ratio:.4f}",
        f"{before_within:.0%} / {before_ratio:.4f}",
        f"{before_sec:.3f}",
        f"{sec:.3f}",
        f"{ref_sec:.3f} ({ref_chains} chains)",
        "PASS" if ok else "FAIL",
    ]


def warm_up(name: str, d: int, generic: bool) -> None:
    """One tiny estimate, so torch's first-call costs do not land in the first timed row.

    4 tokens, the row's d: some maps take only their own d, or one their heads divide.
    """
    X = torch.randn(2, 1, 4, d)
    X = X * d**0.5 / X.norm(dim=-1, keepdim=True)
    word_sensitivity(maps_for(name, 4, d, [99991, 99992], generic), X, seed=[99991, 99992], max_steps=5)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--maps", nargs="+", default=None, help="default: the paper's grid (with --zoo: every zoo map)")
    p.add_argument("--trials", type=int, default=20, help="reviews per row, each with its own fresh map")
    p.add_argument("--n", type=int, nargs="+", default=None, help="n values (default: the grid's per map)")
    p.add_argument("--d", type=int, default=None, help="d (default: the grid's per map)")
    shipped = "default: as the map's shipped config runs (the family's defaults; the zoo maps: zoo.yaml's)"
    p.add_argument("--chains-per-round", type=int, default=None, help=shipped)
    p.add_argument("--max-chains", type=int, default=None, help=shipped)
    p.add_argument("--gain-tol", type=float, default=None, help=shipped)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="6 trials, only the smallest n per map")
    p.add_argument("--generic", action="store_true", help="raf / relu_raf as plain modules (autograd path)")
    p.add_argument("--own-starts", action="store_true", help="with --generic: the modules name their starts")
    p.add_argument("--zoo", action="store_true", help="the zoo config's maps (configs/ws/zoo.yaml) instead")
    a = p.parse_args(argv)
    if a.quick:
        a.trials = 6
    if a.own_starts and not a.generic:
        raise SystemExit("--own-starts: only with --generic (the plain modules name their starts)")
    if a.trials % 2:
        raise SystemExit("--trials must be even (the bundled reviews are balanced: half of each label)")
    torch.set_num_threads(a.threads)
    print(
        f"torch {torch.__version__}, {a.threads} thread(s), {a.trials} trials per row (bundled reviews, a fresh map "
        f"each), token 0, float32; reference: max(16 x the mean chains used, 256 for attention) chains, best of all"
        " runs\n"
    )
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    grid = zoo_grid() if a.zoo else GRID
    unknown = sorted(set(a.maps or []) - set(grid))
    if unknown:
        raise SystemExit(f"--maps: {unknown} not among {sorted(grid)}" + ("" if a.zoo else " (the zoo's maps: --zoo)"))
    grid = {m: v for m, v in grid.items() if a.maps is None or m in a.maps}
    for name, (d, ns) in grid.items():
        d = a.d or d
        ns = a.n or ns
        ns = [min(ns)] if a.quick else ns
        warm_up(name, d, a.generic)
        for n in ns:
            print("| " + " | ".join(row(name, d, n, a)) + " |", flush=True)
    print("\ntarget: >= 95% of samples within 1% of the reference and mean ratio >= 0.995")


if __name__ == "__main__":
    main()
