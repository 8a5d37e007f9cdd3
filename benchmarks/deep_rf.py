"""DeepRF word sensitivity: the closed form against the autograd path it replaced.

The closed form (hand-written backpropagation, the curvature product J^T J v, the exact top curvature from one Jacobian
pass, finished trials leaving the batch) and the autograd path, side by side on the same reviews and maps.

Both sides run `word_sensitivity(FreshMaps("deep_rf", seeds, depth=L), X, ...)` with the search settings the shipped
DeepRF config runs with (configs/ws/deep_rf.yaml: DeepRF's family defaults, one round of 4 chains) on `trials`
bundled reviews (IMDb token embeddings of the bundled MiniLM, rows of norm sqrt(d)), token 0, a fresh map per trial,
one thread. The autograd side hides the closed form (`value_and_grad`, `curvature_product`, `top_curvature`,
`select_trials`), so the search differentiates `change_sq` by autograd and takes the curvature start by power
iteration with double backward, as before. Each side runs in its own subprocess, so its peak memory (ru_maxrss) is
its own. Columns: seconds per trial (maps drawn inside the timed call), the ratio, peak memory, mean steps, and the
largest relative difference of S between the sides (the exact top curvature and float32 rounding of the gradient move
a chain's path a little; both are lower bounds of the same maximum).

    python -m benchmarks.deep_rf                         # d = 64, n = 50 and 80, L = 2, 4, 8
    python -m benchmarks.deep_rf --d 32 --n 50 --depths 2 --trials 4
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from benchmarks.common import module_name
from benchmarks.ws import map_seeds, samples, shipped_search, start_seeds
from wslight.features import FreshMaps
from wslight.features.deep_rf import DeepRFMove
from wslight.features.move import TokenMove
from wslight.search.sensitivity import word_sensitivity


def run_side(side: str, d: int, n: int, depth: int, trials: int, seed: int) -> dict:
    """One side's timed call; prints a JSON line (seconds per trial, S per trial, mean steps, peak memory)."""
    torch.set_num_threads(1)
    if side == "autograd":  # the path before the closed form: no value_and_grad, double-backward curvature
        del DeepRFMove.value_and_grad, DeepRFMove.curvature_product, DeepRFMove.top_curvature
        DeepRFMove.select_trials = TokenMove.select_trials  # type: ignore[method-assign,assignment]
    search = shipped_search("deep_rf")
    X = samples("imdb", trials, n, d, seed)[:, None].float()
    t0 = time.perf_counter()
    fm = FreshMaps("deep_rf", map_seeds(seed, trials), depth=depth)
    res = word_sensitivity(fm, X, search=search, seed=start_seeds(seed, trials))
    sec = (time.perf_counter() - t0) / trials
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    return {"sec": sec, "ws": res.ws.flatten().tolist(), "steps": res.steps.double().mean().item(), "peak_mib": peak}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--n", type=int, nargs="+", default=[50, 80])
    p.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--side", choices=["closed", "autograd"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.side:
        print(json.dumps(run_side(a.side, a.d, a.n[0], a.depths[0], a.trials, a.seed)))
        return
    print(f"torch {torch.__version__}, 1 thread, {a.trials} bundled reviews per row, a fresh map each, token 0\n")
    cols = ["d", "n", "L", "width", "autograd s/trial", "closed form s/trial", "ratio", "peak MiB (autograd / closed)"]
    cols += ["mean steps (autograd / closed)", "max |S diff| / S"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for n in a.n:
        for depth in a.depths:
            out = {}
            for side in ("autograd", "closed"):
                cmd = [sys.executable, "-m", module_name(__file__), "--side", side, "--d", str(a.d), "--n", str(n)]
                cmd += ["--depths", str(depth), "--trials", str(a.trials), "--seed", str(a.seed)]
                line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
                out[side] = json.loads(line)
            old, new = out["autograd"], out["closed"]
            diff = max(abs(x - y) / y for x, y in zip(new["ws"], old["ws"]))
            row = [a.d, n, depth, n * a.d, f"{old['sec']:.3f}", f"{new['sec']:.3f}", f"{old['sec'] / new['sec']:.1f}x"]
            row += [f"{old['peak_mib']:.0f} / {new['peak_mib']:.0f}", f"{old['steps']:.0f} / {new['steps']:.0f}"]
            row += [f"{diff:.1e}"]
            print("| " + " | ".join(str(c) for c in row) + " |", flush=True)


if __name__ == "__main__":
    main()
