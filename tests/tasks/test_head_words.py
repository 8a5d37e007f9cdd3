"""The words that flip a head trained with train.py, against a brute-force loop through it.

See docs/theory/words.md §13.4.
"""

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer

from wslight.records.results import read_records
from wslight.tasks import TrainedHeadWords, TrainedRun
from wslight.tasks.trained_head_words import recall_note, recall_text, screen_note, screen_recall

ROOT = Path(__file__).resolve().parents[2]
N, D = 8, 32


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A gradient fit of RAF's head with a bias on 60 bundled reviews (n = 8, d = 32, 20 epochs), with checkpoints."""
    out = tmp_path_factory.mktemp("trained")
    command = [sys.executable, str(ROOT / "train.py"), "fit", "--config", str(ROOT / "configs" / "raf_gradient.yaml")]
    command += ["--trainer.max_epochs", "20", "--lr_scheduler.init_args.T_max", "20"]
    command += ["--data.init_args.embeddings.num_samples", "60", "--data.init_args.n", str(N)]
    command += ["--data.init_args.d", str(D), "--model.init_args.bias", "true", "--trainer.accelerator", "cpu"]
    command += ["--trainer.default_root_dir", str(out), "--trainer.logger.init_args.save_dir", str(out)]
    command += ["--trainer.enable_progress_bar", "false", "--data.init_args.embeddings.cache_dir", str(out / "cache")]
    callbacks = out / "callbacks.yaml"  # the config's checkpoint, and the words of the fitted head after the fit
    callbacks.write_text(
        "trainer:\n  callbacks:\n"
        "    - {class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: {save_last: true}}\n"
        "    - {class_path: wslight.tasks.HeadWordFlips, init_args: {reviews: 2, positions: [1, 4, 7]}}\n"
    )
    command += ["--config", str(callbacks)]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=out, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next(out.glob("*/version_0"))


def brute_force(run: TrainedRun, words, X: torch.Tensor, ids: torch.Tensor, i: int) -> tuple[int, float]:
    """Flips of sign(f) and the largest relative change of phi over the admissible words, through the full forward."""
    model = copy.deepcopy(run.model).double()
    allowed, _ = words.admissible(ids, i)
    rows = words.rows(i, D).double()[allowed]  # (V', d)
    Xw = X.double().repeat(len(rows), 1, 1)
    Xw[:, i] = rows
    with torch.no_grad():
        out, out0 = model(Xw), model(X.double())
        phi, phi0 = model.feature_map(Xw), model.feature_map(X.double())
    flips = int((torch.sign(out) != torch.sign(out0)).sum())
    return flips, float(((phi - phi0).norm(dim=-1) / phi0.norm()).max())


def test_every_position_of_a_trained_heads_reviews_equals_the_brute_force(trained, tmp_path, cpu_trainer):
    evaluation = TrainedHeadWords(str(trained), reviews=2, positions=[1, 4, 7], output_dir=str(tmp_path))
    run = evaluation.trained
    assert run.bias != 0.0 and run.theta.shape == (N * D,)
    Trainer(**cpu_trainer.kwargs, logger=False).test(evaluation)
    records = read_records(tmp_path / "results.jsonl")
    assert "flip_rate" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "head_words_flips.png").is_file() and (tmp_path / "head_words_flips.pdf").is_file()
    assert {r["trial"] for r in records} == {0, 1} and {r["position"] for r in records} <= {1, 4, 7}
    flipped_somewhere = False
    for r in records:
        index = int(run.test_indices[r["trial"]])
        X, y = evaluation.store.samples([index], N, D)
        ids = evaluation.store.input_ids([index])[0]
        flips, best = brute_force(run, evaluation.words, X, ids, r["position"])
        assert r["flips"] == flips and r["flipped"] == (flips > 0)
        assert r["ws_words"] == pytest.approx(best, rel=1e-6)
        assert r["margin"] == pytest.approx(float(y[0]) * r["output"])
        if r["flipped"]:  # the strongest flipping word does flip the trained model
            flipped_somewhere = True
            assert r["flip_output"] * r["output"] < 0
    assert all(r["sample_id"] == int(evaluation.store.sample_ids[run.test_indices[r["trial"]]]) for r in records)
    assert flipped_somewhere  # a head trained on 42 reviews is flipped by some word (these draws: at every position)


def test_the_callback_after_the_fit_gives_the_records_of_the_run_read_back(trained, tmp_path, cpu_trainer):
    """`HeadWordFlips` on the model in memory equals `TrainedHeadWords` on its files (config.yaml, last.ckpt)."""
    evaluation = TrainedHeadWords(str(trained), reviews=2, positions=[1, 4, 7], output_dir=str(tmp_path))
    Trainer(**cpu_trainer.kwargs, logger=False).test(evaluation)
    read_back = read_records(tmp_path / "results.jsonl")
    in_memory = read_records(trained / "head_words.jsonl")
    assert len(in_memory) == len(read_back) > 0
    for a, b in zip(in_memory, sorted(read_back, key=lambda r: (r["trial"], r["position"]))):
        for key in ("trial", "position", "sample_id", "flips", "flip_word", "ws_words", "word", "output", "margin"):
            assert a[key] == b[key], key


def test_a_run_without_its_files_is_refused_naming_what_is_missing(trained, tmp_path):
    with pytest.raises(ValueError, match=r"run: .* holds no config.yaml: give the log folder train.py printed"):
        TrainedRun.load(tmp_path)
    with pytest.raises(ValueError, match=r"checkpoint: .*nope.ckpt does not exist; it has .*last.ckpt"):
        TrainedRun.load(trained, "nope.ckpt")


