"""Every shipped config parses, its tiny twin has the same keys, and evaluate.py honours the results.jsonl contract.

The twins in tests/conf/ are the shipped configs of configs/ with the grid shrunk, synthetic embeddings (no encoder) and
the CPU; they run through `main([...])` as `evaluate.py` and `train.py` do.
"""

import json
from pathlib import Path

import pytest
import yaml

from wslight.app.cli import WSLightCLI, main
from wslight.records.results import ATTACK_FIELDS, WS_FIELDS

ROOT = Path(__file__).resolve().parents[1]
CONF = Path(__file__).resolve().parent / "conf"
TWINS = sorted(p.relative_to(CONF).as_posix() for d in ("ws", "attack", "probes") for p in (CONF / d).glob("*.yaml"))
# Keys a twin may add: the size of the synthetic source, meaningless for the shipped (encoder) source.
TWIN_ONLY = {"model.init_args.embeddings.synthetic_dim", "data.init_args.embeddings.synthetic_dim"}


def keys(node, prefix=""):
    """The recursive key set of a YAML tree (list items share their list's prefix)."""
    if isinstance(node, dict):
        out = set()
        for k, v in node.items():
            out |= {f"{prefix}{k}"} | keys(v, f"{prefix}{k}.")
        return out
    if isinstance(node, list):
        return set().union(*(keys(v, prefix) for v in node)) if node else set()
    return set()


def run(twin, tmp_path, subcommand="test"):
    args = [subcommand, "--config", str(CONF / twin), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    if subcommand == "test":  # the fit twin lists a progress bar among its callbacks, as its shipped config
        return main([*args, "--trainer.enable_progress_bar", "false"], evaluate=True)
    return main(args)


def records(cli):
    return [json.loads(x) for x in Path(cli.model.results_path).read_text().splitlines()]


@pytest.mark.parametrize("twin", TWINS)
def test_twin_has_the_keys_of_its_shipped_config(twin):
    shipped = yaml.safe_load((ROOT / "configs" / twin).read_text())
    tiny = yaml.safe_load((CONF / twin).read_text())
    assert keys(shipped) - keys(tiny) == set(), f"keys of configs/{twin} missing from its twin"
    assert keys(tiny) - keys(shipped) <= TWIN_ONLY, f"keys of the twin missing from configs/{twin}"


def test_every_shipped_config_has_a_twin():
    shipped = {
        p.relative_to(ROOT / "configs").as_posix()
        for d in ("ws", "attack", "probes")
        for p in (ROOT / "configs" / d).glob("*.yaml")
    }
    assert shipped == {t for t in TWINS}


@pytest.mark.parametrize("name", ["rf", "deep_rf", "raf", "relu_raf"])
def test_ws_twin_writes_the_contract(tmp_path, capsys, name):
    cli = run(f"ws/{name}.yaml", tmp_path)
    recs = records(cli)
    sweep = cli.model
    expected = len(sweep.cells()) * sweep.trials
    assert len(recs) == expected and len({r["trial_key"] for r in recs}) == expected
    assert len({r["L"] for r in recs}) == len(sweep.depths if name == "deep_rf" else [1])
    for r in recs:
        assert WS_FIELDS <= set(r) and r["experiment"] == "ws" and r["map"] == name
        assert r["seed"] == sweep.seed and isinstance(r["map_seed"], int)  # the user's seed, the map's beside it
        assert 0 < r["ws"] and r["delta_norm"] <= r["d"] ** 0.5 * (1 + 1e-6)
        if name == "rf":
            assert r["ws"] <= r["bound"] * (1 + 1e-9)
    out_dir = Path(cli.model.results_path).parent
    assert (out_dir / "summary.md").exists() and (out_dir / f"ws_{name}.png").exists()
    assert (out_dir / f"ws_{name}.pdf").exists()
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"results: {cli.model.results_path}"
    # TensorBoard: S against n as one curve per map and d (and depth), step = n, value = the cell's mean S
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out_dir)).Reload()
    curves = {t: {e.step: e.value for e in events.Scalars(t)} for t in events.Tags()["scalars"] if t.startswith("ws/")}
    for r in recs:
        tag = f"ws/{name}/d{r['d']}" + (f"/L{r['L']}" if name == "deep_rf" else "")
        cell = [x["ws"] for x in recs if (x["d"], x["n"], x["L"]) == (r["d"], r["n"], r["L"])]
        assert abs(curves[tag][r["n"]] - sum(cell) / len(cell)) < 1e-5 * max(cell)


