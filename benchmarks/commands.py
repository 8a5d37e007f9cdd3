"""The package's commands as a user types them, run from a benchmark: train.py and evaluate.py in a working folder."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(command: list[str], cwd: Path) -> tuple[str, float]:
    """Run a command in `cwd`; its output and wall seconds (a failure stops the benchmark with its output)."""
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr, time.perf_counter() - start


def train(config: str, cwd: Path, *extra: str) -> tuple[str, float, float]:
    """train.py fit on `config` (and `extra` arguments): its log folder, test accuracy and wall seconds."""
    out, seconds = run([sys.executable, str(ROOT / "train.py"), "fit", "--config", config, *extra], cwd)
    logs = re.search(r"^logs: (\S+)", out, re.M)
    acc = re.search(r"test/acc\s*│\s*([0-9.]+)", out)
    if logs is None or acc is None:
        sys.exit(f"train.py printed no logs folder or test accuracy:\n{out[-3000:]}")
    return logs.group(1), float(acc.group(1)), seconds


def evaluate(config: str, cwd: Path, *extra: str) -> tuple[Path, float]:
    """evaluate.py on `config` (and `extra` arguments): the results.jsonl it printed and wall seconds."""
    out, seconds = run([sys.executable, str(ROOT / "evaluate.py"), "--config", config, *extra], cwd)
    found = re.search(r"^results: (\S+)", out, re.M)
    if found is None:
        sys.exit(f"evaluate.py printed no results file:\n{out[-3000:]}")
    return cwd / found.group(1), seconds


def page_arguments(
    script: str, doc: str, page: str, more: Callable[[argparse.ArgumentParser], None] | None = None
) -> tuple[argparse.Namespace, list[str]]:
    """The arguments of a benchmark that runs commands and writes one results page, and its command line for the page.

    Args:
        script: the benchmark's file (its `__file__`).
        doc: its docstring (the first line describes it in --help).
        page: the folder under reports/ where its page goes by default.
        more: adds the benchmark's own arguments to the parser.

    Returns:
        The parsed arguments (`out`, the runs' working folder, created; `page`) and the command as typed.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="working folder for the runs' logs")
    parser.add_argument("--page", type=Path, default=ROOT / "reports" / page, help="where the page goes")
    if more is not None:
        more(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return args, ["python", f"benchmarks/{Path(script).name}", *sys.argv[1:]]
