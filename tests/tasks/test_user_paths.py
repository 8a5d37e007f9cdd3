"""A path setting that starts with `~` is under the home folder, as in a shell, never a folder named `~` here."""

from pathlib import Path

import pytest
from dummy_evaluation import SquaresEvaluation
from lightning.pytorch import Trainer

from wslight.base.paths import user_path
from wslight.data.cache import cache_root
from wslight.data.encoders import resolve_encoder
from wslight.records.results import read_records
from wslight.tasks.probes import LayerwiseChangeProbe


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A home folder of the test's own, and a working directory apart from it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return home


def test_user_path_expands_a_leading_tilde_and_keeps_anything_else(home):
    assert user_path("~/runs/a") == str(home / "runs" / "a")
    assert user_path(Path("~") / "x") == str(home / "x")
    assert user_path("~") == str(home)
    assert user_path(None) is None
    assert user_path("runs/~a") == "runs/~a" and user_path("s3://bucket/x") == "s3://bucket/x"


def test_an_evaluations_output_dir_under_tilde_writes_in_the_home_folder(home, cpu_trainer):
    evaluation = SquaresEvaluation(trials=3, output_dir="~/squares")
    assert evaluation.out_dir == home / "squares"
    Trainer(**cpu_trainer.kwargs, logger=False).test(evaluation)
    assert [r["value"] for r in read_records(home / "squares" / "results.jsonl")] == [0, 1, 4]
    assert not (Path.cwd() / "~").exists()  # no folder named ~ in the working directory


def test_the_embedding_cache_and_an_encoder_folder_under_tilde_are_in_the_home_folder(home, monkeypatch):
    assert cache_root("~/cache") == home / "cache"
    monkeypatch.setenv("WSLIGHT_CACHE", "~/env-cache")
    assert cache_root() == home / "env-cache"
    assert resolve_encoder("~/encoders/mine") == str(home / "encoders" / "mine")
    assert resolve_encoder("bert-base-uncased") == "bert-base-uncased"  # a hub id is no path


def test_a_probe_text_file_under_tilde_is_read_from_the_home_folder(home):
    (home / "review.txt").write_text("a fine film", encoding="utf-8")
    probe = LayerwiseChangeProbe(text_file="~/review.txt")
    assert probe.kwargs["text"] == "a fine film"
