"""Makefile targets that talk to the outside world fail in one line that says what to do."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_authors_code_without_the_repository_is_one_line_naming_it_and_exit_2(tmp_path):
    """`make authors-code` where the repository cannot be reached (offline): no raw git error, the folder named."""
    url, folder = tmp_path / "unreachable", tmp_path / "authors" / "attention-sensitivity"
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "authors-code", f"AUTHORS_URL={url}", f"AUTHORS_CODE={folder}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")},  # under make test
    )
    assert done.returncode == 2
    ours = [line for line in done.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*", line)]  # make's own
    assert len(ours) == 1, done.stderr
    assert ours[0].startswith(f"make authors-code: error: cannot clone {url} into {folder} (")
    assert "does not exist" in ours[0] and "at commit b984775" in ours[0]
    assert not folder.exists()
