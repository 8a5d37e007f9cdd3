"""How far a workload runs from the machine's floor: its matrix-multiply FLOPs at the machine's measured rate.

- `Rates`: the machine's matrix-multiply rate, float32 and float64, on one thread and on every usable core, measured
  in the run that reports it: the best of short bursts of a transformer feed-forward's two products and a square one
  (other work on a shared machine lowers the best burst least).
- `count_flops`: the FLOPs of the matrix products a call makes (torch's own formulas, `torch.utils.flop_counter`),
  split by dtype; elementwise work, reductions and factorisations are not counted, so the floor is a lower bound.
- `time_shares`: where a call's time goes, by torch operator (the profiler's self CPU time), grouped.
- `floor_lines`: the page's section: the rates, the FLOPs per trial (or per word), the floor and the fraction of it
  the workload reaches (floor seconds / measured seconds: 100% would be every second spent in matrix products at the
  machine's rate), and the time shares.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

SHAPES = ((8192, 384, 1536), (8192, 1536, 384), (2048, 2048, 2048))  # (rows, inner, columns) of the products timed:
# a transformer feed-forward's two products and a square one; the rate is the best of them, the machine's own
DTYPES = {"float32": torch.float32, "float64": torch.float64}
MATMULS = ("mm", "bmm", "addmm", "baddbmm", "linear", "matmul", "dot", "mv", "sdpa")


def matmul_rate(threads: int, dtype: torch.dtype = torch.float32, seconds: float = 2.0, bursts: int = 4) -> float:
    """GFLOP/s of `dtype` products on `threads` threads: the best burst over `SHAPES`, `seconds` a shape.

    The best, not the mean: the floor is what the machine allows, and other work on a shared machine only slows some
    bursts down; the best shape, since a workload's own products may run at the machine's best rate.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    best = 0.0
    try:
        for rows, inner, columns in SHAPES:
            a, b = torch.randn(rows, inner, dtype=dtype), torch.randn(inner, columns, dtype=dtype)
            a @ b  # warm-up
            for _ in range(bursts):
                count, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds / bursts:
                    a @ b
                    count += 1
                best = max(best, 2 * rows * inner * columns * count / (time.perf_counter() - start) / 1e9)
        return best
    finally:
        torch.set_num_threads(before)


@dataclasses.dataclass(frozen=True)
class Rates:
    """The machine's matrix-multiply rates, GFLOP/s: `{dtype name: (one thread, every core)}`, and the core count."""

    gflops: dict[str, tuple[float, float]]
    cores: int

    @classmethod
    def measure(cls, cores: int) -> Rates:
        """Measure float32 and float64 on one thread and on `cores` threads."""
        return cls({name: (matmul_rate(1, dt), matmul_rate(cores, dt)) for name, dt in DTYPES.items()}, cores)

    def at(self, dtype: str, threads: int) -> float:
        """The rate of `dtype` on `threads` threads: the one-thread rate, or the every-core one (threads > 1)."""
        one, every = self.gflops[dtype]
        return one if threads == 1 else every


class _FlopsByDtype(TorchDispatchMode):
    """Counts the FLOPs of the matrix products dispatched under it, by the dtype of their first operand."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in flop_registry:
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
        elif packet is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:  # the CPU's fused attention
            q, k, v = args[:3]
            flops = sdpa_flop_count(q.shape, k.shape, v.shape)
        else:
            return out
        self.flops[str(args[0].dtype).removeprefix("torch.")] += int(flops)
        return out


def count_flops(call: Callable[[], object]) -> dict[str, int]:
    """The matrix-product FLOPs of `call()` (a multiply-add counts 2), by dtype name: `{"float32": ..., ...}`."""
    with _FlopsByDtype() as mode:
        call()
    return dict(mode.flops)


def time_shares(call: Callable[[], object], top: int = 4) -> list[tuple[str, float]]:
    """Where `call()`'s time goes: shares of its wall time, by torch operator.

    The parts: matrix products, the `top` other operators, the rest of torch's operators, and outside them (Python,
    the interpreter, the engines' bookkeeping). Measured with torch's profiler (self CPU time per operator); its own
    overhead makes the share outside the operators larger than in a plain run.
    """
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with _without_profiler_notes(), profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    wall_us = (time.perf_counter() - start) * 1e6
    own: Counter[str] = Counter()
    for event in prof.key_averages():
        own[event.key] += event.self_cpu_time_total
    matmul = sum(t for k, t in own.items() if _is_matmul(k))
    others = Counter({k: t for k, t in own.items() if not _is_matmul(k)})
    shares = [("matrix products", matmul / wall_us)]
    shares += [(name, t / wall_us) for name, t in others.most_common(top)]
    rest = sum(t for _, t in others.most_common()[top:])
    shares.append(("other torch operators", rest / wall_us))
    shares.append(("outside torch's operators", max(0.0, 1 - sum(s for _, s in shares))))
    return shares


@contextlib.contextmanager
def _without_profiler_notes() -> Iterator[None]:
    """Standard error with the profiler's own start and stop notes left out (the rest of it written back)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [x for x in caught.read().decode(errors="replace").splitlines(True) if not x.startswith("USDT:")]
            sys.stderr.write("".join(kept))


