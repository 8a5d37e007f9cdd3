"""How many processes an evaluation runs.

Every available core on the CPU unless the config or the command line says otherwise.

An evaluation's records do not depend on its device count (the steps are formed before Lightning shards them and
each process computes on one thread: tests/test_determinism.py), so a CPU evaluation whose `trainer.devices` is
`auto` runs one DDP process per available core. Lightning's launcher starts the other processes by running the
command line again, so this applies to the command line only (evaluate.py, `wslight evaluate`); called from Python,
`devices: auto` keeps Lightning's own meaning (one process on the CPU). Under a launcher that started the processes
itself (torchrun, srun) `auto` is the number it started on this node: Lightning requires devices x num_nodes to be the
launcher's world size.
"""

from __future__ import annotations

import os
from typing import Any


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the system has one, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - no affinity on macOS / Windows
        return os.cpu_count() or 1


def on_cpu(accelerator: Any) -> bool:
    """Whether a trainer with this `accelerator` setting computes on the CPU."""
    name = str(getattr(accelerator, "class_path", accelerator) or "auto").lower()
    if name == "cpu" or name.endswith("cpuaccelerator"):
        return True
    if name != "auto":
        return False
    import torch

    mps = getattr(torch.backends, "mps", None)
    return not torch.cuda.is_available() and not (mps is not None and mps.is_available())


def launcher_processes() -> int | None:
    """The processes per node that a launcher outside Lightning started for this run, None without one.

    torchrun's LOCAL_WORLD_SIZE (with the other variables Lightning's TorchElasticEnvironment detects it by), or srun's
    SLURM_NTASKS_PER_NODE where Lightning's SLURMEnvironment applies (SLURM_NTASKS set, a job name other than `bash`
    and `interactive`).
    """
    env = os.environ
    if all(key in env for key in ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        value = env["LOCAL_WORLD_SIZE"]
    elif "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        value = env.get("SLURM_NTASKS_PER_NODE", "")
    else:
        return None
    return int(value) if value.strip().isdigit() else None


def every_core(trainer: Any) -> int | None:
    """Set `devices` to the available cores (and `strategy` to ddp) in a CPU evaluation's trainer config.

    Only when its `devices` is auto. Under torchrun or srun: the processes the launcher started on this node instead
    (`launcher_processes`). Returns the processes set, or None when the config keeps its own placement.
    """
    if str(trainer.get("devices", "auto")) != "auto" or not on_cpu(trainer.get("accelerator")):
        return None
    cores = launcher_processes() or available_cores()
    trainer["devices"] = cores
    trainer["accelerator"] = "cpu"
    if cores > 1 and str(trainer.get("strategy") or "auto") == "auto":
        trainer["strategy"] = "ddp"
    return cores
