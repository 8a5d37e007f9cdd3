"""The README is a manual whose commands run as written.

Every config, `make` target and `wslight` verb named in its bash blocks exists (and those of the getting-started and
task pages of the documentation site), every relative link points at a file, and it stays short (at most 250 lines) with
no dated measurement in it (those live in docs/results/).
"""

import re
import shlex
from pathlib import Path

import pytest

from wslight.app.verbs import VERBS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The pages a newcomer types from; the results pages quote commands too, but their subject is what a run measured.
MANUALS = [README, ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "tasks").glob("*.md"))]
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def bash_blocks(path: Path) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", path.read_text(), re.S | re.M)


def commands(path: Path) -> list[list[str]]:
    """Each command of the file's bash blocks as its words.

    Continuation lines joined, comments dropped, and `a && b`, `a; b`, `a | b` split into their commands.
    """
    out = []
    for block in bash_blocks(path):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            command: list[str] = []
            for word in [*words, ";"]:
                if word in (";", "&&", "||", "|"):
                    if command:
                        out.append(command)
                    command = []
                else:
                    command.append(word)
    return out


def shipped_names() -> set[str]:
    configs = ROOT / "configs"
    return {p.relative_to(configs).with_suffix("").as_posix() for p in configs.rglob("*.yaml")}


def config_exists(value: str) -> bool:
    """A `--config` value as evaluate.py and train.py take it: a file (from the repository root) or a shipped name."""
    return (ROOT / value).is_file() or value.removesuffix(".yaml") in shipped_names()


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*(?: [A-Za-z0-9_][A-Za-z0-9_.-]*)*)\s*:(?![=:])", line)
        if match:
            targets.update(match.group(1).split())
    return targets


def program(words: list[str]) -> list[str]:
    """The command without its leading environment assignments (`HF_HUB_OFFLINE=1 python ...`)."""
    i = 0
    while i < len(words) and ENV_ASSIGNMENT.match(words[i]):
        i += 1
    return words[i:]


def config_values(words: list[str]) -> list[str]:
    values = []
    for i, word in enumerate(words):
        if word == "--config" and i + 1 < len(words):
            values.append(words[i + 1])
        elif word.startswith("--config="):
            values.append(word.removeprefix("--config="))
    return values


def wslight_verb(words: list[str]) -> str | None:
    """The verb of `wslight <verb> ...` or `python -m wslight <verb> ...` (None for other commands)."""
    if words[:1] == ["wslight"]:
        rest = words[1:]
    elif len(words) >= 3 and words[0].startswith("python") and words[1:3] == ["-m", "wslight"]:
        rest = words[3:]
    else:
        return None
    return rest[0] if rest else ""


@pytest.mark.parametrize("path", MANUALS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_config_named_in_a_command_exists(path):
    cmds = [program(c) for c in commands(path)]
    runs = [c for c in cmds if c and (c[0] in ("python", "torchrun", "srun", "wslight") or c[0].endswith(".py"))]
    named = [value for c in runs for value in config_values(c)]
    assert named or path != README, "README.md: no command names a config"
    missing = sorted({value for value in named if not config_exists(value)})
    assert not missing, f"{path.name} names configs that are neither files nor shipped names: {missing}"


@pytest.mark.parametrize("path", MANUALS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_make_target_and_wslight_verb_exists(path):
    cmds = [program(c) for c in commands(path)]
    targets = make_targets()
    named_targets = [w for c in cmds if c[:1] == ["make"] for w in c[1:] if not w.startswith("-") and "=" not in w]
    unknown = sorted(set(named_targets) - targets)
    assert not unknown, f"{path.name} names make targets the Makefile lacks: {unknown} (targets: {sorted(targets)})"
    verbs = [v for v in map(wslight_verb, cmds) if v is not None]
    unknown = sorted({v for v in verbs if v not in VERBS and v not in ("--help", "-h")})
    assert not unknown, f"{path.name} names wslight verbs that do not exist: {unknown} (verbs: {sorted(VERBS)})"


def test_the_readme_shows_the_commands_it_is_meant_to():
    cmds = [program(c) for c in commands(README)]
    assert any(c[:2] == ["make", "env"] for c in cmds) and any(c[:2] == ["make", "test"] for c in cmds)
    assert any(c[:2] == ["python", "evaluate.py"] for c in cmds)
    assert any(c[:3] == ["python", "train.py", "fit"] for c in cmds)
    verbs = {wslight_verb(c) for c in cmds}
    assert {"evaluate", "reproduce"} <= verbs
    reproduce = [c for c in cmds if wslight_verb(c) == "reproduce"]
    assert any("--list" in c for c in reproduce) and any("--only" in c for c in reproduce)
    assert any(wslight_verb(c) == "evaluate" and "--help" in c and config_values(c) for c in cmds)


def test_the_readme_says_early_where_a_first_evaluation_writes():
    head = "\n".join(README.read_text().splitlines()[:60])
    for what in ("python evaluate.py --config", "results.jsonl", "summary.md", ".png", "tensorboard --logdir"):
        assert what in head, f"the first 60 lines of README.md do not mention {what!r}"


def test_the_readme_is_short_and_undated():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250: details go to docs/)"
    dated = [(i + 1, line) for i, line in enumerate(lines) if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, f"README.md holds dates (measurements go to docs/results/, history to CHANGELOG.md): {dated}"


@pytest.mark.parametrize("path", MANUALS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_at_files(path):
    links = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    local = [link.split("#")[0] for link in links if not re.match(r"^[a-z]+:", link) and not link.startswith("#")]
    missing = sorted({link for link in local if link and not (path.parent / link).exists()})
    assert not missing, f"{path.name} links to missing files: {missing}"


def test_the_checks_catch_what_they_look_for():
    """The extraction itself: a continued line is one command, comments are not words, an overlay name resolves."""
    assert config_exists("ws/raf") and config_exists("configs/ws/raf.yaml") and config_exists("paper/ws/raf")
    assert not config_exists("ws/nope") and not config_exists("configs/ws")
    assert {"env", "test", "docs", "reproduce"} <= make_targets() and ".PHONY" not in make_targets()
    assert wslight_verb(["python", "-m", "wslight", "fit"]) == "fit" and wslight_verb(["make", "test"]) is None
    assert program(["HF_HUB_OFFLINE=1", "python", "evaluate.py"]) == ["python", "evaluate.py"]
