"""Delta-attack benchmark: `wslight.attack.delta_attack` against the authors' own code (docs/theory/attack.md §6.5).

The paper's protocol: every trial has its own random map and its own training set; every side sees the same maps
and data. The package attacks all trials in one call with `FreshMaps(map, seeds)` (maps built inside the timed call).

The headline baseline is the authors' code as they wrote it: their utils.py (fetched from their public repository by
`make authors-code` into benchmarks/authors/attention-sensitivity, or any folder given with --authors-code) called as
their gen.py calls it for one trial (benchmarks/authors_gen.py: numpy features concatenated one sample at a time,
np.linalg.pinv of Phi, the dense D x D projector P = I - Phi^+ Phi, theta_r from the pinv of the stacked system, then
plain projected descent in torch from the clean token 0 on the test error, lr 1 for 50 n steps for RAF / ReLU-RAF, lr
100 for 300 steps for RF, final iterate). `--port` adds the earlier torch port of the same procedure as a second row.
The package batches all trials in one call (closed forms in N x N space, single-token structure, normalised momentum
steps, 4 restarts, early stop).

All sides see the same data (by default N + 1 distinct bundled reviews per trial, MiniLM layer-0 token embeddings
with rows rescaled to sqrt(d) and their labels, the first one the context sample; `--data synthetic`: the "aniso"
rows of docs/theory/checks.md §11 with random +-1 labels; the largest cell, d = 768, is synthetic) and the same random
weights. Each side runs in its own subprocess, so the peak memory (ru_maxrss from wait4) is its own; numpy's and
torch's BLAS are pinned to the same number of threads there (OMP/OPENBLAS/MKL_NUM_THREADS set before any import).
Times cover everything after drawing the data: features, heads, search, records. The agreement of the sides: the
authors' closed-form outputs t0, t1 against the package's closed forms on the same float64 features (`fit_heads`),
and the err / sign of every trial. `--profile` prints where the package's time goes (cProfile, one table).

    python -m benchmarks.attack                  # RAF, d=384, n=40, N=400, re-trained, loss err, 10 trials
    python -m benchmarks.attack --trials 3       # a quick run
    python -m benchmarks.attack --profile        # the package's side only, under cProfile
    python -m benchmarks.attack --largest        # also the paper's largest cell (RAF, d=768, n=120, N=1300), ours only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks import progress

if __name__ == "__main__" and "--part" in sys.argv:  # before torch is imported (seconds): Ctrl-C stops that too
    progress.start_part()
elif __name__ == "__main__":
    progress.start("benchmarks.attack")

import torch  # noqa: E402

from benchmarks.attack_page import print_sides, write_attack_page  # noqa: E402
from benchmarks.authors_gen import (  # noqa: E402
    AUTHORS_DIR,
    AUTHORS_MAPS,
    authors_trial,
    how_to_get,
    load_utils,
    run_quietly,
)
from benchmarks.common import command_line, run_part  # noqa: E402
from benchmarks.floor import Rates, profile_call  # noqa: E402
from wslight.attack import delta_attack  # noqa: E402
from wslight.attack.heads import fit_heads  # noqa: E402
from wslight.base.seeding import derive_seed, generator  # noqa: E402
from wslight.features import FreshMaps, make_map  # noqa: E402
from wslight.records.pages import usable_cores  # noqa: E402

# The maps the baseline runs on (a dense float64 forward through the map itself).
MAPS = ("raf", "relu_raf", "rf")


# The pool of bundled reviews the trials draw from (distinct reviews, balanced labels +-1)
REVIEW_POOL = 1000


def trial_data(t: int, n: int, d: int, N: int, seed: int, data: str = "imdb") -> tuple[torch.Tensor, ...]:
    """One trial, float64, rows of norm sqrt(d): N + 1 distinct bundled reviews, or synthetic rows.

    The reviews (MiniLM layer-0 token embeddings, their labels) are drawn from the pool by the trial's own permutation;
    or (`data="synthetic"`) aniso rows (docs/theory/checks.md §11), 0.7 u + sqrt(0.51) g / sqrt(d) renormalised, with
    random +-1 labels.

    Returns X_train (N, n, d), Y (N,), X_ctx (1, n, d), y (1,): N + 1 distinct samples, the first is the context.
    """
    if data == "imdb":
        emb = _reviews(max(REVIEW_POOL, N + 1))
        first = emb.first_copies()  # skip a review the source holds twice
        order = torch.randperm(len(emb), generator=generator(seed, "bench.attack.reviews", t)).tolist()
        idx = [i for i in order if first[i]][: N + 1]
        if len(idx) < N + 1:
            raise SystemExit(f"the bundled pool holds {len(idx)} distinct reviews, need N + 1 = {N + 1}")
        X, lab = emb.samples(idx, n, d, dtype=torch.float64)
        lab = lab.double()
        return X[1:], lab[1:], X[:1], lab[:1]
    g = generator(seed, "bench.attack.data", t)
    u = torch.randn(d, generator=g, dtype=torch.float64)
    u = u / u.norm()
    X = 0.7 * u + 0.51**0.5 * torch.randn(N + 1, n, d, generator=g, dtype=torch.float64) / d**0.5
    X = X / X.norm(dim=-1, keepdim=True) * d**0.5  # (N + 1, n, d), rows of norm sqrt(d)
    lab = torch.randint(0, 2, (N + 1,), generator=g).double() * 2 - 1
    return X[1:], lab[1:], X[:1], lab[:1]


_POOL: dict[int, object] = {}


def _reviews(size: int):
    """The bundled reviews' token embeddings (built once into the cache, then read)."""
    if size not in _POOL:
        from wslight.data import EmbeddingSpec, load_token_embeddings  # type: ignore[attr-defined]

        _POOL[size] = load_token_embeddings(EmbeddingSpec(num_samples=size))
    return _POOL[size]


