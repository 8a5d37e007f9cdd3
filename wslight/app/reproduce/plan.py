"""The reproduction's plan: `configs/reproduce/plan.yaml`, its `offline` and `full` lists of stages.

Each stage is an evaluate.py config (a file or a shipped name; an overlay runs on top of its base) that a user can also
run alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from ...base import validate
from ..config_files import (
    UnknownConfigError,
    configs_dir,
    find_config,
    overlay_chain,
    read_config,
    read_text,
    resolve_config_args,
)
from ..errors import UsageError
from ..messages import given_values
from ..placement import available_cores, on_cpu

PLAN = configs_dir() / "reproduce" / "plan.yaml"
PLANS = ("offline", "full")


@dataclass
class Stage:
    """One evaluate.py run of a config: a file, or a shipped config's name.

    `configs/reproduce/ws_rf.yaml` resolves to the shipped file from any working directory; an overlay is run on top of
    its base, as `--config` does.
    """

    name: str
    config: str
    title: str = ""

    @property
    def path(self) -> Path:
        """The config's file: the shipped file of a name, else the path as given."""
        try:
            return find_config(self.config)
        except UnknownConfigError:
            return Path(self.config)  # does not exist: `load_plan` names the stage

    def shares_maps(self) -> bool:
        """True when the config's cells share one random map across their trials.

        That is `shared_weights: true` in the config or its base, the overlay winning, as jsonargparse reads them.
        """
        given = given_values(resolve_config_args(["--config", str(self.path)]), "model.init_args.shared_weights")
        return bool(given and given[-1][1])

    def processes(self) -> int:
        """How many processes the stage runs on this machine.

        Its `trainer.devices` (the overlay winning), with `auto` on the CPU one per available core
        (wslight.app.placement).
        """
        args = resolve_config_args(["--config", str(self.path)])
        given = given_values(args, "trainer.devices")
        devices = given[-1][1] if given else "auto"
        if str(devices) == "auto":
            accelerator = given_values(args, "trainer.accelerator")
            return available_cores() if on_cpu(accelerator[-1][1] if accelerator else "auto") else 1
        return int(devices) if isinstance(devices, int) or str(devices).isdigit() else 1


def load_plan(which: str = "offline", path: str | Path = PLAN) -> list[Stage]:
    """The ordered stages of the plan file's `offline` or `full` list.

    Each entry has `name` (its folder and section in the report), `config` (a file or a shipped name; an overlay runs
    on top of its base) and optionally `title`.

    Raises:
        ValueError: a malformed entry, or a stage's config that is missing or cannot be read (naming the stage).
        UsageError: the plan file is not UTF-8 (`read_text`).
    """
    validate.choice("plan", which, PLANS)
    path = Path(path)
    plan = yaml.safe_load(read_text(path)) or {}
    entries = plan.get(which)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: `{which}` must be a non-empty list of stages, got {entries!r}")
    stages = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry.get("config"):
            raise ValueError(f"{path}: {which}[{i}] must have a `name` and a `config`, got {entry!r}")
        unknown = sorted(set(entry) - {"name", "config", "title"})
        if unknown:
            raise ValueError(f"{path}: {which}[{i}] ({entry['name']}): unknown key(s) {unknown}")
        stage = Stage(entry["name"], str(entry["config"]), str(entry.get("title", "")))
        if not stage.path.is_file():
            raise ValueError(f"{path}: {which}[{i}] ({stage.name}): config {stage.config} does not exist")
        try:
            overlay_chain(stage.path)  # an overlay's base exists: named here, before any stage runs
            read_config(stage.path)  # UTF-8, valid YAML, no key written twice
        except UsageError as err:
            raise ValueError(f"{path}: {which}[{i}] ({stage.name}): {err}") from None
        stages.append(stage)
    names = [s.name for s in stages]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{path}: `{which}` names each stage once, got repeated name(s) {repeated}")
    return stages


def stage_table(stages: list[Stage]) -> str:
    """One line per stage: its name, config and title (`--list`)."""
    name = max(len(s.name) for s in stages)
    config = max(len(s.config) for s in stages)
    return "\n".join(f"{s.name:<{name}}  {s.config:<{config}}  {s.title}".rstrip() for s in stages)
