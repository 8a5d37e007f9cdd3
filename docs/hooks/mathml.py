r"""The theory's TeX as MathML, written into the pages when the site is built (a mkdocs hook, mkdocs.yml `hooks:`).

pymdownx.arithmatex keeps every `$...$` and `$$...$$` whole, as `<span class="arithmatex">\(...\)</span>` and
`<div class="arithmatex">\[...\]</div>`; this hook converts each into MathML with latex2mathml (pure Python), which
browsers render themselves. So the site needs no script from elsewhere (MathJax, KaTeX) and reads offline. A formula
latex2mathml cannot convert is a warning (so `mkdocs build --strict` fails) and stays as TeX.
"""

import html
import logging
import re

from latex2mathml.converter import convert

log = logging.getLogger("mkdocs")

MATH = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)


def _mathml(match: re.Match, where: str) -> str:
    tag, body = match.group(1), html.unescape(match.group(2)).strip()
    display = tag == "div"
    tex = body[2:-2] if body[:2] in ("\\(", "\\[") else body
    try:
        return convert(tex, display="block" if display else "inline")
    except Exception as err:  # latex2mathml raises its own and plain Python errors alike
        log.warning("%s: this TeX does not convert to MathML (%s): %s", where, err, tex[:80])
        return match.group(0)


def on_page_content(content: str, page, **kwargs) -> str:
    """The page's HTML with every arithmatex formula converted to MathML (mkdocs' `on_page_content` event)."""
    return MATH.sub(lambda m: _mathml(m, page.file.src_uri), content)
