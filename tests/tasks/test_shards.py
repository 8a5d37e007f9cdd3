"""Shards (`--shard i/N`): independent jobs of one evaluation writing into one run folder, merged on disk.

The split (every N-th step, the same on every machine, balanced), the merge of the folder's results files (each
finished trial once, in the trials' order, another shard's write in progress skipped quietly), the section of
summary.md naming the missing shards, the refusals (a bad value before any work, a second writer of the other kind);
then, in subprocesses, three shards of a tiny word-sensitivity sweep started at different times, one stopped by SIGTERM
and restarted, whose merged records and summary equal a one-job run's.
"""

import json
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from wslight.app.cli import main
from wslight.app.errors import UsageError
from wslight.app.shard_option import take_shard
from wslight.records.results import LOCK_NAME, RESULTS_NAME, ResultsFile, RunFolderBusy, RunLock, without_timing
from wslight.records.shards import (
    MISSING_HEADING,
    RunResults,
    Shard,
    missing_shards,
    note_missing,
    parse_shard,
    results_files,
    shard_of_file,
    take_run_lock,
)

ROOT = Path(__file__).resolve().parents[2]


# --- the split ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, shard", [("0/1", Shard(0, 1)), ("1/3", Shard(1, 3)), (" 2 / 3 ", Shard(2, 3))])
def test_parse_shard_reads_i_of_n(text, shard):
    assert parse_shard(text) == shard
    assert str(shard) == f"{shard.index}/{shard.count}"


@pytest.mark.parametrize(
    "text, message",
    [
        ("3/3", "shard: 3/3: i must be below N"),
        ("5/2", "shard: 5/2: i must be below N"),
        ("0/0", "shard: 0/0: N must be at least 1"),
        ("-1/3", "shard: -1/3: give i/N"),
        ("1of3", "shard: 1of3: give i/N"),
        ("1.5/3", "shard: 1.5/3: give i/N"),
    ],
)
def test_parse_shard_refuses_a_bad_value_naming_key_and_value(text, message):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.")):
        parse_shard(text)


@pytest.mark.parametrize("count, items", [(1, 7), (3, 16), (3, 2), (4, 17)])
def test_the_shares_partition_the_items_and_balance(count, items):
    shares = [Shard(i, count).take(list(range(items))) for i in range(count)]
    assert sorted(x for share in shares for x in share) == list(range(items))  # none lost, none twice
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert shares == [Shard(i, count).take(list(range(items))) for i in range(count)]  # the same split every time


def test_shard_file_names_round_trip():
    shard = Shard(1, 3)
    assert shard.results_name == "results.shard-1-of-3.jsonl" and shard.lock_name == "results.shard-1-of-3.lock"
    assert shard_of_file(Path("/x") / shard.results_name) == shard
    assert shard_of_file("results.jsonl") is None and shard_of_file("results.shard-3-of-3.jsonl") is None


def test_the_command_line_takes_the_shard_out_of_the_config_args():
    args, shard = take_shard(["test", "--config", "c.yaml", "--shard", "2/3", "--seed_everything", "1"], True)
    assert shard == Shard(2, 3) and args == ["test", "--config", "c.yaml", "--seed_everything", "1"]
    assert take_shard(["--shard=0/2"], True) == ([], Shard(0, 2))
    assert take_shard(["--config", "c.yaml"], True) == (["--config", "c.yaml"], None)
    for bad, message in [
        (["--shard", "3/3"], "shard: 3/3: i must be below N"),
        (["--shard"], "--shard needs a value"),
        (["--shard", "0/2", "--shard", "1/2"], "given 2 times"),
    ]:
        with pytest.raises(UsageError, match=message):
            take_shard(bad, True)
    with pytest.raises(UsageError, match="only an evaluation"):
        take_shard(["fit", "--shard", "0/2"], False)


# --- the merge -------------------------------------------------------------------------------------------------------
def _trial(key: str, value: float, size: int = 1) -> list[dict]:
    return [{"trial_key": key, "record_key": f"{key}/{j}", "value": value + j, "seconds": 0.1} for j in range(size)]


