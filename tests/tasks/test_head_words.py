"""The words that flip a head trained with train.py (docs/theory.md §13.4), against a brute-force loop through it."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer

from wslight.records.results import read_records
from wslight.tasks import TrainedHeadWords, TrainedRun

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
