"""Size limits of the package's code: no module over 400 lines, no function over 80.

A module past the limit holds more than one concept (split it into modules of one job each); a function past it does
several steps (give each step a helper of its own). Each failure names the file, the function and its length.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "wslight"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
MODULES = sorted(PACKAGE.rglob("*.py"))


def relative(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length in lines with decorators left out) of every function of a module."""
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                out.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return out


def test_the_package_has_modules_to_measure():
    assert len(MODULES) > 50 and PACKAGE / "__init__.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=relative)
def test_no_module_is_over_400_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_FILE_LINES, f"{relative(path)} has {lines} lines (at most {MAX_FILE_LINES})"


@pytest.mark.parametrize("path", MODULES, ids=relative)
def test_no_function_is_over_80_lines(path):
    long = [
        f"{relative(path)}:{first} {name} has {length} lines (at most {MAX_FUNCTION_LINES})"
        for name, first, length in function_lengths(path)
        if length > MAX_FUNCTION_LINES
    ]
    assert not long, "\n".join(long)


def test_the_measure_counts_a_function_from_its_def_to_its_last_line(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class A:\n    def f(self):\n        def g():\n            pass\n\n        return 1\n")
    assert function_lengths(module) == [("A.f", 2, 5), ("A.f.g", 3, 2)]
