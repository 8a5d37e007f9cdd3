"""What several benchmarks share: the repository's folders, a benchmark's command line and parts, the commands.

- `ROOT`, `CONFIGS`: the repository's root and its configs folder.
- `command_line`: the command a results page's header shows (`python -m benchmarks.<name> ...`); `page_header`: that
  header; `page_arguments`: the arguments of a benchmark that runs the package's commands and writes one page.
- `run_part`: one part of a benchmark in a fresh interpreter (its own peak memory, its JSON result); its progress
  line and its end on Ctrl-C are benchmarks/progress.py's.
- `run`, `train`, `evaluate`: train.py and evaluate.py as a user types them, in a working folder; `stoppable`: a
  command stopped as Ctrl-C stops it once its seconds are spent (a run keeps its finished trials).
- `Budget`: a wall-clock budget of parts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import progress

ROOT = Path(__file__).resolve().parents[1]  # the repository: train.py, evaluate.py, configs/, reports/
CONFIGS = ROOT / "configs"


# ----------------------------------------------------------------------------------------------------------------------
# A benchmark's command line and its parts
# ----------------------------------------------------------------------------------------------------------------------


def module_name(script: str) -> str:
    """The module of a benchmark's file (its `__file__`): `benchmarks.<name>`."""
    return f"benchmarks.{Path(script).stem}"


def command_line(script: str, argv: list[str] | None = None) -> list[str]:
    """The command as typed, for a results page's header: `python -m benchmarks.<name>` and its arguments.

    Args:
        script: the benchmark's file (its `__file__`).
        argv: the arguments its `main` was given; None: this process's (sys.argv[1:]).
    """
    return ["python", "-m", module_name(script), *(sys.argv[1:] if argv is None else argv)]


def run_part(
    script: str,
    part: str,
    argv: list[str],
    what: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
) -> dict:
    """Run one part of a benchmark in a fresh interpreter: `python -m benchmarks.<name> --part P --out F ...`.

    Args:
        script: the benchmark's file (its `__file__`), whose `--part` runs the part.
        part: the part's name.
        argv: the part's other arguments.
        what: what the part computes, said as a progress line before it starts (benchmarks/progress.py).
        env: the part's environment (default: this process's).
        cwd: the part's working folder (default: this process's); the benchmarks must be importable from there.

    Returns:
        The JSON object the part wrote to F, with `peak_gib` (the peak memory of its process, ru_maxrss) and
        `process_s` (the wall seconds of its process: the interpreter's start and the imports included) added.

    Raises:
        SystemExit: the part failed (its exit status named).
    """
    if what is not None:
        progress.say(what)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        start = time.perf_counter()
        command = [sys.executable, "-m", module_name(script), "--part", part, "--out", path, *argv]
        status, usage = progress.run_part(command, env, cwd)
        seconds = time.perf_counter() - start
        if status != 0:
            raise SystemExit(f"part {part} failed with exit status {status}")
        result = json.loads(Path(path).read_text())
    finally:
        os.unlink(path)
    return {**result, "peak_gib": usage.ru_maxrss / 1024**2, "process_s": seconds}  # ru_maxrss: KiB on Linux


def page_header(command: list[str], commit: str | None = None):
    """The header of a page written now by `command` (wslight.records.pages.PageHeader).

    Args:
        command: the command as typed.
        commit: the commit of the tree, given where the tree is a copy without its git folder (a GPU machine's).
    """
    import dataclasses

    from wslight.records.pages import PageHeader  # here: the drivers import this module before torch

    header = PageHeader.collect(command)
    if commit:  # a copy of the tree on another machine: its own git folder, if any, need not be the tree's
        header = dataclasses.replace(header, commit=f"{commit} (as given: a copy of that tree)", dirty=False)
    return header


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
    return args, command_line(script)


# ----------------------------------------------------------------------------------------------------------------------
# The package's commands as a user types them: train.py and evaluate.py in a working folder
# ----------------------------------------------------------------------------------------------------------------------


def run(command: list[str], cwd: Path) -> tuple[str, float]:
    """Run a command in `cwd`; its output and wall seconds (a failure stops the benchmark with its output)."""
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr, time.perf_counter() - start


def fit_result(out: str) -> tuple[str, float] | None:
    """The log folder and test accuracy a train.py fit printed (None: it printed either not)."""
    logs = re.search(r"^logs: (\S+)", out, re.M)
    acc = re.search(r"test/acc\s*│\s*([0-9.]+)", out)
    return None if logs is None or acc is None else (logs.group(1), float(acc.group(1)))


def train(config: str, cwd: Path, *extra: str) -> tuple[str, float, float]:
    """train.py fit on `config` (and `extra` arguments): its log folder, test accuracy and wall seconds."""
    out, seconds = run([sys.executable, str(ROOT / "train.py"), "fit", "--config", config, *extra], cwd)
    found = fit_result(out)
    if found is None:
        sys.exit(f"train.py printed no logs folder or test accuracy:\n{out[-3000:]}")
    return *found, seconds


GRACE = 90  # seconds a stopped run may take to write its finished trials and exit


def stoppable(
    command: list[str], cwd: Path, seconds: float, log: str = "last_run.log", grace: float = GRACE, group: bool = False
) -> tuple[int, float, str]:
    """Run `command`; Ctrl-C it after `seconds` (a run keeps its finished trials). Status, wall seconds, output.

    Args:
        command: the command.
        cwd: its working folder.
        seconds: when it is sent SIGINT.
        log: its output's file, in `cwd`.
        grace: the seconds it has after SIGINT before it is killed.
        group: start it in a process group of its own and signal the whole group (the commands it starts too).
    """
    start = time.perf_counter()
    with open(cwd / log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=group
        )

        def send(sig: int) -> None:
            try:
                os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
            except ProcessLookupError:  # it ended meanwhile
                pass

        try:
            proc.wait(timeout=max(1.0, seconds))
        except subprocess.TimeoutExpired:
            send(signal.SIGINT)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                send(signal.SIGKILL)
                proc.wait()
    return proc.returncode, time.perf_counter() - start, (cwd / log).read_text()


def evaluate(config: str, cwd: Path, *extra: str) -> tuple[Path, float]:
    """evaluate.py on `config` (and `extra` arguments): the results.jsonl it printed and wall seconds."""
    out, seconds = run([sys.executable, str(ROOT / "evaluate.py"), "--config", config, *extra], cwd)
    found = re.search(r"^results: (\S+)", out, re.M)
    if found is None:
        sys.exit(f"evaluate.py printed no results file:\n{out[-3000:]}")
    return cwd / found.group(1), seconds


# ----------------------------------------------------------------------------------------------------------------------
# A wall-clock budget
# ----------------------------------------------------------------------------------------------------------------------


class Budget:
    """Wall-clock budget of a whole benchmark: parts ask before they start and are skipped when it is spent."""

    def __init__(self, seconds: float) -> None:
        self.start, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def allows(self, estimate: float) -> bool:
        return estimate <= self.left()