def trial_seed(t: int, seed: int) -> int:
    """Trial t's map seed (both sides)."""
    return derive_seed(seed, "bench.attack.map", t)


def trial_map(name: str, t: int, n: int, d: int, seed: int, dtype: str = "float32"):
    """Trial t's map, built by the package's one factory (what FreshMaps builds for attention maps)."""
    return make_map(name, n, d, trial_seed(t, seed), dtype=dtype)


# ----------------------------------------------------------------------------------------------------------------------
# The authors' own code (benchmarks/authors_gen.py) and the torch port of their procedure (docs/theory/attack.md §6.5)
# ----------------------------------------------------------------------------------------------------------------------

AUTHORS_TRAINING = {"retrain": "total", "finetune": "fine_tuning"}


def trial_weights(name: str, t: int, n: int, d: int, seed: int):
    """Trial t's map weights as the authors' functions take them: RAF W (d, d) or RF V (k, n d), float64 numpy."""
    fm = trial_map(name, t, n, d, seed, dtype="float64")
    return (fm.V if name == "rf" else fm.W).numpy()


def part_authors(a) -> dict:
    """Their gen.py per trial with their utils.py (timed), then the package's closed forms on the same features."""
    utils = load_utils(Path(a.authors_code))
    data = [trial_data(t, a.n, a.d, a.N, a.seed, a.data) for t in range(a.trials)]
    weights = [trial_weights(a.map, t, a.n, a.d, a.seed) for t in range(a.trials)]
    args = [(dt[0].numpy(), dt[1].numpy(), dt[2][0].numpy(), dt[3][0].numpy()) for dt in data]
    start, cpu = time.perf_counter(), time.process_time()
    outs = [
        run_quietly(authors_trial, utils, *args[t], weights[t], AUTHORS_MAPS[a.map], AUTHORS_TRAINING[a.training])
        for t in range(a.trials)
    ]
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    rows = []
    for t, out in enumerate(outs):
        y = float(data[t][3][0])
        t0, t1 = package_closed_forms(a, t, data[t])
        rows.append(dict(out, y=y, err=(out["D1"] + y) ** 2, pkg_t0=t0, pkg_t1=t1))
    return dict(time_s=elapsed, cpu_s=cpu, trials=rows)


