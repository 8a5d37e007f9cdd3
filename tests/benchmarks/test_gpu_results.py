"""benchmarks.gpu_results (`make gpu-results`): the budget's split among the parts, its command line, its pages.

The slow tests run the whole command at tiny sizes (--smoke) on the CPU: the three pages with their headers and
tables, their copies under $OUT, `make results-pages RUNS=gpu_results`; and a part given too little time.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, subprocess_env

from benchmarks import gpu_results as gr
from wslight.app import results_pages
from wslight.app.results_pages import Coverage

HEADER = ("- date: ", "- machine: ", "- commit: ", "- command: ")


def test_the_shares_sum_to_one_and_split_the_budget_exactly():
    """Every part using its whole share: each gets budget x share, and nothing of the budget is left over."""
    assert sum(gr.SHARES.values()) == pytest.approx(1.0)
    parts = list(gr.SHARES)
    planned = gr.shares_of(570.0, parts)
    assert sum(planned.values()) == pytest.approx(570.0)
    left = 570.0
    for i, part in enumerate(parts):
        seconds = gr.part_seconds(left, part, parts[i:])
        assert seconds == pytest.approx(570.0 * gr.SHARES[part])
        left -= seconds
    assert left == pytest.approx(0.0, abs=1e-9)
    assert gr.shares_of(100.0, ["finetuned"]) == {"finetuned": 100.0}  # a part run alone gets the whole budget


def test_a_part_that_ends_early_leaves_its_seconds_to_the_parts_after_it():
    """The maps ending 100 s early: words and finetuned share those seconds in proportion to their shares."""
    after_maps = 570.0 * (1 - gr.SHARES["maps"]) + 100.0
    words = gr.part_seconds(after_maps, "words", ["words", "finetuned"])
    finetuned = gr.part_seconds(after_maps - words, "finetuned", ["finetuned"])
    assert words + finetuned == pytest.approx(after_maps)
    assert words > 570.0 * gr.SHARES["words"] and finetuned > 570.0 * gr.SHARES["finetuned"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--budget", "0"], "--budget 0"),
        (["--budget", "-30"], "--budget -30"),
        (["--reviews", "0"], "--reviews 0"),
        (["--positions", "-2"], "--positions -2"),
        (["--train-reviews", "0"], "--train-reviews 0"),
        (["--parts", "maps", "mapz"], "'mapz'"),
    ],
)
def test_a_bad_value_is_refused_naming_it(argv, named, capsys):
    with pytest.raises(SystemExit) as stop:
        gr.arguments(argv)
    assert stop.value.code == 2
    assert named in capsys.readouterr().err


def test_the_defaults_fit_a_ten_minute_gpu_job_and_the_parts_keep_their_order(tmp_path):
    a = gr.arguments(["--page", str(tmp_path), "--parts", "finetuned", "maps"])
    assert a.budget == gr.BUDGET and gr.BUDGET + gr.GRACE < 600
    assert a.parts == ["maps", "finetuned"] and a.out == (tmp_path / "runs").resolve()
    assert gr.arguments(["--page", str(tmp_path), "--smoke"]).budget == gr.SMOKE_BUDGET


def test_each_part_stops_itself_a_margin_before_its_share_ends(tmp_path):
    """Its own budget is its share less MARGIN; --smoke reaches every part; the fine-tuned part gets its sizes."""
    a = gr.arguments(["--page", str(tmp_path), "--smoke", "--commit", "abc1234", "--train-reviews", "500"])
    maps = gr.part_command(a, "maps", 100.0)
    assert maps[maps.index("--budget-s") + 1] == "85" and "--cpu-smoke" in maps and "--skip-tests" in maps
    words = gr.part_command(a, "words", 100.0)
    assert words[:2] == ["-m", "benchmarks.gpu_words"] and words[words.index("--budget") + 1] == "85"
    assert "--smoke" in words and words[words.index("--commit") + 1] == "abc1234"
    fine = gr.part_command(a, "finetuned", 200.0)
    assert fine[fine.index("--budget") + 1] == "185" and fine[fine.index("--reviews") + 1] == "1000"
    assert fine[fine.index("--train-reviews") + 1] == "500"


def _check_json() -> dict:
    """What benchmarks/gpu_check.py writes (gpu_check.json), one part and one DeepRF cell."""
    part = {"part": "word sensitivity, RAF, d=768, n=50", "trials": 10, "gpu_s": 3.5, "cpu_s": 9.0, "cpu_trials": 2}
    part |= {"ratio": 2.6, "peak_gib": 0.16, "note": "mean S 4.7", "status": "ok"}
    cell = {"n": 80, "L": 8, "width": 61440, "weights_gb": 120.8, "draw_s": 0.14, "ws_s": 24.6, "ws": 0.15}
    cell |= {"steps": 280, "peak_gib": 114.0, "status": "ok"}
    env = {"torch": "2.11.0", "python": "3.12.3", "cpu_cores": 16, "torch_threads": 16, "device": "NVIDIA H200"}
    env |= {"gpu_memory_gib": 139.8, "cuda": "13.0", "multiprocessors": 132}
    args = {"cpu_smoke": False, "deep_rf_trials": 1}
    return {"environment": env, "parts": [part], "deep_rf": [cell], "total_s": 150.0, "stopped": False, "args": args}


def test_the_maps_page_covers_every_section_of_the_committed_gpu_page(tmp_path):
    """gpu.md from gpu_check.json holds the sections of docs/results/gpu.md: results-pages copies it over that one."""
    a = gr.arguments(["--page", str(tmp_path)])
    (a.out / "maps").mkdir(parents=True)
    (a.out / "maps" / "gpu_check.json").write_text(json.dumps(_check_json()))
    run = {"part": "maps", "share_s": 171.0, "wall_s": 150.0, "status": 0, "stopped": False, "log": ""}
    text = gr.finish_page(a, run, ["python", "-m", "benchmarks.gpu_results"]).read_text()
    assert all(field in text for field in HEADER)
    assert "| 80 | 8 | 61440 | 120.8 | 0.14 | 24.6 | 0.15 | 280 | 114 | ok |" in text
    assert "| word sensitivity, RAF, d=768, n=50 | 10 | 3.5 | 9 (from 2, scaled) | 2.6x |" in text
    committed = Coverage.of((REPO_ROOT / "docs" / "results" / "gpu.md").read_text())
    assert committed.sections and Coverage.of(text).shortfall(committed) is None


def test_a_part_without_its_page_gets_one_saying_it_did_not_finish(tmp_path):
    a = gr.arguments(["--page", str(tmp_path), "--commit", "abc1234"])
    log = "loading\nstill training\nKeyboardInterrupt\n"
    run = {"part": "finetuned", "share_s": 228.0, "wall_s": 243.0, "status": -9, "stopped": True, "log": log}
    text = gr.finish_page(a, run, ["python", "-m", "benchmarks.gpu_results"]).read_text()
    assert text.startswith("# A fine-tuned classifier's robustness on a GPU")
    assert "**Did not finish.**" in text and "given 228 s of the 570 s budget" in text
    assert "still running when its share ended, stopped after 243 s" in text and "KeyboardInterrupt" in text
    assert "- commit: `abc1234 (as given: a copy of that tree)`" in text


def test_results_pages_copies_the_three_gpu_pages_and_names_a_missing_one(tmp_path, capsys):
    folder = tmp_path / "reports" / "gpu_results"
    folder.mkdir(parents=True)
    for name in ("gpu.md", "gpu_words.md"):
        (folder / name).write_text(f"# {name}\n")
    argv = ["--runs", "gpu_results", "--reports", str(tmp_path / "reports"), "--docs", str(tmp_path / "docs")]
    with pytest.raises(SystemExit):
        results_pages.main(argv)
    assert "gpu_finetuned.md does not exist; run `make gpu-results` first" in capsys.readouterr().err
    (folder / "gpu_finetuned.md").write_text("# gpu_finetuned.md\n")
    copied = results_pages.main(argv)
    assert sorted(p.name for p in copied) == ["gpu.md", "gpu_finetuned.md", "gpu_words.md"]


def _run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """`python -m benchmarks.gpu_results --smoke ...` with its pages in tmp_path/gpu_results and OUT=tmp_path/out."""
    command = [sys.executable, "-m", "benchmarks.gpu_results", "--page", str(tmp_path / "gpu_results"), "--smoke"]
    env = {**subprocess_env(), "OUT": str(tmp_path / "out")}
    return subprocess.run([*command, *argv], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)


@pytest.mark.slow(seconds=480)  # every part at tiny sizes in subprocesses: a fit, evaluate.py runs, the maps
def test_the_smoke_run_writes_the_three_pages_with_headers_and_tables(tmp_path):
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pages = {name: (tmp_path / "gpu_results" / name).read_text() for name in gr.PAGES.values()}
    for name, text in pages.items():
        assert text.startswith("# ") and all(field in text for field in HEADER), name
        assert "--smoke" in text and "Did not finish" not in text, name
    assert "| part | trials | GPU s | CPU s |" in pages["gpu.md"] and "| n | L | width |" in pages["gpu.md"]
    assert "## What was verified where" in pages["gpu.md"]
    assert "## The real classifier at n = 8" in pages["gpu_words.md"]
    assert "## The continuous S of the whole encoder against n" in pages["gpu_words.md"]
    fine = pages["gpu_finetuned.md"]
    assert "| candidates | reviews finished | run |" in fine and "| k = 10 neighbours | 3 of 3 |" in fine
    assert "test accuracy" in fine
    out = sorted(os.listdir(tmp_path / "out"))
    assert out == sorted([*gr.PAGES.values(), "gpu_results.json", "gpu_results_records.tar.gz"])
    summary = json.loads((tmp_path / "out" / "gpu_results.json").read_text())
    assert [p["part"] for p in summary["parts"]] == list(gr.SHARES)
    argv = ["--runs", "gpu_results", "--reports", str(tmp_path), "--docs", str(tmp_path / "docs")]
    assert sorted(p.name for p in results_pages.main(argv)) == sorted(gr.PAGES.values())


@pytest.mark.slow(seconds=60)  # the fine-tuned part in subprocesses, stopped at once
def test_a_part_given_too_little_time_says_on_its_page_that_it_did_not_finish(tmp_path):
    """20 s for the fine-tuned part: its fit is stopped before it ends, and the page says the part did not finish."""
    proc = _run(tmp_path, "--parts", "finetuned", "--budget", "20")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = (tmp_path / "gpu_results" / "gpu_finetuned.md").read_text()
    assert all(field in text for field in HEADER)
    assert "did not finish" in text.lower() and "test accuracy" not in text
    assert not (tmp_path / "gpu_results" / "gpu.md").exists()  # only the parts asked for run
