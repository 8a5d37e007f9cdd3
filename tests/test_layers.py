"""The floors of the package hold: an import goes to its own floor or a lower one, never up, and never in a circle.

Floors, top to bottom, one folder each (design: the folders are the floors): the command line (`wslight.app`); the
Lightning floor (`wslight.tasks`: modules, callbacks, evaluations, the DataModule); the Delta attack
(`wslight.attack`), the word-sensitivity search (`wslight.search`) and the encoder probes (`wslight.probes`) side by
side; the maps (`wslight.features`); the chain engine and the ball both searches move in (`wslight.chains`); figures
(`wslight.plots`); records (`wslight.records`, plain Python); data (sources, spec, cache, encoders); base
(`wslight.base`: validation, seeding, numerics, names, fingerprints). Every import of a module counts, also one inside
a function; so does the package a module sits in (importing `wslight.data.encoders` runs `wslight/data/__init__.py`).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "wslight"
FLOORS = {  # folder -> floor (higher imports lower); the longest matching prefix decides
    "wslight.__main__": 9,
    "wslight.app": 9,
    "wslight.tasks": 8,
    "wslight.attack": 7,  # the Delta attack and the word-sensitivity search are siblings over the chain engine
    "wslight.search": 7,
    "wslight.probes": 7,
    "wslight.features": 6,
    "wslight.chains": 5,
    "wslight.plots": 4,
    "wslight.records": 3,
    "wslight.data": 2,
    "wslight.base": 1,
    "wslight": 1,  # the package itself: its __init__ holds only the version
}
NAMES = {
    9: "app",
    8: "tasks",
    7: "attack, search, probes",
    6: "features",
    5: "chains",
    4: "plots",
    3: "records",
    2: "data",
    1: "base",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def floor(module: str) -> int:
    prefix = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return FLOORS[prefix]


def imports(module: str) -> set[str]:
    """The package's modules that `module` imports anywhere in its file, with the packages they sit in."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            targets = [target] + [f"{target}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # a module and every package above it run on import
                name = ".".join(parts[:i])
                if name in MODULES and name != module and not module.startswith(name + "."):
                    found.add(name)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_no_import_goes_up_a_floor():
    upward = sorted(
        f"{m} ({NAMES[floor(m)]}) imports {t} ({NAMES[floor(t)]})"
        for m, targets in GRAPH.items()
        for t in targets
        if floor(t) > floor(m)
    )
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    """Tarjan's strongly connected components of the module graph: every one is a single module."""
    circles = [component for component in components(GRAPH) if len(component) > 1]
    assert not circles, circles


def components(graph) -> list[list[str]]:
    """Tarjan's strongly connected components of `graph` (module -> the modules it imports), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for v in sorted(graph):
        if v not in index:
            _visit(graph, v, index, low, stack, found)
    return found


def _visit(graph, v: str, index: dict[str, int], low: dict[str, int], stack: list[str], found: list[list[str]]) -> None:
    """Tarjan's depth-first step from v: the components closed below v are appended to `found`."""
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in graph[v]:
        if w not in index:
            _visit(graph, w, index, low, stack, found)
            low[v] = min(low[v], low[w])
        elif w in stack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        component = []
        while True:
            w = stack.pop()
            component.append(w)
            if w == v:
                break
        found.append(sorted(component))


def test_every_module_has_a_floor():
    assert all(any(m == p or m.startswith(p + ".") for p in FLOORS) for m in MODULES)


@pytest.mark.parametrize(
    "modules",
    [
        ["wslight.features", "wslight.search.sensitivity", "wslight.attack", "wslight.attack.heads", "wslight.probes"],
        ["wslight.records.summary", "wslight.records.paper_checks", "wslight.records.results"],
        ["wslight.data.encoders", "wslight.data.build", "wslight.data.store"],
    ],
    ids=["maths", "records", "data"],
)
def test_the_floors_below_lightning_run_without_it(modules):
    """Importing the maths, the records or the data never loads Lightning (they stay usable from a notebook)."""
    code = f"import sys\nfor m in {modules!r}:\n    __import__(m)\nprint('lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
