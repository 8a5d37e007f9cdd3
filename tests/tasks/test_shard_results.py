"""What a run folder that shards wrote holds and names once a run ends: the file `results:` names, its records, no lock.

A run without `--shard` writes the whole run (every shard's trials and its own, each once, in the trials' order, each
line as a shard wrote it) into results.jsonl and names it; a shard names its own file, on disk even when its share had
nothing to run; a later shard or run reads each trial once; summary.lock goes with its last holder; and the readers of
a run's records (`run_records`, `wslight reproduce`'s report) see the shards' records.
"""

import json
import threading
from pathlib import Path

from wslight.app.cli import main
from wslight.records.results import RESULTS_NAME, ResultsFile, read_records, without_timing
from wslight.records.shards import (
    SUMMARY_LOCK_NAME,
    RunResults,
    Shard,
    run_records,
    shard_files,
    summary_lock,
    write_whole,
)


def _last_line(capsys) -> str:
    return capsys.readouterr().out.splitlines()[-1]


def _plain(records: list[dict]) -> list[dict]:
    return [without_timing(r) for r in records]


def test_a_run_without_shard_after_one_shard_writes_the_whole_run_into_the_file_it_names(tmp_path, squares, capsys):
    whole = main(["test", "--config", str(squares(trials=7, trials_per_step=2, name="whole"))], evaluate=True)
    want = _plain(read_records(whole.model.results_path))
    config = str(squares(trials=7, trials_per_step=2, name="sharded"))
    shard = main(["test", "--config", config, "--shard", "1/2"], evaluate=True)  # steps {t2 t3} {t6}
    folder = Path(shard.model.results_path).parent
    assert _last_line(capsys) == f"results: {folder / Shard(1, 2).results_name}"
    share = (folder / Shard(1, 2).results_name).read_bytes()
    assert "## Shards missing" in (folder / "summary.md").read_text()

    run = main(["test", "--config", config], evaluate=True)  # computes shard 0/2's trials, then writes the whole run
    out = capsys.readouterr().out
    assert "3 of 7 trials already in" in out and out.splitlines()[-1] == f"results: {folder / RESULTS_NAME}"
    written = read_records(folder / RESULTS_NAME)
    assert [r["trial_key"] for r in written] == [f"t{i}" for i in range(7)]  # each once, in the trials' order
    assert _plain(written) == want  # the numbers of a one-job run
    lines = (folder / RESULTS_NAME).read_bytes().splitlines(keepends=True)
    assert set(share.splitlines(keepends=True)) <= set(lines)  # the shard's lines as it wrote them
    assert (folder / Shard(1, 2).results_name).read_bytes() == share  # kept as it was
    assert not (folder / "summary.md").exists()  # the section naming shard 0/2 went (the squares write no table)
    assert _plain(run.model.merged_records()) == want
    assert not list(folder.glob("*.lock")) and not list(folder.glob(".*.tmp"))

    # a later shard finds its share done, writes nothing of the run, and names its own (empty) file
    again = main(["test", "--config", config, "--shard", "0/2"], evaluate=True)
    out = capsys.readouterr()
    assert "4 of 4 trials already in" in out.out and "shards missing" not in out.err
    own = folder / Shard(0, 2).results_name
    assert out.out.splitlines()[-1] == f"results: {own}" and own.read_bytes() == b""
    assert (folder / RESULTS_NAME).read_bytes() == b"".join(lines)
    assert _plain(again.model.merged_records()) == want
    main(["test", "--config", config], evaluate=True)  # and a run without --shard again: nothing to do or rewrite
    assert (folder / RESULTS_NAME).read_bytes() == b"".join(lines)
    assert not list(folder.glob("*.lock"))


def test_a_shard_whose_share_is_empty_names_a_file_that_exists(tmp_path, squares, capsys):
    config = str(squares(trials=2, trials_per_step=2))  # one step: shard 1/2 has none
    cli = main(["test", "--config", config, "--shard", "1/2"], evaluate=True)
    path = Path(cli.model.results_path)
    assert _last_line(capsys) == f"results: {path}"
    assert path.name == Shard(1, 2).results_name and path.read_bytes() == b""
    assert not list(path.parent.glob("*.lock"))


def _trial(key: str, value: float) -> list[dict]:
    return [{"trial_key": key, "value": value, "ratio": value / 3, "none": None}]


