"""Two nodes simulated on one machine (slow): torchrun and SLURM launches over loopback, and a signal to one node.

The commands are those of docs/tasks/gpus.md, read from it: the two `torchrun --nnodes 2 ...` lines of "Several nodes"
(a free port, the tiny setting of their config), and the SLURM job script, run by bash with the environment sbatch
gives a job of 2 nodes x 1 task and a stand-in for `srun` that starts the two tasks with the variables srun sets
(each task in a session of its own, as on its own node). Each run gives the records of one process; a SIGINT or
SIGTERM to one node's process stops both with 130 or 143, leaves no process running, and the same commands run again
resume to the records of an uninterrupted run.
"""

import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import subprocess_env, tiny_config

from wslight.records.results import without_timing

ROOT = Path(__file__).resolve().parents[2]
GPUS_MD = ROOT / "docs" / "tasks" / "gpus.md"
HINT = "run the same command again to resume"

# The tiny setting of configs/ws/raf.yaml (tests/conf/ws/raf.yaml, an overlay of it) with 30 one-trial steps: 15 a
# process, so that a signal after the first record comes in the middle of the run.
TINY = "ws/raf"
SETTINGS = {
    "grid.maps": ["raf"],
    "grid.d_values": [8],
    "grid.n_values": [5],
    "grid.trials": 30,
    "search.chains_per_round": 3,
    "search.max_steps": 40,
    "seed": 3,
    "embeddings.max_length": 16,
}
TRIALS = 30
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
# What a launcher or an enclosing job could have left in the test's environment
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in subprocess_env().items() if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "TORCH"))}
    return {**env, **extra}


def _records(save_dir: Path) -> list[dict]:
    """The records of the run under save_dir without timings and run keys, in a fixed order."""
    (path,) = save_dir.rglob("results.jsonl")
    recs = [without_timing(json.loads(x)) for x in path.read_text().splitlines()]
    recs = [{k: v for k, v in r.items() if k != "run_key"} for r in recs]
    return sorted(recs, key=lambda r: json.dumps(r, sort_keys=True))


def _lines(save_dir: Path) -> int:
    paths = list(save_dir.rglob("results.jsonl"))
    return len(paths[0].read_text().splitlines()) if paths else 0


