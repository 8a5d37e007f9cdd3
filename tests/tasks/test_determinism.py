"""Determinism: the same config and seed give bit-identical per-trial records across runs, thread counts and devices.

Per-trial randomness comes from generators seeded by (seed, salts) (wslight.base.seeding), never from the global RNG, so
a trial's records depend only on the config. The remaining source of run-to-run differences on the CPU is the thread
count: torch sums a single-output reduction of more than 32768 elements in per-thread partial sums, and a 2-process
DDP run on the same cores uses half the threads of a 1-process run; `wslight.attack.heads.sum_last` sums those in a
thread-count invariant way.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wslight.app.cli import main
from wslight.app.placement import available_cores, every_core
from wslight.base.numerics import sum_last
from wslight.records.results import without_timing

ROOT = Path(__file__).resolve().parents[2]

# The tiny test settings (tests/conf) of the shipped configs, with each test's grid and seed; one trial a step.
WS_CONFIG = (
    "ws/raf",
    {
        "grid.maps": ["rf", "raf", "relu_raf"],
        "grid.d_values": [8],
        "grid.n_values": [5],
        "grid.trials": 2,
        "search.chains_per_round": 3,
        "search.max_steps": 40,
        "seed": 3,
        "embeddings.max_length": 16,
    },
)
ATTACK = {"N_values": [10], "trials": 2, "losses": ["err"], "seed": 1, "trials_per_step": 1}
ATTACK_CONFIG = (
    "attack/fig4",
    {**ATTACK, "cases": [{"map": "raf", "n": 6}], "d": 8, "attack.steps": 60, "embeddings.max_length": 16},
)
# The bundled reviews and vocabulary: one real word, with heads, each trial its own step (two per process).
WORDS_CONFIG = (
    "words/raf",
    {"grid.maps": ["raf"], "grid.n_values": [4], "grid.trials": 4, "N": 12, "trials_per_step": 1},
)
# Features p = n d = 100 * 384 = 38400 > 32768: the context sample's scalars (||phi||^2, phi^T P phi, ...) are
# single-output reductions big enough for torch to split them over threads.
WIDE_ATTACK_CONFIG = (
    "attack/fig4",
    {
        **ATTACK,
        "cases": [{"map": "raf", "n": 100}],
        "d": 384,
        "attack.steps": 30,
        "attack.restarts": 2,
        "embeddings.synthetic_dim": 384,
        "embeddings.num_samples": 12,
        "embeddings.max_length": 100,
    },
)


@pytest.fixture
def config_args(cpu_trainer, tiny):
    """A function of a setting (name, changes) giving that tiny test setting's arguments, on the CPU trainer."""

    def args(setting):
        name, changes = setting
        return [*tiny(name, changes), *cpu_trainer.args, "--trainer.logger.init_args.name", "det"]

    return args


def records_of(path):
    recs = [without_timing(json.loads(x)) for x in Path(path).read_text().splitlines()]
    return sorted(recs, key=lambda r: (r["trial_key"], r.get("record_key", "")))


def run_in_process(config, save_dir, *extra):
    args = ["test", *config, "--trainer.logger.init_args.save_dir", str(save_dir), *extra]
    return Path(main(args, evaluate=True).model.results_path)


@pytest.mark.parametrize("body", [WS_CONFIG, ATTACK_CONFIG], ids=["ws", "attack"])
def test_two_runs_give_bit_identical_records_and_another_seed_other_ones(tmp_path, config_args, body):
    cfg = config_args(body)
    a = run_in_process(cfg, tmp_path / "a")
    b = run_in_process(cfg, tmp_path / "b")
    assert a != b and a.parent.name == b.parent.name  # separate files, same run key
    ra, rb = records_of(a), records_of(b)
    assert len(ra) == (6 if body is WS_CONFIG else 4)
    assert ra == rb  # every field but the timings, floats compared exactly
    if body is WS_CONFIG:  # the seed is what makes them equal: another seed gives other values
        other = ("--model.init_args.seed", "4", "--model.init_args.grid.maps", "[rf]")
        c = records_of(run_in_process(cfg, tmp_path / "c", *other))
        assert [r["ws"] for r in ra if r["map"] == "rf"] != [r["ws"] for r in c]


