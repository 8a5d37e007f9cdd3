"""A fine-tuned classifier's robustness on a GPU machine: a short fine-tuning, then its words on 1,000 held-out reviews.

Runs, each as a user types it (train.py, then evaluate.py), within one wall-clock budget (--budget):
1. `train.py fit --config configs/finetune/imdb.yaml`: the shipped config (the bundled MiniLM fine-tuned end to end,
   128 tokens, one epoch; --train-reviews: fewer training reviews, a shorter epoch), stopped by Lightning's own timer
   (`--trainer.max_time`) once --fit-share of the budget is spent: it then validates, restores the best checkpoint,
   tests it on the 2,500 held-out reviews and exports it, as a fit that ends on its own does;
2. `evaluate.py --config configs/words/classifier.yaml` on that classifier over --reviews held-out reviews (1,000),
   --positions positions each, for each candidate set of `make finetuned` in turn (the k = 10 and k = 50 nearest
   words, the whole vocabulary screened to 32 words): each set gets the time left split evenly among the sets not
   run yet, and is stopped there (Ctrl-C: its finished reviews kept); the page counts the reviews that finished.

Writes gpu_finetuned.md (with date, machine, commit and command) and each set's records into --page:

    python -m benchmarks.gpu_finetuned --out reports/gpu_results/runs/finetuned --page reports/gpu_results
    python -m benchmarks.gpu_finetuned --out /tmp/gf --page /tmp/gf --smoke      # tiny sizes, any machine
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.common import ROOT, Budget, fit_result, page_arguments, page_header, stoppable
from benchmarks.finetuned_classifier import CANDIDATE_SETS
from benchmarks.gpu_words import ended, evaluate_until, keep
from wslight.records.classifier_words import classifier_table
from wslight.records.pages import write_page

FINETUNE = "configs/finetune/imdb.yaml"
WORDS = "configs/words/classifier.yaml"
SETS = CANDIDATE_SETS  # those of `make finetuned`, in the order they run there
FIT_OVERHEAD = 45  # seconds of the fit's share outside its training loop: the start, the last validation, test, export
FIT_GRACE = 30  # seconds a fit stopped by Ctrl-C (its timer having failed to stop it) may take to exit
MIN_SET = 20  # a candidate set with fewer seconds left is not started (evaluate.py's start alone takes seconds)
RESERVE = 10  # seconds kept for the page
# Smoke: a fit of a few batches on 32 tokens, 24 held-out reviews, one process
SMOKE_FIT = [
    *("--data.init_args.train_size", "32", "--data.init_args.val_size", "16", "--data.init_args.test_size", "24"),
    *("--data.init_args.max_length", "32", "--data.init_args.batch_size", "8"),
]


def max_time(seconds: float) -> str:
    """Lightning's `trainer.max_time` of `seconds` (at least 1): `DD:HH:MM:SS`."""
    s = max(1, int(seconds))
    return f"{s // 86400:02d}:{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def fine_tune(a: argparse.Namespace, seconds: float) -> tuple[str | None, str]:
    """The shipped fine-tuning, stopped by its timer within `seconds`: its log folder (None: none) and a sentence."""
    extra = ["--trainer.max_time", max_time(seconds - FIT_OVERHEAD)]
    extra += ["--data.init_args.train_size", str(a.train_reviews)] if a.train_reviews else []
    extra += SMOKE_FIT if a.smoke else []
    command = [sys.executable, str(ROOT / "train.py"), "fit", "--config", FINETUNE, *extra]
    status, wall, output = stoppable(command, a.out, seconds, log="fit.log", grace=FIT_GRACE)
    found = fit_result(output) if status == 0 else None
    typed = f"`train.py fit --config {FINETUNE} {' '.join(extra)}`"
    if found is None:
        print(output[-3000:], file=sys.stderr)
        last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "")
        return None, (
            f"The fine-tuning, {typed}, did not finish within its share of {seconds:.0f} s (exit {status} after "
            f"{wall:.0f} s; its last line: `{last[:200]}`): no classifier, so no candidate set ran."
        )
    logs, acc = found
    timer = "stopped by its timer before its epoch ended" if "Time limit reached" in output else "its whole epoch ran"
    return logs, (
        f"The classifier: {typed} ({timer}; its share {seconds:.0f} s), {wall:.0f} s of wall time; test accuracy "
        f"**{acc:.4f}** on its held-out reviews; `{logs}` under the runs' folder."
    )


