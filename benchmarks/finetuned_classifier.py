"""A fine-tuned classifier and the words that flip it: robust accuracy over three candidate sets, against the floor.

Runs, each as a user types it:
1. the fine-tuning, `train.py fit --config configs/finetune/imdb.yaml` (skipped with --run <an earlier run>): its
   held-out test accuracy and wall time;
2. `evaluate.py --config configs/words/classifier.yaml` on that run for the k = 10 and k = 50 nearest words and for
   the whole vocabulary screened (32 words a position), on --reviews held-out reviews at --positions positions each;
3. the screen's recall: the whole vocabulary checked exactly at --recall-positions positions of the first review.

Beside each run: the forwards it made, their FLOPs (`wslight.features.classifiers.forward_flops`), and the floor
they set at the machine's matrix-multiply rate, measured in the same run on the products that dominate a forward
(float32, one thread and every core). Writes finetuned_classifier.md into --page:

    python -m benchmarks.finetuned_classifier --out reports/finetuned/runs --page reports/finetuned   # = make finetuned
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.common import evaluate, page_arguments, train
from benchmarks.floor import Rates, rates_line
from wslight.records.pages import PageHeader, usable_cores, write_page

CONFIG = "configs/words/classifier.yaml"
CANDIDATE_SETS = {  # name: evaluate.py's arguments
    "k = 10 neighbours": ["--model.init_args.k", "10"],
    "k = 50 neighbours": ["--model.init_args.k", "50"],
    "vocabulary, screened (32)": ["--model.init_args.candidates", "vocabulary", "--model.init_args.screen", "32"],
}


def summary_row(results: Path) -> dict[str, str]:
    """The table row of a run's summary.md, as {column: value}."""
    lines = [x for x in results.with_name("summary.md").read_text().splitlines() if x.startswith("|")]
    head, row = (x.strip("|").split("|") for x in (lines[0], lines[2]))
    return {h.strip(): v.strip() for h, v in zip(head, row, strict=True)}


def run_counts(results: Path) -> tuple[int, int, float]:
    """The forwards the run's reviews made (clean ones included), their mean tokens, and the reviews' seconds summed."""
    reviews = [json.loads(x) for x in results.read_text().splitlines() if '"kind": "review"' in x]
    forwards = sum(r["forwards"] for r in reviews)
    tokens = sum(r["tokens"] * r["forwards"] for r in reviews) // max(1, forwards)
    return forwards, tokens, sum(r["seconds"] for r in reviews)


def run_wall(results: Path, seconds: float) -> float:
    """The run's wall seconds: from its first TensorBoard file to the last record written.

    A run resumed with nothing left to do keeps its first run's time; the command's own `seconds` where longer.
    """
    starts = [int(f.name.split(".")[3]) for f in results.parent.glob("events.out.tfevents.*")]
    span = results.stat().st_mtime - min(starts) if starts else 0.0
    return max(span, seconds)


def closest_review(results: Path, run: str, out: Path) -> Path:
    """A .jsonl holding the correctly classified review of a run with the smallest clean margin (where words flip)."""
    from wslight.data.review_texts import TextSplit
    from wslight.features.classifiers import model_folder

    reviews = [json.loads(x) for x in results.read_text().splitlines() if '"kind": "review"' in x]
    pick = min((r for r in reviews if r["status"] != "wrong"), key=lambda r: r["clean_margin"])
    recorded = TextSplit.read(model_folder(run))
    texts, labels, _ = (recorded[0] if recorded else TextSplit()).texts("test")
    path = (out / "closest_review.jsonl").resolve()  # evaluate.py runs in `out`
    path.write_text(json.dumps({"text": texts[pick["trial"]], "label": int(labels[pick["trial"]])}) + "\n")
    return path


def flops_per_forward(run: str, tokens: int) -> float:
    """FLOPs of one forward of the run's classifier over `tokens` tokens."""
    from transformers import AutoConfig

    from wslight.features.classifiers import forward_flops, model_folder

    return forward_flops(AutoConfig.from_pretrained(model_folder(run)), tokens)


def recall_line(results: Path) -> str:
    """The sentence of a run's summary.md that gives the screen's recall."""
    found = re.search(r"The screen against the whole vocabulary[^\n]*", results.with_name("summary.md").read_text())
    return found.group(0) if found else "(no recall in summary.md)"


