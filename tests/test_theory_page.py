r"""The theory pages (docs/theory/): their TeX renders as math on the site, and their section references resolve.

arithmatex (mkdocs.yml: pymdownx.arithmatex) takes `$$...$$` as display math only as a block of its own (a blank line
before it), and docs/hooks/mathml.py converts each formula whole: a `$` inside display math stays a literal `$`, a
backslash ending a line of it a literal `\`, and a heading's math shows as raw `\(...\)` in the table of contents. So
the pages write display math as blocks, text inside it with `\text{...}`, and their headings in words and Unicode (Δ,
θ, n).

The sections are numbered across the pages (§4.3 is on search.md), and the code cites them as
`docs/theory/<page>.md §4.3`: a section reference on another page than the section's is a link to it, and a cited page
holds the section cited.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THEORY = ROOT / "docs" / "theory"
PAGES = sorted(THEORY.glob("*.md"))
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.M)


def display_blocks(text: str) -> list[tuple[int, int, str]]:
    """(line of the opening `$$`, line of the closing one, the TeX between them), 1-based lines."""
    out = []
    starts = [m.start() for m in re.finditer(r"\$\$", text)]
    assert len(starts) % 2 == 0, "an odd number of $$ on a theory page"
    for a, b in zip(starts[::2], starts[1::2]):
        out.append((text.count("\n", 0, a) + 1, text.count("\n", 0, b) + 1, text[a + 2 : b]))
    return out


def section_pages() -> dict[str, str]:
    """Every numbered section (`4`, `4.3`) -> the name of the page that holds it (`search`)."""
    where: dict[str, str] = {}
    for page in PAGES:
        for number in HEADING.findall(page.read_text(encoding="utf-8")):
            assert number not in where, f"§{number} on {where[number]}.md and {page.name}"
            where[number] = page.stem
    return where


def test_the_pages_are_the_ones_the_site_lists():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert [p.name for p in PAGES] == [
        "attack.md",
        "checks.md",
        "index.md",
        "maps.md",
        "probes.md",
        "search.md",
        "words.md",
    ]
    assert all(f"theory/{p.name}" in nav for p in PAGES)
    assert not (ROOT / "docs" / "theory.md").exists()


def test_every_section_is_on_one_page_and_numbered_without_a_gap():
    where = section_pages()
    top = sorted(int(n) for n in where if "." not in n)
    assert top == list(range(1, 14))
    assert where["1"] == "index" and where["4.3"] == "search" and where["13.5"] == "words"


def test_no_heading_holds_math():
    headings = [line for p in PAGES for line in p.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    assert len(headings) > 50
    bad = [h for h in headings if "$" in h or "\\(" in h or "\\[" in h]
    assert not bad, f"headings with math (raw TeX in the table of contents): {bad}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_display_math_holds_no_inline_math_and_no_line_ending_in_a_backslash(page):
    blocks = display_blocks(page.read_text(encoding="utf-8"))
    inline = [(a, tex[:60]) for a, _, tex in blocks if "$" in tex]
    assert not inline, f"$ inside display math (rendered as text): {inline}"
    stray = [(a, line) for a, _, tex in blocks for line in tex.splitlines() if re.search(r"(?<!\\)\\$", line)]
    assert not stray, f"a display line ending in a lone backslash (rendered as a stray \\): {stray}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_display_math_stands_as_a_block_of_its_own(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    bad = []
    for a, b, _ in display_blocks("\n".join(lines)):
        before = lines[a - 2] if a >= 2 else ""
        after = lines[b] if b < len(lines) else ""
        if before.strip() or after.strip() or not lines[a - 1].lstrip().startswith("$$"):
            bad.append((a, lines[a - 1][:60]))
    assert not bad, f"display math inside a paragraph (arithmatex reads it as $ + inline math + $): {bad}"


def test_every_formula_converts_to_mathml_without_a_raw_command():
    convert = pytest.importorskip("latex2mathml.converter").convert  # the docs extra
    display, inline = [], []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        display += [tex for _, _, tex in display_blocks(text)]
        inline += re.findall(r"(?<![\\$])\$([^$\n]+?)\$", re.sub(r"\$\$.*?\$\$|`[^`\n]*`", "", text, flags=re.S))
    assert len(display) > 20 and len(inline) > 300
    raw = []
    for tex in display + inline:
        mathml = convert(tex)
        if re.search(r"<m(i|o|n|text)>[^<]*\\", mathml):
            raw.append(tex[:60])
    assert not raw, f"TeX that latex2mathml leaves as a raw command: {raw}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_reference_to_a_section_on_another_page_is_a_link_to_it(page):
    where = section_pages()
    text = re.sub(r"`[^`\n]*`", "", page.read_text(encoding="utf-8"))  # code spans cite paths, not sections
    bad = []
    for m in re.finditer(r"(\[)?§(\d+(?:\.\d+)?)(?!\d)(?:\]\((\w+)\.md#[\w-]+\))?", text):
        number, target = m.group(2), m.group(3)
        if number not in where:
            bad.append(f"§{number}: no such section")
        elif target is not None and target != where[number]:
            bad.append(f"§{number} links to {target}.md, it is on {where[number]}.md")
        elif target is None and where[number] != page.stem:
            bad.append(f"§{number} is on {where[number]}.md: a link to it is needed")
    assert not bad, bad


def test_a_cited_page_holds_the_sections_cited():
    """`docs/theory/search.md §4.3` in the code, tests, configs and docs: §4.3 is on search.md."""
    where = section_pages()
    files = [ROOT / "Makefile", ROOT / "README.md"]
    for folder in ("wslight", "tests", "configs", "benchmarks", "docs"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".yaml", ".md") and p.is_file()]
    refs = re.compile(
        r"theory/(\w+)\.md((?:[ \t]+|[ \t]*\n[ \t]*#*[ \t]*)§[\d.]+(?:-[\d.]+)?(?:,[ \t]*§[\d.]+(?:-[\d.]+)?)*)"
    )
    bad, seen = [], 0
    for path in files:
        for m in refs.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for number in re.findall(r"§(\d+(?:\.\d+)?)", m.group(2)):
                seen += 1
                if where.get(number.rstrip(".")) != m.group(1):
                    bad.append(f"{path.relative_to(ROOT)}: theory/{m.group(1)}.md §{number}")
    assert seen > 0
    assert not bad, bad
