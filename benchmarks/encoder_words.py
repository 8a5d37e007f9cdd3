"""One real word through the whole pre-trained encoder: S_words of L = 1, 2, 6 layers against n (theory §12.5, §13).

Beside RAF and the encoder's single pre-trained attention layer.

Runs, as a user types them: `evaluate.py --config configs/words/encoder.yaml` (RAF, `pretrained_attn` and the whole
encoder, 6 layers), then the same config with `maps` set to the encoder's first 1 and first 2 layers. Each record is
the exact best of every admissible vocabulary word at token 1 of a bundled review (S_words), the same reviews in
every cell. The continuous S is left out (`continuous: false`): through six layers its search takes about 10 minutes
a review on one core (benchmarks/encoder_continuous.py runs it on fewer reviews and cells).

Writes the results page encoder_words.md (the table, the slopes, the words, with date, machine and commit) into --page:

    python -m benchmarks.encoder_words --out reports/encoder_words/runs --page reports/encoder_words
    # the same: make encoder-words
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable

from benchmarks.common import evaluate, page_arguments
from benchmarks.floor import Rates, count_flops, floor_section, per_unit, time_shares
from wslight.records.pages import PageHeader, usable_cores, write_page
from wslight.records.summary import markdown_table, slope_table

CONFIG = "configs/words/encoder.yaml"
FLOOR_WORDS = 64  # candidate words a cell's FLOPs and time shares are measured on
FEWER_LAYERS = (1, 2)  # the encoder's first L layers, each its own run (one record name per run)


def label(record: dict) -> str:
    """A row's name: the map, and the encoder's number of layers (all 6 unless the run set `layers`)."""
    if record["map"] != "pretrained_encoder":
        return record["map"]
    return f"pretrained_encoder, L = {record.get('map_args', {}).get('layers', 6)}"


def mean_sd(values: list[float]) -> str:
    """`mean ± sd` of a cell's values (sd 0 for a single value)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def table(records: list[dict]) -> list[dict]:
    """Per map: mean S_words (sd over reviews) at each n, the best word's mean distance, and seconds per review."""
    rows = []
    ns = sorted({r["n"] for r in records})
    for name in dict.fromkeys(label(r) for r in records):
        mine = [r for r in records if label(r) == name]
        row: dict = {"map": name}
        for n in ns:
            values = [r["ws_words"] for r in mine if r["n"] == n]
            row[f"S_words, n = {n}"] = mean_sd(values) if values else "-"
        row["distance / sqrt(d)"] = round(statistics.fmean(r["distance"] for r in mine), 3)
        row["s per review"] = round(statistics.fmean(r["seconds"] for r in mine), 2)
        rows.append(row)
    return rows


def slopes(records: list[dict], key: str = "ws_words", column: str = "slope of S_words") -> list[dict]:
    """The slope of log records[key] against log n per map (least squares over every review, 95% interval)."""
    fitted = slope_table([{**r, "map": label(r), "ws": r[key]} for r in records])
    return [{"map": r["map"], column: f"{r['slope']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]"} for r in fitted]


def best_words(records: list[dict], k: int = 6) -> str:
    """The most frequent best words per map (count over its records)."""
    lines = ["| map | most frequent best words (count) |", "|---|---|"]
    for name in dict.fromkeys(label(r) for r in records):
        counts = Counter(r["word"] for r in records if label(r) == name)
        lines.append(f"| {name} | " + ", ".join(f"`{w}` ({c})" for w, c in counts.most_common(k)) + " |")
    return "\n".join(lines)


def word_call(record: dict, words: int = FLOOR_WORDS) -> Callable[[], object]:
    """`word_substitution` as the run calls it for one review of the record's cell, on `words` candidate words.

    Random rows stand for the review and the words: the FLOPs of a word depend on the shapes only (the float64 re-check
    of the words rounding could decide, a handful a review, aside).
    """
    import torch

    from wslight.features.entries import resolve_map
    from wslight.search.substitution import word_substitution

    spec = {"class_path": record["map"], "init_args": record["map_args"]} if "map_args" in record else record["map"]
    n, d = record["n"], record["d"]
    feature_map = resolve_map(spec).build(n, d, 0, dtype="float32")
    gen = torch.Generator().manual_seed(0)
    X, rows = torch.randn(1, 1, n, d, generator=gen), torch.randn(words, d, generator=gen)
    X, rows = X * d**0.5 / X.norm(dim=-1, keepdim=True), rows * d**0.5 / rows.norm(dim=-1, keepdim=True)
    return lambda: word_substitution([feature_map], X, [record["position"]], rows)


def words_floor(records: list[dict]) -> list[str]:
    """Each cell's seconds per word against the machine's floor, and where the largest n's time goes, per map."""
    rates = Rates.measure(usable_cores())
    rows, shares = [], []
    largest = max(r["n"] for r in records)
    for name in dict.fromkeys(label(r) for r in records):
        for n in sorted({r["n"] for r in records if label(r) == name}):
            cell = [r for r in records if label(r) == name and r["n"] == n]
            per_word = statistics.fmean(r["seconds"] / r["admissible"] for r in cell)
            call = word_call(cell[0])
            rows.append((f"{name}, n = {n}", per_unit(count_flops(call), FLOOR_WORDS), per_word, 1))
            if n == largest:  # the profile of the largest n only
                shares.append((f"{name} at n = {n} ({FLOOR_WORDS} words)", time_shares(call)))
    preface = (
        "Each process of the runs works on one thread (one process per core), so the floor is at the one-thread rate; "
        "s / word: a review's seconds over its admissible words, mean over the cell's reviews."
    )
    return floor_section(rows, rates, shares, unit="word", preface=preface)


def main() -> None:
    a, command = page_arguments(__file__, __doc__ or "", "encoder_words")
    runs = [evaluate(CONFIG, a.out)]
    for L in FEWER_LAYERS:
        maps = f"[{{class_path: pretrained_encoder, init_args: {{layers: {L}}}}}]"
        runs.append(evaluate(CONFIG, a.out, "--model.init_args.grid.maps", maps))
    records = [json.loads(line) for path, _ in runs for line in path.read_text().splitlines()]
    walls = ", ".join(f"{seconds / 60:.1f} min" for _, seconds in runs)
    body = [
        __doc__,
        "",
        f"## S_words against n ({len({r['trial'] for r in records})} reviews, token 1, d = 384)",
        "",
        f"The runs took {walls} of wall time (the config, then L = {', '.join(map(str, FEWER_LAYERS))}; one process "
        "per core). S_words is the exact maximum over the admissible vocabulary of ||phi(X with x_1 = h_w) - phi(X)|| "
        "/ ||phi(X)||, the maps per token (p = n d); mean ± sd over the reviews.",
        "",
        markdown_table(table(records)),
        "",
        "Slope of log S_words against log n (-0.5: the 1/sqrt(n) law; 0: order-one sensitivity):",
        "",
        markdown_table(slopes(records)),
        "",
        best_words(records),
        "",
        *words_floor(records),
    ]
    title = "One word through the whole encoder"
    print(write_page(a.page / "encoder_words.md", title, PageHeader.collect(command), body))


if __name__ == "__main__":
    main()