def earlier_fit(run: str) -> str:
    """What an earlier fine-tuning run says of itself in its TensorBoard events: test accuracy and wall time."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(run).glob("events.out.tfevents.*"))  # the fit's, then the test's after it
    if not files:
        return "(an earlier run, given with --run; no TensorBoard events in it)"
    times, acc = [], float("nan")
    for file in files:
        events = EventAccumulator(str(file))
        events.Reload()
        tags = events.Tags()["scalars"]
        times += [e.wall_time for tag in tags for e in events.Scalars(tag)]
        acc = events.Scalars("test/acc")[-1].value if "test/acc" in tags else acc
    return (
        f"test accuracy **{acc:.4f}** on its held-out reviews, {(max(times) - min(times)) / 60:.1f} min from its first "
        "logged step to its test (an earlier run, given with --run)"
    )


def more_arguments(parser) -> None:
    """The benchmark's own arguments."""
    parser.add_argument("--run", help="an earlier fine-tuning run (its log folder): skip the fit")
    parser.add_argument("--reviews", type=int, default=100, help="held-out reviews per candidate set")
    parser.add_argument("--positions", type=int, default=10, help="positions per review, spread over its words")
    parser.add_argument("--recall-positions", type=int, default=2, help="positions checked over the whole vocabulary")


def main() -> None:
    a, command = page_arguments(__file__, __doc__ or "", "finetuned", more_arguments)
    if a.run is not None:
        fit = earlier_fit(a.run)
    else:
        a.run, acc, seconds = train("configs/finetune/imdb.yaml", a.out)
        fit = f"test accuracy **{acc:.4f}** on the 2,500 held-out reviews, {seconds / 60:.1f} min of wall time"
    rates = Rates.measure(usable_cores())
    base = ["--model.init_args.model", a.run, "--model.init_args.num_reviews", str(a.reviews)]
    base += ["--model.init_args.positions_per_review", str(a.positions)]
    rows = []
    for name, extra in CANDIDATE_SETS.items():
        results, seconds = evaluate(CONFIG, a.out, *base, *extra)
        seconds = run_wall(results, seconds)
        forwards, tokens, compute = run_counts(results)
        flops = forwards * flops_per_forward(a.run, tokens)
        rows.append((name, summary_row(results), seconds, forwards, compute, flops))
    recall = "not measured (--recall-positions 0)."
    if a.recall_positions:
        review = closest_review(results, a.run, a.out)
        recall_args = ["--model.init_args.model", a.run, "--model.init_args.reviews", str(review)]
        recall_args += ["--model.init_args.candidates", "vocabulary", "--model.init_args.screen", "32"]
        recall_args += ["--model.init_args.recall_reviews", "1", "--model.init_args.num_reviews", "1"]
        recall_args += ["--model.init_args.positions_per_review", str(a.recall_positions)]
        recall_results, recall_s = evaluate(CONFIG, a.out, *recall_args)
        recall = f"{recall_s / 60:.1f} min: {recall_line(recall_results)}"
    lines = [
        f"The classifier: `{a.run}` (configs/finetune/imdb.yaml: the bundled MiniLM fine-tuned end to end, 128 "
        f"tokens); {fit}.",
        "",
        rates_line(rates),
        "",
        f"{a.reviews} held-out reviews, {a.positions} positions each (spread over the words that are one token), "
        "each candidate checked exactly (a forward of the edited review):",
        "",
        "| candidates | clean acc | robust acc | attack success | flip rate | words / position | forwards | "
        "wall s | forwards / s | review s | floor s | of floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row, seconds, forwards, compute, flops in rows:
        floor = flops / (rates.at("float32", 1) * 1e9)
        lines.append(
            f"| {name} | {row['clean_accuracy']} | {row['robust_accuracy']} | {row['attack_success']} | "
            f"{row['flip_rate']} | {row['words_per_position']} | {forwards} | {seconds:.0f} | "
            f"{forwards / seconds:.1f} | {compute:.0f} | {floor:.0f} | {100 * floor / compute:.1f}% |"
        )
    lines += [
        "",
        "wall s: the command as typed, its start included (loading the model, the reviews, the word vocabulary). "
        "review s: the reviews' own seconds summed over the processes (one per core, one thread each); floor s: "
        "the forwards' FLOPs (`forward_flops`) at the one-thread float32 rate, so 'of floor' (floor s / review s) is "
        "how close the forwards run to the machine's own matrix products. A screened review also costs one backward.",
        "",
        f"The screen's recall ({a.recall_positions} positions of the correct review with the smallest clean margin "
        f"in the screened run, checked over the whole vocabulary too), {recall}",
        "",
    ]
    title = "A fine-tuned classifier and the words that flip it"
    write_page(a.page / "finetuned_classifier.md", title, PageHeader.collect(command), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
