"""Each probe writes a summary.md table of its records, beside results.jsonl."""

from pathlib import Path

import pytest

from wslight.app.cli import main


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of the (first) markdown table in `text`, as {column: cell text}."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[2:]]


@pytest.mark.parametrize("name", ["attention_edit", "attention_under_delta", "layerwise_change"])
def test_each_probe_writes_a_summary_table_of_its_records(tmp_path, name):
    import json
    import statistics

    conf = Path(__file__).resolve().parents[1] / "conf" / "probes" / f"{name}.yaml"
    args = ["test", "--config", str(conf), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = main([*args, "--trainer.enable_progress_bar", "false"], evaluate=True)
    results = Path(cli.model.results_path)
    records = [json.loads(x) for x in results.read_text().splitlines()]
    summary = results.parent / "summary.md"
    rows = markdown_rows(summary.read_text())
    assert rows
    if name == "attention_edit":  # per token: the mean over the queries of the attention it receives, a and b
        assert len(rows) == len({r["key"] for r in records})
        for row in rows:
            cells = [r for r in records if r["key"] == int(row["key"])]
            assert float(row["b - a"]) == pytest.approx(statistics.fmean(r["diff"] for r in cells), rel=1e-3, abs=1e-6)
        assert [row["token b"] for row in rows if row["token a"] != row["token b"]] == ["smile"]  # the edited word
    elif name == "attention_under_delta":  # the moved token attracts the attention: first row, up from before
        moved = rows[0]
        assert moved["token"].endswith("(moved)") and int(moved["key"]) == records[0]["position"]
        assert float(moved["after"]) > float(moved["before"]) and float(moved["after - before"]) > 0
    else:  # one row per layer; at layer 0 Delta and the Gaussian draws (same norm) change X by the same ratio
        assert [int(row["layer"]) for row in rows] == sorted({r["layer"] for r in records})
        first = rows[0]
        assert float(first["Delta (optimised)"]) == pytest.approx(float(first["Gaussian (mean)"]), rel=1e-3)
        assert all(row["best word"] != "-" for row in rows)  # the replacement words are in the table
