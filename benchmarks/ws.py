"""Word-sensitivity benchmark on the paper's protocol: a fresh random map per trial, both sides on the same maps.

The package side is one call of `word_sensitivity(FreshMaps(map, seeds), X, seed=[...])` for all trials (X of shape
(T, 1, n, d)): RAF maps are built per trial, RF maps are never built: their (z = V flat(X), V^(0)) are drawn from the
exact joint law (docs/theory/maps.md §3.6). Its time includes drawing the maps.

The baseline follows the authors' `sensitivity.py` (docs/theory/search.md §4.1), one trial at a time with its own dense
map: token 0, a start at x_0 + 0.1 N(0, I), plain projected gradient descent on -RMSE(phi(X'), phi(X)) with the ball of
radius sqrt(d) centred at the noisy start, lr 100 and 300 steps for RF, lr 10 and 50 n steps for RAF / ReLU-RAF,
float64, the dense weights and autograd through the full map. Its per-trial time excludes building the map (reported
apart), which favours the baseline.

Same maps on both sides: trial t's RAF is `make_map(map, n, d, seed_t)` on both sides. For RF the baseline builds a
dense float64 V (k x D) that is exactly the package's drawn map: V^(0) is the drawn block, and the other columns are
W - (W r - g) r^T / ||r||^2 with W iid N(0, 1/D), r = flat(x_1, ..., x_{n-1}) and g = z - V^(0) x_0 the drawn
remainder; then V flat(X) = z, and the rows of V are iid N(0, I / D) (the r-component g r^T / ||r||^2 has variance 1/D
and is independent of the rest), so this is a fresh map of the authors' law that agrees with the package's draw.

The authors centre the ball at the noisy start, so the baseline's realised ||Delta|| from the clean token exceeds
sqrt(d) (by about 7%); the table therefore also shows the package run at each trial's realised baseline radius.

Every measured part runs in its own subprocess, so the reported peak memory (ru_maxrss from wait4) is that part's own.

    python -m benchmarks.ws --threads 1                           # RAF cell, RF cell, per-step cost of RAF against n
    python -m benchmarks.ws --threads 1 --baseline-trials 3       # the baseline on the first 3 trials, time scaled
    python -m benchmarks.ws --largest             # also RF at d=768, n=150, k=D=115,200 (one map, minutes)
    python -m benchmarks.ws --data synthetic      # Gaussian rows instead of the bundled reviews (the default)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from benchmarks import progress

if __name__ == "__main__" and "--part" in sys.argv:  # before torch is imported (seconds): Ctrl-C stops that too
    progress.start_part()
elif __name__ == "__main__":
    progress.start("benchmarks.ws")

import torch  # noqa: E402
import yaml  # noqa: E402

from benchmarks.common import CONFIGS, command_line, run_part  # noqa: E402
from benchmarks.floor import Rates, floor_section, per_unit, profile_call  # noqa: E402
from wslight.base.seeding import derive_seed, generator  # noqa: E402
from wslight.features import (  # noqa: E402
    MAPS,
    FreshMaps,
    family_defaults,  # noqa: E402
    make_map,
)
from wslight.features.rf import fresh_preactivations  # noqa: E402
from wslight.records.pages import PageHeader, usable_cores, write_page  # noqa: E402
from wslight.search import SearchSettings  # noqa: E402
from wslight.search.sensitivity import moved_token_objective, word_sensitivity  # noqa: E402

WS_CONFIGS = CONFIGS / "ws"  # the shipped sweeps' configs, whose search settings the benchmarks run

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
        if len(emb) < trials:
            raise SystemExit(f"--data imdb gave {len(emb)} reviews, need {trials}")
        X, _ = emb.samples(list(range(trials)), n, d, dtype=torch.float64)  # rows of norm sqrt(d)
    # Paper: every row rescaled to norm sqrt(d)
    return X / X.norm(dim=-1, keepdim=True) * d**0.5


# ----------------------------------------------------------------------------------------------------------------------
# The faithful per-sample baseline (docs/theory/search.md §4.1)
# ----------------------------------------------------------------------------------------------------------------------


def map_seeds(seed: int, trials: int) -> list[int]:
    """Trial t's map seed (both sides)."""
    return [derive_seed(seed, "bench.ws.map", t) for t in range(trials)]


