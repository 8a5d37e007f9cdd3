"""One word through the whole encoder on a GPU machine: what the CPU runs of docs/theory/words.md §13.5 leave out.

Runs, each as a user types it (train.py, then evaluate.py), within one wall-clock budget (--budget):
1. the real classifier of configs/encoder_classifier.yaml (n = 128): its test accuracy;
2. its words (configs/words/encoder_classifier.yaml), each review screened with 16 centroids and also
   checked over the whole admissible vocabulary (`recall_reviews` = `reviews`): the classifier's exact flips and the
   screen's recall at n = 128, on positions the screen was not tuned on. Stopped (Ctrl-C: finished reviews kept) when
   its share of the budget is spent; the page counts the reviews that finished;
3. the same reviews screened with 64 centroids (the default), compared position by position with 2's exact check;
4. configs/words/encoder.yaml with `continuous: true` for the whole encoder (6 layers, then its first layer): the
   continuous S beside S_words against n, stopped at the budget like 2 (finished cells kept).

Writes gpu_words.md (the tables, with date, machine and commit) and each run's results.jsonl into --page:

    python -m benchmarks.gpu_words --out reports/gpu_words/runs --page reports/gpu_words   # = make gpu-words
    python -m benchmarks.gpu_words --out /tmp/gw --page /tmp/gw --smoke                   # tiny sizes, any machine
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from benchmarks.common import ROOT, Budget, page_arguments, page_header, stoppable, train
from benchmarks.encoder_words import label, mean_sd, slopes
from wslight.records.pages import write_page
from wslight.records.summary import markdown_table
from wslight.tasks.trained_head_words import head_words_table, recall_text, screen_recall

CLASSIFIER = "configs/encoder_classifier.yaml"
WORDS = "configs/words/encoder_classifier.yaml"
ENCODER = "configs/words/encoder.yaml"


def evaluate_until(config: str, cwd: Path, out_dir: Path, seconds: float, *extra: str) -> tuple[list[dict], dict]:
    """evaluate.py on `config` writing into `out_dir`, stopped after `seconds`: its records and how the run ended."""
    command = [sys.executable, str(ROOT / "evaluate.py"), "--config", config]
    command += ["--model.init_args.output_dir", str(out_dir), *extra]
    status, wall, output = stoppable(command, cwd, seconds)
    results = out_dir / "results.jsonl"
    records = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    if status not in (0, 130):
        print(output[-3000:], file=sys.stderr)
    return records, {"status": status, "wall": wall, "stopped": status == 130}


def ended(run: dict) -> str:
    """How a run ended, in words."""
    if run["stopped"]:
        return f"stopped at its share of the budget after {run['wall']:.0f} s (exit 130, finished trials kept)"
    if run["status"] == 0:
        return f"finished in {run['wall']:.0f} s"
    return f"failed with exit status {run['status']} after {run['wall']:.0f} s"


EXACT = ("exact_flipped", "exact_flips", "exact_ws_words")  # what a record checked over the whole vocabulary adds


def recall_of(screened: list[dict], exact: list[dict]) -> dict | None:
    """`screen_recall` of a screen-only run against another run's exact check of the same positions."""
    truth = {r["record_key"]: r for r in exact if "exact_flipped" in r}
    return screen_recall(
        [r | {k: truth[r["record_key"]][k] for k in EXACT} for r in screened if r["record_key"] in truth]
    )


def recall_row(name: str, recall: dict | None, records: list[dict]) -> dict:
    """One row of the recall table."""
    if recall is None:
        return {"screen": name, "positions": 0}
    return {
        "screen": name,
        "positions": recall["positions"],
        "flipped (exact)": recall["flipped"],
        "found": recall["found"],
        "position recall": recall_text(recall["position_recall"]),
        "flipping words checked / all": f"{recall['words']} / {recall['exact_words']}",
        "word recall": recall_text(recall["word_recall"]),
        "s per position": round(statistics.fmean(r["seconds"] for r in records), 2),
    }


def exact_row(records: list[dict]) -> dict:
    """`head_words_table` of the records as the whole admissible vocabulary's check counts them (no screen)."""
    checked = [r for r in records if "exact_flipped" in r]
    return head_words_table([r | dict(zip(("flipped", "flips", "ws_words"), (r[k] for k in EXACT))) for r in checked])


def continuous_table(records: list[dict]) -> list[dict]:
    """Per map and n: mean ± sd over reviews of S and S_words, and their ratio."""
    rows = []
    for name in dict.fromkeys(label(r) for r in records):
        for n in sorted({r["n"] for r in records if label(r) == name}):
            cell = [r for r in records if label(r) == name and r["n"] == n and r.get("ws") is not None]
            if not cell:
                continue
            rows.append(
                {
                    "map": name,
                    "n": n,
                    "reviews": len(cell),
                    "S (search)": mean_sd([r["ws"] for r in cell]),
                    "S_words": mean_sd([r["ws_words"] for r in cell]),
                    "S_words / S": round(statistics.fmean(r["ws_words"] / r["ws"] for r in cell), 3),
                    "s per review": round(statistics.fmean(r["seconds"] for r in cell), 1),
                }
            )
    return rows


