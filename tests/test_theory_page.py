r"""The theory page's TeX renders as math on the site (mkdocs.yml: pymdownx.arithmatex, docs/hooks/mathml.py).

arithmatex takes `$$...$$` as display math only as a block of its own (a blank line before it), and the hook converts
each formula whole: a `$` inside display math stays a literal `$`, a backslash ending a line of it a literal `\`, and
a heading's math shows as raw `\(...\)` in the table of contents. So the page writes display math as blocks, text
inside it with `\text{...}`, and its headings in words and Unicode (Δ, θ, n).
"""

import re
from pathlib import Path

import pytest

THEORY = Path(__file__).resolve().parents[1] / "docs" / "theory.md"


def display_blocks(text: str) -> list[tuple[int, int, str]]:
    """(line of the opening `$$`, line of the closing one, the TeX between them), 1-based lines."""
    out = []
    starts = [m.start() for m in re.finditer(r"\$\$", text)]
    assert len(starts) % 2 == 0, "an odd number of $$ on the theory page"
    for a, b in zip(starts[::2], starts[1::2]):
        out.append((text.count("\n", 0, a) + 1, text.count("\n", 0, b) + 1, text[a + 2 : b]))
    return out


def test_no_heading_holds_math():
    text = THEORY.read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert len(headings) > 50
    bad = [h for h in headings if "$" in h or "\\(" in h or "\\[" in h]
    assert not bad, f"headings with math (raw TeX in the table of contents): {bad}"


def test_display_math_holds_no_inline_math_and_no_line_ending_in_a_backslash():
    text = THEORY.read_text(encoding="utf-8")
    blocks = display_blocks(text)
    assert len(blocks) > 20
    inline = [(a, tex[:60]) for a, _, tex in blocks if "$" in tex]
    assert not inline, f"$ inside display math (rendered as text): {inline}"
    stray = [(a, line) for a, _, tex in blocks for line in tex.splitlines() if re.search(r"(?<!\\)\\$", line)]
    assert not stray, f"a display line ending in a lone backslash (rendered as a stray \\): {stray}"


def test_display_math_stands_as_a_block_of_its_own():
    lines = THEORY.read_text(encoding="utf-8").splitlines()
    bad = []
    for a, b, _ in display_blocks("\n".join(lines)):
        before = lines[a - 2] if a >= 2 else ""
        after = lines[b] if b < len(lines) else ""
        if before.strip() or after.strip() or not lines[a - 1].lstrip().startswith("$$"):
            bad.append((a, lines[a - 1][:60]))
    assert not bad, f"display math inside a paragraph (arithmatex reads it as $ + inline math + $): {bad}"


def test_every_formula_converts_to_mathml_without_a_raw_command():
    convert = pytest.importorskip("latex2mathml.converter").convert  # the docs extra
    text = THEORY.read_text(encoding="utf-8")
    display = [tex for _, _, tex in display_blocks(text)]
    inline = re.findall(r"(?<![\\$])\$([^$\n]+?)\$", re.sub(r"\$\$.*?\$\$|`[^`\n]*`", "", text, flags=re.S))
    assert len(inline) > 300
    raw = []
    for tex in display + inline:
        mathml = convert(tex)
        if re.search(r"<m(i|o|n|text)>[^<]*\\", mathml):
            raw.append(tex[:60])
    assert not raw, f"TeX that latex2mathml leaves as a raw command: {raw}"
