"""The CUDA path (`pytest -m gpu`; skipped without CUDA, never selected by `make test`).

What "the same on CUDA" means here:
- Weights: a map built on the CPU and moved with `.to(DEV)` (or `make_map(..., device=DEV)` for RF, RAF and
  ReLU-RAF, which build on the CPU and move) holds exactly the CPU weights, bit for bit. DeepRF given a CUDA device
  draws its weights there with per-layer device generators: reproducible, N(0, 2/fan_in), but not the CPU numbers
  (see DeepRandomFeatures' `device` argument); its tests build on the CPU and move where CPU numbers are compared.
- Outputs: float32 forwards agree to a relative error below FWD32 (TF32 off, another summation order); float64
  forwards below FWD64.
- Word sensitivity and the Delta attack: float64 maps and searches agree to WS64 / ATTACK64 relative (the same
  ascent, rounding apart); float32 word sensitivity to WS32 (rounding can move an accept/reject decision of the ascent,
  which converges to the same maximum within its tolerance). ReLU-RAF is discontinuous where a row's only positive
  score crosses zero (docs/theory/search.md §4.3), so even in float64 a rounding-level difference can put a chain on the
  other side of a jump: its records agree to WS_RELU64, and their path counts (steps, chains, near_best) may differ.
- Lightning: `train.py fit` and an `evaluate.py` run with `--trainer.accelerator gpu --trainer.devices 1` on tiny
  synthetic embeddings write the same results contract as on the CPU, with the same records.

Sizes are tiny: the whole set takes well under two minutes on one GPU. Class paths are not imported here: the tests go
through public functions (`make_map`, `word_sensitivity`, `delta_attack`, `wslight.app.cli.main`) and shipped configs.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from wslight.records.results import without_timing

ROOT = Path(__file__).resolve().parents[1]
# WSLIGHT_GPU_TEST_DEVICE=cpu runs this file's logic on the CPU (a dry run of the test code where there is no GPU).
DEV = os.environ.get("WSLIGHT_GPU_TEST_DEVICE", "cuda")
ON_GPU = DEV == "cuda"
ACC = "gpu" if ON_GPU else "cpu"

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(ON_GPU and not torch.cuda.is_available(), reason="needs a CUDA GPU")]
gpu_only = pytest.mark.skipif(not ON_GPU, reason="checks CUDA itself")

FWD32, FWD64 = 1e-5, 1e-12
WS32, WS64 = 2e-2, 1e-6
# ReLU-RAF in float64 (see the module doc): on the CPU, 60 samples at d = 8, n = 6 scaled by 1 + 1e-15 moved S by up
# to 3.0e-4 relative (RAF: 2e-13 under a 1e-13 change)
WS_RELU64 = 1e-3
# a record's counts of its search's own path: one accept decision flipped by rounding changes them
PATH_FIELDS = ("steps", "chains", "near_best")
ATTACK64 = 1e-6

# the stable results.jsonl fields (README, "Evaluations"; extra fields are allowed)
WS_FIELDS = {
    "experiment",
    "map",
    "d",
    "n",
    "L",
    "trial",
    "sample_id",
    "position",
    "ws",
    "delta_norm",
    "phi_norm",
    "steps",
    "seed",
}
ATTACK_FIELDS = {
    "experiment",
    "map",
    "training",
    "loss",
    "p",
    "d",
    "n",
    "N",
    "trial",
    "y",
    "t0",
    "t1",
    "D0",
    "D1",
    "err",
    "sign_err",
    "gamma",
    "proj_ratio",
    "seed",
}


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
    """TF32 off (torch's default for matmuls, stated here so a site default cannot loosen the tolerances)."""
    if not ON_GPU:
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def unit_rows(B: int, n: int, d: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Gaussian tokens rescaled to norm sqrt(d), (B, n, d), on the CPU."""
    X = torch.randn(B, n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return X / X.norm(dim=-1, keepdim=True) * d**0.5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def cpu_map(name: str, n: int, d: int, seed: int = 3, dtype: str = "float32", **options):
    from wslight.features import make_map

    return make_map(name, n, d, seed=seed, depth=3, dtype=dtype, **options)


MAP_CASES = {
    "rf": {},
    "rf_memory_bounded": {"max_stored_bytes": 1024, "block_rows": 16},
    "deep_rf": {},
    "raf": {},
    "relu_raf": {},
}


def build(case: str, n: int, d: int, dtype: str = "float32"):
    name = "rf" if case.startswith("rf") else case
    return cpu_map(name, n, d, dtype=dtype, **MAP_CASES[case])


# ----------------------------------------------------------------------------------------------------------------------
# Maps
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(MAP_CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_map_moved_to_cuda_has_the_cpu_weights_and_outputs(case, dtype):
    n, d = 5, 12
    fm = build(case, n, d, dtype)
    gm = build(case, n, d, dtype).to(DEV)
    for (name, a), (name_g, b) in zip(fm.named_buffers(), gm.named_buffers(), strict=True):
        assert name == name_g and b.device.type == DEV
        assert torch.equal(a, b.cpu()), name  # drawn on the CPU, moved: exact
    if case == "rf_memory_bounded":  # no stored V: blocks regenerated from the seed land on the map's device
        assert fm.V is None and gm.V is None
        blocks = list(gm.row_blocks())
        assert all(V_b.device.type == DEV for _, V_b in blocks)
        assert torch.equal(torch.cat([V_b.cpu() for _, V_b in blocks]), torch.cat([V for _, V in fm.row_blocks()]))
    X = unit_rows(4, n, d, dtype=getattr(torch, dtype))
    with torch.no_grad():
        out_cpu, out_gpu = fm(X), gm(X.to(DEV))
    assert out_gpu.device.type == DEV and out_gpu.shape == out_cpu.shape
    assert rel(out_gpu, out_cpu) < (FWD32 if dtype == "float32" else FWD64)


@pytest.mark.parametrize("name", ["rf", "raf", "relu_raf"])
def test_make_map_on_cuda_builds_the_cpu_map_and_moves_it(name):
    from wslight.features import make_map

    fm = make_map(name, 4, 8, seed=5)
    gm = make_map(name, 4, 8, seed=5, device=DEV)
    assert all(b.device.type == DEV for b in gm.buffers())
    assert all(torch.equal(a, b.cpu()) for a, b in zip(fm.buffers(), gm.buffers(), strict=True))


def test_deep_rf_drawn_on_the_device_is_reproducible_scaled_and_never_on_the_host():
    from wslight.features import DeepRandomFeatures, make_map

    n, d, depth, width = 6, 64, 3, 1500  # 1500 rows: more than one draw chunk
    if ON_GPU:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    a = DeepRandomFeatures(n, d, depth=depth, width=width, seed=11, device=DEV)
    if ON_GPU:
        peak = torch.cuda.max_memory_allocated() - base
        weights = sum(b.numel() * b.element_size() for b in a.buffers())
        assert peak <= weights + 2**20  # float32 draws go straight into the weights: no second copy on the device
    assert all(b.device.type == DEV for b in a.buffers())
    b = make_map("deep_rf", n, d, seed=11, depth=depth, width_ratio=width / (n * d), device=DEV)
    assert all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers(), strict=True))  # same seed, same weights
    c64 = DeepRandomFeatures(n, d, depth=depth, width=width, seed=11, dtype="float64", device=DEV)
    if ON_GPU:  # the CPU path casts a float32 draw too, but that is tested with the CPU suite
        assert all(torch.equal(x.double(), y) for x, y in zip(a.buffers(), c64.buffers(), strict=True))
        cpu = DeepRandomFeatures(n, d, depth=depth, width=width, seed=11)
        assert not torch.equal(cpu.Vs[0].V, a.Vs[0].V.cpu())  # documented: another generator, other numbers
    other = DeepRandomFeatures(n, d, depth=depth, width=width, seed=12, device=DEV)
    assert not torch.equal(other.Vs[0].V, a.Vs[0].V)
    for layer in a.Vs:  # N(0, 2/fan_in) entries
        V = layer.V.double()
        fan_in = V.shape[1]
        assert abs(V.mean().item()) < 5 * (2 / fan_in / V.numel()) ** 0.5
        assert V.std().item() * (fan_in / 2) ** 0.5 == pytest.approx(1.0, rel=5e-3)
    assert not torch.equal(a.Vs[1].V, a.Vs[2].V)  # layers drawn from their own generators
    X = unit_rows(3, n, d).to(DEV)
    out = a(X)
    assert out.shape == (3, width) and torch.isfinite(out).all()
    assert rel(out, c64(X.double())) < FWD32


# ----------------------------------------------------------------------------------------------------------------------
# Word sensitivity and the Delta attack
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(MAP_CASES))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_word_sensitivity_on_cuda_matches_cpu(case, dtype):
    from wslight.search.sensitivity import word_sensitivity

    n, d = 5, 12
    fm = build(case, n, d, dtype)
    gm = build(case, n, d, dtype).to(DEV)
    X = unit_rows(3, n, d, seed=1)
    kw = dict(positions=[0, 2], chains_per_round=4, max_steps=150, seed=7)
    r_cpu = word_sensitivity(fm, X, **kw)
    r_gpu = word_sensitivity(gm, X.to(DEV), **kw)
    tol = WS64 if dtype == "float64" else WS32
    assert torch.isfinite(r_gpu.ws).all() and (r_gpu.ws > 0).all()
    for field in ("ws", "phi_norm"):
        a, b = getattr(r_gpu, field).cpu().double(), getattr(r_cpu, field).double()
        assert torch.allclose(a, b, rtol=tol, atol=0), (field, a, b)
    assert (r_gpu.delta_norm.cpu() <= d**0.5 * (1 + 1e-6)).all()
    if dtype == "float64":
        assert torch.equal(r_gpu.position.cpu(), r_cpu.position)
        assert torch.allclose(r_gpu.delta.cpu(), r_cpu.delta, rtol=1e-4, atol=1e-6 * d**0.5)


@pytest.mark.parametrize("name", ["raf", "relu_raf", "rf"])
@pytest.mark.parametrize("training", ["finetune", "retrain"])
def test_delta_attack_on_cuda_matches_cpu(name, training):
    from wslight.attack import delta_attack

    n, d, N = 5, 8, 12
    fm = cpu_map(name, n, d, seed=2)
    gm = cpu_map(name, n, d, seed=2).to(DEV)
    X = unit_rows(N + 2, n, d, seed=4)
    y = torch.where(torch.arange(N + 2) % 2 == 0, 1.0, -1.0)
    args = (X[2:], y[2:], X[:2], y[:2])
    kw = dict(training=training, loss="err", steps=120, seed=3)
    out_cpu = delta_attack(fm, *args, **kw)
    out_gpu = delta_attack(gm, *(t.to(DEV) for t in args), **kw)
    assert set(out_cpu) == set(out_gpu)
    for key in ("y", "t0", "t1", "D0", "D1", "err", "gamma", "proj_ratio", "abs_t0", "abs_D0", "delta_norm"):
        a, b = out_gpu[key].double().cpu(), out_cpu[key].double()
        scale = b.abs().max().clamp_min(1.0)
        assert (a - b).abs().max() <= ATTACK64 * scale, (key, a, b)
    assert torch.equal(out_gpu["sign_err"].cpu(), out_cpu["sign_err"])
    assert (out_gpu["t1"].cpu() - out_cpu["y"]).abs().max() < 1e-6  # both heads interpolate the context sample


@pytest.mark.parametrize("ridge", [0.0, 10.0])
def test_ridge_head_on_cuda_matches_cpu(ridge):
    from wslight.attack.heads import ridge_head

    g = torch.Generator().manual_seed(5)
    Phi, Y = torch.randn(30, 12, generator=g, dtype=torch.float64), torch.randn(30, generator=g, dtype=torch.float64)
    theta, b = ridge_head(Phi, Y, ridge, bias=True)
    theta_gpu, b_gpu = ridge_head(Phi.to(DEV), Y.to(DEV), ridge, bias=True)
    assert theta_gpu.device.type == torch.device(DEV).type
    assert torch.allclose(theta_gpu.cpu(), theta, rtol=1e-9, atol=1e-12)
    assert abs(float(b_gpu) - float(b)) < 1e-9


# ----------------------------------------------------------------------------------------------------------------------
# Lightning: train.py fit and evaluate.py on one GPU
# ----------------------------------------------------------------------------------------------------------------------


def _records(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def _comparable(record: dict) -> dict:
    """A record without the fields that say where or when it was made (timings, rank, host, device)."""
    skip = ("time", "elapsed", "duration", "wall", "rank", "host", "device", "date")
    return {k: v for k, v in without_timing(record).items() if not any(s in k for s in skip)}


def _sort_key(record: dict) -> str:
    """Records ordered by their identifying fields (neither floats nor the search's path counts)."""
    ident = {k: v for k, v in sorted(record.items()) if not isinstance(v, float) and k not in PATH_FIELDS}
    return json.dumps(ident, sort_keys=True)


def _close_records(gpu: list[dict], cpu: list[dict], rtol: float, atol: float = 1e-9, paths: bool = True) -> None:
    """Record for record, the same identifying fields and floats within rtol (or atol).

    With `paths`, also the same path counts.
    """
    gpu = sorted((_comparable(r) for r in gpu), key=_sort_key)
    cpu = sorted((_comparable(r) for r in cpu), key=_sort_key)
    assert len(gpu) == len(cpu) > 0
    for a, b in zip(gpu, cpu, strict=True):
        assert set(a) == set(b)
        for k in a:
            if isinstance(b[k], float) and math.isfinite(b[k]):
                assert a[k] == pytest.approx(b[k], rel=rtol, abs=atol), (k, a, b)
            elif not isinstance(b[k], float) and (paths or k not in PATH_FIELDS):
                assert a[k] == b[k], (k, a[k], b[k])


TINY_EMB = [
    "--model.init_args.embeddings.source",
    "synthetic",
    "--model.init_args.embeddings.synthetic_dim",
    "16",
    "--model.init_args.embeddings.num_samples",
    "40",
    "--model.init_args.embeddings.max_length",
    "16",
]


def _evaluate(config: str, tmp_path: Path, accelerator: str, *extra: str):
    from wslight.app.cli import main

    args = [
        "test",
        "--config",
        str(ROOT / config),
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / accelerator),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.accelerator",
        accelerator,
        "--trainer.devices",
        "1",
        *TINY_EMB,
        *extra,
    ]
    return main(args, evaluate=True)


def test_evaluate_ws_on_gpu_writes_the_contract_and_the_cpu_records(tmp_path, capsys):
    extra = [
        "--model.init_args.grid.maps",
        "[rf, deep_rf, raf, relu_raf]",
        "--model.init_args.grid.d_values",
        "[8]",
        "--model.init_args.grid.n_values",
        "[4, 6]",
        "--model.init_args.grid.depths",
        "[2]",
        "--model.init_args.grid.trials",
        "2",
        "--model.init_args.search.max_steps",
        "60",
        "--model.init_args.dtype",
        "float64",
    ]
    gpu = _evaluate("configs/ws/raf.yaml", tmp_path, ACC, *extra)
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"results: {gpu.model.results_path}"
    assert gpu.trainer.strategy.root_device.type == DEV
    recs = _records(gpu.model.results_path)
    assert len(recs) == 4 * 2 * 2
    for r in recs:
        assert WS_FIELDS <= set(r) and r["experiment"] == "ws" and 0 < r["ws"] < math.inf
    cpu = _evaluate("configs/ws/raf.yaml", tmp_path, "cpu", *extra)
    # DeepRF is left out of the comparison: a sweep may draw its weights on the GPU (other numbers, by design)
    cpu_recs = _records(cpu.model.results_path)
    same = lambda rs, maps: [r for r in rs if r["map"] in maps]  # noqa: E731
    _close_records(same(recs, ("rf", "raf")), same(cpu_recs, ("rf", "raf")), rtol=WS64)
    _close_records(same(recs, ("relu_raf",)), same(cpu_recs, ("relu_raf",)), rtol=WS_RELU64, paths=False)


def test_evaluate_attack_on_gpu_writes_the_contract_and_the_cpu_records(tmp_path):
    extra = [
        "--model.init_args.cases",
        '[{"map": "rf", "n": 6}, {"map": "raf", "n": 6}]',
        "--model.init_args.d",
        "8",
        "--model.init_args.N_values",
        "[10]",
        "--model.init_args.trials",
        "2",
        "--model.init_args.steps",
        "60",
        "--model.init_args.losses",
        "[err]",
    ]
    gpu = _evaluate("configs/attack/fig4.yaml", tmp_path, ACC, *extra)
    assert gpu.trainer.strategy.root_device.type == DEV
    recs = _records(gpu.model.results_path)
    assert len(recs) == 2 * 2 * 2  # cases x trials x trainings
    for r in recs:
        assert ATTACK_FIELDS <= set(r) and r["experiment"] == "attack"
        assert abs(r["t1"] - r["y"]) < 1e-6  # both heads interpolate the context sample
    cpu = _evaluate("configs/attack/fig4.yaml", tmp_path, "cpu", *extra)
    _close_records(recs, _records(cpu.model.results_path), rtol=ATTACK64 * 100)


def _fit(save_dir: Path, accelerator: str, config: str = "configs/attack/callback_raf.yaml"):
    from wslight.app.cli import main

    args = [
        "fit",
        "--config",
        str(ROOT / config),
        "--trainer.logger.init_args.save_dir",
        str(save_dir / accelerator),
        "--trainer.accelerator",
        accelerator,
        "--trainer.devices",
        "1",
        *_data_args(source="synthetic", synthetic_dim=16, num_samples=60, max_length=16, cache_dir=save_dir / "c"),
        "--data.init_args.n",
        "6",
        "--data.init_args.d",
        "16",
        "--data.init_args.batch_size",
        "16",
    ]
    return main(args)


def _data_args(**spec) -> list[str]:
    """DataModule overrides of the embedding spec, nested (`data.init_args.embeddings.*`) or flat, as it takes them."""
    import inspect

    from wslight.tasks import EmbeddingDataModule

    nested = "embeddings" in inspect.signature(EmbeddingDataModule.__init__).parameters
    prefix = "--data.init_args.embeddings." if nested else "--data.init_args."
    return [x for k, v in spec.items() for x in (prefix + k, str(v))]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """`train.py fit` of the attack-callback config on one GPU (tiny synthetic data), run once for the tests below."""
    return _fit(tmp_path_factory.mktemp("fit"), ACC)


def test_fit_on_gpu_trains_the_head_there_and_writes_the_attack_contract(fitted, tmp_path):
    model = fitted.model
    # trained on the GPU; Lightning's teardown moves the module back to the CPU when the run ends
    assert fitted.trainer.strategy.root_device.type == DEV
    model = model.to(DEV)
    assert model.theta.device.type == DEV and all(b.device.type == DEV for b in model.feature_map.buffers())
    metrics = fitted.trainer.callback_metrics
    assert 0.0 <= float(metrics["test/acc"]) <= 1.0 and model.theta.abs().sum() > 0  # fitted, then tested
    dm = fitted.datamodule
    X, y, _ = next(iter(dm.train_dataloader()))
    with torch.no_grad():  # the min-norm head interpolates its training set (p = 96 > N = 42)
        assert torch.allclose(model(X.to(DEV)).double().cpu(), y.double(), atol=1e-3)
    log_dir = Path(fitted.trainer.log_dir)
    found = sorted(log_dir.rglob("*results.jsonl"))
    assert found, f"no results file under {log_dir}"
    recs = _records(found[0])
    assert recs
    for r in recs:
        assert ATTACK_FIELDS <= set(r) and r["experiment"] == "attack"
    assert list(log_dir.rglob("*.ckpt"))
    cpu = _fit(tmp_path, "cpu")
    assert torch.allclose(model.theta.cpu().double(), cpu.model.theta.double(), rtol=1e-4, atol=1e-6)
    cpu_recs = _records(sorted(Path(cpu.trainer.log_dir).rglob("*results.jsonl"))[0])
    # the attack's chains run in float32 (docs/theory/attack.md §6.5): rounding moves their paths, and the float64
    # values read out where they stop, err included (resolved to about 1e-9 by a float32 chain), by less than these
    _close_records(recs, cpu_recs, rtol=1e-3, atol=1e-6, paths=False)


@gpu_only
def test_datamodule_pins_memory_on_gpu(fitted):
    """Batches go host -> GPU once per step from page-locked memory (DataLoader pin_memory) when training on a GPU."""
    dm = fitted.datamodule
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        assert loader.pin_memory, "EmbeddingDataModule's loaders should set pin_memory=True when training on a GPU"
