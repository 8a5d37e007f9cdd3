"""The command as users run it.

Exit statuses of the installed `wslight` and `python -m wslight`, one writer per run folder, where a run without a log
folder writes, the run key of settings that change numbers, Lightning's refusals and missing files as one block, and
`--ckpt_path last`.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import subprocess_env, tiny_args

from wslight.app.cli import main
from wslight.app.failures import EXIT_BUSY
from wslight.app.runs import run_key
from wslight.records.results import RunLock

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
TRAIN = str(TESTS / "conf" / "raf.yaml")


def _console_script() -> str:
    script = Path(sys.executable).parent / "wslight"
    if not script.exists():
        pytest.skip("the wslight console script is not installed next to this python (pip install -e .)")
    return str(script)


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------------------- exit statuses


@pytest.mark.slow  # two subprocesses of the installed script: about 16 s
def test_console_script_exits_0_after_an_evaluation_and_a_fit(tmp_path, squares):
    script = _console_script()
    proc = _run([script, "evaluate", "--config", str(squares())], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("results: ")
    assert "WSLightCLI object" not in proc.stdout + proc.stderr
    overrides = ["--trainer.logger.init_args.save_dir", str(tmp_path / "fit")]
    proc = _run([script, "fit", "--config", TRAIN, *overrides], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("checkpoints: ")
    assert "WSLightCLI object" not in proc.stdout + proc.stderr


def test_python_m_wslight_lists_the_verbs_and_refuses_an_unknown_one(tmp_path, squares):
    proc = _run([sys.executable, "-m", "wslight", "--help"], tmp_path)
    assert proc.returncode == 0
    verbs = [line.split()[0] for line in proc.stdout.split("verbs:")[1].strip().splitlines()[:5]]
    assert verbs == ["fit", "validate", "test", "evaluate", "reproduce"]
    assert "predict" not in proc.stdout
    proc = _run([sys.executable, "-m", "wslight", "predict", "--config", TRAIN], tmp_path)
    assert proc.returncode == 2 and "unknown verb 'predict'" in proc.stderr and "Traceback" not in proc.stderr
    proc = _run([sys.executable, "-m", "wslight", "evaluat"], tmp_path)
    assert proc.returncode == 2 and "did you mean evaluate?" in proc.stderr  # a whole run: the slow DDP test below


def test_usage_lines_name_the_command_as_typed(capsys):
    for args, kwargs, usage in [
        (["evaluate", "--help"], {"prog": "wslight evaluate"}, "usage: wslight evaluate "),
        (["fit", "--help"], {"prog": "wslight fit"}, "usage: wslight fit "),
        (["test", "--help"], {"evaluate": True, "prog": "evaluate.py"}, "usage: evaluate.py "),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(args, **kwargs)
        assert exc.value.code == 0
        assert capsys.readouterr().out.startswith(usage)


def test_train_py_refuses_predict(cli_fails):
    err = cli_fails(["predict", "--config", TRAIN])
    assert "predict" in err and "fit" in err


# ------------------------------------------------------------------------------------------- one writer per folder


def test_a_busy_run_folder_stops_a_second_run_before_any_trial(tmp_path, squares, capsys):
    cfg = squares(trials=3)
    cli = main(["test", "--config", str(cfg)], evaluate=True)
    path = Path(cli.model.results_path)
    path.unlink()  # the run folder stays; its trials are to be computed again
    capsys.readouterr()
    holder = RunLock(path.parent)
    holder.acquire()
    try:
        with pytest.raises(SystemExit) as exc:
            main(["test", "--config", str(cfg)], evaluate=True)
    finally:
        holder.release()
    assert exc.value.code == EXIT_BUSY
    err = capsys.readouterr().err
    assert f"{path.parent} is being written by pid {os.getpid()}" in err and "Traceback" not in err
    assert not path.exists()  # no trial computed
    main(["test", "--config", str(cfg)], evaluate=True)  # released: the same command runs
    assert len(path.read_text().splitlines()) == 3


@pytest.mark.slow  # two processes started at once on one folder, each computing trials with a pause
def test_two_processes_on_one_run_folder_write_each_trial_once(tmp_path, squares):
    cfg = squares(trials=6, sleep=0.3)
    cmd = [sys.executable, str(ROOT / "evaluate.py"), "--config", str(cfg)]
    procs = [
        subprocess.Popen(
            cmd, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes in ([0, 0], [0, EXIT_BUSY]), [o[1][-2000:] for o in outs]
    if codes == [0, EXIT_BUSY]:
        busy = next(err for p, (_, err) in zip(procs, outs, strict=True) if p.returncode == EXIT_BUSY)
        assert "is being written by pid" in busy and "Traceback" not in busy
    (path,) = (tmp_path / "logs").rglob("results.jsonl")
    trials = [json.loads(x)["trial"] for x in path.read_text().splitlines()]
    assert sorted(trials) == list(range(6))  # every trial once


# ------------------------------------------------------------------------------------------- where results go


@pytest.mark.parametrize("setting", [["--trainer.logger", "false"], ["--trainer.fast_dev_run", "true"]])
def test_a_run_without_log_folder_writes_in_a_folder_of_its_own(tmp_path, squares, setting, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = []
    for trials in (2, 3):
        cli = main(["test", "--config", str(squares(trials=trials, name=f"s{trials}")), *setting], evaluate=True)
        paths.append(Path(cli.model.results_path).absolute())
        assert paths[-1].parent == tmp_path / f"run-{cli.run_key}"
        assert (paths[-1].parent / "config.yaml").exists() or "fast_dev_run" in setting[0]
    assert paths[0].parent != paths[1].parent
    assert not (tmp_path / "results.jsonl").exists() and not (tmp_path / "config.yaml").exists()


def test_precision_is_part_of_the_run_key_unless_default():
    base = {"model": {"class_path": "x"}, "trainer": {"devices": 1}}
    default = run_key(base)
    for same in (None, "32-true", "32", 32):
        assert run_key({**base, "trainer": {"precision": same}}) == default
    keys = {run_key({**base, "trainer": {"precision": p}}) for p in ("16-mixed", "bf16-mixed", "64-true", "64")}
    assert default not in keys and len(keys) == 3  # 64 and 64-true are one setting


def test_a_precision_run_does_not_resume_the_fp32_records(tmp_path, squares):
    cfg = squares(trials=2)
    a = main(["test", "--config", str(cfg)], evaluate=True)
    b = main(["test", "--config", str(cfg), "--trainer.precision", "64-true"], evaluate=True)
    assert a.run_key != b.run_key and a.model.results_path != b.model.results_path


# ------------------------------------------------------------------------------------------- one-block failures


@pytest.mark.parametrize(
    "args, key",
    [
        (["--trainer.devices", "0"], "trainer.devices"),
        (["--trainer.max_epochs", "-5"], "trainer.max_epochs"),
        (["--ckpt_path", "/no/such.ckpt"], "ckpt_path=/no/such.ckpt: no such checkpoint file"),
    ],
)
def test_lightning_refusals_are_one_block_naming_the_key(cli_fails, tmp_path, args, key):
    err = cli_fails(["fit", "--config", TRAIN, "--trainer.logger.init_args.save_dir", str(tmp_path), *args])
    assert f"error: {key}" in err


def test_a_gpu_accelerator_without_a_gpu_is_one_block(cli_fails, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    err = cli_fails(
        ["fit", "--config", TRAIN, "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.accelerator", "gpu"]
    )
    assert "error: trainer.accelerator:" in err


def test_an_unwritable_cache_folder_is_one_block_with_status_1(tmp_path, capsys):
    """The embedding cache's folder cannot be made (a file stands where it should be): one block naming it."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "fit",
                "--config",
                "raf",
                "--trainer.logger.init_args.save_dir",
                str(tmp_path),
                "--data.init_args.embeddings.cache_dir",
                str(blocker / "cache"),
            ]
        )
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"cannot write {blocker / 'cache'} (Not a directory)" in err
    assert not list(tmp_path.rglob("events.out.tfevents.*"))  # the failed run's new folder is gone: no empty run


