"""One word and a real classifier: the words that flip trained heads on the bundled reviews.

See docs/theory/words.md §13.5.

Runs, each as a user types it (train.py, then evaluate.py on the run it printed):
1. the real classifier: configs/encoder_classifier.yaml (the whole bundled encoder, mean-pooled, a ridge head with a
   bias), its test accuracy, and its screened words (configs/words/encoder_classifier.yaml);
2. the screen's recall through the encoder: the same classifier fitted at n = 32 (`--data.init_args.n 32`), its words
   at tokens 1, 9, 17, 25 of 5 reviews screened as in 1 and checked over the whole admissible vocabulary too
   (about two minutes a position on the 2 cores);
3. the RAF head of configs/raf.yaml, its words screened as the classifier's and checked over the whole admissible
   vocabulary too (recall_reviews 20), at the classifier's first five positions (every 8th token, 100
   review-positions), with the screen's centroids (the default) and without them (`screen_centroids: 0`, the
   clean review's expansion alone): the recall where the exact check is cheap.

Writes the results page real_classifier.md (the runs' tables, with date, machine and commit) into --page:

    python -m benchmarks.real_classifier --out reports/classifier/runs --page reports/classifier   # = make classifier
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from benchmarks.common import evaluate, page_arguments, train
from wslight.records.pages import PageHeader, write_page


def words(config: str, logs: str, cwd: Path, *extra: str) -> tuple[str, float]:
    """evaluate.py on a words config for the run in `logs`: its summary.md text and wall seconds."""
    results, seconds = evaluate(config, cwd, "--model.init_args.run", logs, *extra)
    return results.parent.joinpath("summary.md").read_text(), seconds


def recall_sentence(summary: str) -> str:
    """The sentence of a summary.md that gives the screen's recall against the whole vocabulary."""
    found = re.search(r" Against the whole admissible vocabulary[^\n]*", summary)
    if found is None:
        sys.exit(f"summary.md gives no recall:\n{summary[-2000:]}")
    return found.group(0)


def main() -> None:
    a, command = page_arguments(__file__, __doc__ or "", "classifier")
    enc_logs, enc_acc, enc_fit = train("configs/encoder_classifier.yaml", a.out)
    enc_words, enc_s = words("configs/words/encoder_classifier.yaml", enc_logs, a.out)
    short = ["--data.init_args.n", "32"]
    short_logs, short_acc, short_fit = train("configs/encoder_classifier.yaml", a.out, *short)
    recall = ["--model.init_args.reviews", "5", "--model.init_args.recall_reviews", "5"]
    recall += ["--model.init_args.positions", "[1, 9, 17, 25]"]
    short_words, short_s = words("configs/words/encoder_classifier.yaml", short_logs, a.out, *recall)
    raf_logs, raf_acc, raf_fit = train("configs/raf.yaml", a.out)
    extra = ["--model.init_args.screen", "32", "--model.init_args.recall_reviews", "20"]
    extra += ["--model.init_args.positions", "[1, 9, 17, 25, 33]"]
    raf_words, raf_s = words("configs/words/trained_head.yaml", raf_logs, a.out, *extra)
    plain, plain_s = words(
        "configs/words/trained_head.yaml", raf_logs, a.out, *extra, "--model.init_args.screen_centroids", "0"
    )
    body = [
        __doc__,
        "",
        "## The real classifier: the whole bundled encoder and a linear head",
        "",
        f"Test accuracy {enc_acc:.3f} on the run's held-out bundled reviews (fit: {enc_fit:.0f} s wall). Its words, "
        f"screened ({enc_s:.0f} s wall, one process per core):",
        "",
        enc_words,
        "",
        "## The screen through the encoder: the classifier at n = 32, checked over the whole vocabulary",
        "",
        f"Test accuracy {short_acc:.3f} (fit: {short_fit:.0f} s wall). Its words at tokens 1, 9, 17, 25 of 5 reviews, "
        f"screened as above and checked over the whole admissible vocabulary too ({short_s:.0f} s wall):",
        "",
        short_words,
        "",
        "## The RAF head of configs/raf.yaml: the screen against the whole vocabulary",
        "",
        f"Test accuracy {raf_acc:.3f} (fit: {raf_fit:.0f} s wall). Its words, screened as the classifier's and checked "
        f"over the whole admissible vocabulary at tokens 1, 9, 17, 25, 33 of 20 reviews ({raf_s:.0f} s wall):",
        "",
        raf_words,
        "",
        f"The same screen without its centroids (`screen_centroids: 0`, {plain_s:.0f} s wall):"
        + recall_sentence(plain),
    ]
    title = "One word and a real classifier"
    print(write_page(a.page / "real_classifier.md", title, PageHeader.collect(command), body))


if __name__ == "__main__":
    main()
