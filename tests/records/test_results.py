"""results.jsonl: atomic appends, resume by trial key, run keys that never mix, torn lines, strict JSON."""

import json
import math

import pytest

from wslight.records.results import CorruptResults, ResultsFile, config_key, read_records


def test_append_skips_finished_and_duplicate_trials(tmp_path):
    rf = ResultsFile(tmp_path / "r.jsonl", "k1")
    assert rf.append([{"trial_key": "a", "v": 1}, {"trial_key": "a", "v": 99}, {"trial_key": "b", "v": 2}]) == 2
    assert rf.append([{"trial_key": "b", "v": 3}, {"trial_key": "c", "v": 4}]) == 1
    assert {r["trial_key"]: r["v"] for r in rf.records()} == {"a": 1, "b": 2, "c": 4}


def test_other_run_key_does_not_count_as_finished(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsFile(path, "k1").append([{"trial_key": "a", "v": 1}])
    other = ResultsFile(path, "k2")
    assert other.finished_keys() == set()
    other.append([{"trial_key": "a", "v": 2}])
    assert [r["v"] for r in ResultsFile(path, "k1").records()] == [1]
    assert [r["v"] for r in other.records()] == [2]


def test_torn_last_line_is_dropped_with_warning_and_repaired(tmp_path):
    path = tmp_path / "r.jsonl"
    rf = ResultsFile(path, "k")
    rf.append([{"trial_key": "a", "v": 1}, {"trial_key": "b", "v": 2}])
    full = path.read_bytes()
    path.write_bytes(full[:-7])  # cut inside the last record, as a crash mid-write would
    with pytest.warns(UserWarning, match="torn last line"):
        assert [r["trial_key"] for r in rf.records()] == ["a"]
    with pytest.warns(UserWarning, match="torn last line"):
        rf.append([{"trial_key": "b", "v": 2}])
    lines = path.read_text().splitlines()
    assert [json.loads(x)["trial_key"] for x in lines] == ["a", "b"]  # no glued line, no garbage


def test_corrupt_line_in_the_middle_raises(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"trial_key": "a"}\nnot json\n{"trial_key": "b"}\n')
    with pytest.raises(CorruptResults, match="line 2 of 3 is not a JSON record"):
        read_records(path)


def test_non_finite_numbers_become_null(tmp_path):
    rf = ResultsFile(tmp_path / "r.jsonl", "k")
    rf.append([{"trial_key": "a", "v": math.nan, "w": [1.0, math.inf]}])
    text = (tmp_path / "r.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["v"] is None


def test_config_key_is_order_independent_and_sensitive():
    assert config_key({"a": 1, "b": [1, 2]}) == config_key({"b": [1, 2], "a": 1})
    assert config_key({"a": 1}) != config_key({"a": 2})


def test_a_trial_with_several_records_counts_only_when_complete(tmp_path):
    path = tmp_path / "r.jsonl"
    rf = ResultsFile(path, "k")
    rf.append([{"trial_key": "t", "record_key": f"t/{i}", "v": i} for i in range(3)])
    assert rf.finished_keys() == {"t"} and len(rf.records()) == 3
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n")  # a trial cut short (e.g. killed between lines)
    assert rf.finished_keys() == set() and rf.records() == []
    rf.append([{"trial_key": "t", "record_key": f"t/{i}", "v": i} for i in range(3)])
    assert sorted(r["v"] for r in rf.records()) == [0, 1, 2]