def test_the_merge_keeps_each_finished_trial_once_in_the_trials_order(tmp_path):
    ResultsFile(tmp_path / RESULTS_NAME, "k").append(_trial("t4", 4.0))
    ResultsFile(tmp_path / Shard(0, 2).results_name, "k").append(_trial("t0", 0.0, 2) + _trial("t2", 2.0, 2))
    ResultsFile(tmp_path / Shard(1, 2).results_name, "k").append(_trial("t1", 1.0, 2))
    # the same trial again in another split's file (a re-split run): read once
    ResultsFile(tmp_path / Shard(0, 3).results_name, "k").append(_trial("t2", 2.0, 2) + _trial("t3", 3.0))
    ResultsFile(tmp_path / Shard(2, 3).results_name, "other").append(_trial("t5", 5.0))  # another run's key
    run = RunResults(tmp_path, "k", tmp_path / Shard(0, 2).results_name)
    assert [p.name for p in results_files(tmp_path)] == [
        RESULTS_NAME,
        "results.shard-0-of-2.jsonl",
        "results.shard-1-of-2.jsonl",
        "results.shard-0-of-3.jsonl",
        "results.shard-2-of-3.jsonl",
    ]
    order = ["t0", "t1", "t2", "t3", "t4", "t5"]
    got = [(r["trial_key"], r["value"]) for r in run.records(order)]
    assert got == [("t0", 0.0), ("t0", 1.0), ("t1", 1.0), ("t1", 2.0), ("t2", 2.0), ("t2", 3.0), ("t3", 3.0), ("t4", 4)]
    assert run.finished_keys() == {"t0", "t1", "t2", "t3", "t4"}
    with pytest.raises(Exception, match="holds records of another run"):
        run.check_single_run()


def test_another_shards_write_in_progress_is_skipped_quietly_and_an_unfinished_trial_not_counted(tmp_path):
    own = tmp_path / Shard(0, 2).results_name
    ResultsFile(own, "k").append(_trial("t0", 0.0))
    other = tmp_path / Shard(1, 2).results_name
    ResultsFile(other, "k").append(_trial("t1", 1.0))
    half = json.dumps({**_trial("t3", 3.0, 2)[0], "trial_size": 2, "run_key": "k"})
    with open(other, "a") as f:  # a whole line of a two-record trial, then half a line: a write under way
        f.write(half + "\n" + half[:20])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn-line warning for a file another process is appending to
        keys = RunResults(tmp_path, "k", own).finished_keys()
    assert keys == {"t0", "t1"}
    assert other.read_text().endswith(half[:20])  # another's file is never repaired


def test_missing_shards_are_named_in_summary_md_and_the_section_goes_once_none_is(tmp_path):
    shares = {Shard(0, 3): ["a", "d"], Shard(1, 3): ["b", "e"], Shard(2, 3): ["c"]}
    missing = missing_shards(shares, {"a", "d", "b", "c"})
    assert missing == {Shard(1, 3): (1, 2)}
    summary = tmp_path / "summary.md"
    summary.write_text("| table |\n")
    note_missing(summary, missing, tmp_path)
    note_missing(summary, missing, tmp_path)  # again: one section, replaced
    text = summary.read_text()
    assert text.startswith("| table |\n") and text.count(MISSING_HEADING) == 1 and "1/3 (1 of 2 trials)" in text
    note_missing(summary, {}, tmp_path)
    assert summary.read_text() == "| table |\n"


# --- runs of the squares evaluation, in process -------------------------------------------------------------------
def _records(folder: Path, run_key: str) -> list[dict]:
    """The merged records of a run folder without their seconds, by trial."""
    merged = RunResults(folder, run_key, folder / RESULTS_NAME).records()
    return sorted((without_timing(r) for r in merged), key=lambda r: r["trial_key"])