def package_closed_forms(a, t: int, data) -> tuple[float, float]:
    """t0 and t1 of the package's closed forms (`fit_heads`) on trial t's float64 features (the authors' features)."""
    fm = trial_map(a.map, t, a.n, a.d, a.seed, dtype="float64")
    X_tr, Y, X_ctx, y = data
    with torch.no_grad():
        heads = fit_heads(fm(X_tr), Y, fm(X_ctx), y)
    direction = heads.phi if a.training == "finetune" else heads.Pphi
    t1 = heads.t0 + heads.coef(a.training) * (heads.phi * direction).sum(-1)
    return float(heads.t0[0]), float(t1[0])


def port_trial(fm, X_tr, Y, X_ctx, y, training: str, lr: float, steps: int) -> dict:
    """The torch port of the authors' procedure for one trial, float64, dense algebra; t0, t1, D0, D1, err."""
    f64 = torch.float64
    with torch.no_grad():
        Phi = fm(X_tr)  # (N, D)
        phi = fm(X_ctx)[0]  # (D,)
        Phi_pinv = torch.linalg.pinv(Phi)  # (D, N)
        theta_star = Phi_pinv @ Y
        P = torch.eye(Phi.shape[1], dtype=f64) - Phi_pinv @ Phi  # (D, D): the authors' P_o
        if training == "retrain":
            A = torch.cat([Phi, phi[None]])  # (N + 1, D)
            theta = torch.linalg.pinv(A) @ torch.cat([Y, y])
        else:
            theta = theta_star + phi * (y[0] - phi @ theta_star) / (phi @ phi)
        proj_ratio = float((P @ phi).norm() / phi.norm())
    x0 = X_ctx[0, 0].clone()
    x = x0.clone().requires_grad_(True)
    radius = X_ctx.shape[-1] ** 0.5
    mse = torch.nn.MSELoss()
    for _ in range(steps):
        Xp = torch.cat([x[None, None], X_ctx[:, 1:]], dim=1)  # (1, n, d) with token 0 replaced
        loss = mse(fm(Xp)[0] @ theta, -y[0])  # (16): the test error against y_Delta = -y
        (g,) = torch.autograd.grad(loss, x)
        with torch.no_grad():
            x -= lr * g
            dlt = x - x0
            if dlt.norm() > radius:
                x.copy_(x0 + dlt / dlt.norm() * radius)
    with torch.no_grad():
        phi_p = fm(torch.cat([x[None, None], X_ctx[:, 1:]], dim=1))[0]
        D0, D1 = float(phi_p @ theta_star), float(phi_p @ theta)
        t0, t1 = float(phi @ theta_star), float(phi @ theta)
    return dict(y=float(y[0]), t0=t0, t1=t1, D0=D0, D1=D1, err=(D1 + float(y[0])) ** 2, proj_ratio=proj_ratio)


def part_port(a) -> dict:
    """The torch port of the authors' procedure, one trial at a time."""
    lr, steps = (100.0, 300) if a.map == "rf" else (1.0, 50 * a.n)
    data = [trial_data(t, a.n, a.d, a.N, a.seed, a.data) for t in range(a.trials)]
    maps = [trial_map(a.map, t, a.n, a.d, a.seed, dtype="float64") for t in range(a.trials)]
    start, cpu = time.perf_counter(), time.process_time()
    rows = [port_trial(maps[t], *data[t], a.training, lr, steps) for t in range(a.trials)]
    return dict(time_s=time.perf_counter() - start, cpu_s=time.process_time() - cpu, trials=rows)


# ----------------------------------------------------------------------------------------------------------------------
# Package
# ----------------------------------------------------------------------------------------------------------------------


def ours_inputs(a) -> tuple[torch.Tensor, ...]:
    """The trials' data stacked: X_tr (T, N, n, d), Y (T, N), X_ctx (T, 1, n, d), y (T, 1)."""
    data = [trial_data(t, a.n, a.d, a.N, a.seed, a.data) for t in range(a.trials)]
    X_tr, Y, X_ctx, y = (torch.stack([dt[i] for dt in data]) for i in range(4))
    if a.largest:
        X_tr = X_tr.float()  # the map works in float32; halves the largest input (1300 x 120 x 768)
    return X_tr, Y, X_ctx, y


