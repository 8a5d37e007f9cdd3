"""Delta-attack benchmark: `wslight.attack.delta_attack` against a faithful per-trial baseline (docs/theory.md §6.5).

The paper's protocol: every trial has its own random map and its own training set; the two sides see the same maps
and data. The package attacks all trials in one call with `FreshMaps(map, seeds)` (maps built inside the timed call).

The baseline follows the authors' `gen.py`: one context sample at a time, float64, the explicit pseudo-inverse of Phi
(torch.linalg.pinv), the dense D x D projector P = I - Phi^+ Phi, theta_r from the pseudo-inverse of the stacked system,
a start exactly at the clean token 0, plain projected gradient descent on the test error with lr 1 for 50 n steps
(RAF / ReLU-RAF; RF: lr 100 for 300 steps) and autograd through the full map. The package batches all trials in one
call (closed forms in N x N space, single-token structure, normalised momentum steps, 4 restarts, early stop).

Both sides see the same data (by default N + 1 distinct bundled reviews per trial, MiniLM layer-0 token embeddings
with rows rescaled to sqrt(d) and their labels, the first one the context sample; `--data synthetic`: the "aniso"
rows of docs/theory.md §11 with random +-1 labels; the largest cell, d = 768, is synthetic) and the same random
weights. Each side runs in its own subprocess, so the peak memory (ru_maxrss from wait4) is its own. Times cover
everything after drawing the data: features, heads, search, records.
Both parts use the same number of torch threads (1 by default: thousands of tiny steps gain nothing from intra-op
threads, and on a shared machine oversubscription slows both sides by an order of magnitude; --threads 0 for torch's
default).

    python benchmarks/attack.py                  # RAF, d=384, n=40, N=400, re-trained, loss err, 10 trials
    python benchmarks/attack.py --trials 3       # a quick run
    python benchmarks/attack.py --largest        # also the paper's largest cell (RAF, d=768, n=120, N=1300), ours only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from wslight.attack import delta_attack
from wslight.base.seeding import derive_seed, generator
from wslight.features import FreshMaps, make_map
from wslight.records.pages import PageHeader, write_page

# The maps the baseline runs on (a dense float64 forward through the map itself).
MAPS = ("raf", "relu_raf", "rf")


# The pool of bundled reviews the trials draw from (distinct reviews, balanced labels +-1)
REVIEW_POOL = 1000


def trial_data(t: int, n: int, d: int, N: int, seed: int, data: str = "imdb") -> tuple[torch.Tensor, ...]:
    """One trial, float64, rows of norm sqrt(d): N + 1 distinct bundled reviews, or synthetic rows.

    The reviews (MiniLM layer-0 token embeddings, their labels) are drawn from the pool by the trial's own permutation;
    or (`data="synthetic"`) aniso rows (docs/theory.md §11), 0.7 u + sqrt(0.51) g / sqrt(d) renormalised, with random
    +-1 labels.

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
# Faithful baseline (docs/theory.md §6.5)
# ----------------------------------------------------------------------------------------------------------------------


def baseline_trial(fm, X_tr, Y, X_ctx, y, training: str, lr: float, steps: int) -> dict:
    """The authors' procedure for one trial, float64, dense algebra; returns t0, t1, D0, D1, err."""
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


def part_baseline(a) -> dict:
    lr, steps = (100.0, 300) if a.map == "rf" else (1.0, 50 * a.n)
    data = [trial_data(t, a.n, a.d, a.N, a.seed, a.data) for t in range(a.trials)]
    maps = [trial_map(a.map, t, a.n, a.d, a.seed, dtype="float64") for t in range(a.trials)]
    start = time.perf_counter()
    rows = [baseline_trial(maps[t], *data[t], a.training, lr, steps) for t in range(a.trials)]
    return dict(time_s=time.perf_counter() - start, trials=rows)


# ----------------------------------------------------------------------------------------------------------------------
# Package
# ----------------------------------------------------------------------------------------------------------------------


