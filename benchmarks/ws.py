"""Word-sensitivity benchmark: the batched estimator of `wslight.sensitivity` against a faithful per-sample baseline.

The baseline follows the authors' `sensitivity.py` (docs/theory.md §4.1): one sample at a time, token 0, a start at
x_0 + 0.1 N(0, I), plain projected gradient descent on -RMSE(phi(X'), phi(X)) with the ball of radius sqrt(d) centred at
the noisy start, lr 100 and 300 steps for RF, lr 10 and 50 n steps for RAF / ReLU-RAF, float64, the dense weights and
autograd through the full map. Both sides see the same samples and the same random weights (same seeds).

The authors centre the ball at the noisy start, so the baseline's realised ||Delta|| from the clean token exceeds
sqrt(d) (by up to ~10%); the table therefore also shows the package run at each trial's realised baseline radius.

Every measured part runs in its own subprocess, so the reported peak memory (ru_maxrss from wait4) is that part's own.
Times exclude drawing the weights (shared by both sides); they include everything else (for the package: the
precomputation, the search and the float64 recomputation with the full map).

    python benchmarks/ws.py                       # RAF cell, RF cell, per-step cost of RAF against n
    python benchmarks/ws.py --trials 3 --baseline-trials 1   # a quick run (baseline time extrapolated per trial)
    python benchmarks/ws.py --largest             # also RF at d=768, n=150, k=D=115,200 (minutes)
    python benchmarks/ws.py --data imdb           # token embeddings from wslight.data instead of synthetic rows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from wslight.features import make_map
from wslight.seeding import generator
from wslight.sensitivity import single_token_objective, word_sensitivity

# ----------------------------------------------------------------------------------------------------------------------
# Data and maps (deterministic: both sides rebuild the same ones from the seed)
# ----------------------------------------------------------------------------------------------------------------------


def samples(data: str, trials: int, n: int, d: int, seed: int) -> torch.Tensor:
    """(trials, n, d) float64 rows of norm sqrt(d): synthetic Gaussian rows, or IMDb token embeddings."""
    if data == "synthetic":
        X = torch.randn(trials, n, d, generator=generator(seed, "bench.ws.data", n, d), dtype=torch.float64)
    else:
        try:
            from wslight.data import EmbeddingSpec, load_token_embeddings  # type: ignore[attr-defined]
        except ImportError as err:
            raise SystemExit(f"--data imdb needs wslight.data.load_token_embeddings ({err})") from None
        emb = load_token_embeddings(EmbeddingSpec(num_samples=trials))
        X = torch.as_tensor(emb if isinstance(emb, torch.Tensor) else emb[0])[:trials, :n, :d].to(torch.float64)
        if X.shape != (trials, n, d):
            raise SystemExit(f"--data imdb gave embeddings of shape {tuple(X.shape)}, need {(trials, n, d)}")
    # Paper: every row rescaled to norm sqrt(d)
    return X / X.norm(dim=-1, keepdim=True) * d**0.5


# ----------------------------------------------------------------------------------------------------------------------
# The faithful per-sample baseline (docs/theory.md §4.1)
# ----------------------------------------------------------------------------------------------------------------------


def dense_phi(name: str, fm) -> callable:
    """The full map on one sample (n, d) -> flat features, float64 dense weights, differentiable."""
    if name == "rf":
        if fm.V is None:
            raise SystemExit("the baseline needs the dense V (k x D); this RF is on the memory-bounded path")
        V = fm.V.to(torch.float64)  # (k, D), the authors' dense float64 matrix
        return lambda X: torch.relu(V @ X.reshape(-1))  # (k, D) @ (D,) -> (k,)
    W = fm.W.to(torch.float64)
    d = W.shape[0]

    def attention(X: torch.Tensor) -> torch.Tensor:
        S = X @ W @ X.T / d**0.5  # (n, d) @ (d, d) @ (d, n) -> (n, n)
        if name == "raf":
            A = torch.softmax(S, dim=-1)
        else:
            R = torch.relu(S)
            s = R.sum(-1, keepdim=True)
            A = R / torch.where(s == 0, torch.ones_like(s), s)
        return (A @ X).reshape(-1)  # (n, n) @ (n, d) -> (n d,)

    return attention


def baseline_ws(phi, X: torch.Tensor, lr: float, steps: int, g: torch.Generator) -> tuple[float, float]:
    """The authors' estimate for one sample X (n, d) float64: returns (S, ||x_0' - x_0|| / sqrt(d))."""
    d = X.shape[1]
    radius = d**0.5
    with torch.no_grad():
        phi0 = phi(X)
    xt = X[0] + 0.1 * torch.randn(d, generator=g, dtype=torch.float64)  # noisy start
    x0 = xt.clone()  # the authors' ball centre: the noisy start, not the token
    rest = X[1:]
    for _ in range(steps):
        xt.requires_grad_(True)
        out = phi(torch.cat([xt[None], rest]))
        loss = -torch.sqrt(torch.mean((out - phi0) ** 2))  # -RMSE
        (grad,) = torch.autograd.grad(loss, xt)
        with torch.no_grad():
            xt = xt - lr * grad
            dist = (xt - x0).norm()
            if dist > radius:
                xt = x0 + (xt - x0) * radius / dist
    with torch.no_grad():
        out = phi(torch.cat([xt[None], rest]))
        S = ((out - phi0).norm() / phi0.norm()).item()
        realised = ((xt - X[0]).norm() / radius).item()
    return S, realised


# ----------------------------------------------------------------------------------------------------------------------
# Parts (each runs in a subprocess; writes a JSON result)
# ----------------------------------------------------------------------------------------------------------------------


def reset_peak() -> bool:
    """Reset this process's peak RSS (Linux: writing 5 to /proc/self/clear_refs); False where unsupported.

    The reset also lowers what wait4 reports, so every part records the peak before it (drawing the weights).
    """
    global SETUP_PEAK_GIB
    SETUP_PEAK_GIB = peak_since_reset_gib()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


SETUP_PEAK_GIB: float | None = None


def peak_since_reset_gib() -> float | None:
    """VmHWM (peak RSS since the last reset_peak, GiB), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return None


