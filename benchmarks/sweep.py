"""The word-sensitivity sweep as a user runs it, side by side with the bare call it makes and with the authors' loop.

One cell of a shipped sweep config (default configs/ws/raf.yaml at d = 384, n = 50, 10 trials, a fresh map each), its
trials computed three ways on the same reviews, maps and seeds:

- bare: one call of `word_sensitivity(FreshMaps(map, seeds), X, ...)` for the cell's trials, as benchmarks/ws.py makes
  it (maps drawn inside the timed call, after a warm-up call on other data), on the sweep's own trials: its samples
  (`sample_index`), map seeds, restart seeds, radius and search settings.
- sweep: `evaluate.py --config configs/ws/<map>.yaml` overridden to that cell, `--trainer.devices 1`, in a fresh
  interpreter, its progress bar on: the records' `seconds` (each trial's share of its step), the wall time of the test
  run (from the callbacks' `setup` to `on_test_end`: the results file's checks, the steps with the opening of the
  embeddings, the summary and the figures) and of the whole command (the interpreter's start and imports included).
- the authors' loop: benchmarks/ws.py's faithful re-implementation of their procedure (one trial at a time, dense
  float64 map, autograd through the full map) on the first --baseline-trials trials, its dense maps built off its clock.

The bare call and the sweep alternate --repeats times (each in its own process, one torch thread); the table takes
each side's median. The records' `ws` must equal the bare call's values bit for bit: the benchmark stops otherwise.

    python -m benchmarks.sweep                       # RAF, d = 384, n = 50, 10 trials, 3 repeats, 3 baseline trials
    python -m benchmarks.sweep --map rf --d 192 --n 90 --baseline-trials 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml
from lightning.pytorch.callbacks import Callback

from benchmarks import ws as bench_ws  # the warm-up and the authors' loop
from benchmarks.common import ROOT
from benchmarks.common import run_part as run_module_part
from wslight.base.seeding import derive_seed, generator
from wslight.features import FreshMaps
from wslight.search.sensitivity import word_sensitivity


class LoopClock(Callback):
    """Writes the test run's phases (seconds) to the file named by WSLIGHT_LOOP_CLOCK.

    before: setup to the first step (the results file's checks, the run folder's lock); steps: the first step's start
    to the last one's end (opening the embeddings in the first, the search, the records, the progress bar); after: to
    on_test_end (the summary, the figures).
    """

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.times = {"setup": time.perf_counter()}  # before test_dataloader

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.times.setdefault("first", time.perf_counter())

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.times["last"] = time.perf_counter()

    def on_test_end(self, trainer, pl_module) -> None:
        t = {**self.times, "end": time.perf_counter()}
        phases = {"before": t["first"] - t["setup"], "steps": t["last"] - t["first"], "after": t["end"] - t["last"]}
        Path(os.environ["WSLIGHT_LOOP_CLOCK"]).write_text(json.dumps({"loop_s": t["end"] - t["setup"], **phases}))


def sweep_of(a) -> object:
    """The cell's WordSensitivitySweep, built from the config's model block (for its trials' inputs)."""
    from wslight.chains.settings import SearchSettings
    from wslight.data import EmbeddingSpec, load_token_embeddings
    from wslight.tasks import GridSettings, WordSensitivitySweep

    args = dict(yaml.safe_load(Path(a.config).read_text())["model"]["init_args"])
    args["grid"] = GridSettings(**{**args["grid"], "d_values": [a.d], "n_values": [a.n], "trials": a.trials})
    args["embeddings"] = EmbeddingSpec(**args.get("embeddings", {}))
    args["search"] = SearchSettings(**args["search"]) if args.get("search") else None
    sweep = WordSensitivitySweep(**args)
    sweep._store = load_token_embeddings(sweep.embeddings, progress=False)
    return sweep


def trial_inputs(a) -> tuple[object, torch.Tensor, list[int]]:
    """The sweep, its trials' X (T, n, d) (float32, rows of norm sqrt(d)) and map seeds, as its step draws them."""
    sweep = sweep_of(a)
    index = [sweep.sample_index(t) for t in range(a.trials)]
    X, _ = sweep.store.samples(index, a.n, a.d)
    seeds = [sweep.map_seed(a.map, a.d, a.n, 1, t) for t in range(a.trials)]
    return sweep, X, seeds


def part_bare(a) -> dict:
    sweep, X, seeds = trial_inputs(a)
    bench_ws.warm_up(a.map)
    restarts = [derive_seed(s, "ws.restarts") for s in seeds]
    t0 = time.perf_counter()
    fm = FreshMaps(a.map, seeds, depth=1, width_ratio=sweep.grid.rf_width_ratio, dtype=sweep.map_dtype)
    res = word_sensitivity(fm, X[:, None], sweep.positions, sweep.search, restarts, radius=sweep.radius(a.d))
    wall = time.perf_counter() - t0
    return {"ws": res.ws[:, 0].tolist(), "wall_s": wall}


def part_sweep(a) -> dict:
    from wslight.app.verbs import run_verb

    folder = tempfile.mkdtemp(prefix="bench_sweep_")
    clock = Path(folder) / "loop_clock.json"
    os.environ["WSLIGHT_LOOP_CLOCK"] = str(clock)
    args = [
        "--config",
        a.config,
        "--model.init_args.grid.d_values",
        f"[{a.d}]",
        "--model.init_args.grid.n_values",
        f"[{a.n}]",
        "--model.init_args.grid.trials",
        str(a.trials),
        "--trainer.devices",
        "1",
        "--trainer.logger.init_args.save_dir",
        folder,
        "--trainer.callbacks+=__main__.LoopClock",
    ]
    status = run_verb("evaluate", args, prog="evaluate.py")
    if status:
        raise SystemExit(f"evaluate.py exited {status}")
    path = next(Path(folder).rglob("results.jsonl"))
    records = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["trial"])
    loop = json.loads(clock.read_text())
    shutil.rmtree(folder)
    return {"ws": [r["ws"] for r in records], "seconds": [r["seconds"] for r in records], **loop}