def test_two_shards_in_process_give_the_records_of_one_job(tmp_path, squares, capsys):
    whole = main(["test", "--config", str(squares(trials=7, trials_per_step=2, name="whole"))], evaluate=True)
    config = str(squares(trials=7, trials_per_step=2, name="sharded"))
    shards = [main(["test", "--config", config, "--shard", f"{i}/2"], evaluate=True) for i in (1, 0)]
    folder = Path(shards[0].model.results_path).parent
    assert {cli.model.run_key for cli in shards} == {whole.model.run_key}  # the shard is not in the run key
    assert {Path(cli.model.results_path).parent for cli in shards} == {folder}  # one run folder
    assert Path(shards[0].model.results_path).name == "results.shard-1-of-2.jsonl"
    err = capsys.readouterr().err
    # steps {t0 t1} {t2 t3} {t4 t5} {t6}: shard 0/2 runs the first and third, shard 1/2 ran first
    assert "shards missing" in err and "0/2 (4 of 4 trials)" in err
    assert [r["trial_key"] for r in shards[1].model.merged_records()] == [f"t{i}" for i in range(7)]
    assert not (folder / RESULTS_NAME).exists()
    # a run without --shard finds every trial on disk and computes nothing
    again = main(["test", "--config", config], evaluate=True)
    out = capsys.readouterr().out
    assert "7 of 7 trials already in" in out
    # ... and writes them into results.jsonl, the file it names: every trial once, in the trials' order
    assert out.splitlines()[-1] == f"results: {folder / RESULTS_NAME}"
    assert [r["trial_key"] for r in ResultsFile(folder / RESULTS_NAME, again.model.run_key).records()] == [
        f"t{i}" for i in range(7)
    ]
    assert not list(folder.glob("*.lock"))  # every lock file removed by its holder, summary.lock too
    key = whole.model.run_key
    want = _records(Path(whole.model.results_path).parent, key)
    assert _records(folder, key) == want and len(want) == 7
    assert [without_timing(r) for r in again.model.merged_records()] == [without_timing(r) for r in want]


def test_a_bad_shard_is_refused_before_any_work(tmp_path, squares, cli_fails):
    err = cli_fails(["test", "--config", str(squares()), "--shard", "3/3"], evaluate=True)
    assert "shard: 3/3: i must be below N" in err
    assert not (tmp_path / "logs").exists()


def test_a_shard_and_the_whole_run_refuse_to_write_the_folder_together(tmp_path):
    from dummy_evaluation import SquaresEvaluation

    evaluation = SquaresEvaluation(output_dir=str(tmp_path))
    evaluation.shard = Shard(0, 2)
    whole = RunLock(tmp_path)  # the run without --shard, as another process holds it (flock: per open file)
    whole.acquire()
    try:
        with pytest.raises(RunFolderBusy, match="this run without --shard"):
            take_run_lock(tmp_path, evaluation.shard)
        assert not (tmp_path / Shard(0, 2).lock_name).exists()  # its own lock given back
    finally:
        whole.release()
    take_run_lock(tmp_path, evaluation.shard).release()  # free now
    shard = RunLock(tmp_path, Shard(1, 2).lock_name)
    shard.acquire()
    (tmp_path / Shard(1, 2).results_name).write_text("")
    evaluation.shard = None
    try:
        with pytest.raises(RunFolderBusy, match="shard 1/2 of this run"):
            take_run_lock(tmp_path, evaluation.shard)
        assert not (tmp_path / LOCK_NAME).exists()
        other = SquaresEvaluation(output_dir=str(tmp_path))
        other.shard = Shard(0, 2)  # another shard of the split: writes beside it
        take_run_lock(tmp_path, other.shard).release()
    finally:
        shard.release()


