"""The contract between the maps and the engines that move a token: declared once on `TokenMove`, read by name.

Every family's move class offers only names `TokenMove` declares (a capability the engines could not see would be
dead code, or a probe waiting to happen), a capability overrides its declared default with the same kind of member,
and the engines (the search, the attack, the chain engine) never probe a move with getattr or isinstance.
"""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import wslight.features as features
from wslight.features.move import TokenMove

PACKAGE = Path(features.__file__).resolve().parents[1]
for _module in pkgutil.iter_modules(features.__path__):
    importlib.import_module(f"wslight.features.{_module.name}")


def subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *subclasses(sub)]
    return out


FAMILIES = [c for c in subclasses(TokenMove) if c.__module__.startswith("wslight.")]
CONTRACT = {n for n in dir(TokenMove) if not n.startswith("_")}


def test_every_family_of_the_package_has_a_move_class():
    names = {c.__name__ for c in FAMILIES}
    assert {"RFMove", "DeepRFMove", "AttentionMove", "MultiHeadMove", "ElementwiseMove", "GenericMove"} <= names


@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
def test_a_family_offers_only_names_of_the_contract(cls):
    """Public members beyond the contract are refused; a family's own constructors (classmethods) are its business."""
    extra = sorted(
        name
        for name, member in vars(cls).items()
        if not name.startswith("_") and name not in CONTRACT and not isinstance(member, classmethod)
    )
    assert not extra, f"{cls.__name__} offers {extra}, which TokenMove does not declare"


@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
def test_a_capability_keeps_its_declared_kind(cls):
    """A declared method stays a method, a property a property, a flag a bool: the engines read it one way."""
    for name, member in vars(cls).items():
        if name.startswith("_") or name not in CONTRACT:
            continue
        declared = inspect.getattr_static(TokenMove, name)
        if isinstance(declared, property):
            assert isinstance(member, property), f"{cls.__name__}.{name} must stay a property"
        elif isinstance(declared, bool):
            assert isinstance(member, bool), f"{cls.__name__}.{name} must be a bool"
        elif declared is None or callable(declared):  # an optional capability (None) or a method
            assert callable(member) or isinstance(member, property), f"{cls.__name__}.{name} must be callable"


def test_every_optional_capability_is_typed_and_none_or_false_by_default():
    declared = TokenMove.__annotations__
    for name in ("value_and_grad", "live_value_and_grad", "curvature_product", "top_curvature", "starts"):
        assert "None" in declared[name] and getattr(TokenMove, name) is None, name
    assert TokenMove.ridges is False and TokenMove.structure_blind is False


ENGINES = ["chains", "search", "attack"]


def _probes(path: Path) -> list[str]:
    """Getattr calls for a name of the contract (or on a move) and isinstance tests against a move class."""
    moves = {c.__name__ for c in FAMILIES} | {"TokenMove"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "getattr" and len(node.args) >= 2:
            first, name = ast.unparse(node.args[0]), node.args[1]
            asked = name.value if isinstance(name, ast.Constant) else None
            # a dataclass read field by field (getattr(self, f.name)) asks no capability
            if asked in CONTRACT or "move" in first:
                found.append(f"{path.name}:{node.lineno} getattr({first}, {ast.unparse(name)})")
        if node.func.id == "isinstance" and len(node.args) == 2:
            classes = ast.unparse(node.args[1])
            if any(m in classes for m in moves):
                found.append(f"{path.name}:{node.lineno} isinstance(..., {classes})")
    return found


@pytest.mark.parametrize("room", ENGINES)
def test_the_engines_read_declared_names_only(room):
    found = [p for path in sorted((PACKAGE / room).glob("*.py")) for p in _probes(path)]
    assert not found, "\n".join(found)