def start_seeds(seed: int, trials: int) -> list[int]:
    """Trial t's seed of the package's random chain starts."""
    return [derive_seed(seed, "bench.ws.restarts", t) for t in range(trials)]


def dense_rf(X: torch.Tensor, seed: int) -> torch.Tensor:
    """The dense float64 V (k = D) of trial seed `seed` for one sample X (n, d): exactly the map the package draws.

    V^(0) and z = V flat(X) come from `fresh_preactivations` (what FreshMaps("rf") uses); the other columns are
    W - (W r - g) r^T / ||r||^2, W iid N(0, 1/D), so that V flat(X) = z and V has iid N(0, 1/D) entries (module doc).
    """
    n, d = X.shape
    D = n * d
    z, blocks = fresh_preactivations(X[None, None].float(), [0], D, [seed])  # (1, 1, k) float64, (1, 1, k, d)
    V = torch.empty(D, D, dtype=torch.float64)  # (k, D), the authors' dense float64 matrix
    V[:, :d] = blocks[0, 0].to(torch.float64)
    r = X[1:].reshape(-1).to(torch.float64)  # the unmoved tokens, flat
    g = z[0, 0] - V[:, :d] @ X[0].to(torch.float64)  # (k,) the drawn remainder V^(-0) r
    rest = V[:, d:]
    rest.normal_(generator=generator(seed, "bench.ws.dense_rest"))
    rest.mul_(D**-0.5)
    rest.addr_(rest @ r - g, r, alpha=-1.0 / float(r @ r))  # in place: rest r = g
    return V


def dense_phi(name: str, n: int, d: int, seed: int, X: torch.Tensor) -> callable:
    """Trial `seed`'s full map on one sample (n, d) -> flat features, float64 dense weights, differentiable."""
    if name == "rf":
        V = dense_rf(X, seed)
        return lambda Xs: torch.relu(V @ Xs.reshape(-1))  # (k, D) @ (D,) -> (k,)
    W = make_map(name, n, d, seed).W.to(torch.float64)

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


def warm_up(map_: str) -> None:
    """One tiny estimate (other maps, other data) before the timed call.

    torch's first calls of each kernel and allocation pattern cost a few tenths of a second once per process, which a
    sweep pays once, not per cell.
    """
    X = torch.randn(2, 1, 4, 8, generator=generator(99991, "bench.ws.warmup"))
    word_sensitivity(FreshMaps(map_, [99991, 99992]), X * 8**0.5 / X.norm(dim=-1, keepdim=True), seed=[99991, 99992])


def part_package(a) -> dict:
    X = samples(a.data, a.trials, a.n, a.d, a.seed)[:, None].float()  # (T, 1, n, d): one review per trial
    warm_up(a.map)
    reset = reset_peak()
    t0 = time.perf_counter()
    fm = FreshMaps(a.map, map_seeds(a.seed, a.trials))  # a fresh map per trial; RF drawn from its law
    res = word_sensitivity(fm, X, search=a.search, seed=start_seeds(a.seed, a.trials))
    wall = time.perf_counter() - t0
    again = FreshMaps(a.map, map_seeds(a.seed, a.trials))  # the same call, untimed, for its FLOPs and time shares
    floor = profile_call(lambda: word_sensitivity(again, X, search=a.search, seed=start_seeds(a.seed, a.trials)))
    return {
        **floor,
        "ws": res.ws[:, 0].tolist(),
        "delta_norm_over_radius": (res.delta_norm[:, 0] / a.d**0.5).tolist(),
        "steps": res.steps[:, 0].tolist(),
        "wall_s": wall,
        "estimate_peak_gib": peak_since_reset_gib() if reset else None,
    }