def part_ours(a) -> dict:
    data = [trial_data(t, a.n, a.d, a.N, a.seed, a.data) for t in range(a.trials)]
    X_tr, Y, X_ctx, y = (torch.stack([dt[i] for dt in data]) for i in range(4))  # (T, N, n, d), (T, N), ...
    if a.largest:
        X_tr = X_tr.float()  # the map works in float32; halves the largest input (1300 x 120 x 768)
    del data
    start = time.perf_counter()
    maps = FreshMaps(a.map, [trial_seed(t, a.seed) for t in range(a.trials)])  # a fresh map per trial
    seeds = [derive_seed(a.seed, "bench.attack.restarts", t) for t in range(a.trials)]
    r = delta_attack(maps, X_tr, Y, X_ctx, y, training=a.training, loss="err", seed=seeds)
    elapsed = time.perf_counter() - start
    keys = ("y", "t0", "t1", "D0", "D1", "err", "proj_ratio", "steps", "gram_cond")
    rows = [{k: float(r[k][t, 0]) for k in keys} for t in range(a.trials)]
    return dict(time_s=elapsed, trials=rows)


# ----------------------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------------------


def run_part(part: str, argv: list[str]) -> dict:
    """Run one part in a subprocess and add its peak resident memory."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    proc = subprocess.Popen([sys.executable, __file__, "--part", part, "--out", path, *argv])
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"part {part} failed with status {status}")
    with open(path) as fh:
        result = json.load(fh)
    os.unlink(path)
    result["peak_gib"] = usage.ru_maxrss / 1024**2  # ru_maxrss is in KiB on Linux
    return result


# ----------------------------------------------------------------------------------------------------------------------
# The results page (attack_speed.md)
# ----------------------------------------------------------------------------------------------------------------------

PROTOCOL = (
    "The paper's protocol: every trial has its own random map and its own training set, the same on both sides. The "
    "package attacks all trials in one call of `delta_attack` with `FreshMaps(map, seeds)` (closed-form heads in N x N "
    "space, token-move features, batched trials and restarts); the baseline follows the authors' `gen.py` one trial at "
    "a time (docs/theory.md §6.5: an explicit pseudo-inverse of Phi, the dense D x D projector, float64, fixed-step "
    "projected descent). Times cover everything after drawing the data; peak memory is each side's own process "
    "(ru_maxrss)."
)


def side_row(name: str, res: dict, trials: int) -> str:
    """One side of the comparison as a row of the page's table: time, per trial, peak memory, mean err and y*D1."""
    errs = [r["err"] for r in res["trials"]]
    yD1 = [r["y"] * r["D1"] for r in res["trials"]]
    return (
        f"| {name} | {res['time_s']:.2f} s | {res['time_s'] / trials:.3f} s | {res['peak_gib']:.2f} GiB "
        f"| {sum(errs) / len(errs):.2e} | {sum(yD1) / len(yD1):+.3f} |"
    )