def robustness(a: argparse.Namespace, logs: str, budget: Budget) -> list[tuple[str, list[dict], dict | None]]:
    """Each candidate set over the held-out reviews, stopped at its share of the time left (None: not started)."""
    base = ["--model.init_args.model", logs, "--model.init_args.num_reviews", str(a.reviews)]
    base += ["--model.init_args.positions_per_review", str(a.positions)]
    base += ["--trainer.devices", "1"] if a.smoke else ["--model.init_args.batch_size", str(a.batch_size)]
    out = []
    for i, (name, extra) in enumerate(SETS.items()):
        seconds = (budget.left() - RESERVE) / (len(SETS) - i)
        if seconds < MIN_SET:
            out.append((name, [], None))
            continue
        folder = a.out / logs / f"words_{i}"
        records, run = evaluate_until(WORDS, a.out, folder, seconds, *base, *extra)
        records = [r for r in records if r.get("kind") in ("review", "position")]
        keep(records, a.page, f"finetuned_words_{i}")
        out.append((name, records, run))
    return out


COLUMNS = ("candidates", "reviews finished", "run", "clean accuracy", "robust accuracy", "attack success")
COLUMNS += ("flip rate", "words per position", "forwards", "forwards / s")


def set_row(name: str, records: list[dict], run: dict | None, total: int) -> dict:
    """One candidate set's row of the page's table ("-" where nothing finished)."""
    reviews = [r for r in records if r["kind"] == "review"]
    row: dict = dict.fromkeys(COLUMNS)
    row |= {"candidates": name, "reviews finished": f"{len(reviews)} of {total}"}
    row["run"] = "not started (time budget)" if run is None else ended(run)
    if reviews:
        table = classifier_table(records)
        keys = ("clean_accuracy", "robust_accuracy", "attack_success", "flip_rate", "words_per_position")
        row |= {k.replace("_", " "): table[k] for k in keys}
        row |= {"forwards": sum(r["forwards"] for r in reviews), "forwards / s": round(table["forwards_per_s"], 1)}
    return row


def own_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of this benchmark beside --out and --page."""
    parser.add_argument("--budget", type=float, default=228.0, help="wall seconds for the whole benchmark")
    parser.add_argument("--fit-share", type=float, default=0.5, help="the share of the budget the fine-tuning gets")
    parser.add_argument("--train-reviews", type=int, default=None, help="training reviews (default: the config's)")
    parser.add_argument("--reviews", type=int, default=1000, help="held-out reviews per candidate set")
    parser.add_argument("--positions", type=int, default=10, help="positions per review, spread over its words")
    parser.add_argument("--batch-size", type=int, default=512, help="edited reviews per forward (GPU)")
    parser.add_argument("--commit", default=None, help="the commit of the tree, where it is no checkout of it")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: the script end to end on a CPU")


def main() -> None:
    a, command = page_arguments(__file__, __doc__ or "", "gpu_results", own_arguments)
    if not 0 < a.fit_share < 1:
        raise SystemExit(f"gpu_finetuned: --fit-share {a.fit_share}: give a share between 0 and 1")
    a.out = a.out.resolve()
    budget = Budget(a.budget)
    if a.smoke:
        a.reviews, a.positions = min(a.reviews, 3), min(a.positions, 2)
    logs, fit = fine_tune(a, a.fit_share * a.budget)
    sets = robustness(a, logs, budget) if logs is not None else [(name, [], None) for name in SETS]
    rows = [set_row(name, records, run, a.reviews) for name, records, run in sets]
    from wslight.records.summary import markdown_table

    body = [
        __doc__ or "",
        "",
        "## The fine-tuning",
        "",
        fit,
        "",
        "## Robustness over the held-out reviews",
        "",
        f"{a.reviews} held-out reviews, {a.positions} positions each (spread over the words that are one token), each "
        "candidate checked exactly (a forward of the edited review, float64 where rounding could decide); robust "
        "accuracy is an upper bound and attack success a lower bound of those over every position. A set stopped at "
        "its share counts the reviews that finished.",
        "",
        markdown_table(rows),
        "",
    ]
    title = "A fine-tuned classifier's robustness on a GPU"
    page = write_page(a.page / "gpu_finetuned.md", title, page_header(command, a.commit), body)
    print(page.read_text())


if __name__ == "__main__":
    main()
