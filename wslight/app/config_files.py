"""The configs shipped with the package, found by name: `--config ws/raf` from any working directory.

The YAML files live in `configs/` at the repository root and are installed as the package data `wslight/configs/`
(pyproject.toml maps the folder), so a wheel carries them. A `--config` value that names an existing file (relative to
the working directory) is used as given; otherwise `ws/raf`, `ws/raf.yaml` or `configs/ws/raf.yaml` resolve to the
shipped file. A directory (`--config configs/ws`, `--config ws`) is refused with what to give instead.

Overlays. A config file whose first line is `# overlay of: <name>` holds only what differs from the shipped config
`<name>` (the paper's setting, the reproduce grid, a tiny test setting). `--config <overlay>` stands for
`--config <base> --config <overlay>`: jsonargparse reads them in that order and the later value wins, key by key (a
list is replaced whole). The base is always a shipped name (never a file of the working directory) and may itself be
an overlay (`paper/ws/deep_rf_h200` -> `paper/ws/deep_rf` -> `ws/deep_rf`). To put your own files together, give them
in order: `--config base.yaml --config mine.yaml`.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError

_PACKAGE = Path(__file__).resolve().parents[1]  # wslight/


class UnknownConfigError(UsageError):
    """A `--config` value that is neither a file nor a shipped config name (the message lists close names)."""


def configs_dir() -> Path:
    """The shipped configs: `wslight/configs` in an installed wheel, the repository's `configs/` in a checkout."""
    installed = _PACKAGE / "configs"
    return installed if installed.is_dir() else _PACKAGE.parent / "configs"


def shipped_names() -> list[str]:
    """Every shipped config as a name without `.yaml` (`raf`, `ws/raf`, `paper/attack/fig4`, ...)."""
    root = configs_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def _name(value: str) -> str:
    """`configs/ws/raf.yaml`, `ws/raf.yaml` -> `ws/raf`."""
    name = value[len("configs/") :] if value.startswith("configs/") else value
    return name.removesuffix(".yaml").removesuffix(".yml")


def _no_shipped(what: str, name: str) -> UnknownConfigError:
    names = shipped_names()
    close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; shipped configs: {', '.join(names)}"
    return UnknownConfigError(f"{what}: no such file, and no shipped config named {name!r}{hint}")


def _folder_error(value: str, folder: Path) -> UnknownConfigError:
    """`--config <a directory>`: say that it is one, and what to give instead (a few of the YAML files it holds)."""
    files = sorted(p for p in folder.glob("*.y*ml") if p.is_file())
    shown = ", ".join(str(p) for p in files[:3]) + (", ..." if len(files) > 3 else "")
    inside = f"a YAML file in it ({shown})" if files else "a YAML file"
    return UnknownConfigError(
        f"--config {value}: {folder} is a directory, not a config file; give {inside} or the name of a shipped "
        "config such as ws/raf"
    )


def find_config(value: str) -> Path:
    """The file a `--config` value means: an existing path as given, else the shipped config of that name.

    Raises:
        UnknownConfigError: neither exists, or the value names a directory (of the working directory, or a folder of
            shipped configs such as `ws`); the message lists the closest shipped names, or what to give instead.
    """
    given = Path(value).expanduser()
    if given.is_file() or "\n" in value or ": " in value:  # a file, or YAML given inline
        return given
    if given.is_dir():
        raise _folder_error(value, given)
    if given.is_absolute() or value.startswith(("./", "../", "~")):  # meant as a file, not a shipped name
        raise UnknownConfigError(f"--config {value}: no such file")
    shipped = configs_dir() / f"{_name(value)}.yaml"
    if shipped.is_file():
        return shipped
    folder = configs_dir() / _name(value)
    if _name(value) and folder.is_dir():  # `ws`: a folder of shipped configs
        names = sorted(p.relative_to(configs_dir()).with_suffix("").as_posix() for p in folder.rglob("*.yaml"))
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise UnknownConfigError(
            f"--config {value}: {_name(value)} is a folder of shipped configs, not a config; give one of {shown}"
        )
    raise _no_shipped(f"--config {value}", _name(value))


def overlay_chain(path: Path) -> list[Path]:
    """The files `path` stands for, in the order jsonargparse reads them.

    Its base (and the base's base, ...), then `path` itself; `[path]` for a whole config.

    Raises:
        UnknownConfigError: an overlay names no shipped config (the message names the file and lists close names).
        UsageError: overlays that name each other in a circle.
    """
    chain = [path]
    while (name := base_of(chain[0])) is not None:  # the first line `# overlay of: <name>` (`base_of`)
        base = configs_dir() / f"{name}.yaml"
        if not base.is_file():
            raise _no_shipped(f"{chain[0]}, line 1: overlay of {name}", name)
        if base.resolve() in [p.resolve() for p in chain]:
            circle = " -> ".join(str(p) for p in [*reversed(chain), base])
            raise UsageError(f"{chain[0]}, line 1: overlay of {name}: overlays in a circle ({circle})")
        chain.insert(0, base)
    return chain