# --- three shards in subprocesses ------------------------------------------------------------------------------------
WS = {  # the tiny word-sensitivity sweep of tests/tasks/test_resume_sweep.py, 8 trials a cell: 32 trials, one a step
    "grid.maps": ["rf", "raf"],
    "grid.d_values": [8],
    "grid.n_values": [4, 8],
    "grid.trials": 8,
    "search.chains_per_round": 4,
    "search.max_steps": 40,
    "seed": 5,
    "embeddings.max_length": 16,
}
TRIALS = 32
SHARE = {0: 11, 1: 11, 2: 10}  # trials of each of 3 shards


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    from conftest import subprocess_env

    command = [sys.executable, str(ROOT / "evaluate.py"), *args]
    return subprocess.Popen(command, cwd=cwd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_lines(root: Path, name: str, count: int, proc: subprocess.Popen, timeout: float = 120) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = list(root.rglob(name))
        if found and found[0].read_bytes().count(b"\n") >= count:
            return found[0]
        if proc.poll() is not None:
            pytest.fail(f"the shard ended too soon: {proc.communicate()[1].decode()[-2000:]}")
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"no {count} lines in {name} in time")


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode(), err.decode()


@pytest.mark.slow(seconds=60)  # evaluate.py in four subprocesses, one stopped by SIGTERM
def test_three_shards_at_different_times_one_stopped_and_restarted_equal_one_job(tmp_path, cpu_trainer, tiny):
    logs = tmp_path / "logs"
    args = [*tiny("ws/raf", WS), *cpu_trainer.args]
    args += ["--trainer.logger.init_args.save_dir", str(logs), "--trainer.logger.init_args.name", "ws"]
    first = _start([*args, "--shard", "0/3"], tmp_path)
    _wait_for_lines(logs, Shard(0, 3).results_name, 1, first)
    second = _start([*args, "--shard", "1/3"], tmp_path)
    assert first.poll() is None  # the two overlap
    stopped = _wait_for_lines(logs, Shard(1, 3).results_name, 1, second)
    second.send_signal(signal.SIGTERM)
    _, err = second.communicate(timeout=120)
    assert second.returncode != 0 and b"interrupted" in err
    partial = stopped.read_bytes()
    assert partial.endswith(b"\n") and 1 <= partial.count(b"\n") < SHARE[1], "stopped after its share was done"
    third = _start([*args, "--shard", "2/3"], tmp_path)  # later, while the first may still run
    # meanwhile, in this process: the same sweep as one job, in a folder of its own
    one_args = [*tiny("ws/raf", WS), *cpu_trainer.args, "--trainer.logger.init_args.name", "ws"]
    reference = main(["test", *one_args, "--trainer.logger.init_args.save_dir", str(tmp_path / "one")], evaluate=True)
    (_, err_first), (_, err_third) = _finish(first), _finish(third)
    done = partial.count(b"\n")
    assert "shards missing" in err_first and "1/3 (" in err_first  # as on disk when it ended: 1/3 not all there
    named = f"1/3 ({SHARE[1] - done} of {SHARE[1]} trials)"
    assert "shards missing" in err_third and named in err_third  # started after the stop
    folder = stopped.parent
    section = (folder / "summary.md").read_text().split(MISSING_HEADING)[1]  # by the last to end: only 1/3 missing
    assert named in section and "0/3" not in section and "2/3" not in section

    out, err = _finish(_start([*args, "--shard", "1/3"], tmp_path))  # restarted: resumes its own share
    assert f"{done} of {SHARE[1]} trials already in" in out
    assert "shards missing" not in err
    assert (folder / Shard(1, 3).results_name).read_bytes().startswith(partial)  # kept, not recomputed
    assert not list(folder.glob("*.lock"))  # results.shard-*.lock and summary.lock: removed by their last holder

    one = Path(reference.model.results_path).parent
    assert one.name == folder.name  # the same run key
    lines = [json.loads(x) for p in folder.glob("results.shard-*.jsonl") for x in p.read_text().splitlines()]
    assert len(lines) == TRIALS and len({r["trial_key"] for r in lines}) == TRIALS  # none lost, none twice
    key = reference.model.run_key
    assert _records(folder, key) == _records(one, key)  # every field but seconds, floats compared exactly
    assert (folder / "summary.md").read_text() == (one / "summary.md").read_text()
