"""The GPU results pages in one command (`make gpu-results`), within a 10-minute job on a GPU machine.

Parts, one after the other, each in processes of its own (a process group), within one wall-clock budget (--budget,
570 s by default). Each part gets its share (SHARES) of the time left, in proportion to the shares of the parts not
run yet: a part that ends early leaves its seconds to the next ones, and parts that use their whole share get exactly
`budget * share`:
1. maps (30%): benchmarks/gpu_check.py without its GPU tests (`make gpu-check` runs those): word sensitivity of RAF
   and RF at d = 768, the Delta attack, DeepRF at the paper's width, GPU against the CPU of the same machine -> gpu.md;
2. words (30%): benchmarks/gpu_words.py: the encoder classifier's exact words at n = 128 over the whole vocabulary
   (20 reviews) with the screen's recall, then the encoder's continuous S -> gpu_words.md;
3. finetuned (40%): benchmarks/gpu_finetuned.py: a short fine-tuning of configs/finetune/imdb.yaml, then its
   robustness over 1,000 held-out reviews for each candidate set -> gpu_finetuned.md.

Each part stops itself MARGIN seconds before its share ends (its own --budget), keeping what finished; a part still
running when its share ends is sent SIGINT, killed GRACE seconds later, and its page then says it did not finish.
Writes the three pages (each with date, machine, commit and command) and the parts' records into --page, and copies
the pages, gpu_results.json (what ran) and gpu_results_records.tar.gz (records and logs) under $OUT when OUT is set:

    python -m benchmarks.gpu_results --page reports/gpu_results      # = make gpu-results (runs in reports/.../runs)
    python -m benchmarks.gpu_results --page /tmp/gr --smoke          # tiny sizes, any machine, about 7 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

from benchmarks.common import ROOT, Budget, command_line, page_header, stoppable

SHARES = {"maps": 0.30, "words": 0.30, "finetuned": 0.40}  # of the budget; they sum to 1
PAGES = {"maps": "gpu.md", "words": "gpu_words.md", "finetuned": "gpu_finetuned.md"}
TITLES = {
    "maps": "GPU",
    "words": "One word through the encoder on a GPU",
    "finetuned": "A fine-tuned classifier's robustness on a GPU",
}
WHAT = {
    "maps": "the maps at the paper's sizes, benchmarks/gpu_check.py",
    "words": "the encoder classifier's words at n = 128, benchmarks/gpu_words.py",
    "finetuned": "a fine-tuned classifier's robustness, benchmarks/gpu_finetuned.py",
}
BUDGET = 570.0  # a 10-minute GPU job, less the driver's start, its pages and a part's GRACE
SMOKE_BUDGET = 420.0  # --smoke on a 2-core CPU
MARGIN = 15.0  # seconds of a part's share it does not give its own budget: its stop and its page
GRACE = 15.0  # seconds a part sent SIGINT at the end of its share has to exit before it is killed
OUT_LIMIT = 16 * 1024**2  # the largest file a GPU job may return from $OUT


def shares_of(budget: float, parts: list[str]) -> dict[str, float]:
    """Each part's seconds when every part uses its whole share: the budget split in proportion to SHARES."""
    total = sum(SHARES[p] for p in parts)
    return {p: budget * SHARES[p] / total for p in parts}


