"""The classifier words evaluation as a user runs it (evaluate.py), and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_classifiers import tiny_bert_classifier, tiny_causal_lm

from wslight.app.cli import main
from wslight.records.results import read_records

pytestmark = pytest.mark.usefixtures("one_thread")
CONFIG = "configs/words/classifier.yaml"
REVIEWS = [
    {"text": "A dull plot, and the acting is worse.", "label": 0},
    {"text": "The music is lovely and I smiled twice.", "label": 1},
    {"text": "Not good, not bad: a film you forget at once.", "label": 0},
]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return tiny_bert_classifier(tmp_path_factory.mktemp("bert"))


@pytest.fixture
def reviews(tmp_path):
    path = tmp_path / "reviews.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in REVIEWS))
    return path


def evaluate(tmp_path, cpu_trainer, capsys, **settings):
    """Run the config with the tiny CPU trainer and these model settings: (results path, its records)."""
    args = [
        "test",
        "--config",
        CONFIG,
        *cpu_trainer.args,
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "logs"),
    ]
    for key, value in settings.items():
        args += [f"--model.init_args.{key}", value if isinstance(value, str) else json.dumps(value)]
    path = main(args, evaluate=True).model.results_path
    return path, read_records(path)


def test_reviews_positions_and_summary_agree(bert, reviews, tmp_path, cpu_trainer, capsys):
    path, records = evaluate(tmp_path, cpu_trainer, capsys, model=str(bert), reviews=str(reviews), num_reviews=3, k=8)
    positions = [r for r in records if r["kind"] == "position"]
    per_review = [r for r in records if r["kind"] == "review"]
    assert len(per_review) == 3
    for review in per_review:
        mine = [r for r in positions if r["trial"] == review["trial"]]
        assert review["positions"] == len(mine) > 0
        flipped = sum(r["status"] == "flipped" for r in mine)
        assert review["flipped_positions"] == flipped
        expected = "wrong" if review["pred"] != review["label"] else ("attacked" if flipped else "robust")
        assert review["status"] == expected
        assert review["forwards"] == 1 + sum(r["checked"] for r in mine)
    assert all(r["checked"] + r["not_one_token"] == 8 for r in positions)
    assert all((r["flips"] > 0) == (r["status"] == "flipped") for r in positions)
    summary = Path(path).with_name("summary.md").read_text()
    robust = sum(r["status"] == "robust" for r in per_review) / 3
    assert f"| 3 | {sum(r['status'] != 'wrong' for r in per_review) / 3:.4g} | {robust:.4g} |" in summary
    assert Path(path).with_name("classifier_flips.png").is_file()
    # the same command again resumes: nothing is recomputed
    _, again = evaluate(tmp_path, cpu_trainer, capsys, model=str(bert), reviews=str(reviews), num_reviews=3, k=8)
    assert len(again) == len(records)


def test_screened_vocabulary_flips_are_real_and_recall_is_measured(bert, reviews, tmp_path, cpu_trainer, capsys):
    path, records = evaluate(
        tmp_path,
        cpu_trainer,
        capsys,
        model=str(bert),
        reviews=str(reviews),
        num_reviews=1,
        candidates="vocabulary",
        screen=4,
        recall_reviews=1,
        positions_per_review=3,
        batch_size=512,
    )
    positions = [r for r in records if r["kind"] == "position"]
    assert len(positions) == 3
    assert all(r["checked"] <= 4 and r["exhaustive_checked"] > 1000 for r in positions)
    assert all(r["exhaustive_flips"] >= r["flips"] for r in positions)  # a flip the screen finds is real
    assert all(r["status"] in ("flipped", "not found") for r in positions)  # a screen certifies nothing
    assert "The screen against the whole vocabulary on 3 positions" in Path(path).with_name("summary.md").read_text()


def test_a_users_substitutes(bert, reviews, tmp_path, cpu_trainer, capsys):
    table = tmp_path / "subs.json"
    table.write_text(json.dumps({"dull": ["boring", "xylophonist", "dull"], "lovely": ["awful"]}))
    _, records = evaluate(
        tmp_path,
        cpu_trainer,
        capsys,
        model=str(bert),
        reviews=str(reviews),
        num_reviews=2,
        candidates="file",
        substitutes=str(table),
    )
    by_word = {r["word"]: r for r in records if r["kind"] == "position"}
    assert by_word["dull"]["checked"] == 1 and by_word["dull"]["not_one_token"] == 1  # boring; not xylophonist
    assert by_word["lovely"]["checked"] == 1
    assert by_word["plot"]["status"] == "no candidates"


def test_a_prompt_classifier(tmp_path, reviews, cpu_trainer, capsys):
    llama = tiny_causal_lm(tmp_path / "llama")
    _, records = evaluate(
        tmp_path,
        cpu_trainer,
        capsys,
        model=str(llama),
        reviews=str(reviews),
        num_reviews=1,
        k=3,
        prompt_template="Review: {text} Is it positive?",
        answers='[" no", " yes"]',
    )
    positions = [r for r in records if r["kind"] == "position"]
    assert [r["word"] for r in positions] == ["A", "dull", "plot", "and", "the", "acting", "is", "worse"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"candidates": "file"}, "substitutes: candidates 'file' needs a JSON file"),
        ({"recall_reviews": 1}, "recall_reviews: 1 measures the screen's recall"),
        ({"reviews": "nowhere.txt"}, "reviews: 'nowhere.txt' is not a file"),
        ({"num_reviews": 9}, "num_reviews must be an integer in [1, 3] (the reviews), got 9"),
    ],
)
def test_refusals_name_the_key(settings, message, bert, reviews, cli_fails, cpu_trainer, tmp_path):
    args = ["test", "--config", CONFIG, *cpu_trainer.args, "--trainer.logger.init_args.save_dir", str(tmp_path)]
    args += ["--model.init_args.model", str(bert), "--model.init_args.reviews", str(reviews)]
    for key, value in settings.items():
        args += [f"--model.init_args.{key}", str(value)]
    assert message in cli_fails(args, evaluate=True)


def test_a_folder_that_is_no_model(tmp_path, cli_fails, cpu_trainer):
    (tmp_path / "notes.txt").write_text("x")
    args = ["test", "--config", CONFIG, *cpu_trainer.args, "--model.init_args.model", str(tmp_path)]
    err = cli_fails(args, evaluate=True)
    assert "is a folder without a config.json" in err and "notes.txt" in err
