"""benchmarks.textattack_side without TextAttack installed: its missing-TextAttack exit and its word alignment."""

import subprocess
import sys

from conftest import REPO_ROOT, subprocess_env
from tiny_classifiers import bundled_tokenizer

from benchmarks import textattack_side as side
from wslight.data.word_positions import tokenise


def test_missing_textattack_exits_2_with_the_install_line(tmp_path):
    """Without TextAttack the benchmark says in one line how to install it, exits 2 and writes no page."""
    argv = ["benchmarks.textattack_side", "--model", str(tmp_path / "absent"), "--page", str(tmp_path / "page")]
    code = (
        "import runpy, sys; sys.modules['textattack'] = None; "  # TextAttack not importable, whatever is installed
        f"sys.argv = {argv!r}; runpy.run_module('benchmarks.textattack_side', run_name='__main__', alter_sys=True)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "pip install --target /tmp/ta-site --no-deps textattack==0.3.11" in lines[0]
    assert "PYTHONPATH=/tmp/ta-site" in lines[0]
    assert not (tmp_path / "page").exists()


def test_textattack_words_map_to_the_package_positions_they_are():
    """A TextAttack word gets the package's candidates only where its characters are exactly one package position."""
    text = "I didn't like the film, really-bad acting."
    words = ["I", "didn't", "like", "the", "film", "really-bad", "acting"]  # TextAttack's words_from_text
    spans = side.word_spans(text, words)
    assert [text[a:b] for a, b in spans] == words
    positions = tokenise(bundled_tokenizer(), text, None).positions
    mapped = side.addressable(positions, spans)
    assert sorted(mapped) == [0, 2, 3, 4, 6]  # not "didn't" (didn ' t) nor "really-bad" (really - bad)
    assert all(mapped[i].word == words[i] and (mapped[i].start, mapped[i].end) == spans[i] for i in mapped)
    assert {p.word for p in positions} >= {"didn", "really", "bad"}  # positions TextAttack's words cannot reach
