"""A user's own map in a sweep config: `maps: [module.Class]` and `{class_path, init_args}`.

As a training config's `class_path`; the records name it, its numbers are the map's own, and a bad entry is one clear
error before any work.
"""

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from wslight.attack import AttackSettings
from wslight.base.seeding import derive_seed
from wslight.data import EmbeddingSpec
from wslight.features import MAPS, make_map, resolve_map, resolve_maps
from wslight.search import SearchSettings
from wslight.search.sensitivity import word_sensitivity
from wslight.tasks import DeltaAttackSweep, GridSettings, WordSensitivitySweep

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]

USER_MODULE = '''
import torch
from torch import nn

from wslight.features import FeatureMap, register_map


class TanhMean(FeatureMap):
    """tanh(V mean_i x_i), (B, n, d) -> (B, k)."""

    def __init__(self, d: int, k: int = 24, seed: int = 0, dtype: str = "float32") -> None:
        super().__init__()
        self.d, self.k = d, k
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("V", torch.randn(k, d, generator=g, dtype=getattr(torch, dtype)) / d**0.5)  # (k, d)

    def out_dim(self, n=None) -> int:
        return self.k

    def forward(self, X):
        return torch.tanh(X.to(self.V.dtype).mean(dim=1) @ self.V.T)  # (B, d) @ (d, k) -> (B, k)


@register_map("{registered}")
class Registered(TanhMean):
    pass


class Unregistered(Registered):
    pass


class Plain(nn.Module):
    """A plain module built for n tokens: relu(U flat(X)), (B, n, d) -> (B, width)."""

    def __init__(self, n: int, d: int, width: int, seed: int = 0) -> None:
        super().__init__()
        self.n, self.d = n, d
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("U", torch.randn(width, n * d, generator=g) / (n * d) ** 0.5)  # (width, n d)

    def forward(self, X):
        return torch.relu(X.flatten(1).to(self.U.dtype) @ self.U.T)  # (B, n d) @ (n d, width) -> (B, width)


def helper():
    pass
'''