def part_package(a) -> dict:
    X = samples(a.data, a.trials, a.n, a.d, a.seed)
    fm = make_map(a.map, a.n, a.d, a.seed)  # RF: k = D, float32 weights; the baseline casts them to float64
    reset = reset_peak()
    t0 = time.perf_counter()
    res = word_sensitivity(fm, X.float(), restarts=a.restarts, seed=a.seed)
    wall = time.perf_counter() - t0
    return {
        "ws": res.ws.tolist(),
        "delta_norm_over_radius": (res.delta_norm / a.d**0.5).tolist(),
        "steps": res.steps.tolist(),
        "wall_s": wall,
        "estimate_peak_gib": peak_since_reset_gib() if reset else None,
    }


def part_package_at_radius(a) -> dict:
    """The package with, for each trial, the ball radius the baseline actually used (its realised ||Delta||)."""
    X = samples(a.data, a.trials, a.n, a.d, a.seed)
    fm = make_map(a.map, a.n, a.d, a.seed)
    ws = []
    for t, r in enumerate(a.radii):
        ws.append(word_sensitivity(fm, X[t : t + 1].float(), radius=r, restarts=a.restarts, seed=a.seed).ws.item())
    return {"ws": ws}


def part_baseline(a) -> dict:
    X = samples(a.data, a.trials, a.n, a.d, a.seed)
    fm = make_map(a.map, a.n, a.d, a.seed)
    reset = reset_peak()
    t0 = time.perf_counter()
    phi = dense_phi(a.map, fm)  # the dense float64 weights (setup, timed separately)
    setup = time.perf_counter() - t0
    lr, steps = (100.0, 300) if a.map == "rf" else (10.0, 50 * a.n)
    ws, realised, per_trial = [], [], []
    for t in range(a.baseline_trials):
        g = generator(a.seed, "bench.ws.baseline", t)
        t1 = time.perf_counter()
        S, r = baseline_ws(phi, X[t], lr, steps, g)
        per_trial.append(time.perf_counter() - t1)
        ws.append(S)
        realised.append(r)
    return {
        "ws": ws,
        "realised_over_radius": realised,
        "per_trial_s": per_trial,
        "setup_s": setup,
        "estimate_peak_gib": peak_since_reset_gib() if reset else None,
    }


def part_step(a) -> dict:
    """Per-step cost at d = a.d for every n: structured step (value + gradient) against a full forward-backward."""
    out = []
    for n in a.step_n:
        X = samples(a.data, a.trials, n, a.d, a.seed)
        fm = make_map("raf", n, a.d, a.seed)
        phi = dense_phi("raf", fm)
        # structured: all trials x restarts chains in one call, reported per chain
        obj = single_token_objective(fm, X.float(), [0])
        delta = torch.randn(a.trials, 1, a.restarts, a.d, generator=generator(a.seed, "bench.ws.step"))
        delta = (delta / delta.norm(dim=-1, keepdim=True) * a.d**0.5).requires_grad_(True)

        def structured(obj=obj, delta=delta):
            (g,) = torch.autograd.grad(obj(delta).sum(), delta)
            return g

        X0 = X[0].clone()
        phi0 = phi(X0).detach()

        def full(X0=X0, phi=phi, phi0=phi0):
            xt = X0[0].clone().requires_grad_(True)
            loss = -torch.sqrt(torch.mean((phi(torch.cat([xt[None], X0[1:]])) - phi0) ** 2))
            (g,) = torch.autograd.grad(loss, xt)
            return g

        obj1 = single_token_objective(fm, X[:1].float(), [0])
        d1 = delta[:1, :, :1].detach().clone().requires_grad_(True)

        def structured_one(obj1=obj1, d1=d1):
            (g,) = torch.autograd.grad(obj1(d1).sum(), d1)
            return g

        row = {"n": n}
        for key, fn, chains in [
            ("batched", structured, a.trials * a.restarts),
            ("one", structured_one, 1),
            ("full", full, 1),
        ]:
            fn()
            reps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < a.step_seconds:
                fn()
                reps += 1
            row[key + "_ms_per_chain"] = (time.perf_counter() - t0) / reps / chains * 1e3
        out.append(row)
    return {"rows": out}