# ------------------------------------------------------------------------------------------- --ckpt_path last


def test_ckpt_path_last_resumes_the_newest_last_checkpoint_or_says_there_is_none(tmp_path, cli_fails, capsys):
    logs = [
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
        "--trainer.enable_checkpointing",
        "true",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.save_last=true",
    ]
    err = cli_fails(["fit", "--config", TRAIN, *logs, "--ckpt_path", "last"])
    assert "ckpt_path=last: no last.ckpt in" in err and str(tmp_path) in err
    first = main(["fit", "--config", TRAIN, *logs])
    last = Path(first.trainer.checkpoint_callback.last_model_path)
    assert last.name == "last.ckpt"
    time.sleep(0.01)
    capsys.readouterr()
    second = main(["fit", "--config", TRAIN, *logs, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    assert f"resuming from {last}" in capsys.readouterr().err
    assert second.trainer.current_epoch == 2 and second.trainer.global_step == 2  # one more epoch, not two


# ------------------------------------------------------------------------------------------- DDP runs end cleanly


@pytest.mark.slow(seconds=47)  # four 2-process runs
def test_finished_ddp_runs_exit_0_every_time(tmp_path, squares):
    """A 2-process fit with the attack callback and a 2-process evaluation, twice each, exit 0 every time.

    They run through the console's verb table: every run exits 0 and no process aborts at exit (`terminate called ...`,
    a process group or a communication thread outliving the interpreter).
    """
    ddp = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu"]
    fit = tiny_args(tmp_path / "cache", tmp_path / "fit_logs")
    runs = {
        "fit": [sys.executable, "-m", "wslight", "fit", *fit, *ddp],
        "evaluate": [sys.executable, "-m", "wslight", "evaluate", "--config", str(squares(trials=5)), *ddp],
    }
    for attempt in range(2):
        for name, cmd in runs.items():
            proc = _run(cmd, tmp_path, timeout=600)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0 and "terminate called" not in out, (name, attempt, out[-3000:])
    assert len(list((tmp_path / "fit_logs").rglob("attack_results.jsonl"))) == 2


@pytest.fixture
def tiny_disk(tmp_path):
    """A 32 KiB tmpfs (root only; skipped where mounting is not allowed): a disk that is full for a run."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(disk)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield disk
    subprocess.run(["umount", str(disk)], check=False)


def test_a_full_disk_output_folder_fails_before_any_trial(tiny_disk, squares, cli_fails):
    err = cli_fails(["test", "--config", str(squares()), "--model.init_args.output_dir", str(tiny_disk)], evaluate=True)
    assert f"model.init_args.output_dir={tiny_disk}" in err and "No space left on device" in err
    assert not list(tiny_disk.iterdir())
