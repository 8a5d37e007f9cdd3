"""The continuous S of the whole pre-trained encoder against n, beside S_words, RAF and the single layer (theory §12.5).

Does a whole trained encoder make one token (any Delta of norm sqrt(d)) and one real word matter more or less than
the paper's random attention? Runs, as a user types them, `evaluate.py --config configs/words/encoder.yaml` with
`continuous: true` (the continuous search at token 1 beside the exact best word there), one process per core:

1. RAF and `pretrained_attn` (the encoder's first attention sublayer alone), n in --n;
2. the encoder's first L layers (`pretrained_encoder`, per token) for L = 1, 2, n in --n;
3. all 6 layers, one run per entry of --n-deep (a comma list: those n in one run; the search through six layers
   costs about six times one layer's, so a larger n is a run of its own, added without touching the finished ones).

Each record holds S (the generic search's lower bound, with its chains and `near_best`, the chains that ended within
1% of it) and S_words of the same review and token. The page is rewritten after each run, so an interrupted run
leaves the finished rows; evaluate.py resumes a run's finished trials when it is started again.

    python -m benchmarks.encoder_continuous --out reports/encoder_continuous/runs --page reports/encoder_continuous
    # the same: make encoder-continuous
"""

from __future__ import annotations

import json

from benchmarks.common import evaluate, page_arguments
from benchmarks.encoder_words import CONFIG, best_words, label, mean_sd
from benchmarks.encoder_words import slopes as word_slopes
from wslight.records.pages import PageHeader, write_page
from wslight.records.summary import markdown_table


def encoder(layers: int) -> str:
    """The maps override of the encoder's first `layers` layers."""
    return f"[{{class_path: pretrained_encoder, init_args: {{layers: {layers}}}}}]"


def table(records: list[dict], ns: list[int]) -> list[dict]:
    """Per map: S and S_words at each n (mean ± sd over reviews), their ratio, the confirmed share, seconds a review."""
    rows = []
    for name in dict.fromkeys(label(r) for r in records):
        mine = [r for r in records if label(r) == name]
        row: dict = {"map": name}
        for key, column in (("ws", "S"), ("ws_words", "S_words")):
            for n in ns:
                values = [r[key] for r in mine if r["n"] == n]
                row[f"{column}, n = {n}"] = mean_sd(values) if values else "-"
        row["S_words / S"] = f"{sum(r['ws_words'] / r['ws'] for r in mine) / len(mine):.2f}"
        row["confirmed"] = f"{sum(r['near_best'] >= 2 for r in mine)} / {len(mine)}"
        row["s per review"] = round(sum(r["seconds"] for r in mine) / len(mine), 1)
        rows.append(row)
    return rows


def slopes(records: list[dict]) -> list[dict]:
    """The slopes of log S and log S_words against log n per map (least squares over every review, 95% interval)."""
    out: dict[str, dict] = {}
    for key, column in (("ws", "slope of S"), ("ws_words", "slope of S_words")):
        for r in word_slopes(records, key, column):
            out.setdefault(r["map"], {"map": r["map"]})[column] = r[column]
    return [{"map": m, **{c: row.get(c, "-") for c in ("slope of S", "slope of S_words")}} for m, row in out.items()]


def n_list(text: str) -> list[int]:
    """One --n-deep entry: n values separated by commas, run together."""
    return [int(n) for n in text.split(",")]


def arguments(parser) -> None:  # type: ignore[no-untyped-def]
    parser.add_argument("--reviews", type=int, default=3, help="bundled reviews per cell (the same in every cell)")
    parser.add_argument("--n", type=int, nargs="+", default=[8, 16, 32], help="n of RAF, the single layer, L = 1, 2")
    parser.add_argument(
        "--n-deep",
        type=n_list,
        nargs="+",
        default=[[8, 16], [32]],
        help="n of the whole encoder (L = 6), a run per entry",
    )


def main() -> None:
    a, command = page_arguments(__file__, __doc__ or "", "encoder_continuous", arguments)
    runs = [("RAF and the single layer", "[raf, pretrained_attn]", a.n)]
    runs += [(f"L = {L}", encoder(L), a.n) for L in (1, 2)]
    for ns in a.n_deep:
        runs.append((f"L = 6 (n = {', '.join(map(str, ns))})", encoder(6), ns))
    records: list[dict] = []
    walls: list[str] = []
    for done, (name, maps, ns) in enumerate(runs, 1):
        grid = ["--model.init_args.grid.maps", maps, "--model.init_args.grid.n_values", json.dumps(ns)]
        path, seconds = evaluate(
            CONFIG,
            a.out,
            *grid,
            "--model.init_args.continuous=true",
            f"--model.init_args.grid.trials={a.reviews}",
            "--model.init_args.trials_per_step=1",
        )
        records += [json.loads(line) for line in path.read_text().splitlines()]
        walls.append(f"{name}: {seconds / 60:.1f} min")
        ns_all = sorted({r["n"] for r in records})
        left = [n for n, _, _ in runs[done:]]
        body = [
            __doc__,
            "",
            f"## S and S_words against n ({a.reviews} reviews, token 1, d = 384)",
            "",
            f"Wall time of each run (a resumed run's counts only the trials it computed): {'; '.join(walls)}."
            + (f" Not finished when this page was written: {', '.join(left)}." if left else ""),
            "S is the continuous search's best relative change of phi(X) over every Delta of norm at most sqrt(d) "
            "at token 1 (a lower bound; confirmed: a second chain ended within 1% of it), S_words the exact best "
            "admissible vocabulary word there; mean ± sd over the reviews, the maps per token (p = n d).",
            "",
            markdown_table(table(records, ns_all)),
            "",
            "Slopes of log S and log S_words against log n (-0.5: the 1/sqrt(n) law; 0: order-one sensitivity):",
            "",
            markdown_table(slopes(records)),
            "",
            best_words(records),
        ]
        title = "The continuous S of the whole encoder"
        print(write_page(a.page / "encoder_continuous.md", title, PageHeader.collect(command), body), flush=True)


if __name__ == "__main__":
    main()