def test_a_screened_run_reports_only_real_flips_and_measures_its_recall_against_the_exact_one(
    trained, tmp_path, cpu_trainer
):
    """With `screen`, each checked word is checked exactly: flips <= the exact count, and the summary gives the recall.

    A screen as wide as the vocabulary checks every admissible word: then the records equal the exact run's.
    """
    evaluation = TrainedHeadWords(
        str(trained), reviews=2, positions=[1, 4, 7], screen=50, recall_reviews=2, output_dir=str(tmp_path / "s")
    )
    Trainer(**cpu_trainer.kwargs, logger=False).test(evaluation)
    records = read_records(tmp_path / "s" / "results.jsonl")
    assert records and all(r["checked"] == min(50, r["admissible"]) for r in records)
    assert all(r["admissible"] > 50 for r in records)  # the admissible count, not the checked one
    summary = (tmp_path / "s" / "summary.md").read_text()
    assert "up to 50 words checked per position" in summary and "(lower bounds)" in summary
    assert all(r["flips"] <= r["exact_flips"] and r["flipped"] <= r["exact_flipped"] for r in records)
    assert all(r["ws_words"] <= r["exact_ws_words"] * (1 + 1e-12) for r in records)
    for r in records:
        if r["flipped"]:  # the strongest screened flip is a real one, through the trained model
            assert r["flip_output"] * r["output"] < 0
    assert sum(r["flips"] for r in records) > 0 and "recall" in (tmp_path / "s" / "summary.md").read_text()
    wide = TrainedHeadWords(str(trained), reviews=2, positions=[1, 4, 7], screen=10**6, output_dir=str(tmp_path / "w"))
    Trainer(**cpu_trainer.kwargs, logger=False).test(wide)
    exact = {(r["trial"], r["position"]): r for r in records}
    for r in read_records(tmp_path / "w" / "results.jsonl"):
        e = exact[(r["trial"], r["position"])]
        assert r["flips"] == e["exact_flips"] and r["flipped"] == e["exact_flipped"]
        assert r["ws_words"] == pytest.approx(e["exact_ws_words"], rel=1e-12)
        assert r["checked"] == r["admissible"] == e["admissible"]  # every admissible word, and no more
    summary = (tmp_path / "w" / "summary.md").read_text()  # what was checked, not the screen's width
    assert "1000000 words checked" not in summary and "(lower bounds)" not in summary
    assert "covers every admissible word" in summary and "The check is exhaustive" in summary


def test_the_summary_says_how_many_words_a_screen_checked_and_whether_that_was_all():
    def record(admissible: int, checked: int) -> dict:
        return {"admissible": admissible, "checked": checked}

    wide = screen_note([record(23693, 23693), record(23690, 23690)], 100000, 64)
    assert "23690 to 23693 words checked per position (all the admissible ones)" in wide
    assert "exhaustive" in wide and "100000 words checked" not in wide and "(lower bounds)" not in wide
    narrow = screen_note([record(23693, 32), record(20, 20)], 32, 64)
    assert "up to 32 words checked per position" in narrow and "52 of 23713 admissible" in narrow
    assert "at 1 of 2 positions the screen covered every admissible word" in narrow and "(lower bounds)" in narrow


def test_a_recall_of_nothing_reads_nothing_to_recall_not_one():
    """No position flips over the whole vocabulary: the recall is 0 of 0, not 1.000."""
    records = [
        {"flipped": False, "flips": 0, "exact_flipped": False, "exact_flips": 0},
        {"flipped": False, "flips": 0, "exact_flipped": False, "exact_flips": 0},
    ]
    recall = screen_recall(records)
    assert recall is not None and math.isnan(recall["position_recall"]) and math.isnan(recall["word_recall"])
    note = recall_note(recall, 1)
    assert "0 of 0 flipped positions found (nothing to recall)" in note
    assert "0 of 0 flipping words (nothing to recall)" in note and "1.000" not in note
    found = screen_recall([{"flipped": True, "flips": 2, "exact_flipped": True, "exact_flips": 4}])
    assert "1 of 1 flipped positions found (recall 1.000)" in recall_note(found, 1)
    assert "2 of 4 flipping words (recall 0.500)" in recall_note(found, 1)
    assert recall_text(float("nan")) == "nothing to recall" and recall_text(0.5) == "0.500"  # benchmark tables too


def test_repeated_positions_are_evaluated_once_with_a_note(trained, capsys):
    evaluation = TrainedHeadWords(str(trained), reviews=1, positions=[4, 1, 4])
    assert evaluation.positions == [4, 1]
    assert "note: positions repeats 4 (given [4, 1, 4]): each is evaluated once" in capsys.readouterr().err


def test_a_run_under_tilde_is_read_from_the_home_folder(trained, monkeypatch):
    monkeypatch.setenv("HOME", str(trained.parent))
    assert TrainedHeadWords(f"~/{trained.name}", reviews=1, positions=[1]).run == str(trained)


def test_recall_reviews_needs_a_screen(trained):
    with pytest.raises(ValueError, match=r"recall_reviews: 1 measures a screen's recall; set screen too"):
        TrainedHeadWords(str(trained), reviews=2, recall_reviews=1)
    with pytest.raises(ValueError, match=r"screen must be a positive integer or None, got 0"):
        TrainedHeadWords(str(trained), reviews=2, screen=0)
    with pytest.raises(ValueError, match=r"screen_centroids must be .*got -2"):
        TrainedHeadWords(str(trained), reviews=2, screen=4, screen_centroids=-2)