def part_largest(a) -> dict:
    n, d = 150, 768
    X = samples("synthetic", a.largest_trials, n, d, a.seed)
    fm = make_map("rf", n, d, a.seed)  # k = D = 115,200: memory-bounded, V regenerated block by block
    reset = reset_peak()
    t0 = time.perf_counter()
    res = word_sensitivity(fm, X.float(), restarts=a.restarts, seed=a.seed)
    wall = time.perf_counter() - t0
    return {
        "stored_V": fm.V is not None,
        "k": fm.k,
        "ws": res.ws.tolist(),
        "ws_sqrt_n": (res.ws * n**0.5).tolist(),
        "phi_norm_sq_over_k": (res.phi_norm**2 / fm.k).tolist(),
        "delta_norm_over_radius": (res.delta_norm / d**0.5).tolist(),
        "steps": res.steps.tolist(),
        "wall_s": wall,
        "estimate_peak_gib": peak_since_reset_gib() if reset else None,
    }


PARTS = {
    "package": part_package,
    "package_at_radius": part_package_at_radius,
    "baseline": part_baseline,
    "step": part_step,
    "largest": part_largest,
}


def run_part(part: str, argv: list[str]) -> dict:
    """Run one part in a fresh interpreter; return its JSON result plus its own peak RSS (GiB)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    proc = subprocess.Popen([sys.executable, __file__, "--part", part, "--out", path, *argv])
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"part {part} failed with exit code {proc.returncode}")
    with open(path) as f:
        result = json.load(f)
    os.unlink(path)
    result["peak_gib"] = usage.ru_maxrss / 1024**2  # ru_maxrss is in KiB on Linux
    return result


# ----------------------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------------------


def fmt_gib(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} GiB"


def compare_cell(name: str, map_: str, d: int, n: int, a, common: list[str]) -> None:
    cell = [*common, "--map", map_, "--d", str(d), "--n", str(n)]
    pkg = run_part("package", cell)
    base = run_part("baseline", cell)
    bt = len(base["ws"])
    radii = [r * d**0.5 for r in base["realised_over_radius"]]
    fair = run_part("package_at_radius", [*cell, "--radii", *map(str, radii)])["ws"]
    base_total = sum(base["per_trial_s"]) * a.trials / bt  # extrapolated when --baseline-trials < --trials
    ratio = base_total / pkg["wall_s"]
    ok = [p >= b * 0.99 for p, b in zip(pkg["ws"][:bt], base["ws"])]
    ok_fair = [p >= b * 0.99 for p, b in zip(fair, base["ws"])]
    print(f"\n== {name}: {map_}, d={d}, n={n}, {a.trials} trials (baseline run on {bt}) ==")
    print(
        f"{'trial':>5} {'S package':>10} {'S baseline':>10} {'pkg/base':>8} {'|D|/r base':>10} "
        f"{'S pkg @ base |D|':>16} {'ratio':>6}"
    )
    for t in range(a.trials):
        if t < bt:
            b = base["ws"][t]
            tail = (
                f"{b:10.4f} {pkg['ws'][t] / b:8.3f} {base['realised_over_radius'][t]:10.4f} "
                f"{fair[t]:16.4f} {fair[t] / b:6.3f}"
            )
        else:
            tail = f"{'-':>10} {'-':>8} {'-':>10} {'-':>16} {'-':>6}"
        print(f"{t:5d} {pkg['ws'][t]:10.4f} {tail}")
    print(
        f"wall: package {pkg['wall_s']:.2f} s for {a.trials} trials (steps max {max(pkg['steps'])}, |D|/r "
        f"{min(pkg['delta_norm_over_radius']):.6f}-{max(pkg['delta_norm_over_radius']):.6f}); baseline "
        f"{base_total:.1f} s ({base_total / a.trials:.2f} s/trial; + {base['setup_s']:.1f} s dense float64 setup) "
        f"-> {ratio:.1f}x less wall time"
    )
    print(
        f"peak RSS during the estimate (resident weights included): package {fmt_gib(pkg['estimate_peak_gib'])}, "
        f"baseline {fmt_gib(base['estimate_peak_gib'])}; while drawing the weights (shared step): "
        f"{fmt_gib(pkg['setup_peak_gib'])}"
    )
    print(f"S_package >= 0.99 S_baseline, radius sqrt(d): {all(ok)} ({sum(ok)}/{len(ok)} trials)")
    print(f"S_package >= 0.99 S_baseline, at the baseline's realised ||Delta||: {all(ok_fair)} ({sum(ok_fair)}/{bt})")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=10, help="samples per cell (the package does them in one call)")
    p.add_argument("--baseline-trials", type=int, default=None, help="baseline samples (default: --trials)")
    p.add_argument("--restarts", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", choices=["synthetic", "imdb"], default="synthetic")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads in every part")
    p.add_argument("--skip", nargs="*", default=[], choices=["raf", "rf", "step"], help="parts to skip")
    p.add_argument("--largest", action="store_true", help="also RF at d=768, n=150, k=D (minutes)")
    p.add_argument("--largest-trials", type=int, default=2)
    p.add_argument("--step-n", type=int, nargs="+", default=[10, 20, 50, 100, 150, 200, 250])
    p.add_argument("--step-seconds", type=float, default=1.0, help="time spent timing each per-step case")
    # internal: one part in this process
    p.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--map", default="raf", help=argparse.SUPPRESS)
    p.add_argument("--d", type=int, default=384, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=50, help=argparse.SUPPRESS)
    p.add_argument("--step-d", type=int, default=384, help=argparse.SUPPRESS)
    p.add_argument("--radii", type=float, nargs="*", default=[], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.baseline_trials = min(a.trials, a.baseline_trials or a.trials)
    torch.set_num_threads(a.threads)

    if a.part:
        if a.part == "step":
            a.d = a.step_d
        result = PARTS[a.part](a)
        result["setup_peak_gib"] = SETUP_PEAK_GIB
        with open(a.out, "w") as f:
            json.dump(result, f)
        return

    common = [
        "--trials",
        str(a.trials),
        "--baseline-trials",
        str(a.baseline_trials),
        "--restarts",
        str(a.restarts),
        "--seed",
        str(a.seed),
        "--data",
        a.data,
        "--threads",
        str(a.threads),
    ]
    print(f"torch {torch.__version__}, {a.threads} thread(s), data={a.data}, restarts={a.restarts}, seed={a.seed}")
    if "raf" not in a.skip:
        compare_cell("RAF cell", "raf", 384, 50, a, common)
    if "rf" not in a.skip:
        compare_cell("RF cell", "rf", 192, 90, a, common)
    if "step" not in a.skip:
        argv_step = [*common, "--step-n", *map(str, a.step_n), "--step-seconds", str(a.step_seconds)]
        rows = run_part("step", argv_step)["rows"]
        chains = f"{a.trials} x {a.restarts}"
        print(f"\n== RAF per-step cost (value + gradient) against n, d=384; batched = {chains} chains ==")
        print(f"{'n':>5} {'batched ms/chain':>16} {'one chain ms':>12} {'full fwd-bwd ms':>15} {'full/batched':>12}")
        for r in rows:
            print(
                f"{r['n']:5d} {r['batched_ms_per_chain']:16.4f} {r['one_ms_per_chain']:12.4f} "
                f"{r['full_ms_per_chain']:15.4f} {r['full_ms_per_chain'] / r['batched_ms_per_chain']:12.1f}"
            )
        first, last = rows[0], rows[-1]
        growth = {k: last[k + "_ms_per_chain"] / first[k + "_ms_per_chain"] for k in ("batched", "one", "full")}
        print(
            f"growth n={first['n']}->{last['n']}: batched x{growth['batched']:.1f}, one chain x{growth['one']:.1f}, "
            f"full fwd-bwd x{growth['full']:.1f}"
        )
    if a.largest:
        r = run_part("largest", [*common, "--largest-trials", str(a.largest_trials)])
        print(f"\n== RF at the paper's largest size: d=768, n=150, k=D={r['k']:,}, {a.largest_trials} trials ==")
        print(f"V stored: {r['stored_V']} (dense V would be {r['k'] ** 2 * 4 / 1e9:.0f} GB in float32)")
        print(f"S: {[round(s, 4) for s in r['ws']]}; S*sqrt(n): {[round(s, 3) for s in r['ws_sqrt_n']]}")
        print(f"||phi||^2/k: {[round(s, 4) for s in r['phi_norm_sq_over_k']]}; steps: {r['steps']}")
        print(
            f"wall {r['wall_s']:.1f} s, peak RSS {fmt_gib(max(r['peak_gib'], r['setup_peak_gib'] or 0))} "
            f"(target <= 24 GiB; during the estimate {fmt_gib(r['estimate_peak_gib'])})"
        )


if __name__ == "__main__":
    main()
