"""Launching through torchrun (slow): two CPU processes (gloo) give the records of one process.

Multi-GPU and multi-node runs go through Lightning's own launchers; under `torchrun` Lightning finds the processes
torchrun started (its TorchElasticEnvironment) instead of spawning its own, given a matching
`--trainer.devices <processes per node> --trainer.strategy ddp` (and `--trainer.num_nodes` for several nodes). This
test runs exactly the README's command on the CPU:

    torchrun --standalone --nproc_per_node 2 evaluate.py --config configs/ws/raf.yaml \
        --trainer.accelerator cpu --trainer.devices 2 --trainer.strategy ddp
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wslight.records.results import without_timing

ROOT = Path(__file__).resolve().parents[2]

TINY = [
    "--model.init_args.grid.maps", "[raf, rf]",
    "--model.init_args.grid.d_values", "[8]",
    "--model.init_args.grid.n_values", "[4, 6]",
    "--model.init_args.grid.trials", "3",  # odd: the sampler pads with a duplicate, which must not be recorded
    "--model.init_args.search.max_steps", "40",
    "--model.init_args.embeddings.source", "synthetic",
    "--model.init_args.embeddings.synthetic_dim", "16",
    "--model.init_args.embeddings.num_samples", "40",
    "--model.init_args.embeddings.max_length", "16",
    "--trainer.enable_progress_bar", "false",
    "--trainer.accelerator", "cpu",
]  # fmt: skip


def _records(path: Path) -> list[dict]:
    """The records without their timings, in a fixed order."""
    recs = [without_timing(json.loads(x)) for x in path.read_text().splitlines()]
    return sorted(recs, key=lambda r: json.dumps(r, sort_keys=True))


def _run(cmd: list[str], save_dir: Path, *extra: str) -> Path:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    save_dir.mkdir(parents=True)
    args = [
        "--config",
        str(ROOT / "configs/ws/raf.yaml"),
        "--trainer.logger.init_args.save_dir",
        str(save_dir),
        *TINY,
        *extra,
    ]
    proc = subprocess.run(
        [*cmd, str(ROOT / "evaluate.py"), *args], cwd=save_dir, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("results: "), proc.stdout[-2000:]
    return Path(last.removeprefix("results: "))


@pytest.mark.slow  # evaluate.py in subprocesses: one process, then two through torchrun (gloo)
def test_torchrun_two_processes_give_the_records_of_one(tmp_path):
    one = _run([sys.executable], tmp_path / "one", "--trainer.devices", "1")
    two = _run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
        tmp_path / "two",
        *("--trainer.devices", "2", "--trainer.strategy", "ddp"),
    )
    assert one != two and one.parent.name == two.parent.name  # the same run key, separate folders
    a, b = _records(one), _records(two)
    assert len(a) == 2 * 2 * 3  # maps x n x trials, no duplicate from the padded second rank
    assert a == b  # every field but timings, floats compared exactly
