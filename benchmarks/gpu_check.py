"""One-call GPU check (`make gpu-check`): the GPU tests, then a short GPU benchmark against the CPU of the same machine.

Parts, in the order they run (each one skipped, and listed as skipped, once the time budget is spent):
1. `pytest -m gpu tests/test_gpu.py` in a subprocess (its summary line goes into the table).
2. DeepRF at the paper's largest size (d = 768, n = 80, width D = 61,440, L = 8: 121 GB of float32 weights), drawn on
   the GPU (`make_map(..., device="cuda")`), one word-sensitivity estimate: GPU only (the CPU cannot hold it in time).
3. Word sensitivity of RAF at d = 768, n = 50 and n = 250, 10 trials (the paper's protocol: a fresh map and sample
   each, the trials batched with `FreshMaps`).
4. The Delta attack, RAF, d = 768, n = 120, N = 1300, re-trained head, loss err, trials batched with fresh maps.
5. Word sensitivity of RF at d = 768, n = 90, k = D = 69,120, 10 fresh maps drawn from the law of (z, V^(i))
   (docs/theory/maps.md §3.6: k x d numbers per trial instead of the 19 GB V).
6. The rest of the DeepRF grid of configs/paper/ws/deep_rf_h200.yaml (n in {50, 60, 70, 80}, L in {2, 4, 8}), GPU only.

The word-sensitivity parts search with the generic defaults (`wslight.search.GENERIC_DEFAULTS`: rounds of 4 chains up
to 64, 500 steps a chain, stop at < 0.01% over 20 steps; DeepRF: with what a `search:` block of its grid's file
changes), all chains of a sample in one batch, as the recorded GPU checks ran: not the family defaults a sweep runs.

GPU and CPU run the same calls on the same machine; the CPU side uses torch's default thread count (all cores) and
fewer trials (`--cpu-trials`), and its time is scaled per trial (the table says so). Times include drawing the fresh
maps, the search, the float64 recomputation and the records; DeepRF's weight draw is listed apart. Peak GPU memory is
torch.cuda.max_memory_allocated over the part. Tokens are synthetic: Gaussian rows rescaled to norm sqrt(d) (the
paper's input assumption; the GPU machine has no hub access for bert-base-uncased).

    python -m benchmarks.gpu_check                 # on a GPU machine; writes $OUT/gpu_check.md and .json if OUT is set
    python -m benchmarks.gpu_check --cpu-smoke     # tiny sizes on the CPU: the script end to end, no GPU needed
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from benchmarks.common import ROOT, Budget
from benchmarks.ws import every_field
from wslight.attack import delta_attack
from wslight.base.seeding import derive_seed, generator
from wslight.features import FreshMaps, make_map
from wslight.search import SearchSettings
from wslight.search.sensitivity import word_sensitivity

DEEP_RF_CONFIG = ROOT / "configs/paper/ws/deep_rf_h200.yaml"
GiB = 1024**3
# The search of every word-sensitivity part: the generic defaults, every chain of a sample in one batch.
SEARCH = every_field(SearchSettings(chunk_elements=2**31))


# ----------------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------------


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def clock(device: str) -> float:
    """A start time after the device's queued work is done."""
    sync(device)
    return time.perf_counter()


def since(device: str, start: float) -> float:
    """Seconds from `start` until the device's queued work is done."""
    sync(device)
    return time.perf_counter() - start