def resolve_config_args(args: list[str]) -> list[str]:
    """`args` with every `--config NAME` / `--config=NAME` replaced by the path of the file it names.

    An overlay is preceded by its base(s): `--config paper/ws/raf` -> `--config .../ws/raf.yaml --config
    .../paper/ws/raf.yaml`.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--config", "-c") and i + 1 < len(args):
            for path in _expand(args[i + 1]):
                out += [a, path]
            i += 2
            continue
        if a.startswith("--config="):
            out += [f"--config={path}" for path in _expand(a.split("=", 1)[1])]
        else:
            out.append(a)
        i += 1
    return out


def _expand(value: str) -> list[str]:
    """The `--config` values one value stands for: its bases (shipped files), then the file.

    The file is given as it was typed when it is a path, so that messages name it as typed, and as the shipped path for
    a name. YAML given inline stays as it is.
    """
    path = find_config(value)
    if not path.is_file():
        return [value]
    given = value if str(path) == value else str(path)
    return [*(str(p) for p in overlay_chain(path)[:-1]), given]


# --- reading a config file: its overlay line, strictly (syntax, repeated keys, empty files) ------------------------
def config_paths(args: list[str]) -> list[Path]:
    """The values of every `--config X` / `--config=X` of a command line, as paths."""
    out = []
    for i, a in enumerate(args):
        if a in ("--config", "-c") and i + 1 < len(args):
            out.append(Path(args[i + 1]))
        elif a.startswith("--config="):
            out.append(Path(a.split("=", 1)[1]))
    return out


# The first line of an overlay file, `# overlay of: ws/raf`: wslight.app.config_files reads the shipped config of that
# name first (`overlay_chain`); the messages read it too, to name the file a user gave.
OVERLAY_LINE = re.compile(r"#\s*overlay of:\s*(\S+)\s*$")


def base_of(path: Path) -> str | None:
    """The name of the shipped config an overlay file is read on top of, else None.

    `ws/raf` from its first line `# overlay of: ws/raf`; `configs/ws/raf.yaml` there means the same.
    """
    try:
        with path.open() as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError, ValueError):  # not a readable text file: jsonargparse reports it
        return None
    m = OVERLAY_LINE.match(first.strip())
    return m.group(1).removeprefix("configs/").removesuffix(".yaml").removesuffix(".yml") if m else None


def load_yaml(path: Path) -> Any:
    """The content of a YAML file, or None when it cannot be read or parsed (the strict reading is `read_config`)."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: not UTF-8
        return None


def read_text(path: Path) -> str:
    """The text of a UTF-8 file.

    Raises:
        UsageError: the file is not UTF-8 (naming the file, the line and column of the first byte that is not, and
            what to do).
        OSError: the file cannot be read.
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        start = data.rfind(b"\n", 0, err.start) + 1  # where the line of the first bad byte begins
        line = data.count(b"\n", 0, err.start) + 1
        column = len(data[start : err.start].decode("utf-8")) + 1  # in characters: the line is UTF-8 up to there
        raise UsageError(
            f"{path}, line {line}, column {column}: byte 0x{data[err.start]:02x} is not UTF-8 (the file was saved in "
            "another encoding, e.g. Latin-1); save it as UTF-8 (`iconv -f latin1 -t utf-8`, or the editor's encoding "
            "setting)"
        ) from None


def _place(path: Path, mark: Any) -> str:
    return f"{path}, line {mark.line + 1}, column {mark.column + 1}"  # yaml counts lines and columns from 0


def _syntax_message(path: Path, err: yaml.YAMLError) -> str:
    """`<file>, line L, column C: invalid YAML: <problem>` (and where the unclosed construct began)."""
    if not isinstance(err, yaml.MarkedYAMLError) or (err.problem_mark or err.context_mark) is None:
        return f"{path}: invalid YAML: {' '.join(str(err).split())}"
    mark = err.problem_mark or err.context_mark
    msg = f"{_place(path, mark)}: invalid YAML: {err.problem or err.context}"
    if err.problem and err.context and err.context_mark is not None and err.context_mark.line != mark.line:
        msg += f" ({err.context} at line {err.context_mark.line + 1}, column {err.context_mark.column + 1})"
    if "'\\t'" in str(err.problem):
        msg += "; indent with spaces, not tabs"
    return msg


def _repeated_key(node: yaml.Node, prefix: str = "", seen: set[int] | None = None) -> tuple[str, int, int] | None:
    """(key path, line, first line) of the first key written twice in one mapping of a composed YAML document.

    PyYAML keeps the last of two equal keys without a word, and jsonargparse reads files with it; merge keys (`<<:`)
    are overrides by design and are not counted.
    """
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already walked
        return None
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, yaml.ScalarNode):
                continue
            name = (key.tag, key.value)
            if name in first:
                return f"{prefix}{key.value}", key.start_mark.line + 1, first[name]
            first[name] = key.start_mark.line + 1
            found = _repeated_key(value, f"{prefix}{key.value}.", seen)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _repeated_key(item, f"{prefix}{i}.", seen)
            if found:
                return found
    return None


def read_config(path: Path) -> Any:
    """The content of a `--config` file, or None for a value that is no file (YAML given inline).

    Raises:
        UsageError: a file that is not UTF-8 or has a YAML syntax error (the file, line and column), a key written
            twice in one block (the file, line and key path), an empty file or one that holds no keys.
    """
    try:
        text = read_text(path)
    except OSError:
        return None  # jsonargparse reads and reports what is not a file
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        repeated = _repeated_key(node) if node is not None else None
        if repeated:
            key, line, first = repeated
            raise UsageError(
                f"{path}, line {line}: {key} is written twice in the same block (first at line {first}); "
                "YAML would silently keep only the last: remove one"
            )
        tree = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise UsageError(_syntax_message(path, err)) from err
    if tree is None:
        raise UsageError(f"{path} is empty (no keys): a config needs at least a model: block")
    if not isinstance(tree, dict):
        raise UsageError(f"{path} must hold keys (model:, trainer:, ...), got a {type(tree).__name__}: {tree!r:.60}")
    return tree
