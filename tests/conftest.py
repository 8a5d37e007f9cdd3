"""Shared fixtures.

Token rows, the one CPU trainer of every test config, the tiny test settings of tests/conf with a test's own settings,
and one torch thread for tiny tensors.
"""

import json
import os
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Lightning 2.6's LightningCLI calls jsonargparse APIs deprecated in jsonargparse 4.49 (add_instantiator,
# instantiate_classes, skip_none); jsonargparse shows them through its own filter, so its switch turns them off
os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core: one torch thread each
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """The longest slow tests first (`slow(seconds=...)`, their idle duration on one worker).

    With `-n 2 --dist worksteal` a worker that finishes early takes queued tests from the other; started first, the
    long in-process searches do not end the run alone on one worker.
    """

    def seconds(item) -> float:
        mark = item.get_closest_marker("slow")
        return float(mark.kwargs.get("seconds", 0)) if mark is not None else 0.0

    items.sort(key=seconds, reverse=True)  # stable: the others keep their order


@pytest.fixture(scope="session", autouse=True)
def no_home_cache(tmp_path_factory):
    """Keep the tests' embedding caches out of ~/.cache/wslight.

    Embedding caches default to ~/.cache/wslight; tests pass cache_dir, and anything that falls back to the default
    writes under pytest's temporary folder instead (a WSLIGHT_CACHE set by the user is kept).
    """
    if not os.environ.get("WSLIGHT_CACHE"):
        os.environ["WSLIGHT_CACHE"] = str(tmp_path_factory.mktemp("wslight-cache"))
    yield


TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent


def subprocess_env() -> dict:
    """The environment of a command a test runs: the tests' modules and this checkout importable, the hub offline."""
    return {**os.environ, "PYTHONPATH": f"{TESTS_DIR}{os.pathsep}{REPO_ROOT}", "HF_HUB_OFFLINE": "1"}


def start_in_own_group(command: list[str], cwd: Path) -> subprocess.Popen:
    """Start `command` in a process group of its own (a terminal's Ctrl-C reaches the group), its output piped."""
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def unit_rows(B: int, n: int, d: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Gaussian tokens rescaled to norm sqrt(d) (the paper's input assumption), (B, n, d)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, n, d, generator=g, dtype=dtype)
    return X / X.norm(dim=-1, keepdim=True) * d**0.5


@pytest.fixture
def rows():
    return unit_rows


@contextmanager
def num_threads(n: int):
    """Run a block with `n` intra-op torch threads, restoring the previous count."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny tensors: no pool contention on busy cores.

    Opt in per module with `pytestmark = pytest.mark.usefixtures("one_thread")`.
    """
    with num_threads(1):
        yield


@pytest.fixture
def threads():
    """A context manager running a block with n torch threads.

    Used as `with threads(n): ...`.
    """
    return num_threads


@dataclass(frozen=True)
class CPUTrainer:
    """The trainer of every test run: CPU, one device, no progress bar or model summary, TensorBoard logs.

    `kwargs` for `Trainer(**cpu_trainer.kwargs, ...)`, `yaml(save_dir, name)` for a config's `trainer:` block and
    `args` for the same settings as command-line overrides.
    """

    kwargs: dict = field(
        default_factory=lambda: {
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
        }
    )

    @property
    def args(self) -> list[str]:
        out = []
        for key, value in self.kwargs.items():
            out += [f"--trainer.{key}", str(value).lower() if isinstance(value, bool) else str(value)]
        return out

    def yaml(self, save_dir: str | Path, name: str = "test", **extra) -> str:
        """The `trainer:` block (a YAML string ending in a newline); `extra` adds plain trainer keys."""
        lines = ["trainer:"]
        for key, value in {**self.kwargs, **extra}.items():
            lines.append(f"  {key}: {str(value).lower() if isinstance(value, bool) else value}")
        lines += [
            "  logger:",
            "    class_path: lightning.pytorch.loggers.TensorBoardLogger",
            f"    init_args: {{save_dir: {save_dir}, name: {name}, default_hp_metric: false}}",
        ]
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def cpu_trainer() -> CPUTrainer:
    return CPUTrainer()


CONF = Path(__file__).resolve().parent / "conf"


def tiny_args(cache: Path, logs: Path) -> list[str]:
    """`--config` of the tiny attack-callback fit, with its embedding cache and log folder (no progress output)."""
    out = ["--config", str(CONF / "attack" / "callback_raf.yaml"), "--data.init_args.embeddings.cache_dir", str(cache)]
    out += ["--data.init_args.progress", "false", "--trainer.enable_progress_bar", "false"]
    return [*out, "--trainer.logger.init_args.save_dir", str(logs)]


def tiny_config(name: str, settings: dict | None = None, prefix: str = "model.init_args.") -> list[str]:
    """`--config tests/conf/<name>.yaml`, the tiny test setting of the shipped config `<name>`, then the settings.

    The setting is an overlay of the shipped config; then comes `--<prefix><key> <value>` for each setting: what one
    test changes, without a config file of its own. A string is given as it is (YAML text such as "[4, 8]"), any other
    value as JSON (which YAML reads).
    """
    out = ["--config", str(CONF / f"{name}.yaml")]
    for key, value in (settings or {}).items():
        out += [f"--{prefix}{key}", value if isinstance(value, str) else json.dumps(value)]
    return out


@pytest.fixture(scope="session")
def tiny():
    """`tiny(name, settings)`: the arguments of a tiny test setting and a test's own settings (see tiny_config)."""
    return tiny_config


@pytest.fixture
def cli_fails(capsys):
    """A function of (args, evaluate=False) that runs `wslight.app.cli.main(args)` and expects one short block.

    It expects exit status 2 and one short block on stderr (the message and the line saying how to see the traceback, no
    traceback, no value dump); returns stderr.
    """
    from wslight.app.cli import main

    def run(args: list[str], evaluate: bool = False) -> str:
        with pytest.raises(SystemExit) as exc:
            main(args, evaluate=evaluate)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "Given value" not in err, err
        lines = [x for x in err.splitlines() if "error:" in x or x.startswith("(the full traceback")]
        assert len(lines) == 2, err
        return err

    return run


SQUARES = """
seed_everything: 0
model:
  class_path: dummy_evaluation.SquaresEvaluation
  init_args: {init_args}
"""


@pytest.fixture
def squares(tmp_path, cpu_trainer):
    """A function of (trials=4, sleep=0.0, name="squares", **init_args) writing the squares evaluation's config.

    The tiny evaluation of tests/dummy_evaluation.py with the CPU trainer logging under tmp_path/logs; returns the
    config's path.
    """

    def write(trials=4, sleep=0.0, name="squares", **init_args):
        cfg = tmp_path / f"{name}.yaml"
        args = json.dumps({"trials": trials, "sleep": sleep, **init_args})
        cfg.write_text(SQUARES.format(init_args=args) + cpu_trainer.yaml(f"{tmp_path}/logs", name))
        return cfg

    return write