def ours_call(a, X_tr, Y, X_ctx, y) -> dict:
    """The package's timed call: fresh maps built inside it, all trials attacked at once."""
    maps = FreshMaps(a.map, [trial_seed(t, a.seed) for t in range(a.trials)])  # a fresh map per trial
    seeds = [derive_seed(a.seed, "bench.attack.restarts", t) for t in range(a.trials)]
    return delta_attack(maps, X_tr, Y, X_ctx, y, training=a.training, loss="err", seed=seeds)


def part_ours(a) -> dict:
    """The package's side: one call of `delta_attack` on every trial."""
    inputs = ours_inputs(a)
    start, cpu = time.perf_counter(), time.process_time()
    r = ours_call(a, *inputs)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    keys = ("y", "t0", "t1", "D0", "D1", "err", "proj_ratio", "steps", "gram_cond")
    rows = [{k: float(r[k][t, 0]) for k in keys} for t in range(a.trials)]
    floor = {} if a.largest else profile_call(lambda: ours_call(a, *inputs))  # the same call again, untimed
    return dict(time_s=elapsed, cpu_s=cpu, trials=rows, **floor)


# Where the package's time goes: (label, file suffix, function names); cumulative times under cProfile
PHASES = (
    ("training and context features (the map's forward)", "wslight/features/", ("trial_features", "stacked_features")),
    ("Gram Phi Phi^T (float64)", "wslight/base/numerics.py", ("gram",)),
    ("cond(G) (eigenvalues)", "wslight/attack/heads.py", ("gram_condition",)),
    ("theta*, P phi (passes over Phi)", "wslight/attack/heads.py", ("min_norm", "project", "min_norm_and_projection")),
    ("contexts' algebra (AttentionMove, working dtype)", "wslight/features/generic_move.py", ("token_move",)),
    ("chains (all steps)", "wslight/chains/engine.py", ("run_chains",)),
    ("  their read-out phi(X')^T h (forward)", "wslight/features/attention_move.py", ("readout", "readout_and_grad")),
    ("  autograd backward", "torch/autograd/__init__.py", ("grad",)),
    ("float64 algebra and read-out at the kept Delta", "wslight/features/generic_move.py", ("float64_twin",)),
)


def profile_ours(a) -> None:
    """The package's call under cProfile (after one warm-up call): a table of its phases, then the top functions."""
    import cProfile
    import pstats

    inputs = ours_inputs(a)
    ours_call(a, *inputs)  # warm-up
    prof = cProfile.Profile(time.process_time)  # CPU time: what a busy machine changes least
    start, cpu = time.perf_counter(), time.process_time()
    prof.enable()
    ours_call(a, *inputs)
    prof.disable()
    wall, total = time.perf_counter() - start, time.process_time() - cpu
    stats = pstats.Stats(prof)
    print(f"# profile: {a.map}, d={a.d}, n={a.n}, N={a.N}, {a.training}, loss err, {a.trials} trials, ")
    print(
        f"# {torch.get_num_threads()} thread(s); under cProfile {total:.2f} CPU s ({total / a.trials:.3f} per trial), "
        f"{wall:.2f} s wall"
    )
    print("| phase | CPU s | CPU s/trial | share |\n|---|---|---|---|")
    for label, where, names in PHASES:
        cum = sum(v[3] for k, v in stats.stats.items() if where in k[0] and k[2] in names)  # type: ignore[attr-defined]
        print(f"| {label} | {cum:.3f} | {cum / a.trials:.4f} | {cum / total:.0%} |")
    stats.sort_stats("tottime").print_stats(15)


# ----------------------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------------------

BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def run_side(part: str, argv: list[str], threads: int, what: str) -> dict:
    """Run one side in a subprocess (numpy's and torch's BLAS pinned to `threads`), saying `what` it computes.

    Returns its JSON result with its peak memory added.
    """
    env = dict(os.environ, **{k: str(threads) for k in BLAS_THREADS}) if threads else None
    return run_part(__file__, part, argv, what, env)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", default="raf", choices=sorted(MAPS))
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--N", type=int, default=400)
    ap.add_argument("--training", default="retrain", choices=["finetune", "retrain"])
    ap.add_argument("--trials", type=int, default=10, help="trials of the comparison (every side)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--data",
        choices=["imdb", "synthetic"],
        default="imdb",
        help="imdb: the bundled reviews, the workload users run; synthetic: aniso rows, labelled as such",
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch and BLAS threads in each part, every side (0: the defaults)"
    )
    ap.add_argument(
        "--authors-code",
        default=None,
        help=f"the authors' repository checkout (default {AUTHORS_DIR.relative_to(AUTHORS_DIR.parents[2])}, "
        "filled by `make authors-code`); given and missing: exit 2",
    )
    ap.add_argument("--port", action="store_true", help="also the torch port of the authors' procedure (slow)")
    ap.add_argument("--profile", action="store_true", help="only profile the package's call (cProfile), no page")
    ap.add_argument("--largest", action="store_true", help="also RAF d=768, n=120, N=1300, re-trained (ours only)")
    ap.add_argument("--largest-trials", type=int, default=1)
    ap.add_argument("--pages", default="reports/bench", help="where the results page attack_speed.md goes")
    ap.add_argument("--part", choices=["authors", "port", "ours"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.authors_given = a.authors_code is not None
    a.authors_code = str(AUTHORS_DIR) if a.authors_code is None else a.authors_code
    return a


def main(argv: list[str] | None = None) -> None:
    """Run the sides in their own subprocesses, print the table and write the page (exit 2: given code missing)."""
    a = parse(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.part:
        result = {"authors": part_authors, "port": part_port, "ours": part_ours}[a.part](a)
        result["threads"] = torch.get_num_threads()
        with open(a.out, "w") as fh:
            json.dump(result, fh)
        return
    if a.profile:
        profile_ours(a)
        return
    have_authors = (Path(a.authors_code) / "utils.py").is_file()
    if not have_authors:
        if a.authors_given:
            print(how_to_get(Path(a.authors_code)), file=sys.stderr)
            raise SystemExit(2)
        print(how_to_get(Path(a.authors_code)) + "; running without that row")

    common = ["--map", a.map, "--d", str(a.d), "--n", str(a.n), "--N", str(a.N), "--training", a.training]
    common += ["--trials", str(a.trials), "--seed", str(a.seed), "--threads", str(a.threads), "--data", a.data]
    common += ["--authors-code", a.authors_code]
    data = "bundled IMDb reviews (MiniLM layer 0)" if a.data == "imdb" else "SYNTHETIC aniso rows (not reviews)"
    print(f"# {a.map}, d={a.d}, n={a.n}, N={a.N}, {a.training}, loss err, {a.trials} trials, data: {data}")
    sides = {}
    if have_authors:
        sides["authors"] = run_side("authors", common, a.threads, f"the authors' code, {a.trials} trials one at a time")
    if a.port:
        sides["port"] = run_side("port", common, a.threads, f"the torch port, {a.trials} trials one at a time")
    sides["ours"] = run_side("ours", common, a.threads, f"the package, {a.trials} trials in one call")
    rates = Rates.measure(usable_cores())
    print_sides(sides, a)
    largest = None
    if a.largest:
        big = ["--map", "raf", "--d", "768", "--n", "120", "--N", "1300", "--training", "retrain"]
        big += ["--trials", str(a.largest_trials), "--seed", str(a.seed), "--threads", str(a.threads), "--largest"]
        big += ["--data", "synthetic"]  # d = 768 is wider than the bundled encoder
        print(f"\n# largest: raf, d=768, n=120, N=1300, retrain, loss err, {a.largest_trials} trial(s), ours only,")
        print("# SYNTHETIC aniso rows")
        res = run_side("ours", big, a.threads, "the largest cell, the package")
        errs = [r["err"] for r in res["trials"]]
        print(
            f"time {res['time_s']:.1f} s, peak {res['peak_gib']:.2f} GiB (limit 24), errs {[f'{e:.2e}' for e in errs]}"
        )
        steps = [int(r["steps"]) for r in res["trials"]]
        print(f"Gram condition number {res['trials'][0]['gram_cond']:.3g}, steps {steps}")
        largest = res
    page = write_attack_page(Path(a.pages), sides, largest, data, a, command_line(__file__, argv), rates)
    print(f"\nresults page: {page}")


if __name__ == "__main__":
    main()
