"""The main job's driver on a tiny plan: report with the checks table read from results.jsonl, and resume."""

import json
import re

import pytest

from wslight import reproduce
from wslight.reproduce import Stage

SYNTH = {
    "model.init_args.embeddings.source": "synthetic",
    "model.init_args.embeddings.synthetic_dim": 16,
    "model.init_args.embeddings.num_samples": 60,
}


def tiny_plan():
    a = "model.init_args."
    return [
        Stage(
            "ws_rf",
            "configs/ws/rf.yaml",
            {**SYNTH, a + "d_values": [16], a + "n_values": [4, 8], a + "trials": 2, a + "max_steps": 60},
            "RF",
        ),
        Stage(
            "attack_fig4",
            "configs/attack/fig4.yaml",
            {
                **SYNTH,
                a + "cases": [{"map": "rf", "n": 6}],
                a + "d": 8,
                a + "N_values": [10],
                a + "trials": 2,
                a + "losses": ["err"],
                a + "steps": 40,
            },
            "attack",
        ),
    ]


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(reproduce, "offline_plan", tiny_plan)


def test_report_checks_come_from_the_results_and_a_rerun_resumes(tmp_path, tiny):
    report = reproduce.main(["--reports", str(tmp_path)])
    assert report == tmp_path / "offline" / "report.md"
    text = report.read_text()
    assert "## Checks (paper.md §12)" in text and "## Provenance" in text
    results = {p.parent.parent.name: p for p in (tmp_path / "offline" / "tensorboard").rglob("results.jsonl")}
    ws = [json.loads(x) for x in results["ws_rf"].read_text().splitlines()]
    worst = max(r["ws"] / r["bound"] for r in ws)
    row = next(line for line in text.splitlines() if line.startswith("| 3. RF"))
    assert f"max S / bound = {worst:.3f} over {len(ws)} trials" in row and "**PASS**" in row
    att = [json.loads(x) for x in results["attack_fig4"].read_text().splitlines()]
    row = next(line for line in text.splitlines() if line.startswith("| 9. RF cannot flip"))
    assert f"({len(att)} records)" in row
    assert re.search(r"figures/ws_rf__ws_rf\.png", text)
    before = {k: p.read_text() for k, p in results.items()}
    reproduce.main(["--reports", str(tmp_path)])
    assert {k: p.read_text() for k, p in results.items()} == before  # nothing recomputed
    times = json.loads((tmp_path / "offline" / "stage_times.json").read_text())
    assert set(times) == {"ws_rf", "attack_fig4"}


def test_unknown_stage_is_rejected_before_any_work(tmp_path, tiny, capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["--reports", str(tmp_path), "--only", "ws_nope"])
    assert "unknown stage(s) ['ws_nope']" in capsys.readouterr().err
    assert not (tmp_path / "offline").exists()
