"""Fine-tuning a sequence classifier end to end: the held-out split, the Hugging Face export, reading it back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_classifiers import tiny_bert_classifier

from wslight.app.cli import main
from wslight.data.review_texts import SPLIT_FILE, TextSplit, read_labelled_texts

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_split_is_disjoint_seeded_and_sized():
    split = TextSplit(test_size=2000, val_size=500, train_size=None, seed=3)
    rows = {s: split.rows(s) for s in ("train", "val", "test")}
    assert [len(rows[s]) for s in ("test", "val", "train")] == [2000, 500, 25000 - 2500]
    assert len(np.unique(np.concatenate(list(rows.values())))) == 25000  # disjoint, and every row used
    assert np.array_equal(TextSplit(test_size=2000, val_size=500, seed=3).rows("test"), rows["test"])
    assert not np.array_equal(TextSplit(test_size=2000, val_size=500, seed=4).rows("test"), rows["test"])
    _, labels, _ = split.texts("test")
    assert 0.45 < labels.mean() < 0.55  # a random split of a balanced source is about balanced


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"test_size": 24999}, "test_size must be an integer in [1, 24998] (imdb_offline holds 25000 reviews)"),
        ({"train_size": 30000}, "train_size must be an integer in [1, 21500] or None (the rows left for training)"),
        ({"source": "imdb"}, "source must be one of"),
    ],
)
def test_the_split_refuses_sizes_the_source_cannot_hold(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TextSplit(**fields)


def test_a_users_file_of_reviews(tmp_path):
    good = tmp_path / "r.csv"
    good.write_text('text,label\n"fine, really",1\nbad,0\n')
    texts, labels = read_labelled_texts(good)
    assert texts == ["fine, really", "bad"] and labels.tolist() == [1, 0]
    bad = tmp_path / "r.jsonl"
    bad.write_text('{"text": "ok", "label": "positive"}\n')
    with pytest.raises(ValueError, match=r"the label at .*r.jsonl:1 must be an integer >= 0"):
        read_labelled_texts(bad)
    (tmp_path / "r.txt").write_text("x")
    with pytest.raises(ValueError, match=r"must end in .jsonl or .csv, got '.txt'"):
        read_labelled_texts(tmp_path / "r.txt")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny BERT fine-tuned for one short epoch by train.py on the finetune config: the finished CLI."""
    tmp = tmp_path_factory.mktemp("finetune")
    model = tiny_bert_classifier(tmp / "tiny")
    args = ["fit", "--config", "configs/finetune/imdb.yaml", "--model.init_args.model", str(model)]
    for key, value in {"train_size": 32, "val_size": 16, "test_size": 16, "max_length": 32, "batch_size": 8}.items():
        args += [f"--data.init_args.{key}", str(value)]
    args += ["--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", str(tmp / "logs")]
    return main(args)


def test_the_export_is_the_tested_model_and_pipeline_reads_it(fitted):
    from transformers import pipeline

    folder = fitted.trainer.log_dir + "/huggingface"
    text = "A tender, funny film."
    classify = pipeline("text-classification", model=folder, device="cpu", top_k=None)
    scores = {s["label"]: s["score"] for s in classify([text])[0]}
    assert set(scores) == {"negative", "positive"}
    module = fitted.model.eval()
    batch = module.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        probs = module(**batch).softmax(-1)[0]
    assert [scores["negative"], scores["positive"]] == pytest.approx(probs.tolist(), abs=1e-6)
    recorded = json.loads(Path(folder, SPLIT_FILE).read_text())
    assert recorded == {
        "source": "imdb_offline",
        "test_size": 16,
        "val_size": 16,
        "train_size": 32,
        "seed": 0,
        "max_length": 32,
    }
    assert "test/acc" in fitted.trainer.callback_metrics


def test_the_words_evaluation_reads_the_runs_own_held_out_reviews(fitted):
    from wslight.tasks.classifier_words import ClassifierWords

    words = ClassifierWords(model=fitted.trainer.log_dir, num_reviews=None, k=2)
    split = TextSplit(test_size=16, val_size=16, train_size=32)
    assert words.max_length == 32 and "its own held-out split" in words.source
    assert np.array_equal(words.sample_ids, split.rows("test"))
    assert not set(words.sample_ids) & set(split.rows("train"))