def keep(records: list[dict], page: Path, name: str) -> None:
    """Copy a run's records beside the page."""
    page.mkdir(parents=True, exist_ok=True)
    (page / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def own_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of this benchmark beside --out and --page."""
    parser.add_argument("--budget", type=float, default=420.0, help="wall seconds for the whole benchmark")
    parser.add_argument("--commit", default=None, help="the commit of the tree, where it is no checkout of it")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: the script end to end on a CPU")


def main() -> None:
    a, command = page_arguments(__file__, __doc__ or "", "gpu_words", own_arguments)
    budget = Budget(a.budget)

    # Smoke: 8 tokens of 40 reviews, one position of one review, the continuous search short.
    data = ["--data.init_args.n", "8", "--data.init_args.embeddings.num_samples", "40"] if a.smoke else []
    words = ["--model.init_args.positions", "[1]"] if a.smoke else []
    sweep = ["--model.init_args.grid.n_values", "[8]", "--model.init_args.grid.trials", "1"]
    sweep += ["--model.init_args.trials_per_step"]
    sweep = [*sweep, "1", "--model.init_args.search", "{max_steps: 20, max_chains: 4}"] if a.smoke else []
    reviews = 1 if a.smoke else 20
    # A GPU holds far more words per chunk than the CPU default: fewer, larger batches through the layers.
    words += [] if a.smoke else ["--model.init_args.chunk_elements", str(2**28)]

    logs, accuracy, fit = train(CLASSIFIER, a.out, *data)
    n = 8 if a.smoke else 128
    both = ["--model.init_args.run", logs, "--model.init_args.reviews", str(reviews), *words]
    both += ["--model.init_args.screen_centroids", "16", "--model.init_args.recall_reviews", str(reviews)]
    exact, exact_run = evaluate_until(WORDS, a.out, a.out / "c16_exact", 0.45 * budget.left(), *both)
    keep(exact, a.page, "classifier_c16_exact")
    done = len({r["trial"] for r in exact})
    screen = ["--model.init_args.run", logs, "--model.init_args.reviews", str(max(1, done)), *words]
    c64, c64_run = evaluate_until(
        WORDS, a.out, a.out / "c64", 0.25 * budget.left(), *screen, "--model.init_args.screen_centroids", "64"
    )
    keep(c64, a.page, "classifier_c64")

    continuous = []
    runs = []
    for layers in (6, 1):
        maps = f"[{{class_path: pretrained_encoder, init_args: {{layers: {layers}}}}}]"
        share = budget.left() - 20 if layers == 1 else 0.7 * budget.left()
        recs, run = evaluate_until(
            ENCODER, a.out, a.out / f"encoder_L{layers}", share,
            "--model.init_args.grid.maps", maps, "--model.init_args.continuous", "true", *sweep,
        )  # fmt: skip
        keep(recs, a.page, f"encoder_L{layers}_continuous")
        continuous += recs
        runs.append((layers, run))

    header = page_header(command, a.commit)
    body = [
        __doc__ or "",
        "",
        f"## The real classifier at n = {n}",
        "",
        f"Test accuracy {accuracy:.3f} on its held-out bundled reviews (train.py fit: {fit:.0f} s wall).",
        "",
        f"Its words with the screen (16 centroids, 32 words checked) and over the whole admissible vocabulary: "
        f"{ended(exact_run)}; {done} of {reviews} reviews finished.",
        "",
        "Over the whole admissible vocabulary (every word at every checked position, no screen):",
        "",
        markdown_table([exact_row(exact)]) if exact else "(no position finished)",
        "",
        "The screened counts of the same positions (every flip real; flips and S_words count the checked words):",
        "",
        markdown_table([head_words_table(exact)]) if exact else "(no position finished)",
        "",
        f"The screen's recall against that exact check (64 centroids: {ended(c64_run)}; its seconds are the screen "
        "and the check of 32 words; those of 16 centroids include the whole vocabulary's check):",
        "",
        markdown_table(
            [
                recall_row("16 centroids", screen_recall(exact), exact),
                recall_row("64 centroids (the default)", recall_of(c64, exact), c64 or exact),
            ]
        )
        if exact
        else "(no position finished)",
        "",
        "## The continuous S of the whole encoder against n",
        "",
        "configs/words/encoder.yaml with `continuous: true` (the generic search through the layers, beside the exact "
        "best word): " + "; ".join(f"L = {layers}: {ended(run)}" for layers, run in runs) + ".",
        "",
        markdown_table(continuous_table(continuous)) if continuous else "(no cell finished)",
        "",
    ]
    if len({r["n"] for r in continuous}) > 1:
        body += ["Slope of log S_words against log n:", "", markdown_table(slopes(continuous)), ""]
    page = write_page(a.page / "gpu_words.md", "One word through the encoder on a GPU", header, body)
    print(page.read_text())
    shutil.copy(page, a.out / "gpu_words.md")


if __name__ == "__main__":
    main()
