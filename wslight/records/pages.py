"""Results pages: the header every page a run writes starts with (date, machine, commit, command), and writing one.

`wslight reproduce` (`make reproduce`) and the benchmarks (`make bench`) write their results pages with `write_page`,
so each page says where its numbers come from in the same words; `make results-pages` copies the pages of the latest
runs into docs/results/ (wslight.app.results_pages).
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout this wslight runs from (a git work tree, or not)
NO_COMMIT = "unknown (not a git checkout)"


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows of it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system tells it, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def device() -> str:
    """The device torch computes on here: `cuda: <name>` when a GPU is visible, else `cpu`."""
    import torch

    return f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"


def git_commit(root: Path = ROOT) -> tuple[str, bool]:
    """The short commit of the checkout at `root`, and whether its tracked files differ from it (dirty).

    (`NO_COMMIT`, False) where `root` is no git work tree (an installed wheel) or git is missing.
    """
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30
        )
        if head.returncode != 0:
            return NO_COMMIT, False
        changes = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return NO_COMMIT, False
    return head.stdout.strip(), bool(changes.stdout.strip())


def load_averages() -> tuple[float, ...]:
    """The system's 1, 5 and 15-minute load averages, () where the system does not give them."""
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return ()


@dataclass(frozen=True)
class PageHeader:
    """Where a results page's numbers come from.

    Attributes:
        date: when the page was written, UTC (`2026-11-27 14:03 UTC`).
        cpu: the CPU's model name.
        cores: the CPU cores the run could use.
        torch: torch's version.
        device: `cpu`, or `cuda: <GPU name>`.
        commit: the short commit of the code, or `NO_COMMIT`.
        dirty: whether the tree's tracked files had changes from that commit.
        command: the command that wrote the page, as typed.
        load: the system's load averages over 1, 5 and 15 minutes when the page was written (empty where the system
            does not say): above the number of cores, other work shared the machine and the page's timings are
            contended ones.
    """

    date: str
    cpu: str
    cores: int
    torch: str
    device: str
    commit: str
    dirty: bool
    command: str
    load: tuple[float, ...] = ()

    @classmethod
    def collect(cls, command: str | Sequence[str], root: Path = ROOT) -> PageHeader:
        """The header of a page written now, on this machine, by `command` (a string or its words) from `root`."""
        import torch

        commit, dirty = git_commit(root)
        return cls(
            date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            cpu=cpu_model(),
            cores=usable_cores(),
            torch=torch.__version__,
            device=device(),
            commit=commit,
            dirty=dirty,
            command=command if isinstance(command, str) else shlex.join(command),
            load=load_averages(),
        )

    def markdown(self) -> list[str]:
        """The header's lines: the four fields a reader needs, each on a line of a list."""
        return [
            "Written by the run below, not by hand (`make results-pages` copies the latest run's pages here):",
            "",
            f"- date: {self.date}",
            f"- machine: {self.cpu}, {self.cores} cores, torch {self.torch}, device {self.device}",
            f"- commit: `{self.commit}`" + (" (dirty: the tree had changes not committed)" if self.dirty else ""),
            f"- command: `{self.command}`",
            *self._load_line(),
            "",
        ]

    def _load_line(self) -> list[str]:
        """The load line, saying whether the machine was shared (more runnable work than cores) while the run ended."""
        if not self.load:
            return []
        busy = max(self.load) > self.cores
        verdict = "other work shared the machine: timings are contended" if busy else "the machine was not shared"
        averages = ", ".join(f"{x:.1f}" for x in self.load)
        return [f"- load: {averages} (1, 5, 15-minute averages at the end, {self.cores} cores: {verdict})"]


def write_page(path: Path, title: str, header: PageHeader, body: list[str]) -> Path:
    """Write a results page: its title, the header, then the body's lines; return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([f"# {title}", "", *header.markdown(), *body]).rstrip("\n") + "\n")
    return path