def part_package_at_radius(a) -> dict:
    """The package with, for each trial, the ball radius the baseline actually used (its realised ||Delta||)."""
    X = samples(a.data, a.trials, a.n, a.d, a.seed)[:, None].float()
    seeds, starts = map_seeds(a.seed, a.trials), start_seeds(a.seed, a.trials)
    ws = []
    for t, r in enumerate(a.radii):
        fm = FreshMaps(a.map, [seeds[t]])
        res = word_sensitivity(fm, X[t : t + 1], search=a.search, seed=[starts[t]], radius=r)
        ws.append(res.ws.item())
    return {"ws": ws}


def part_baseline(a) -> dict:
    X = samples(a.data, a.trials, a.n, a.d, a.seed).float().double()  # the package's float32 values
    seeds = map_seeds(a.seed, a.trials)
    reset = reset_peak()
    lr, steps = (100.0, 300) if a.map == "rf" else (10.0, 50 * a.n)
    ws, realised, per_trial, setup = [], [], [], []
    for t in range(a.baseline_trials):
        t0 = time.perf_counter()
        phi = dense_phi(a.map, a.n, a.d, seeds[t], X[t])  # trial t's dense float64 map (not timed with the trial)
        setup.append(time.perf_counter() - t0)
        g = generator(a.seed, "bench.ws.baseline", t)
        t1 = time.perf_counter()
        S, r = baseline_ws(phi, X[t], lr, steps, g)
        per_trial.append(time.perf_counter() - t1)
        ws.append(S)
        realised.append(r)
        del phi
    return {
        "ws": ws,
        "realised_over_radius": realised,
        "per_trial_s": per_trial,
        "setup_s": sum(setup),
        "estimate_peak_gib": peak_since_reset_gib() if reset else None,
    }