def reset_peak(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / GiB if device.startswith("cuda") else None


def tokens(B: int, n: int, d: int, seed: int, salt: str) -> torch.Tensor:
    """Synthetic tokens: Gaussian rows rescaled to norm sqrt(d), (B, n, d) float32 on the CPU."""
    X = torch.randn(B, n, d, generator=generator(seed, salt))
    return X / X.norm(dim=-1, keepdim=True) * d**0.5


def fmt(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


# ----------------------------------------------------------------------------------------------------------------------
# Parts
# ----------------------------------------------------------------------------------------------------------------------


def missing_requirements() -> list[str]:
    """The command-line extras this python lacks (a bare CUDA image may hold torch and Lightning without them).

    The `train.py` / `evaluate.py` tests need them and fail with ModuleNotFoundError otherwise.
    """
    from lightning.pytorch.cli import _JSONARGPARSE_SIGNATURES_AVAILABLE as signatures

    return [] if signatures else [str(signatures)]


def run_pytest(timeout: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py", "-p", "no:cacheprovider"]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        out, rc = out + f"\n(timed out after {timeout:.0f} s)", 124
    lines = [x for x in out.strip().splitlines() if x.strip()]
    summary = next((x for x in reversed(lines) if " passed" in x or " failed" in x or " error" in x), lines[-1:])
    failed = [x for x in lines if x.startswith(("FAILED", "ERROR"))]
    return {
        "rc": rc,
        "summary": str(summary).strip("= "),
        "failed": failed + [f"missing: {m}" for m in missing_requirements()],
        "seconds": time.perf_counter() - t,
        "log": out,
    }


def timed_row(row: dict, gpu_s: float, cpu_s: float, cpu_trials: int, peak: float | None, note: str) -> dict:
    """A part's table row: GPU and CPU seconds for all its trials, their ratio, the GPU's peak memory and a note.

    The CPU's seconds are extrapolated from `cpu_trials`.
    """
    return {
        **row,
        "gpu_s": gpu_s,
        "cpu_s": cpu_s,
        "cpu_trials": cpu_trials,
        "ratio": cpu_s / gpu_s,
        "peak_gib": peak,
        "note": note,
        "status": "ok",
    }


def ws_trials(name: str, n: int, d: int, trials: int, device: str, seed: int) -> tuple[float, list[float]]:
    """`trials` independent trials (a fresh map and sample each, the paper's protocol) searched together on `device`.

    `FreshMaps`: RF drawn from the law of (z, V^(i)), attention maps built. Returns (seconds including the draws, S).
    """
    seeds = [derive_seed(seed, "gpu_check.map", name, n, t) for t in range(trials)]
    X = torch.stack([tokens(1, n, d, seed, f"gpu_check.ws.{n}.{t}") for t in range(trials)]).to(device)
    start = clock(device)
    res = word_sensitivity(FreshMaps(name, seeds, device=device), X, "first", SEARCH, seed=list(range(trials)))
    return since(device, start), res.ws[:, 0].tolist()


def part_ws_raf(args, budget: Budget, gpu: str) -> list[dict]:
    rows = []
    for n in args.raf_n:
        row = {"part": f"word sensitivity, RAF, d={args.d}, n={n}", "trials": args.trials}
        if not budget.allows(20):
            rows.append({**row, "status": "skipped (time budget)"})
            continue
        reset_peak(gpu)
        for dev in {gpu, "cpu"}:
            ws_trials("raf", 4, args.d, 1, dev, args.seed)  # warm-up (kernels, handles, thread pools)
        reset_peak(gpu)
        g_s, g_ws = ws_trials("raf", n, args.d, args.trials, gpu, args.seed)
        peak = peak_gib(gpu)
        k = min(args.cpu_trials, args.trials)
        c_s, c_ws = ws_trials("raf", n, args.d, k, "cpu", args.seed)
        c_all = c_s * args.trials / k
        diff = max(abs(a - b) / abs(b) for a, b in zip(g_ws[:k], c_ws))
        rows.append(
            timed_row(
                row,
                g_s,
                c_all,
                k,
                peak,
                f"max rel. diff of S, CPU vs GPU: {diff:.1e}; mean S {sum(g_ws) / len(g_ws):.4g}",
            )
        )
    return rows


def part_attack(args, budget: Budget, gpu: str) -> list[dict]:
    n, d, N = args.attack_n, args.d, args.attack_N
    row = {"part": f"Delta attack, RAF, d={d}, n={n}, N={N}, retrain, err", "trials": args.attack_trials}
    if not budget.allows(40):
        return [{**row, "status": "skipped (time budget)"}]

    def run(device: str, trials: int) -> tuple[float, list[float]]:
        """`trials` trials with their own training sets and fresh maps, attacked together on `device`."""
        seeds = [derive_seed(args.seed, "gpu_check.attack.map", t) for t in range(trials)]
        X = torch.stack([tokens(N + 1, n, d, args.seed, f"gpu_check.attack.{t}") for t in range(trials)])
        draw = lambda t: torch.randint(0, 2, (N + 1,), generator=generator(args.seed, "gpu_check.attack.y", t))  # noqa: E731
        labels = [draw(t) for t in range(trials)]
        y = torch.stack(labels).double() * 2 - 1
        X, y = X.to(device), y.to(device)
        start = clock(device)
        out = delta_attack(
            FreshMaps("raf", seeds, device=device),
            X[:, 1:],
            y[:, 1:],
            X[:, :1],
            y[:, :1],
            training="retrain",
            loss="err",
            seed=list(range(trials)),
        )
        return since(device, start), out["err"][:, 0].tolist()

    reset_peak(gpu)
    g_s, g_err = run(gpu, args.attack_trials)
    peak = peak_gib(gpu)
    k = min(args.cpu_trials, args.attack_trials, 1)
    c_s, c_err = run("cpu", k)
    c_all = c_s * args.attack_trials / k
    return [timed_row(row, g_s, c_all, k, peak, f"err GPU {g_err[0]:.3g} / CPU {c_err[0]:.3g} (trial 0)")]


def part_ws_rf(args, budget: Budget, gpu: str) -> list[dict]:
    n, d = args.rf_n, args.d
    row = {"part": f"word sensitivity, RF, d={d}, n={n}, k=D={n * d}", "trials": args.trials}
    if not budget.allows(60):
        return [{**row, "status": "skipped (time budget)"}]
    try:
        reset_peak(gpu)
        g_s, g_ws = ws_trials("rf", n, d, args.trials, gpu, args.seed)
        peak = peak_gib(gpu)
        k = min(args.cpu_trials, args.trials, 1)
        c_s, c_ws = ws_trials("rf", n, d, k, "cpu", args.seed)
        c_all = c_s * args.trials / k
        return [
            timed_row(
                row,
                g_s,
                c_all,
                k,
                peak,
                f"fresh maps from the law of (z, V^(i)): k x d per trial instead of V's "
                f"{(n * d) ** 2 * 4 / 1e9:.0f} GB; S GPU {g_ws[0]:.4g} / CPU {c_ws[0]:.4g} (trial 0)",
            )
        ]
    except Exception as e:  # report and go on: the other parts still count
        return [{**row, "status": f"failed: {type(e).__name__}: {str(e)[:200]}"}]
    finally:
        reset_peak(gpu)


def deep_rf_grid(args) -> tuple[int, list[int], list[int], SearchSettings]:
    """The DeepRF grid of DEEP_RF_CONFIG (d, n values, depths) and its search.

    SEARCH with what the file's own `search:` block changes (--cpu-smoke: tiny sizes, 40 steps).
    """
    cfg = yaml.safe_load(DEEP_RF_CONFIG.read_text())["model"]["init_args"]
    search = SEARCH.replace(**(cfg.get("search") or {}))
    if args.cpu_smoke:
        return 8, [3, 4], [2, 3], search.replace(max_steps=40)
    grid = cfg["grid"]  # the sweep's grid: block
    return grid["d_values"][0], list(grid["n_values"]), list(grid["depths"]), search


def deep_rf_cell(n: int, L: int, d: int, trials: int, search: SearchSettings, gpu: str, seed: int) -> dict:
    width = n * d
    cell = {"n": n, "L": L, "width": width, "weights_gb": L * width * width * 4 / 1e9}
    reset_peak(gpu)
    try:
        start = clock(gpu)
        fmap = make_map("deep_rf", n, d, seed=derive_seed(seed, "gpu_check.deep_rf", n, L), depth=L, device=gpu)
        draw_s = since(gpu, start)
        X = tokens(trials, n, d, seed, f"gpu_check.deep_rf.{n}").to(gpu)
        start = clock(gpu)
        res = word_sensitivity(fmap, X, "first", search, seed=0)
        ws_s = since(gpu, start)
        fmap = None
        cell.update(
            draw_s=draw_s,
            ws_s=ws_s,
            ws=float(res.ws.mean()),
            steps=int(res.steps.max()),
            peak_gib=peak_gib(gpu),
            status="ok",
        )
    except torch.cuda.OutOfMemoryError as e:
        cell.update(status=f"out of memory: {str(e)[:120]}")
    except Exception as e:
        cell.update(status=f"failed: {type(e).__name__}: {str(e)[:200]}")
    finally:
        reset_peak(gpu)
    return cell


def part_deep_rf(args, budget: Budget, gpu: str, cells: list[tuple[int, int]], done: list[dict]) -> list[dict]:
    """Run `cells` while the budget allows; a cell's time is estimated from the finished ones (time per weight byte)."""
    d, _, _, search = deep_rf_grid(args)
    out = []
    for n, L in cells:
        gb = L * (n * d) ** 2 * 4 / 1e9
        rates = [(c["draw_s"] + c["ws_s"]) / c["weights_gb"] for c in done + out if c.get("status") == "ok"]
        estimate = 1.25 * max(rates) * gb if rates else 30.0
        if not budget.allows(estimate + args.reserve_s):
            out.append(
                {
                    "n": n,
                    "L": L,
                    "width": n * d,
                    "weights_gb": gb,
                    "status": f"skipped (time budget: ~{estimate:.0f} s needed, {budget.left():.0f} s left)",
                }
            )
            continue
        out.append(deep_rf_cell(n, L, d, args.deep_rf_trials, search, gpu, args.seed))
    return out


def run_parts(args, budget: Budget, gpu: str, rows: list[dict], deep: list[dict]) -> None:
    """The benchmark's parts in order, each one's rows appended to `rows` or `deep` as it ends (a stop keeps them).

    The largest DeepRF cell first, then RAF, the attack and RF, then the rest of the DeepRF grid, smallest first.
    """
    d, n_values, depths, _ = deep_rf_grid(args)
    largest = (max(n_values), max(depths))
    deep += part_deep_rf(args, budget, gpu, [largest], [])
    print(f"gpu_check: DeepRF n={largest[0]} L={largest[1]}: {deep[0]['status']}", flush=True)
    rows += part_ws_raf(args, budget, gpu)
    rows += part_attack(args, budget, gpu)
    rows += part_ws_rf(args, budget, gpu)
    print("gpu_check: RAF, attack and RF parts done", flush=True)
    rest = sorted(((n, L) for n in n_values for L in depths if (n, L) != largest), key=lambda c: c[1] * c[0] ** 2)
    for cell in rest:  # one at a time: each cell's time is estimated from those before it
        deep += part_deep_rf(args, budget, gpu, [cell], deep)


# ----------------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------------


def environment(gpu: str) -> dict:
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if gpu.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        env.update(
            device=p.name,
            gpu_memory_gib=round(p.total_memory / GiB, 1),
            cuda=torch.version.cuda,
            multiprocessors=p.multi_processor_count,
        )
    else:
        env.update(device="cpu (smoke run: the 'GPU' column is the CPU)")
    return env


def parts_table(rows: list[dict]) -> list[str]:
    """The markdown table of the GPU-against-CPU parts (a part skipped or failed: its status in the notes)."""
    lines = ["| part | trials | GPU s | CPU s | ratio CPU/GPU | peak GPU GiB | notes |", "|" + "---|" * 7]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['part']} | {r.get('trials', '-')} | - | - | - | - | {r['status']} |")
            continue
        cpu = f"{r['cpu_s']:.3g}" + (f" (from {r['cpu_trials']}, scaled)" if r["cpu_trials"] != r["trials"] else "")
        lines.append(
            f"| {r['part']} | {r['trials']} | {r['gpu_s']:.3g} | {cpu} | {r['ratio']:.1f}x | "
            f"{fmt(r['peak_gib'])} | {r['note']} |"
        )
    return lines


def deep_rf_table(deep: list[dict]) -> list[str]:
    """The markdown table of the DeepRF cells, by depth then n."""
    lines = [
        "| n | L | width | weights GB | draw s | WS s | S | steps | peak GPU GiB | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(deep, key=lambda c: (c["L"], c["n"])):
        lines.append(
            f"| {c['n']} | {c['L']} | {c['width']} | {c['weights_gb']:.1f} | {fmt(c.get('draw_s'))} | "
            f"{fmt(c.get('ws_s'))} | {fmt(c.get('ws'), 4)} | {fmt(c.get('steps'))} | "
            f"{fmt(c.get('peak_gib'))} | {c['status']} |"
        )
    return lines


def render(env: dict, tests: dict | None, rows: list[dict], deep: list[dict], args, total_s: float) -> str:
    lines = [f"## make gpu-check on {env['device']}", ""]
    lines.append(
        f"torch {env['torch']}, Python {env['python']}"
        + (f", CUDA {env['cuda']}, {env['gpu_memory_gib']} GiB" if "cuda" in env else "")
        + f"; CPU side: {env['cpu_cores']} cores, {env['torch_threads']} torch threads; total {total_s:.0f} s."
    )
    lines.append("")
    if tests is not None:
        rc = tests["rc"]
        lines.append(f"GPU tests (`pytest -m gpu`): {tests['summary']} in {tests['seconds']:.0f} s (exit {rc})")
        lines += [f"- {x}" for x in tests["failed"][:20]]
        lines.append("")
    lines += parts_table(rows)
    grid = DEEP_RF_CONFIG.relative_to(ROOT)
    lines += [
        "",
        f"DeepRF at the paper's width (d = {deep_rf_grid(args)[0]}, width D = n d, weights drawn on the "
        f"device, {args.deep_rf_trials} trial(s) per cell, GPU only; grid of {grid}):",
        "",
        *deep_rf_table(deep),
    ]
    lines += [
        "",
        "Tokens: synthetic Gaussian rows of norm sqrt(d). CPU times cover fewer trials where the column says "
        "so and are scaled per trial. Times include drawing the fresh maps (DeepRF: its draw is listed apart).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU (no GPU): the script end to end")
    p.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget of the whole check")
    p.add_argument("--reserve-s", type=float, default=10.0, help="time kept for the report at the end")
    p.add_argument("--pytest-timeout-s", type=float, default=180.0)
    p.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu")
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--raf-n", type=int, nargs="+", default=[50, 250])
    p.add_argument("--rf-n", type=int, default=90)
    p.add_argument("--attack-n", type=int, default=120)
    p.add_argument("--attack-N", type=int, default=1300)
    p.add_argument("--trials", type=int, default=10, help="GPU trials of the word-sensitivity parts")
    p.add_argument("--attack-trials", type=int, default=3)
    p.add_argument("--cpu-trials", type=int, default=2, help="CPU trials (time scaled to the GPU's trial count)")
    p.add_argument("--deep-rf-trials", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu_check.md/.json (default: $OUT)")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.d, args.raf_n, args.rf_n, args.attack_n, args.attack_N = 16, [4, 8], 5, 6, 30
        args.trials, args.attack_trials, args.skip_tests = 3, 2, True
        gpu = "cpu"
    else:
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device (use --cpu-smoke to run the script on the CPU)", file=sys.stderr)
            return 2
        gpu = "cuda"
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 as float32 on both sides
    budget = Budget(args.budget_s)
    env = environment(gpu)
    print(f"gpu_check: {env}", flush=True)

    tests = None
    for missing in missing_requirements():
        print(f"gpu_check: {missing} (the command-line tests will fail)", flush=True)
    if not args.skip_tests:
        tests = run_pytest(min(args.pytest_timeout_s, max(10.0, budget.left() - 120)))
        print(f"gpu_check: tests: {tests['summary']} ({tests['seconds']:.0f} s)", flush=True)

    rows: list[dict] = []
    deep: list[dict] = []
    stopped = False
    try:
        run_parts(args, budget, gpu, rows, deep)
    except KeyboardInterrupt:  # Ctrl-C (or a driver's SIGINT at its budget): report the parts that finished
        stopped = True
        print("gpu_check: stopped (SIGINT); the parts that finished are reported", flush=True)

    total = time.perf_counter() - budget.start
    report = render(env, tests, rows, deep, args, total)
    if stopped:
        report += "\nStopped (SIGINT) before every part ran: the tables hold the parts that finished.\n"
    print(report, flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.md").write_text(report)
        data = {
            "environment": env,
            "tests": None if tests is None else {k: v for k, v in tests.items() if k != "log"},
            "parts": rows,
            "deep_rf": deep,
            "total_s": total,
            "stopped": stopped,
            "args": vars(args),
        }
        (out / "gpu_check.json").write_text(json.dumps(data, indent=1, default=str))
        if tests is not None:
            (out / "pytest_gpu.log").write_text(tests["log"])
    return 0 if tests is None or tests["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