@pytest.mark.parametrize("name", ["fig4", "fig5"])
def test_attack_twin_writes_the_contract(tmp_path, name):
    cli = run(f"attack/{name}.yaml", tmp_path)
    recs = records(cli)
    sweep = cli.model
    assert len(recs) == len(sweep.trial_specs()) * len(sweep.objectives()) * sweep.contexts
    assert {r["p"] for r in recs} == ({1.0, 0.1} if name == "fig5" else {0.0})  # the penalties, in the field `p`
    for r in recs:
        assert ATTACK_FIELDS <= set(r) and r["experiment"] == "attack"
        assert r["seed"] == sweep.seed and r["map_seed"] == r["trial_seed"] != r["attack_seed"]
        assert abs(r["t1"] - r["y"]) < 1e-6  # both heads interpolate the context sample (docs/theory.md §8.8)
        assert r["err"] == pytest.approx((r["D1"] + r["y"]) ** 2, rel=1e-9, abs=1e-12)
        assert r["gamma"] == pytest.approx(max(abs(r["t0"]), abs(r["D0"])))
    out_dir = Path(cli.model.results_path).parent
    assert (out_dir / "summary.md").exists()
    stem = "attack_penalized" if name == "fig5" else "attack_scatter"
    assert (out_dir / f"{stem}.png").exists() and (out_dir / f"{stem}.pdf").exists()


def test_callback_twin_writes_the_records_of_the_attack_sweep(tmp_path):
    cli = run("attack/callback_raf.yaml", tmp_path, subcommand="fit")
    (cb,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "DeltaAttack"]
    assert len(cb.records) == cb.num_contexts * len(cb.trainings) * len(cb.losses)
    for r in cb.records:
        assert ATTACK_FIELDS <= set(r) and r["experiment"] == "attack" and r["map"] == "raf"
        assert r["seed"] == cb.seed and r["map_seed"] == 0 and abs(r["t1"] - r["y"]) < 1e-6
    assert set(cb.metrics) == {f"attack/{k}_{t}" for k in ("err", "flip_rate") for t in cb.trainings}
    out_dir = cb.results_path.parent
    assert (out_dir / "attack_scatter.png").exists() and (out_dir / "attack_scatter.pdf").exists()


@pytest.mark.parametrize("name", ["attention_edit", "attention_under_delta", "layerwise_change"])
def test_probe_twin_writes_records_and_its_figure(tmp_path, name):
    cli = run(f"probes/{name}.yaml", tmp_path)
    recs = records(cli)
    assert recs and all(r["trial_key"] == name and r["probe"] for r in recs)
    out_dir = Path(cli.model.results_path).parent
    assert (out_dir / f"{name}.png").stat().st_size > 1000 and (out_dir / f"{name}.pdf").exists()


def test_every_config_parses():
    """Each shipped config (offline and paper) and each twin is accepted by the CLI (parsed, classes resolved)."""
    for path in sorted((ROOT / "configs").rglob("*.yaml")) + sorted(CONF.rglob("*.yaml")):
        tree = yaml.safe_load(path.read_text())
        if "model" not in tree:  # not a LightningCLI config (e.g. the reproduce plan)
            continue
        evaluate = str(tree["model"].get("class_path", "")).startswith("wslight.evaluations.")
        args = (["test"] if evaluate else ["fit"]) + ["--config", str(path), "--print_config"]
        with pytest.raises(SystemExit) as exit_info:
            WSLightCLI(args=args, evaluate=evaluate, run=True)
        assert exit_info.value.code in (0, None), path