def test_sum_last_is_thread_count_invariant_and_accurate(threads):
    g = torch.Generator().manual_seed(0)
    for p in (7, 1024, 40_000, 300_001):
        x = torch.randn(1, p, generator=g, dtype=torch.float64)
        outs = []
        for n in (1, 2, 3):
            with threads(n):
                outs.append(sum_last(x))
        assert all(torch.equal(outs[0], o) for o in outs[1:])
        assert torch.allclose(outs[0], x.sum(-1), rtol=1e-12, atol=1e-9)
    y = torch.randn(3, 5, 2500, generator=g)
    assert sum_last(y).shape == (3, 5) and torch.allclose(sum_last(y), y.sum(-1), rtol=1e-5, atol=1e-4)


def test_every_core_only_for_a_cpu_evaluation_left_on_auto(monkeypatch):
    """`devices: auto` on the CPU becomes one DDP process per available core.

    A count the config or the command line gives, or another accelerator, is kept.
    """
    monkeypatch.setattr("wslight.app.placement.available_cores", lambda: 3)
    trainer = {"accelerator": "cpu", "devices": "auto", "strategy": "auto"}
    assert every_core(trainer) == 3 and trainer == {"accelerator": "cpu", "devices": 3, "strategy": "ddp"}
    for kept in ({"accelerator": "cpu", "devices": 1}, {"accelerator": "gpu", "devices": "auto"}):
        before = dict(kept)
        assert every_core(kept) is None and kept == before
    monkeypatch.setattr("wslight.app.placement.available_cores", lambda: 1)
    single = {"accelerator": "cpu", "devices": "auto", "strategy": "auto"}
    assert every_core(single) == 1 and single["strategy"] == "auto"  # one core: no process group


def test_evaluations_compute_on_one_thread(threads):
    """The evaluations compute on one thread per process, so that 1 and 2 devices give the same bits.

    On some CPUs a matrix product with a long reduction (the heads' N x N Gram of p features, the gradient of z + V^(i)
    Delta over k neurons) sums in another order with 1 and 2 threads (the slow test below compares the devices).
    """
    from wslight.tasks.steps import one_cpu_thread

    with threads(2):
        with one_cpu_thread(torch.device("cpu")):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with one_cpu_thread(torch.device("meta")):  # another device: left alone
            assert torch.get_num_threads() == 2


def _evaluate_subprocess(config, save_dir, *extra):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # let Lightning pick threads per process
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "evaluate.py"),
            *config,
            "--trainer.logger.init_args.save_dir",
            str(save_dir),
            *extra,
        ],
        cwd=Path(save_dir).parent,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (path,) = Path(save_dir).rglob("results.jsonl")
    (path.parent / "stdout.txt").write_text(proc.stdout)
    return path


@pytest.mark.slow(seconds=25)  # four configs, each in a subprocess on one then two DDP processes
@pytest.mark.parametrize(
    "body", [WS_CONFIG, ATTACK_CONFIG, WIDE_ATTACK_CONFIG, WORDS_CONFIG], ids=["ws", "attack", "attack-wide", "words"]
)
def test_one_and_two_devices_give_identical_records(tmp_path, config_args, body):
    """1 process vs 2 DDP processes (gloo, CPU): the same records, bit for bit (the file order may differ)."""
    cfg = config_args(body)
    one = _evaluate_subprocess(cfg, tmp_path / "one")
    two = _evaluate_subprocess(
        cfg, tmp_path / "two", "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu"
    )
    assert one.parent.name == two.parent.name
    r1, r2 = records_of(one), records_of(two)
    assert len(r1) == len(r2) > 0
    assert r1 == r2


@pytest.mark.slow(seconds=26)  # evaluate.py in subprocesses: one process, then one DDP process per core
@pytest.mark.skipif(available_cores() < 2, reason="one core: nothing to spread")
def test_the_command_line_runs_a_cpu_evaluation_on_every_core_with_the_same_records(tmp_path, config_args, capfd):
    """`devices: auto` (the shipped configs) on the command line: one DDP process per core.

    The same records as one process, and rank 0 says how the steps are spread.
    """
    cfg = config_args(WS_CONFIG)
    one = _evaluate_subprocess(cfg, tmp_path / "one", "--trainer.devices", "1")
    every = _evaluate_subprocess(cfg, tmp_path / "every", "--trainer.devices", "auto")
    assert records_of(one) == records_of(every)
    text = (every.parent / "stdout.txt").read_text()
    assert f"steps over {available_cores()} processes" in text and text.strip().splitlines()[-1] == f"results: {every}"