def _is_matmul(key: str) -> bool:
    name = key.removeprefix("aten::")
    return name in MATMULS or "scaled_dot_product" in name


def floor_seconds(flops: dict[str, int], rates: Rates, threads: int) -> float:
    """Seconds the FLOPs take at the machine's rate: float64 at the float64 rate, anything else at float32's."""
    return sum(f / (rates.at("float64" if d == "float64" else "float32", threads) * 1e9) for d, f in flops.items())


def rates_line(rates: Rates) -> str:
    """One sentence: the machine's four measured rates."""
    shapes = ", ".join(f"({m}, {k}) @ ({k}, {n})" for m, k, n in SHAPES)
    f32, f64 = rates.gflops["float32"], rates.gflops["float64"]
    return (
        f"Matrix-multiply rate of this machine, measured in this run (the best burst of {shapes}): float32 "
        f"{f32[0]:.1f} GFLOP/s on one thread, {f32[1]:.1f} on {rates.cores} cores; float64 {f64[0]:.1f} and "
        f"{f64[1]:.1f}."
    )


def floor_lines(rows: list[tuple[str, dict[str, int], float, int]], rates: Rates, unit: str = "trial") -> list[str]:
    """The floor table: per row (name, FLOPs per `unit` by dtype, measured seconds per `unit`, threads).

    floor s: the FLOPs at the rate of the threads the row ran on; of floor: floor s / measured s.
    """
    lines = [
        rates_line(rates),
        "",
        f"| workload | GFLOP / {unit} (float32) | GFLOP / {unit} (float64) | threads | s / {unit} | floor s / {unit} "
        "| of floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, flops, seconds, threads in rows:
        floor = floor_seconds(flops, rates, threads)
        lines.append(
            f"| {name} | {flops.get('float32', 0) / 1e9:.3g} | {flops.get('float64', 0) / 1e9:.3g} | {threads} "
            f"| {seconds:.3g} | {floor:.3g} | {100 * floor / seconds:.1f}% |"
        )
    lines += [
        "",
        "FLOPs: the matrix products the workload made, counted by torch's formulas (torch.utils.flop_counter) over "
        "the same call run again; elementwise work, reductions and factorisations are left out, so the floor is a "
        "lower bound on the time, and 'of floor' is the share of the time the products would take at the "
        "machine's rate.",
    ]
    return lines


def per_unit(flops: dict[str, int], count: int) -> dict[str, int]:
    """FLOPs by dtype of `count` trials (or words) as FLOPs by dtype of one."""
    return {dtype: f // count for dtype, f in flops.items()}


def floor_section(
    rows: list[tuple[str, dict[str, int], float, int]],
    rates: Rates,
    shares: list[tuple[str, list]],
    unit: str = "trial",
    preface: str | None = None,
) -> list[str]:
    """A page's section "Against the machine's floor".

    Its `preface`, the floor table (`floor_lines`), and where the time of each named workload goes (`shares`: (name,
    `time_shares`)).
    """
    lines = ["## Against the machine's floor", "", *([preface, ""] if preface else [])]
    lines += [*floor_lines(rows, rates, unit), ""]
    for name, parts in shares:
        lines += [*shares_lines(name, parts), ""]
    return lines


def shares_lines(name: str, shares: list[tuple[str, float]]) -> list[str]:
    """Where the time of `name` goes, one table (from `time_shares`)."""
    lines = [f"Where the time of {name} goes (torch's profiler, self time per operator):", ""]
    lines += ["| part | share of wall time |", "|---|---|"]
    lines += [f"| {part} | {100 * share:.1f}% |" for part, share in shares]
    return lines


def profile_call(call: Callable[[], object]) -> dict[str, Any]:
    """A timed part's second and third runs of the same call: its FLOPs by dtype and where its time goes.

    JSON-ready (a part's result): `{"flops": {dtype: FLOPs}, "shares": [[part, share], ...]}`.
    """
    return {"flops": count_flops(call), "shares": [list(s) for s in time_shares(call)]}
