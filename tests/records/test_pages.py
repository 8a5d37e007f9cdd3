"""The header of every results page: the date, the machine, the commit (dirty or not) and the command."""

import os
import re
import subprocess

import pytest
import torch

from wslight.records.pages import NO_COMMIT, PageHeader, git_commit, write_page


def git(root, *args):
    """Run git in `root` with a throwaway identity; return its stdout."""
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", *ident, "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def checkout(tmp_path):
    """A git work tree with one commit of one tracked file."""
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git(tmp_path, "add", "code.py")
    git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def test_the_commit_is_the_checkouts_and_dirty_only_when_a_tracked_file_changed(checkout):
    head = git(checkout, "rev-parse", "--short", "HEAD").strip()
    assert git_commit(checkout) == (head, False)
    (checkout / "notes.txt").write_text("untracked\n")  # an untracked file leaves the code as committed
    assert git_commit(checkout) == (head, False)
    (checkout / "code.py").write_text("x = 2\n")
    assert git_commit(checkout) == (head, True)


def test_no_checkout_says_so(tmp_path):
    assert git_commit(tmp_path) == (NO_COMMIT, False)


def test_the_header_names_this_machine_the_commit_and_the_command(checkout):
    (checkout / "code.py").write_text("x = 2\n")
    header = PageHeader.collect(["python", "benchmarks/ws.py", "--skip", "rf step"], root=checkout)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", header.date)
    assert header.cores == len(os.sched_getaffinity(0)) and header.torch == torch.__version__
    assert header.device == ("cpu" if not torch.cuda.is_available() else f"cuda: {torch.cuda.get_device_name(0)}")
    assert header.cpu and header.commit == git(checkout, "rev-parse", "--short", "HEAD").strip() and header.dirty
    assert header.command == "python benchmarks/ws.py --skip 'rf step'"  # as a shell takes it back
    lines = header.markdown()
    assert f"- date: {header.date}" in lines
    assert f"- machine: {header.cpu}, {header.cores} cores, torch {header.torch}, device {header.device}" in lines
    assert f"- commit: `{header.commit}` (dirty: the tree had changes not committed)" in lines
    assert "- command: `python benchmarks/ws.py --skip 'rf step'`" in lines
    assert len(header.load) == 3 and all(x >= 0 for x in header.load)


def test_the_load_line_says_whether_other_work_shared_the_machine():
    quiet = PageHeader(
        "2026-01-02 03:04 UTC", "a CPU", 2, "2.13.0", "cpu", "abc1234", False, "make bench", (0.9, 1.2, 1.1)
    )
    busy = PageHeader(
        "2026-01-02 03:04 UTC", "a CPU", 2, "2.13.0", "cpu", "abc1234", False, "make bench", (3.1, 2.4, 1.9)
    )
    assert "- load: 0.9, 1.2, 1.1 (1, 5, 15-minute averages at the end, 2 cores: the machine was not shared)" in (
        quiet.markdown()
    )
    assert (
        "- load: 3.1, 2.4, 1.9 (1, 5, 15-minute averages at the end, 2 cores: other work shared the machine: "
        "timings are contended)" in busy.markdown()
    )
    assert not any(line.startswith("- load") for line in PageHeader("a", "b", 2, "c", "d", "e", False, "f").markdown())


def test_a_page_is_its_title_the_header_then_the_body(tmp_path):
    header = PageHeader("2026-01-02 03:04 UTC", "a CPU", 2, "2.13.0", "cpu", "abc1234", False, "make bench")
    page = write_page(tmp_path / "bench" / "ws_speed.md", "Word-sensitivity speed", header, ["| a |", "|---|"])
    text = page.read_text()
    assert text.startswith("# Word-sensitivity speed\n\nWritten by the run below, not by hand")
    assert "- commit: `abc1234`\n" in text and "dirty" not in text
    assert text.index("- command: `make bench`") < text.index("| a |") and text.endswith("|---|\n")