def part_baseline(a) -> dict:
    _, X, seeds = trial_inputs(a)
    X = X.double()
    lr, steps = (100.0, 300) if a.map == "rf" else (10.0, 50 * a.n)
    per_trial, ws = [], []
    for t in range(a.baseline_trials):
        phi = bench_ws.dense_phi(a.map, a.n, a.d, seeds[t], X[t])  # its dense float64 map, off the clock
        t0 = time.perf_counter()
        S, _ = bench_ws.baseline_ws(phi, X[t], lr, steps, generator(a.seed, "bench.ws.baseline", t))
        per_trial.append(time.perf_counter() - t0)
        ws.append(S)
    return {"ws": ws, "per_trial_s": per_trial}


PARTS = {"bare": part_bare, "sweep": part_sweep, "baseline": part_baseline}


def run_part(part: str, argv: list[str], checkout: str | None = None) -> dict:
    """Run one part in a fresh interpreter (one torch thread); its JSON result and its wall time (`process_s`).

    With `checkout`, the part imports wslight from that folder (another commit's package, for an A/B of the sweep):
    it runs there, with that folder first on its path and this repository after it for the benchmarks (a checkout
    whose benchmarks/ is a package runs its own).
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cwd = ROOT
    if checkout:
        cwd = Path(checkout).resolve()
        env["PYTHONPATH"] = f"{cwd}{os.pathsep}{ROOT}"
    return run_module_part(__file__, part, argv, env=env, cwd=cwd)


def sweep_rows(name: str, runs: list[dict], T: int) -> list[tuple[str, float]]:
    """Per-trial medians of a sweep's runs: its records, its test run and that run's phases, the whole command."""
    med = lambda key: statistics.median(r[key] / T for r in runs)  # noqa: E731
    return [
        (f"{name}: records' seconds", statistics.median(sum(r["seconds"]) / T for r in runs)),
        (f"{name}: test run wall", med("loop_s")),
        ("  before the steps", med("before")),
        ("  the steps", med("steps")),
        ("  after (summary, figures)", med("after")),
        (f"{name}: whole command wall", med("process_s")),
    ]


def print_table(rows: list[tuple[str, float]], bare_s: float, base_s: float | None) -> None:
    """The table: s/trial, the ratio to the bare call, the authors' loop's time over it."""
    print(f"\n{'':36} {'s/trial':>9} {'/ bare':>7} {'authors / it':>13}")
    for name, s in rows:
        speed = f"{base_s / s:12.1f}x" if base_s and not name.startswith("  ") else f"{'':>13}"
        print(f"{name:36} {s:9.4f} {s / bare_s:7.2f} {speed}")
    if base_s:
        print(f"{'the authors loop':36} {base_s:9.4f} {base_s / bare_s:7.1f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--map", default="raf", help="the map (its shipped config configs/ws/<map>.yaml)")
    p.add_argument("--config", default=None, help="the sweep config (default configs/ws/<map>.yaml)")
    p.add_argument("--d", type=int, default=384)
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3, help="bare call and sweep, alternating")
    p.add_argument("--baseline-trials", type=int, default=3, help="the authors' loop on the first trials (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkout", help="also the sweep with the package of this folder (e.g. a clone of another commit)")
    p.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.config = str(Path(a.config or bench_ws.WS_CONFIGS / f"{a.map}.yaml").resolve())
    torch.set_num_threads(1)
    if a.part:
        Path(a.out).write_text(json.dumps(PARTS[a.part](a)))
        return

    T = a.trials
    cell = ["--map", a.map, "--config", a.config, "--d", str(a.d), "--n", str(a.n), "--trials", str(T)]
    cell += ["--baseline-trials", str(a.baseline_trials), "--seed", str(a.seed)]
    print(f"torch {torch.__version__}, 1 thread; {a.config} at d = {a.d}, n = {a.n}, {T} trials")
    sides: dict[str, list[dict]] = {"bare": [], "sweep": [], "reference": []}
    for r in range(a.repeats):
        runs = [("bare", None), ("sweep", None)] + ([("reference", a.checkout)] if a.checkout else [])
        for side, checkout in runs:
            sides[side].append(run_part("bare" if side == "bare" else "sweep", cell, checkout))
        line = f"repeat {r}: bare {sides['bare'][-1]['wall_s'] / T:.4f} s/trial"
        for side in ("sweep", "reference")[: len(runs) - 1]:
            run = sides[side][-1]
            same = run["ws"] == sides["bare"][-1]["ws"]
            line += f"; {side}: records {sum(run['seconds']) / T:.4f} s/trial, test run {run['loop_s']:.2f} s"
            line += f", command {run['process_s']:.2f} s, ws equal to the bare call's: {same}"
            if not same:
                raise SystemExit(
                    f"{side}: the records' ws {run['ws']} differ from the bare call's {sides['bare'][-1]['ws']}"
                )
        print(line)
    bare_s = statistics.median(b["wall_s"] / T for b in sides["bare"])
    rows = [("bare call", bare_s), *sweep_rows("sweep", sides["sweep"], T)]
    if a.checkout:
        rows += sweep_rows(f"sweep of {a.checkout}", sides["reference"], T)
    base_s = None
    if a.baseline_trials:
        base = run_part("baseline", cell)
        base_s = statistics.mean(base["per_trial_s"])
        print(f"the authors' loop: {a.baseline_trials} trials, S {[round(s, 4) for s in base['ws']]}")
    print_table(rows, bare_s, base_s)
    print(f"(medians of {a.repeats} alternating repeats; the authors' loop on {a.baseline_trials} of {T} trials)")


if __name__ == "__main__":
    main()