def part_step(a) -> dict:
    """Per-step cost at d = a.d for every n: structured step (value + gradient) against a full forward-backward."""
    out = []
    for n in a.step_n:
        X = samples(a.data, a.trials, n, a.d, a.seed)
        fm = make_map("raf", n, a.d, a.seed)  # one map for all chains (a per-step cost)
        phi = dense_phi("raf", n, a.d, a.seed, X[0])
        # structured: all trials x chains_per_round chains in one call, reported per chain
        per_round = a.search.chains_per_round
        obj = moved_token_objective(fm, X.float(), [0])
        delta = torch.randn(a.trials, 1, per_round, a.d, generator=generator(a.seed, "bench.ws.step"))
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

        obj1 = moved_token_objective(fm, X[:1].float(), [0])
        d1 = delta[:1, :, :1].detach().clone().requires_grad_(True)

        def structured_one(obj1=obj1, d1=d1):
            (g,) = torch.autograd.grad(obj1(d1).sum(), d1)
            return g

        row = {"n": n}
        for key, fn, chains in [
            ("batched", structured, a.trials * per_round),
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
    res = word_sensitivity(fm, X.float(), search=a.search, seed=a.seed)
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


# ----------------------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------------------


def fmt_gib(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} GiB"


def compare_cell(name: str, map_: str, d: int, n: int, a, common: list[str], search: SearchSettings) -> dict:
    cell = [*common, *search_arg(search), "--map", map_, "--d", str(d), "--n", str(n)]
    row = f"{name} ({map_}, d={d}, n={n})"
    pkg = run_part(__file__, "package", cell, f"{row}: the package, {a.trials} trials in one call")
    base = run_part(__file__, "baseline", cell, f"{row}: the baseline, {a.baseline_trials} trials one at a time")
    bt = len(base["ws"])
    radii = [r * d**0.5 for r in base["realised_over_radius"]]
    fair = run_part(
        __file__,
        "package_at_radius",
        [*cell, "--radii", *map(str, radii)],
        f"{row}: the package at the baseline's radii",
    )["ws"]
    base_total = sum(base["per_trial_s"]) * a.trials / bt  # extrapolated when --baseline-trials < --trials
    ratio = base_total / pkg["wall_s"]
    ok = [p >= b * 0.99 for p, b in zip(pkg["ws"][:bt], base["ws"])]
    ok_fair = [p >= b * 0.99 for p, b in zip(fair, base["ws"])]
    print(
        f"\n== {name}: {map_}, d={d}, n={n}, {a.trials} trials, {search.chains_per_round} chains a round up to "
        f"{search.max_chains}, a fresh map per trial (baseline on {bt}) =="
    )
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
    pkg_per = pkg["wall_s"] / a.trials
    base_per = sum(base["per_trial_s"]) / bt
    scaled = "" if bt == a.trials else f", time scaled from {bt} of {a.trials} trials"
    print(
        f"trials share a map: no (a fresh map per trial, the same map and review on both sides); baseline: {bt} of "
        f"{a.trials} trials{scaled}"
    )
    print(
        f"package: {pkg['wall_s']:.2f} s for {a.trials} trials in one call = {pkg_per:.3f} s/trial, maps drawn "
        f"inside (steps max {max(pkg['steps'])}, |D|/r {min(pkg['delta_norm_over_radius']):.6f}-"
        f"{max(pkg['delta_norm_over_radius']):.6f})"
    )
    print(
        f"baseline: {base_per:.2f} s/trial (per-trial range {min(base['per_trial_s']):.1f}-"
        f"{max(base['per_trial_s']):.1f} s; building its dense float64 maps, not counted: "
        f"{base['setup_s'] / bt:.2f} s/trial) -> {ratio:.1f}x less wall time per trial"
    )
    print(f"peak RSS of the part (ru_maxrss): package {fmt_gib(pkg['peak_gib'])}, baseline {fmt_gib(base['peak_gib'])}")
    print(f"S_package >= 0.99 S_baseline, package at radius sqrt(d): {all(ok)} ({sum(ok)}/{len(ok)} trials)")
    print(
        f"S_package >= 0.99 S_baseline, package at each trial's realised baseline ||Delta||: {all(ok_fair)} "
        f"({sum(ok_fair)}/{bt}; min ratio {min(f / b for f, b in zip(fair, base['ws'])):.3f})"
    )
    return {
        "name": name,
        "pkg": pkg,
        "base": base,
        "fair": fair,
        "ratio": ratio,
        "cell": f"{name.removesuffix(' cell')}, d = {d}, n = {n}, {a.trials} trials, {search.chains_per_round} chains "
        f"a round up to {search.max_chains}, at most {search.max_steps} steps a chain",
        "pkg_per": pkg_per,
        "base_per": base_per,
        "baseline_trials": bt,
        "trials": a.trials,
        "ok": (sum(ok), len(ok)),
        "ok_fair": (sum(ok_fair), bt),
    }


def shipped_search(map_: str, config: Path | None = None) -> SearchSettings:
    """The search settings a shipped sweep runs `map_` with, every field filled.

    Those its config states (the `search:` block of `config`, default configs/ws/<map>.yaml), the rest the map family's
    defaults (docs/theory/search.md §4.3).
    """
    args = yaml.safe_load((config or WS_CONFIGS / f"{map_}.yaml").read_text())["model"]["init_args"]
    return every_field(SearchSettings(**(args.get("search") or {})), family_defaults(MAPS[map_]))


def every_field(settings: SearchSettings, family: SearchSettings | None = None) -> SearchSettings:
    """`settings` with every field given: the family's default or the generic one where it leaves one out.

    What the search runs on (`SearchSettings.resolved`), as settings a benchmark prints, changes and passes on.
    """
    return SearchSettings(**dataclasses.asdict(settings.resolved(family)))


def with_flags(settings: SearchSettings, a: argparse.Namespace) -> SearchSettings:
    """`settings` with the search settings given on the command line (--chains-per-round, --max-chains...)."""
    given = {f.name: getattr(a, f.name, None) for f in dataclasses.fields(SearchSettings)}
    return settings.replace(**{k: v for k, v in given.items() if v is not None})


def search_arg(settings: SearchSettings) -> list[str]:
    """A part's command-line argument carrying the whole settings (JSON)."""
    return ["--search", json.dumps(dataclasses.asdict(settings))]


# ----------------------------------------------------------------------------------------------------------------------
# The results page (ws_speed.md)
# ----------------------------------------------------------------------------------------------------------------------

PROTOCOL = (
    "The paper's protocol: a fresh random map per trial, one review per trial, the same maps and reviews on both "
    "sides. The package is one call of `word_sensitivity(FreshMaps(map, seeds), X, seed=[...])` for all trials, maps "
    "drawn inside the timed call. The baseline is a faithful per-trial re-implementation of the authors' procedure in "
    "torch (docs/theory/search.md §4.1: token 0, a noisy start, fixed-step projected gradient ascent, float64, "
    "dense weights, "
    "autograd through the full map), building its dense maps outside its clock. Peak memory: each part's own process "
    "(ru_maxrss)."
)


def cell_row(c: dict) -> str:
    """A compared cell as a row of the page's table."""
    bt, trials = c["baseline_trials"], c["trials"]
    scaled = "" if bt == trials else ", time scaled"
    peak = f"{fmt_gib(c['pkg']['peak_gib'])} / {fmt_gib(c['base']['peak_gib'])}"
    ok, fair = c["ok"], c["ok_fair"]
    return (
        f"| {c['cell']} | {c['pkg_per']:.3f} s/trial | {c['base_per']:.2f} s/trial ({bt} of {trials} trials{scaled}) "
        f"| **{c['ratio']:.1f}x** | {peak} | {ok[0]}/{ok[1]}, {fair[0]}/{fair[1]} |"
    )


def cells_floor(cells: list[dict], rates: Rates, threads: int) -> list[str]:
    """The package's side of each cell against the machine's floor, and where its time goes."""
    rows = [(c["name"], per_unit(c["pkg"]["flops"], c["trials"]), c["pkg_per"], threads) for c in cells]
    return floor_section(rows, rates, [(f"the package's {c['name']}", c["pkg"]["shares"]) for c in cells])


def step_lines(rows: list[dict]) -> list[str]:
    """The per-step table: RAF's cost of one step (value + gradient) against n."""
    lines = [
        "## RAF per-step cost against n (d = 384)",
        "",
        "| n | batched ms/chain | one chain ms | full forward-backward ms | full / batched |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        full, batched = r["full_ms_per_chain"], r["batched_ms_per_chain"]
        lines.append(f"| {r['n']} | {batched:.4f} | {r['one_ms_per_chain']:.4f} | {full:.4f} | {full / batched:.1f} |")
    return [*lines, ""]


def largest_lines(r: dict) -> list[str]:
    """RF at the paper's largest size: its S, wall time and peak memory."""
    peak = fmt_gib(max(r["peak_gib"], r["setup_peak_gib"] or 0))
    return [
        f"## RF at the paper's largest size (d = 768, n = 150, k = D = {r['k']:,})",
        "",
        f"V stored: {r['stored_V']}; S {[round(s, 4) for s in r['ws']]}; S sqrt(n) "
        f"{[round(s, 3) for s in r['ws_sqrt_n']]}; wall {r['wall_s']:.1f} s; peak RSS {peak}.",
        "",
    ]


def write_ws_page(folder: Path, measured: dict, data: str, a: argparse.Namespace, argv: list[str] | None) -> Path:
    """Write ws_speed.md: the header (wslight.records.pages), the protocol, and the measured tables."""
    body = [
        PROTOCOL,
        "",
        f"Data: {data}; {a.threads} torch thread(s) per part; seed {a.seed}.",
        "",
    ]
    if measured["cells"]:
        body += [
            "| cell | package | baseline | speed-up | peak RSS package / baseline | S_package >= 0.99 S_baseline "
            "(at sqrt(d), at the baseline's realised radius) |",
            "|---|---|---|---|---|---|",
            *map(cell_row, measured["cells"]),
            "",
        ]
    if measured["cells"]:
        body += cells_floor(measured["cells"], measured["rates"], a.threads)
    if "step" in measured:
        body += step_lines(measured["step"])
    if "largest" in measured:
        body += largest_lines(measured["largest"])
    command = command_line(__file__, argv)
    return write_page(folder / "ws_speed.md", "Word-sensitivity speed", PageHeader.collect(command), body)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=10, help="samples per cell (the package does them in one call)")
    p.add_argument("--baseline-trials", type=int, default=None, help="baseline samples (default: --trials)")
    shipped = "default: as configs/ws/<map>.yaml runs (the map family's search defaults)"
    p.add_argument("--chains-per-round", type=int, default=None, help=f"chains per round; {shipped}")
    p.add_argument("--max-chains", type=int, default=None, help=shipped)
    p.add_argument("--max-steps", type=int, default=None, help=f"steps per chain; {shipped}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--data",
        choices=["synthetic", "imdb"],
        default="imdb",
        help="imdb: the bundled reviews (MiniLM layer-0 token embeddings), the workload users run; synthetic: "
        "Gaussian rows, labelled as such in the output",
    )
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads in every part")
    p.add_argument("--skip", nargs="*", default=[], choices=["raf", "rf", "step"], help="parts to skip")
    p.add_argument("--largest", action="store_true", help="also RF at d=768, n=150, k=D (minutes)")
    p.add_argument("--largest-trials", type=int, default=2)
    p.add_argument("--step-n", type=int, nargs="+", default=[10, 20, 50, 100, 150, 200, 250])
    p.add_argument("--step-seconds", type=float, default=1.0, help="time spent timing each per-step case")
    p.add_argument("--pages", default="reports/bench", help="where the results page ws_speed.md goes")
    # internal: one part in this process
    p.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--map", default="raf", help=argparse.SUPPRESS)
    p.add_argument("--d", type=int, default=384, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=50, help=argparse.SUPPRESS)
    p.add_argument("--step-d", type=int, default=384, help=argparse.SUPPRESS)
    p.add_argument("--radii", type=float, nargs="*", default=[], help=argparse.SUPPRESS)
    p.add_argument("--search", type=lambda s: SearchSettings(**json.loads(s)), help=argparse.SUPPRESS)
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
        "--seed",
        str(a.seed),
        "--data",
        a.data,
        "--threads",
        str(a.threads),
    ]
    data = "bundled IMDb reviews (MiniLM layer 0)" if a.data == "imdb" else "SYNTHETIC Gaussian rows (not reviews)"
    print(f"torch {torch.__version__}, {a.threads} thread(s), data: {data}, seed={a.seed}")
    raf, rf = with_flags(shipped_search("raf"), a), with_flags(shipped_search("rf"), a)
    measured: dict = {"cells": [], "rates": Rates.measure(usable_cores())}
    if "raf" not in a.skip:
        measured["cells"].append(compare_cell("RAF cell", "raf", 384, 50, a, common, raf))
    if "rf" not in a.skip:
        measured["cells"].append(compare_cell("RF cell", "rf", 192, 90, a, common, rf))
    common = [*common, *search_arg(raf)]  # the per-step part and --largest: RAF's settings
    if "step" not in a.skip:
        argv_step = [*common, "--step-n", *map(str, a.step_n), "--step-seconds", str(a.step_seconds)]
        what = f"RAF per-step cost against n = {', '.join(map(str, a.step_n))}"
        rows = run_part(__file__, "step", argv_step, what)["rows"]
        chains = f"{a.trials} x {raf.chains_per_round}"
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
        measured["step"] = rows
    if a.largest:
        largest = [*common, "--largest-trials", str(a.largest_trials)]
        r = run_part(__file__, "largest", largest, "RF at the paper's largest size (d=768, n=150, k=D)")
        print(f"\n== RF at the paper's largest size: d=768, n=150, k=D={r['k']:,}, {a.largest_trials} trials ==")
        print(f"V stored: {r['stored_V']} (dense V would be {r['k'] ** 2 * 4 / 1e9:.0f} GB in float32)")
        print(f"S: {[round(s, 4) for s in r['ws']]}; S*sqrt(n): {[round(s, 3) for s in r['ws_sqrt_n']]}")
        print(f"||phi||^2/k: {[round(s, 4) for s in r['phi_norm_sq_over_k']]}; steps: {r['steps']}")
        print(
            f"wall {r['wall_s']:.1f} s, peak RSS {fmt_gib(max(r['peak_gib'], r['setup_peak_gib'] or 0))} "
            f"(target <= 24 GiB; during the estimate {fmt_gib(r['estimate_peak_gib'])})"
        )
        measured["largest"] = r
    page = write_ws_page(Path(a.pages), measured, data, a, argv)
    print(f"\nresults page: {page}")


if __name__ == "__main__":
    main()
