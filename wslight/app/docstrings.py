"""Reading Google-style docstrings for the help: the `Args:` section, a first sentence, a class's summary line."""

from __future__ import annotations

import inspect
import re


def arg_docs(doc: str | None) -> dict[str, str]:
    """The `Args:` section of a Google-style docstring as name -> text (`tol, window: ...` gives both names)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    if start is None:
        return {}
    indent = len(lines[start]) - len(lines[start].lstrip())
    docs: dict[str, str] = {}
    names: list[str] = []
    entry_indent = None
    for line in lines[start + 1 :]:
        depth = len(line) - len(line.lstrip())
        if line.strip() and depth <= indent:
            break  # the next section
        if not line.strip():
            continue
        entry = re.match(r"(\w+(?:\s*,\s*\w+)*)\s*(?:\([^)]*\))?:\s*(.*)", line.strip())
        if entry and (entry_indent is None or depth <= entry_indent):
            entry_indent = depth
            names = re.split(r"\s*,\s*", entry.group(1))
            for name in names:
                docs[name] = entry.group(2)
        else:
            for name in names:
                docs[name] += " " + line.strip()
    return docs


def first_sentence(text: str) -> str:
    """The text up to its first full stop outside brackets (not an `e.g.` or `i.e.`)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "." and depth == 0 and text[i + 1 : i + 2] in ("", " ") and not text[:i].endswith(("e.g", "i.e")):
            return text[: i + 1]
    return text


def summary_line(cls: type) -> str:
    """The first sentence of a class's docstring (its first paragraph joined into one line)."""
    paragraph = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]
    return first_sentence(" ".join(paragraph.split()))


def class_arg_docs(cls: type) -> dict[str, str]:
    """The documented constructor arguments of a class and of its bases (a base documents what it adds)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        docs.update(arg_docs(klass.__doc__))
        docs.update(arg_docs(getattr(klass.__dict__.get("__init__"), "__doc__", None)))
    return docs
