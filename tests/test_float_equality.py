"""No test compares two floats with `float(a) == float(b)`.

Two floats computed in different orders (a batched forward against a loop, a closed form against a reference formula)
agree to rounding, not to the bit, and which bits they end on depends on the CPU's kernels (AVX2 or not, the BLAS
build): such an assertion passes on one machine and fails on another. A test says the rounding it expects instead,
e.g. `pytest.approx(b, rel=1e-12)` for float64. The check reads the syntax tree of every test file, so a comment or a
string that shows the pattern is not flagged; `make test-rounding` runs the suite under other kernels for the cases
this pattern does not catch.
"""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_float_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float"


def float_equalities(source: str) -> list[int]:
    """The lines of `float(...) == float(...)` in a module's source (chained comparisons included)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
                if isinstance(op, ast.Eq) and _is_float_call(left) and _is_float_call(right):
                    lines.append(node.lineno)
    return lines


def test_the_check_finds_the_pattern_and_nothing_else():
    eq = "=" * 2  # the pattern spelled out would be flagged by a plain-text search of the tests
    flagged = f"assert float(a) {eq} float(b @ c + 0.3)\nx = 1 < float(a) {eq} float(b)\n"
    kept = (
        "assert float(a) == pytest.approx(float(b), rel=1e-12)\n"
        "assert float(a) == 1.0 and int(a) == int(b) and float(a) != float(b)\n"
        "s = 'float(a) == float(b)'  # float(a) == float(b)\n"
    )
    assert float_equalities(flagged) == [1, 2]
    assert float_equalities(kept) == []


def test_no_test_compares_two_floats_exactly():
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in float_equalities(path.read_text())
    ]
    assert not found, (
        "float(...) == float(...) compares two floats to the last bit; say the rounding expected instead, e.g. "
        f"pytest.approx(b, rel=1e-12) for float64: {', '.join(found)}"
    )