_count = itertools.count()


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The name of a fresh user module (TanhMean, Registered, Unregistered, Plain, helper) importable from tmp_path.

    Its registered name is `<module>_tanh`. The module and its registry entry are removed afterwards.
    """
    name = f"user_maps_{os.getpid()}_{next(_count)}"
    registered = f"{name}_tanh"
    (tmp_path / f"{name}.py").write_text(USER_MODULE.replace("{registered}", registered))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    MAPS.pop(registered, None)


def tiny_embeddings(tmp_path) -> EmbeddingSpec:
    return EmbeddingSpec(source="synthetic", synthetic_dim=16, num_samples=40, max_length=16, cache_dir=str(tmp_path))


def run(evaluation, cpu_trainer) -> list[dict]:
    pl.Trainer(**cpu_trainer.kwargs, logger=False).test(evaluation, verbose=False)
    return [json.loads(x) for x in Path(evaluation.results_path).read_text().splitlines()]


def test_entries_resolve_to_record_names(user_module):
    mod = user_module
    assert resolve_map("raf").name == "raf"
    assert resolve_map("wslight.features.RandomAttentionFeatures").name == "raf"  # a shipped class: its name
    assert resolve_map(f"{mod}.TanhMean").name == f"{mod}.TanhMean"  # no registered name: the path as written
    assert resolve_map(f"{mod}.Registered").name == f"{mod}_tanh"  # importing the module registered it
    assert resolve_map(f"{mod}.Unregistered").name == f"{mod}.Unregistered"  # a subclass does not take its parent's
    entry = resolve_map({"class_path": f"{mod}.Plain", "init_args": {"width": 12}})
    assert (entry.name, entry.init_args) == (f"{mod}.Plain", {"width": 12})
    assert entry.record_fields == {"map_args": {"width": 12}}  # recorded beside `map`
    assert [e.name for e in resolve_maps(["raf", "raf", f"{mod}.TanhMean"])] == ["raf", "raf", f"{mod}.TanhMean"]
    # a dotted path builds the same map as the name
    X = torch.randn(2, 4, 8)
    a, b = make_map("wslight.features.RandomAttentionFeatures", 4, 8, seed=3), make_map("raf", 4, 8, seed=3)
    assert torch.equal(a(X), b(X))


def test_ws_sweep_runs_user_maps_with_their_own_numbers(tmp_path, user_module, cpu_trainer):
    mod = user_module
    plain = {"class_path": f"{mod}.Plain", "init_args": {"width": 12}}
    sweep = WordSensitivitySweep(
        grid=GridSettings(maps=[f"{mod}.TanhMean", f"{mod}.Registered", plain], d_values=[8], n_values=[4], trials=2),
        search=SearchSettings(chains_per_round=2, max_steps=20),
        embeddings=tiny_embeddings(tmp_path),
        output_dir=str(tmp_path / "out"),
    )
    records = run(sweep, cpu_trainer)
    assert sorted({r["map"] for r in records}) == sorted([f"{mod}.TanhMean", f"{mod}_tanh", f"{mod}.Plain"])
    assert len(records) == 6 and all(r["trial_key"].startswith(f"{r['map']}/d8/n4/L1/t") for r in records)
    for r in records:
        extra = r.get("map_args", {})
        assert extra == ({"width": 12} if r["map"] == f"{mod}.Plain" else {})
        path = r["map"] if "." in r["map"] else f"{mod}.Registered"
        fmap = make_map(path, 4, 8, seed=r["map_seed"], **extra)
        X, _ = sweep.store.samples([sweep.sample_index(r["trial"])], 4, 8)  # (1, n, d): the trial's sample
        res = word_sensitivity(
            fmap, X, radius=8**0.5, chains_per_round=2, max_steps=20, seed=derive_seed(r["map_seed"], "ws.restarts")
        )
        # the sweep searched the cell's two trials together, here one alone: float32 chains in another batch, which
        # may part at rounding (as tests/features/test_fresh_maps.py's batched trials), and a float64 readout
        assert r["ws"] == pytest.approx(float(res.ws[0]), rel=1e-4)
        assert r["phi_norm"] == pytest.approx(float(res.phi_norm[0]), rel=1e-6)


def test_attack_sweep_takes_a_user_map_in_cases(tmp_path, user_module, cpu_trainer):
    sweep = DeltaAttackSweep(
        cases=[{"map": f"{user_module}.TanhMean", "n": 4}, {"map": "raf", "n": 4}],
        d=8,
        N_values=[10],
        trials=1,
        attack=AttackSettings(steps=10),
        embeddings=tiny_embeddings(tmp_path),
        output_dir=str(tmp_path / "out"),
    )
    records = run(sweep, cpu_trainer)
    assert {r["map"] for r in records} == {f"{user_module}.TanhMean", "raf"}


BAD = [
    ("{mod}.TanhMeen", r"maps: '{mod}.TanhMeen': module '{mod}' has no attribute 'TanhMeen'; did you mean TanhMean\?"),
    ("{mod}_nope.TanhMean", r"maps: '{mod}_nope.TanhMean': no module named '{mod}_nope'"),
    ("{mod}.helper", r"maps: '{mod}.helper': {mod}.helper is a function, not a map class"),
    ("torch.Tensor", r"maps: 'torch.Tensor': torch.Tensor is the class Tensor, not a map class"),
    ("mean_average", r"maps must be one of \[.*\] or a dotted path module.Class, got 'mean_average'"),
    ("{mod}.Plain", r"maps: '{mod}.Plain': Plain\(\) needs 'width', which the sweep does not give"),
    ({"class_path": "{mod}.TanhMean", "init_args": {"kk": 1}}, r"TanhMean\(\) takes no argument 'kk'"),
    ({"class_path": "{mod}.TanhMean", "init_args": {"d": 4}}, r"init_args 'd' is set by the sweep"),
    ({"class_path": "{mod}.TanhMean", "args": {}}, r"a dict entry takes class_path .* got 'args'"),
]


@pytest.mark.parametrize("entry, pattern", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_entry_is_one_error_naming_maps_and_the_entry(tmp_path, user_module, entry, pattern):
    fill = {"mod": user_module}
    entry = json.loads(json.dumps(entry).replace("{mod}", user_module))
    with pytest.raises(ValueError, match=pattern.format(**fill)):
        WordSensitivitySweep(GridSettings(["raf", entry], [8], [4]), embeddings=tiny_embeddings(tmp_path))
    assert not (tmp_path / "out").exists()


def test_two_maps_under_one_record_name_are_refused(tmp_path, user_module):
    entries = [f"{user_module}.TanhMean", {"class_path": f"{user_module}.TanhMean", "init_args": {"k": 8}}]
    with pytest.raises(ValueError, match=r"maps: .*another entry also records as map"):
        WordSensitivitySweep(GridSettings(entries, [8], [4]), embeddings=tiny_embeddings(tmp_path))


# ------------------------------------------------------------------------------- the command line, as users run it


def readme_map(folder: Path) -> None:
    """The README's example map saved as folder/mymap.py."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- example-map -->\s*```python\n(.*?)```", readme, re.S)
    assert block is not None
    (folder / "mymap.py").write_text(block.group(1))


def evaluate(tmp_path, *extra) -> subprocess.CompletedProcess:
    cfg = TESTS / "conf" / "ws" / "raf.yaml"
    args = [
        "--config", str(cfg), "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
        "--trainer.enable_progress_bar", "false", "--model.init_args.grid.d_values", "[8]",
        "--model.init_args.grid.n_values", "[4]", "--model.init_args.grid.trials", "1",
        "--model.init_args.search.max_steps", "20", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'user'}{os.pathsep}{ROOT}"}
    return subprocess.run(
        [sys.executable, str(ROOT / "evaluate.py"), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow  # a whole evaluate.py subprocess; the in-process sweeps above cover the maths
def test_evaluate_py_runs_the_readme_map_by_its_dotted_path(tmp_path):
    (tmp_path / "user").mkdir()
    readme_map(tmp_path / "user")
    proc = evaluate(tmp_path, "--model.init_args.grid.maps", "[raf, mymap.MeanRandomFeatures]")
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("results: ")
    records = [json.loads(x) for x in Path(last.removeprefix("results: ")).read_text().splitlines()]
    assert sorted(r["map"] for r in records) == ["mean_rf", "raf"]  # the registered name of the README's class


def test_evaluate_py_names_maps_and_a_misspelled_class(tmp_path):
    (tmp_path / "user").mkdir()
    readme_map(tmp_path / "user")
    proc = evaluate(tmp_path, "--model.init_args.grid.maps", "[raf, mymap.MeanRandomFeature]")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1 and errors[0].endswith(
        "error: model.init_args.grid.maps: 'mymap.MeanRandomFeature': module 'mymap' has no attribute "
        "'MeanRandomFeature'; did you mean MeanRandomFeatures?"
    ), proc.stderr
    assert not list(tmp_path.rglob("results.jsonl"))