def part_seconds(left: float, part: str, remaining: list[str]) -> float:
    """The seconds of `part` out of the `left` seconds of the budget, shared with the parts `remaining` (it too)."""
    return left * SHARES[part] / sum(SHARES[p] for p in remaining)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a bad value is refused naming it (exit status 2)."""
    p = argparse.ArgumentParser(prog="gpu_results", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--page", type=Path, default=ROOT / "reports" / "gpu_results", help="where the pages go")
    p.add_argument("--out", type=Path, default=None, help="the parts' working folder (default: <page>/runs)")
    p.add_argument("--budget", type=float, default=None, help=f"wall seconds of all parts (default {BUDGET:.0f})")
    p.add_argument("--parts", nargs="+", choices=list(SHARES), default=list(SHARES), help="the parts to run")
    p.add_argument("--commit", default=None, help="the commit of the tree, where it is a copy without its git folder")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: every part end to end on a CPU")
    p.add_argument("--train-reviews", type=int, default=None, help="finetuned: training reviews (default: config's)")
    p.add_argument("--reviews", type=int, default=1000, help="finetuned: held-out reviews per candidate set")
    p.add_argument("--positions", type=int, default=10, help="finetuned: positions per review")
    a = p.parse_args(argv)
    a.budget = (SMOKE_BUDGET if a.smoke else BUDGET) if a.budget is None else a.budget
    if not a.budget > 0:
        p.error(f"--budget {a.budget:g}: give the wall seconds of all parts, a positive number")
    for name in ("train_reviews", "reviews", "positions"):
        value = getattr(a, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} {value}: give a positive number")
    a.parts = [p for p in SHARES if p in a.parts]  # in their order, once each
    a.out = (a.page / "runs" if a.out is None else a.out).resolve()
    a.page = a.page.resolve()
    return a


def part_command(a: argparse.Namespace, part: str, seconds: float) -> list[str]:
    """The command of a part, its own budget MARGIN seconds short of its share."""
    inner = f"{max(1.0, seconds - MARGIN):.0f}"
    work = str(a.out / part)
    tail = (["--smoke"] if a.smoke else []) + (["--commit", a.commit] if a.commit else [])
    if part == "maps":
        return ["-m", "benchmarks.gpu_check", "--skip-tests", "--budget-s", inner, "--out", work] + (
            ["--cpu-smoke"] if a.smoke else []
        )
    command = ["-m", f"benchmarks.gpu_{part}", "--out", work, "--page", str(a.page), "--budget", inner, *tail]
    if part == "finetuned":
        command += ["--reviews", str(a.reviews), "--positions", str(a.positions)]
        command += ["--train-reviews", str(a.train_reviews)] if a.train_reviews else []
    return command


def run_part(a: argparse.Namespace, part: str, seconds: float) -> dict:
    """Run one part within `seconds` (its stale page removed first); how it ended."""
    (a.page / PAGES[part]).unlink(missing_ok=True)
    (a.out / part).mkdir(parents=True, exist_ok=True)
    (a.out / part / "gpu_check.json").unlink(missing_ok=True)
    command = part_command(a, part, seconds)
    print(f"gpu_results: {part}: {seconds:.0f} s: python {' '.join(command)}", flush=True)
    status, wall, output = stoppable([sys.executable, *command], a.out, seconds, f"{part}.log", GRACE, group=True)
    stopped = wall >= seconds
    print(f"gpu_results: {part}: exit {status} after {wall:.0f} s{' (stopped at its share)' if stopped else ''}")
    return {"part": part, "share_s": seconds, "wall_s": wall, "status": status, "stopped": stopped, "log": output}


def ended(run: dict) -> str:
    """How a part ended, in words."""
    if run["stopped"]:
        return f"was still running when its share ended, stopped after {run['wall_s']:.0f} s"
    return f"exited with status {run['status']} after {run['wall_s']:.0f} s"


def unfinished_page(run: dict, budget: float) -> list[str]:
    """The body of the page of a part that wrote none: what it was given, how it ended, the end of its log."""
    tail = [line for line in run["log"].replace("\r", "\n").splitlines() if line.strip()][-15:]
    return [
        f"**Did not finish.** This part of `make gpu-results` ({WHAT[run['part']]}) was given {run['share_s']:.0f} s "
        f"of the {budget:.0f} s budget; it {ended(run)}, before it wrote its page: no result of it is here.",
        "",
        "The last lines of its log:",
        "",
        "```",
        *tail,
        "```",
    ]


def maps_page(data: dict, run: dict) -> list[str]:
    """The body of gpu.md from what benchmarks/gpu_check.py wrote (gpu_check.json)."""
    from benchmarks.gpu_check import DEEP_RF_CONFIG, deep_rf_grid, deep_rf_table, parts_table

    env, args = data["environment"], argparse.Namespace(**data["args"])
    machine = f"torch {env['torch']}, Python {env['python']}"
    machine = f"{env['gpu_memory_gib']} GiB; {machine}, CUDA {env['cuda']}" if "cuda" in env else machine
    stopped = "; it was stopped before every part ran: the tables hold the parts that finished"
    return [
        "The maps at the paper's sizes: benchmarks/gpu_check.py without its GPU tests (`make gpu-check` runs those), "
        f"a part of `make gpu-results` given {run['share_s']:.0f} s.",
        "",
        f"**Where the numbers come from.** {env['device']} ({machine}) with {env['cpu_cores']} CPU cores on the same "
        f"machine ({env['torch_threads']} torch threads); the check ran in {data['total_s']:.0f} s"
        f"{stopped if data.get('stopped') else ''}.",
        "",
        "## GPU against the CPU cores of the same machine",
        "",
        "Tokens: synthetic Gaussian rows of norm sqrt(d); times include drawing the fresh maps; CPU times from fewer "
        "trials where the table says so, scaled per trial. A part the budget left no time for says so in its notes.",
        "",
        *parts_table(data["parts"]),
        "",
        "## DeepRF at the paper's width",
        "",
        f"The grid of `{DEEP_RF_CONFIG.relative_to(ROOT)}`: d = {deep_rf_grid(args)[0]}, width D = n d, weights drawn "
        f"on the device, {args.deep_rf_trials} trial(s) per cell, GPU only (draw s: the weights' draw; WS s: the "
        "search). The largest cell runs first, the others from the smallest while the budget lasts.",
        "",
        *deep_rf_table(data["deep_rf"]),
        "",
        "## What was verified where",
        "",
        "- One GPU: the run above; the GPU tests (`pytest -m gpu`, in `make gpu-check`) compare maps, word "
        "sensitivity, the attack, `fit` and `evaluate.py` on CUDA with the CPU within the tolerances they state.",
        "- torchrun: 2 processes on the CPU (gloo) give the records of 1 process (`tests/tasks/test_torchrun.py`); "
        "two nodes over loopback, torchrun and SLURM, likewise (`tests/app/test_multinode.py`).",
        "- Several GPUs: not tried yet.",
    ]


def finish_page(a: argparse.Namespace, run: dict, command: list[str]) -> Path:
    """The part's page: its own (words, finetuned), gpu.md from gpu_check.json (maps), or one saying it stopped."""
    path = a.page / PAGES[run["part"]]
    check = a.out / "maps" / "gpu_check.json"
    if run["part"] == "maps" and check.is_file():
        body = maps_page(json.loads(check.read_text()), run)
    elif run["part"] == "maps" or not path.is_file():
        body = unfinished_page(run, a.budget)
    else:
        return path
    from wslight.records.pages import write_page

    return write_page(path, TITLES[run["part"]], page_header(command, a.commit), body)