def write_attack_page(folder, base: dict, ours: dict, worse: int, largest: dict | None, data: str, a, argv) -> Path:
    """Write attack_speed.md: the header (wslight.records.pages), the protocol, and the measured table."""
    body = [
        PROTOCOL,
        "",
        f"The cell: {a.map}, d = {a.d}, n = {a.n}, N = {a.N}, {a.training}, loss err, {a.trials} trials; data: {data}; "
        f"{ours['threads']} torch thread(s) per side; seed {a.seed}.",
        "",
        "| side | time | per trial | peak memory | mean err | mean y*D1 |",
        "|---|---|---|---|---|---|",
        side_row("baseline (the authors' procedure)", base, a.trials),
        side_row("package", ours, a.trials),
        "",
        f"Speed-up: **{base['time_s'] / ours['time_s']:.1f}x**; trials where the package's err is above the "
        f"baseline's (by more than 1e-6): {worse} of {a.trials}.",
        "",
    ]
    if largest is not None:
        errs = ", ".join(f"{r['err']:.2e}" for r in largest["trials"])
        body += [
            "## The paper's largest cell (RAF, d = 768, n = 120, N = 1300, re-trained; synthetic rows; package only)",
            "",
            f"{len(largest['trials'])} trial(s): {largest['time_s']:.1f} s, peak {largest['peak_gib']:.2f} GiB, "
            f"err {errs}.",
            "",
        ]
    command = ["python", "benchmarks/attack.py", *(sys.argv[1:] if argv is None else argv)]
    return write_page(folder / "attack_speed.md", "Attack speed", PageHeader.collect(command), body)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", default="raf", choices=sorted(MAPS))
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--N", type=int, default=400)
    ap.add_argument("--training", default="retrain", choices=["finetune", "retrain"])
    ap.add_argument("--trials", type=int, default=10, help="trials of the comparison (both sides)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--data",
        choices=["imdb", "synthetic"],
        default="imdb",
        help="imdb: the bundled reviews, the workload users run; synthetic: aniso rows, labelled as such",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each part, both sides (0: torch default)")
    ap.add_argument("--largest", action="store_true", help="also RAF d=768, n=120, N=1300, re-trained (ours only)")
    ap.add_argument("--largest-trials", type=int, default=1)
    ap.add_argument("--pages", default="reports/bench", help="where the results page attack_speed.md goes")
    ap.add_argument("--part", choices=["baseline", "ours"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.part:
        result = (part_baseline if a.part == "baseline" else part_ours)(a)
        result["threads"] = torch.get_num_threads()
        with open(a.out, "w") as fh:
            json.dump(result, fh)
        return

    common = ["--map", a.map, "--d", str(a.d), "--n", str(a.n), "--N", str(a.N), "--training", a.training]
    common += ["--trials", str(a.trials), "--seed", str(a.seed), "--threads", str(a.threads), "--data", a.data]
    data = "bundled IMDb reviews (MiniLM layer 0)" if a.data == "imdb" else "SYNTHETIC aniso rows (not reviews)"
    print(f"# {a.map}, d={a.d}, n={a.n}, N={a.N}, {a.training}, loss err, {a.trials} trials, data: {data}")
    base = run_part("baseline", common)
    ours = run_part("ours", common)
    print(f"threads per part: {ours['threads']}; trials share a map: no (own map and training set per trial, the same")
    print("maps and data on both sides); baseline on all trials, one at a time; package: all trials in one call")
    print(f"{'':10s} {'time (s)':>9s} {'s/trial':>8s} {'peak (GiB)':>10s} {'mean err':>9s} {'mean y*D1':>9s}")
    for name, res in (("baseline", base), ("ours", ours)):
        errs = [r["err"] for r in res["trials"]]
        yD1 = [r["y"] * r["D1"] for r in res["trials"]]
        mean_err, mean_yD1 = sum(errs) / len(errs), sum(yD1) / len(yD1)
        per = res["time_s"] / a.trials
        print(f"{name:10s} {res['time_s']:9.2f} {per:8.3f} {res['peak_gib']:10.2f} {mean_err:9.4f} {mean_yD1:9.3f}")
    print(f"speed-up: {base['time_s'] / ours['time_s']:.1f}x")
    print(f"{'trial':>5s} {'err base':>9s} {'err ours':>9s} {'D0 base':>8s} {'D0 ours':>8s} {'steps':>6s}")
    worse = 0
    for t, (rb, ro) in enumerate(zip(base["trials"], ours["trials"], strict=True)):
        worse += ro["err"] > rb["err"] + 1e-6
        print(f"{t:5d} {rb['err']:9.2e} {ro['err']:9.2e} {rb['D0']:8.3f} {ro['D0']:8.3f} {int(ro['steps']):6d}")
    print(f"trials where ours is worse than the baseline: {worse} of {a.trials}")
    largest = None

    if a.largest:
        big = ["--map", "raf", "--d", "768", "--n", "120", "--N", "1300", "--training", "retrain"]
        big += ["--trials", str(a.largest_trials), "--seed", str(a.seed), "--threads", str(a.threads), "--largest"]
        big += ["--data", "synthetic"]  # d = 768 is wider than the bundled encoder
        print(f"\n# largest: raf, d=768, n=120, N=1300, retrain, loss err, {a.largest_trials} trial(s), ours only,")
        print("# SYNTHETIC aniso rows")
        res = run_part("ours", big)
        errs = [r["err"] for r in res["trials"]]
        print(
            f"time {res['time_s']:.1f} s, peak {res['peak_gib']:.2f} GiB (limit 24), errs {[f'{e:.2e}' for e in errs]}"
        )
        steps = [int(r["steps"]) for r in res["trials"]]
        print(f"Gram condition number {res['trials'][0]['gram_cond']:.3g}, steps {steps}")
        largest = res
    page = write_attack_page(Path(a.pages), base, ours, worse, largest, data, a, argv)
    print(f"\nresults page: {page}")


if __name__ == "__main__":
    main()
