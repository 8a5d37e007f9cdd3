"""The configs shipped with the package, found by name: `--config ws/raf` from any working directory.

The YAML files live in `configs/` at the repository root and are installed as the package data `wslight/configs/`
(pyproject.toml maps the folder), so a wheel carries them. A `--config` value that names an existing file (relative to
the working directory) is used as given; otherwise `ws/raf`, `ws/raf.yaml` or `configs/ws/raf.yaml` resolve to the
shipped file.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from .messages import UsageError

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


def find_config(value: str) -> Path:
    """The file a `--config` value means: an existing path as given, else the shipped config of that name.

    Raises:
        UnknownConfigError: neither exists; the message lists the closest shipped names.
    """
    given = Path(value).expanduser()
    if given.is_file() or "\n" in value or ": " in value:  # a file, or YAML given inline
        return given
    if given.is_absolute() or value.startswith(("./", "../", "~")):  # meant as a file, not a shipped name
        raise UnknownConfigError(f"--config {value}: no such file")
    name = value[len("configs/") :] if value.startswith("configs/") else value
    name = name.removesuffix(".yaml").removesuffix(".yml")
    shipped = configs_dir() / f"{name}.yaml"
    if shipped.is_file():
        return shipped
    names = shipped_names()
    close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; shipped configs: {', '.join(names)}"
    raise UnknownConfigError(f"--config {value}: no such file, and no shipped config named {name!r}{hint}")


def resolve_config_args(args: list[str]) -> list[str]:
    """`args` with every `--config NAME` / `--config=NAME` replaced by the path of the file it names."""
    out = list(args)
    for i, a in enumerate(out):
        if a in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = _as_arg(out[i + 1])
        elif a.startswith("--config="):
            out[i] = f"--config={_as_arg(a.split('=', 1)[1])}"
    return out


def _as_arg(value: str) -> str:
    path = find_config(value)
    return value if str(path) == value or not path.is_file() else str(path)