def copy_out(a: argparse.Namespace, runs: list[dict], out: Path) -> None:
    """The pages, gpu_results.json and the records with the logs (one archive) under `out` ($OUT)."""
    out.mkdir(parents=True, exist_ok=True)
    for run in runs:
        shutil.copyfile(a.page / PAGES[run["part"]], out / PAGES[run["part"]])
    summary = {"budget_s": a.budget, "smoke": a.smoke, "commit": a.commit}
    summary["parts"] = [{k: v for k, v in r.items() if k != "log"} for r in runs]
    (out / "gpu_results.json").write_text(json.dumps(summary, indent=1) + "\n")
    archive = out / "gpu_results_records.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in a.page.glob("*.jsonl"):  # the parts' records, beside their pages
            tar.add(path, arcname=path.name)
        for path in [*a.out.glob("*.log"), *a.out.glob("*/*.json"), *a.out.glob("*/*.log")]:  # what each part said
            tar.add(path, arcname=f"runs/{path.relative_to(a.out).as_posix()}")
    if archive.stat().st_size > OUT_LIMIT:  # none of it would come back then: say so instead
        archive.unlink()
        print(f"gpu_results: the records' archive is over {OUT_LIMIT // 1024**2} MiB: left in {a.page}", flush=True)


def main(argv: list[str] | None = None) -> int:
    a = arguments(argv)
    command = command_line(__file__, argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a GPU machine without network: the bundled models only
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the parts run as `python -m benchmarks.<name>` in the working folder: the checkout importable from there
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    a.page.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    from benchmarks.gpu_check import missing_requirements

    for missing in missing_requirements():
        print(f"gpu_results: {missing} (train.py and evaluate.py need it: the words and finetuned parts will fail)")
    budget = Budget(a.budget)
    planned = shares_of(a.budget, a.parts)
    print("gpu_results: " + ", ".join(f"{p} {s:.0f} s" for p, s in planned.items()) + f" of {a.budget:.0f} s")
    runs = []
    for i, part in enumerate(a.parts):
        runs.append(run_part(a, part, part_seconds(max(0.0, budget.left()), part, a.parts[i:])))
        finish_page(a, runs[-1], command)
    for run in runs:
        print((a.page / PAGES[run["part"]]).read_text(), flush=True)
    if os.environ.get("OUT"):
        copy_out(a, runs, Path(os.environ["OUT"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