def _settings() -> list[str]:
    """The test's settings after the tiny overlay's `--config` (tiny_config's own form)."""
    return tiny_config(TINY, SETTINGS)[2:]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> list[dict]:
    """The records of the setting computed by one process (evaluate.py, devices 1)."""
    save_dir = tmp_path_factory.mktemp("one")
    args = [*tiny_config(TINY, SETTINGS), "--trainer.devices", "1", *QUIET]
    command = [sys.executable, str(ROOT / "evaluate.py"), *args, "--trainer.logger.init_args.save_dir", str(save_dir)]
    proc = subprocess.run(command, cwd=save_dir, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = _records(save_dir)
    assert len(records) == TRIALS
    return records


# ------------------------------------------------------------------------------------------- the docs' commands


def _blocks(text: str) -> list[str]:
    """The ```bash blocks of a markdown page, continuation lines joined."""
    return [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", text, re.S)]


def _free_port(low: int = 15000, high: int = 24999) -> int:
    """A TCP port nothing listens on now, in [low, high]."""
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def torchrun_commands(save_dir: Path) -> list[list[str]]:
    """The two node commands of gpus.md's "Several nodes" block, to run over loopback with the tiny setting."""
    section = GPUS_MD.read_text().split("### Several nodes", 1)[1]
    (block,) = [b for b in _blocks(section) if "--node-rank" in b][:1]
    lines = [shlex.split(x) for x in block.splitlines() if x.strip() and not x.startswith("#")]
    assert [line[line.index("--node-rank") + 1] for line in lines] == ["0", "1"], block
    port = str(_free_port())
    commands = []
    for words in lines:
        assert words[0] == "torchrun" and words[words.index("--config") + 1] == f"configs/{TINY}.yaml", words
        words = [port if words[i - 1] == "--master-port" else w for i, w in enumerate(words)]
        words = ["127.0.0.1" if w == "$MASTER_ADDR" else w for w in words]
        words[words.index("--config") + 1] = tiny_config(TINY)[1]  # the overlay of the docs' config
        tail = [*_settings(), *QUIET, "--trainer.logger.init_args.save_dir", str(save_dir)]
        commands.append([sys.executable, "-m", "torch.distributed.run", *words[1:], *tail])
    return commands


def sbatch_script() -> str:
    """The SLURM job script of gpus.md (its ```bash block with #SBATCH lines)."""
    section = GPUS_MD.read_text().split("## SLURM", 1)[1]
    (script,) = [b for b in re.findall(r"```bash\n(.*?)```", section, re.S) if "#SBATCH" in b][:1]
    assert script.startswith("#!/bin/bash\n") and "\nsrun python evaluate.py " in script
    return script


# srun on one machine: SLURM_NTASKS tasks, task i the only task of node i, each in a session of its own; it writes the
# tasks' pids to $FAKE_SRUN_PIDS and exits with their highest status (128 + the signal for one a signal ended), as srun
FAKE_SRUN = """#!{python}
import os, subprocess, sys
tasks = int(os.environ["SLURM_NTASKS"])
procs = []
for i in range(tasks):
    env = {{**os.environ, "SLURM_PROCID": str(i), "SLURM_LOCALID": "0", "SLURM_NODEID": str(i), "SLURM_STEP_ID": "0",
           "SLURM_STEP_NODELIST": os.environ["SLURM_JOB_NODELIST"], "SLURM_STEP_NUM_TASKS": str(tasks),
           "SLURM_STEP_NUM_NODES": os.environ["SLURM_NNODES"]}}
    procs.append(subprocess.Popen(sys.argv[1:], env=env, start_new_session=True))
with open(os.environ["FAKE_SRUN_PIDS"] + ".tmp", "w") as f:
    f.write(" ".join(str(p.pid) for p in procs))
os.replace(os.environ["FAKE_SRUN_PIDS"] + ".tmp", os.environ["FAKE_SRUN_PIDS"])
codes = [p.wait() for p in procs]
print("tasks ended with", codes, file=sys.stderr)
sys.exit(max(c if c >= 0 else 128 - c for c in codes))
"""


def slurm_job(tmp_path: Path, save_dir: Path) -> tuple[list[str], dict]:
    """The command and environment of the docs' job script as sbatch runs it for 2 nodes x 1 task (the tiny setting)."""
    script = tmp_path / "wslight-ws.sbatch"
    script.write_text(sbatch_script())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN.format(python=sys.executable))
    srun.chmod(0o755)
    port = _free_port()  # Lightning's port: 15000 + the job id's last four digits
    job_name = re.search(r"#SBATCH --job-name=(\S+)", script.read_text()).group(1)
    assert job_name not in ("bash", "interactive")  # names that Lightning takes for no SLURM job
    env = _env(
        PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        SLURM_JOB_ID=f"7{port - 15000:04d}",
        SLURM_JOB_NAME=job_name,
        SLURM_NNODES="2",
        SLURM_NTASKS="2",
        SLURM_NTASKS_PER_NODE="1",
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_NODELIST="localhost",
        SLURM_NODELIST="localhost",
        FAKE_SRUN_PIDS=str(tmp_path / "srun.pids"),
    )
    logs = ["--trainer.logger.init_args.save_dir", str(save_dir)]
    return ["bash", str(script), *tiny_config(TINY, SETTINGS), *QUIET, *logs], env


# ------------------------------------------------------------------------------------------- processes


class Launch:
    """Commands started together (the nodes of a run), each in a session of its own, their output in files."""

    def __init__(self, commands: list[list[str]], env: dict, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.procs = []
        for i, command in enumerate(commands):
            with open(folder / f"{i}.out", "w") as out, open(folder / f"{i}.err", "w") as err:
                self.procs.append(
                    subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True)
                )
        self.seen: set[int] = set()  # every process of the run seen so far (the launched ones and their children)

    def text(self, i: int, name: str = "err") -> str:
        return (self.folder / f"{i}.{name}").read_text()

    def look(self) -> None:
        """Note the processes the launched ones have started (any depth)."""
        self.seen |= _descendants({p.pid for p in self.procs})

    def wait(self, timeout: float = 300) -> list[int]:
        deadline = time.time() + timeout
        while any(p.poll() is None for p in self.procs) and time.time() < deadline:
            self.look()
            time.sleep(0.2)
        codes = [p.poll() for p in self.procs]
        if None in codes:
            self.kill()
        assert None not in codes, f"still running after {timeout} s: {self.texts()}"
        return codes

    def kill(self) -> None:
        for pid in self.seen | {p.pid for p in self.procs}:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def texts(self) -> str:
        return "\n".join(f"--- {i}:\n{self.text(i)[-2500:]}" for i in range(len(self.procs)))


def _parents() -> dict[int, int]:
    """Every running (not zombie) process and its parent, from /proc (Linux)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after "pid (comm)": state, ppid, ...
        except OSError:  # ended meanwhile
            continue
        if fields[0] != "Z":
            out[int(stat.parent.name)] = int(fields[1])
    return out


def _descendants(pids: set[int]) -> set[int]:
    parents = _parents()
    found, todo = set(), set(pids)
    while todo:
        found |= todo
        todo = {p for p, parent in parents.items() if parent in todo} - found
    return found & set(parents)


def _running(pids: set[int]) -> set[int]:
    return pids & set(_parents())


def _wait_for_first_record(launch: Launch, save_dir: Path, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while _lines(save_dir) == 0:
        assert all(p.poll() is None for p in launch.procs), f"a node ended before its first record: {launch.texts()}"
        assert time.time() < deadline, f"no record within {timeout} s"
        launch.look()
        time.sleep(0.05)
    launch.look()


# ------------------------------------------------------------------------------------------- runs


@pytest.mark.slow(seconds=21)  # one process, then two torchrun nodes over loopback
def test_two_torchrun_nodes_give_the_records_of_one_process(tmp_path, one_process):
    save_dir = tmp_path / "logs"
    launch = Launch(torchrun_commands(save_dir), _env(), tmp_path / "nodes")
    assert launch.wait() == [0, 0], launch.texts()
    assert _records(save_dir) == one_process
    assert launch.text(0, "out").strip().splitlines()[-1].startswith("results: ")  # rank 0 reports, node 1 does not
    assert "results: " not in launch.text(1, "out")


@pytest.mark.slow(seconds=16)  # one process, then the docs' job script with a stand-in srun: two tasks
def test_the_docs_slurm_script_on_two_nodes_gives_the_records_of_one_process(tmp_path, one_process):
    save_dir = tmp_path / "logs"
    command, env = slurm_job(tmp_path, save_dir)
    launch = Launch([command], env, tmp_path / "job")
    assert launch.wait() == [0], launch.texts()
    assert "tasks ended with [0, 0]" in launch.text(0)
    assert launch.text(0).count("GLOBAL_RANK: ") == 2  # SLURMEnvironment's ranks, one process each
    assert _records(save_dir) == one_process


@pytest.mark.slow(seconds=36)  # one process; the job script stopped by a signal to one task; the same script again
@pytest.mark.parametrize("task, sig", [(1, signal.SIGINT), (0, signal.SIGTERM)], ids=["SIGINT-1", "SIGTERM-0"])
def test_a_signal_to_one_slurm_task_stops_both_and_the_same_script_resumes(tmp_path, one_process, task, sig):
    save_dir = tmp_path / "logs"
    command, env = slurm_job(tmp_path, save_dir)
    launch = Launch([command], env, tmp_path / "job")
    _wait_for_first_record(launch, save_dir)
    tasks = [int(p) for p in (tmp_path / "srun.pids").read_text().split()]
    os.kill(tasks[task], sig)
    assert launch.wait(timeout=60) == [128 + sig], launch.texts()
    err = launch.text(0)
    assert f"tasks ended with [{128 + sig}, {128 + sig}]" in err, err[-3000:]
    assert err.count(HINT) == 1 and "Traceback" not in err, err[-3000:]
    assert not _running(launch.seen), "a process of the job is still running"
    assert 0 < _lines(save_dir) < TRIALS  # stopped in the middle of the run
    again = Launch([command], env, tmp_path / "again")
    assert again.wait() == [0], again.texts()
    assert _records(save_dir) == one_process


@pytest.mark.slow(seconds=40)  # one process; two torchrun nodes, node 0 stopped by SIGTERM; the same commands again
def test_a_signal_to_one_torchrun_node_stops_both_and_the_same_commands_resume(tmp_path, one_process):
    save_dir = tmp_path / "logs"
    commands = torchrun_commands(save_dir)
    launch = Launch(commands, _env(), tmp_path / "nodes")
    _wait_for_first_record(launch, save_dir)
    os.killpg(launch.procs[0].pid, signal.SIGTERM)  # a `kill` of node 0's torchrun (it forwards it to its worker)
    codes = launch.wait(timeout=60)
    assert codes == [1, 1], launch.texts()  # torchrun's own status for a worker that did not end with 0
    assert "exitcode  : 143" in launch.text(1), launch.text(1)[-3000:]  # node 1's worker stopped with SIGTERM's status
    assert launch.text(0).count(HINT) == 1 and HINT not in launch.text(1), launch.texts()
    assert not _running(launch.seen), "a process of the run is still running"
    assert 0 < _lines(save_dir) < TRIALS
    again = Launch(commands, _env(), tmp_path / "again")
    assert again.wait() == [0, 0], again.texts()
    assert _records(save_dir) == one_process


# ------------------------------------------------------------------------------------------- the parts, in process


@pytest.mark.parametrize(
    "env, processes",
    [
        ({"RANK": "1", "GROUP_RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, 1),  # torchrun, 1 per node
        ({"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NAME": "wslight-ws"}, 4),  # srun
        ({"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NAME": "interactive"}, None),  # no SLURM job
        ({}, None),
    ],
)
def test_devices_auto_under_a_launcher_is_the_processes_it_started_on_the_node(monkeypatch, env, processes):
    from wslight.app.placement import every_core, launcher_processes

    for key in [*LAUNCH_VARS, "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NAME"]:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("wslight.app.placement.available_cores", lambda: 3)
    assert launcher_processes() == processes
    trainer = {"accelerator": "cpu", "devices": "auto", "num_nodes": 2, "strategy": "auto"}
    assert every_core(trainer) == (processes or 3) and trainer["devices"] == (processes or 3)


@pytest.fixture
def relay_of(monkeypatch):
    """`relay_of(store, world_size)`: a StopRelay of this process, its self-signals collected instead of sent."""
    from wslight.app import interrupts

    sent: list[int] = []
    relays = []
    monkeypatch.setattr(interrupts, "received", None)
    monkeypatch.setattr(interrupts.os, "kill", lambda pid, sig: sent.append(sig))

    def make(store, world_size):
        relay = interrupts.StopRelay(store, world_size)
        relay.STOP_S = float("inf")  # never end the test's process
        relay.sent = sent
        relays.append(relay)
        relay.start()
        return relay

    yield make
    for relay in relays:
        relay._done.set()
        relay.join(5)


def test_a_stop_relay_hands_a_signal_to_the_other_process_and_the_first_waits_for_it(relay_of):
    import torch.distributed as dist

    from wslight.app import interrupts

    store = dist.HashStore()
    # the other process: it finds the stop in the store, counts itself, notes the signal and sends it to itself
    store.set(interrupts._STOP_KEY, str(int(signal.SIGTERM)))
    store.add(interrupts._SEEN_KEY, 1)
    other = relay_of(store, 2)
    deadline = time.time() + 30
    while not other.sent and time.time() < deadline:
        time.sleep(0.05)
    assert other.sent == [signal.SIGTERM] and interrupts.received == signal.SIGTERM
    assert store.add(interrupts._SEEN_KEY, 0) == 2
    other._done.set()
    del other.sent[:]

    # the process the signal reached: its handler returns once the other has counted itself
    store = dist.HashStore()
    interrupts.received = signal.SIGINT
    first = relay_of(store, 2)
    seen = []

    def peer():
        while not store.check([interrupts._STOP_KEY]):
            time.sleep(0.05)
        seen.append(store.get(interrupts._STOP_KEY))
        store.add(interrupts._SEEN_KEY, 1)

    threading.Thread(target=peer, daemon=True).start()
    first.signalled()
    assert seen == [str(int(signal.SIGINT)).encode()] and store.add(interrupts._SEEN_KEY, 0) == 2
    assert first.sent == []  # the first process signals nobody


@pytest.mark.parametrize("fit", [True, False], ids=["fit", "evaluation"])
def test_under_slurm_sigterm_stays_the_packages_and_sigusr1_requeues(monkeypatch, fit):
    import lightning.pytorch as pl

    from wslight.app import interrupts

    for key, value in {"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NAME": "wslight-ws"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NODEID", "0")
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        interrupts.stop_on_signals()
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
        interrupts.keep_own_signal_handlers(trainer, checkpoint_on_requeue=fit)
        trainer._signal_connector.register_signal_handlers()
        assert signal.getsignal(signal.SIGTERM) is interrupts.raise_interrupt
        assert signal.getsignal(signal.SIGINT) is interrupts.raise_interrupt
        usr1 = signal.getsignal(signal.SIGUSR1)
        if fit:  # Lightning's: a checkpoint, then the requeue
            assert usr1 not in (signal.SIG_DFL, None, interrupts.requeue_job)
        else:  # an evaluation resumes from its records: the requeue alone
            assert usr1 is interrupts.requeue_job
        assert interrupts._relay is None  # one process: nothing to relay
        trainer._signal_connector.teardown()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _scontrol(tmp_path: Path) -> Path:
    """A stand-in `scontrol` on a bin folder: it appends its arguments to <bin>/scontrol.calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {bin_dir / "scontrol.calls"}\n')
    scontrol.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    "env, job, said",
    [
        ({"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0"}, "4242", "SIGUSR1: requeued SLURM job 4242"),
        (
            {"SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "3", "SLURM_PROCID": "0"},
            "4240_3",
            "SIGUSR1: requeued SLURM job 4240_3",
        ),
        ({"SLURM_JOB_ID": "4242", "SLURM_PROCID": "1"}, None, ""),  # rank 1: rank 0 requeues the job
    ],
    ids=["job", "array task", "rank 1"],
)
def test_requeue_job_asks_slurm_to_requeue_the_job_from_rank_0(tmp_path, monkeypatch, capsys, env, job, said):
    from wslight.app import interrupts

    bin_dir = _scontrol(tmp_path)
    for key in LAUNCH_VARS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    interrupts.requeue_job(signal.SIGUSR1, None)
    calls = bin_dir / "scontrol.calls"
    assert (calls.read_text() if calls.exists() else None) == (None if job is None else f"requeue {job}\n")
    assert capsys.readouterr().err.strip() == said


@pytest.mark.slow(seconds=20)  # one process, then the docs' job script with SIGUSR1 to both tasks in the middle
def test_sigusr1_to_an_evaluations_slurm_tasks_requeues_the_job_once_and_the_run_goes_on(tmp_path, one_process):
    save_dir = tmp_path / "logs"
    command, env = slurm_job(tmp_path, save_dir)
    bin_dir = _scontrol(tmp_path)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    launch = Launch([command], env, tmp_path / "job")
    _wait_for_first_record(launch, save_dir)
    for task in (tmp_path / "srun.pids").read_text().split():  # SLURM's --signal=USR1@T reaches every task
        os.kill(int(task), signal.SIGUSR1)
    assert launch.wait() == [0], launch.texts()  # the stand-in requeues nothing: the run goes on to its end
    assert (bin_dir / "scontrol.calls").read_text() == f"requeue {env['SLURM_JOB_ID']}\n"  # once, by rank 0
    err = launch.text(0)
    assert err.count(f"SIGUSR1: requeued SLURM job {env['SLURM_JOB_ID']}") == 1 and "Traceback" not in err, err[-3000:]
    assert not list(tmp_path.rglob("*.ckpt")) and not list(ROOT.glob("hpc_ckpt*")), "a checkpoint was written"
    assert _records(save_dir) == one_process