def test_write_whole_keeps_each_line_and_is_atomic_and_idempotent(tmp_path):
    ResultsFile(tmp_path / Shard(0, 2).results_name, "k").append(_trial("t0", 0.1) + _trial("t2", 2.7))
    ResultsFile(tmp_path / Shard(1, 2).results_name, "k").append(_trial("t1", 1e-300))
    run = RunResults(tmp_path, "k", tmp_path / RESULTS_NAME)
    assert write_whole(tmp_path, run.records(order=["t0", "t1", "t2"]))
    shard_lines = {x for p in shard_files(tmp_path) for x in p.read_bytes().splitlines()}
    whole = (tmp_path / RESULTS_NAME).read_bytes().splitlines()
    assert len(whole) == 3 and set(whole) == shard_lines  # byte for byte: no number changes
    assert [json.loads(x)["trial_key"] for x in whole] == ["t0", "t1", "t2"]
    mtime = (tmp_path / RESULTS_NAME).stat().st_mtime_ns
    assert not write_whole(tmp_path, run.records(order=["t0", "t1", "t2"]))  # holds them already: untouched
    assert (tmp_path / RESULTS_NAME).stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESULTS_NAME, *(p.name for p in shard_files(tmp_path))]


def test_run_records_reads_the_shards_and_leaves_a_folder_without_them_as_written(tmp_path):
    sharded = tmp_path / "sharded"
    ResultsFile(sharded / Shard(1, 2).results_name, "k").append(_trial("t1", 1.0))
    ResultsFile(sharded / Shard(0, 2).results_name, "k").append(_trial("t0", 0.0) + _trial("t1", 1.0))
    for given in (sharded, sharded / RESULTS_NAME, sharded / Shard(1, 2).results_name):
        assert [(r["trial_key"], r["value"]) for r in run_records(given)] == [("t0", 0.0), ("t1", 1.0)]
    plain = tmp_path / "plain" / RESULTS_NAME
    plain.parent.mkdir()
    plain.write_text('{"ws": 1.5}\n{"ws": 1.5}\n')  # hand-written records (no keys): read as they are
    assert run_records(plain) == run_records(plain.parent) == [{"ws": 1.5}, {"ws": 1.5}]
    assert run_records(tmp_path / "empty") == []


def test_the_summary_lock_goes_with_its_last_holder_and_a_waiter_locks_the_path_anew(tmp_path):
    inside: list[str] = []
    entered = threading.Event()

    def second() -> None:
        entered.set()
        with summary_lock(tmp_path):  # waits on the file the first holds, which the first removes as it lets go
            inside.append("second in")
            assert (tmp_path / SUMMARY_LOCK_NAME).exists()  # its own file, at the path
        inside.append("second out")

    with summary_lock(tmp_path):
        inside.append("first in")
        waiter = threading.Thread(target=second)
        waiter.start()
        entered.wait()
        waiter.join(timeout=0.3)
        assert waiter.is_alive() and inside == ["first in"]  # the second waits while the first holds the lock
        inside.append("first out")
    waiter.join(timeout=30)
    assert inside == ["first in", "first out", "second in", "second out"]
    assert not (tmp_path / SUMMARY_LOCK_NAME).exists()


def test_the_reproduction_report_reads_a_stage_whose_run_only_shards_wrote(tmp_path):
    from wslight.app.reproduce.plan import load_plan
    from wslight.app.reproduce.report import RunRecords

    ws = [
        {"experiment": "ws", "map": "rf", "d": 8, "n": n, "L": 1, "trial": t, "ws": 1.3 / n**0.5, "bound": 1.0}
        for n in (10, 40)
        for t in range(3)
    ]
    for r in ws:
        r.update(trial_key=f"rf/{r['n']}/{r['trial']}", ws_sqrt_n=1.3, delta_norm=8**0.5, radius=8**0.5, phi_norm=1.0)
    folder = tmp_path / "offline" / "tensorboard" / "ws_rf" / "run-k"
    for shard in Shard(0, 2).siblings():
        ResultsFile(folder / shard.results_name, "k").append(shard.take(ws))
    plan = [s for s in load_plan("offline") if s.name == "ws_rf"]
    run = RunRecords.read(tmp_path / "offline", plan)
    assert run.results["ws_rf"].parent == folder
    assert sorted(r["trial_key"] for r in run.records["ws_rf"]) == sorted(r["trial_key"] for r in ws)
