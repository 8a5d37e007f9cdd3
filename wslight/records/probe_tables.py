"""The encoder probes' summary tables: one table each, from the probe's records (one trial).

`attention_edit_table`, `attention_under_delta_table` and `layerwise_table` each return (caption, rows) for
`wslight.records.summary.write_summary`. Plain Python on dicts: no torch, no Lightning.
"""

from __future__ import annotations

import statistics
from collections import defaultdict


def _per_key(records: list[dict], fields: tuple[str, ...]) -> dict[int, dict[str, float]]:
    """{key position: {field: mean over the queries}} of a probe's (query, key) attention records."""
    cells: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        cells[int(r["key"])].append(r)
    return {k: {f: statistics.fmean(float(r[f]) for r in recs) for f in fields} for k, recs in sorted(cells.items())}


def _head_label(head: object) -> str:
    return "mean over heads" if head in (None, "mean") else f"head {head}"


def attention_edit_table(records: list[dict]) -> tuple[str, list[dict]]:
    """(caption, rows) of the attention-edit probe.

    Per token, the attention it receives (mean over the queries) in the two sentences and their difference.

    Args:
        records: the probe's records, one per (query, key) cell (`wslight.probes.attention_edit`).
    """
    first = records[0]
    tokens = {int(r["key"]): (r["key_token_a"], r["key_token_b"]) for r in records}
    means = _per_key(records, ("attention_a", "attention_b"))
    rows = [
        {
            "key": k,
            "token a": tokens[k][0],
            "token b": tokens[k][1],
            "attention a": m["attention_a"],
            "attention b": m["attention_b"],
            "b - a": m["attention_b"] - m["attention_a"],
        }
        for k, m in means.items()
    ]
    caption = (
        f"Attention of layer {first['layer']} ({_head_label(first['head'])}, {first['encoder']}) that each token "
        "receives, mean over the queries, in sentence a and in sentence b ([CLS] and [SEP] left out, rows not "
        "renormalised); b - a: their difference. results.jsonl holds every (query, key) cell.\n\n"
    )
    return caption, rows


def attention_under_delta_table(records: list[dict], top: int = 8) -> tuple[str, list[dict]]:
    """(caption, rows) of the attention-under-Delta probe.

    The keys that receive the most attention after the move (mean over the queries), before and after, the moved token
    always among them.

    Args:
        records: the probe's records, one per (query, key) cell (`wslight.probes.attention_under_delta`).
        top: keys listed (plus the moved token when it is not among them).
    """
    first = records[0]
    position = int(first["position"])
    tokens = {int(r["key"]): r["key_token"] for r in records}
    means = _per_key(records, ("attention_before", "attention_after"))
    order = sorted(means, key=lambda k: (-means[k]["attention_after"], k))
    keys = order[:top] + ([position] if position not in order[:top] else [])
    rows = [
        {
            "key": k,
            "token": tokens[k] + (" (moved)" if k == position else ""),
            "before": means[k]["attention_before"],
            "after": means[k]["attention_after"],
            "after - before": means[k]["attention_after"] - means[k]["attention_before"],
        }
        for k in keys
    ]
    caption = (
        f"Attention of layer {first['layer']}, {_head_label(first['head'])} ({first['encoder']}) that each key "
        f"receives, mean over the queries, before and after token {first['token']!r} (position {position}) moves by "
        f"the {first['method']} Delta (||Delta|| = {float(first['delta_norm']):.4g}, heads targeted: "
        f"{first['delta_heads']}): the {len(keys)} keys with the most attention after. results.jsonl holds every "
        "(query, key) cell.\n\n"
    )
    return caption, rows


def layerwise_table(records: list[dict]) -> tuple[str, list[dict]]:
    """(caption, rows) of the layer-wise probe: per layer, the relative change under each perturbation.

    Args:
        records: the probe's records, one per (layer, kind, method) (`wslight.probes.layerwise_change`).
    """
    first = records[0]
    value: dict[tuple[int, str, str], dict] = {(int(r["layer"]), r["kind"], r["method"]): r for r in records}
    gaussian = sorted({m for _, kind, m in value if kind == "gaussian"})
    words = {m: r["word"] for (_, kind, m), r in value.items() if kind == "replacement"}

    def rel(layer: int, kind: str, method: str, field: str = "rel_change") -> float | None:
        r = value.get((layer, kind, method))
        return None if r is None else float(r[field])

    rows = []
    for layer in sorted({k[0] for k in value}):
        g = gaussian[0] if gaussian else ""
        rows.append(
            {
                "layer": layer,
                "Delta (optimised)": rel(layer, "delta", "optimised"),
                "Delta (closed form)": rel(layer, "delta", "closed_form"),
                "Gaussian (mean)": rel(layer, "gaussian", g),
                "Gaussian (sd)": rel(layer, "gaussian", g, "rel_change_sd"),
                "best word": rel(layer, "replacement", "best"),
                "nearest word": rel(layer, "replacement", "nearest"),
            }
        )
    draws = gaussian[0].removeprefix("mean_of_") if gaussian else "?"
    edits = (
        f", or is replaced by the best real word {words['best']!r} and the nearest one {words['nearest']!r}"
        if {"best", "nearest"} <= set(words)
        else ""
    )
    caption = (
        f"Relative change ||H_l(X') - H_l(X)||_F / ||H_l(X)||_F of each layer l ({first['encoder']}; layer 0: the "
        f"embedding output) when token {first['token']!r} (position {first['position']} of {first['n_tokens']}) "
        f"moves by the attention-attracting Delta (optimised and closed form), by Gaussian noise of the same norm "
        f"(mean and sd of {draws} draws){edits}.\n\n"
    )
    return caption, rows
