"""Every shipped config name resolves through the CLI, and an overlay holds only what differs from its base.

And evaluate.py honours the results.jsonl contract on the tiny test settings.

A shipped name is a whole config (`ws/raf`) or an overlay (`paper/ws/raf`, `reproduce/ws_raf`: first line
`# overlay of: <name>`), which `--config` reads on top of its base. The tiny test settings in tests/conf/ are overlays
of the shipped configs of the same name (synthetic tokens, small grids, the CPU); they run through `main([...])` as
`evaluate.py` and `train.py` do.
"""

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from wslight.app.cli import main
from wslight.app.config_files import (
    UnknownConfigError,
    configs_dir,
    find_config,
    overlay_chain,
    resolve_config_args,
    shipped_names,
)
from wslight.app.errors import UsageError
from wslight.app.messages import check_command, given_values
from wslight.records.results import ATTACK_FIELDS, WORDS_FIELDS, WS_FIELDS

CONF = Path(__file__).resolve().parents[1] / "conf"
SHIPPED = [name for name in shipped_names() if name != "reproduce/plan"]
TINY = sorted(p.relative_to(CONF).with_suffix("").as_posix() for p in CONF.rglob("*.yaml"))
# Keys an overlay may write again with its base's value, and why.
RESTATED = {
    # benchmarks/gpu_check.py reads the DeepRF grid from this file itself
    "paper/ws/deep_rf_h200": {
        "model.init_args.grid.d_values",
        "model.init_args.grid.n_values",
        "model.init_args.grid.depths",
    },
}


def resolved(config: Path | str, *more: str) -> dict:
    """The config that `--config <config>` (an overlay composed with its bases) resolves to, as the CLI prints it.

    `--print_config`: parsed and checked by jsonargparse, no class built, nothing run.
    """
    base = yaml.safe_load(overlay_chain(Path(config))[0].read_text())
    evaluate = "data" not in base
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["test" if evaluate else "fit", "--config", str(config), *more, "--print_config"], evaluate=evaluate)
    assert exit_info.value.code in (0, None), config
    return yaml.safe_load(out.getvalue())


def leaves(tree, prefix=""):
    """{dotted key: value} of a YAML tree; a list is one value (it replaces, never merges)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out = {}
    for k, v in tree.items():
        out.update(leaves(v, f"{prefix}{k}."))
    return out


def holds(value, given) -> bool:
    """`value` (as resolved, every default filled in) holds what a file gives: dicts key by key, lists item by item."""
    if isinstance(given, dict):
        return isinstance(value, dict) and all(k in value and holds(value[k], v) for k, v in given.items())
    if isinstance(given, list):
        return isinstance(value, list) and len(value) == len(given) and all(map(holds, value, given))
    return value == given


def get(tree, key):
    """The value at a dotted key, or None where the tree has no such key (a null block above it)."""
    for k in key.split("."):
        tree = tree.get(k) if isinstance(tree, dict) else None
    return tree


@pytest.mark.parametrize("name", SHIPPED + [f"tests/conf/{t}" for t in TINY])
def test_every_config_resolves_and_its_files_win_in_order(name):
    """Each shipped name and each tiny test setting parses through the CLI, its files winning in order.

    Every value its files write is the resolved one unless a later file (the overlay) writes it again, and an overlay
    writes only what differs.
    """
    path = CONF / f"{name.removeprefix('tests/conf/')}.yaml" if name.startswith("tests/conf/") else find_config(name)
    chain = overlay_chain(path)
    config = resolved(path)
    final = {}
    for file in chain:
        final.update(leaves(yaml.safe_load(file.read_text())))
    for key, value in final.items():
        assert holds(get(config, key), value), (name, key, value)
    if len(chain) > 1:  # an overlay: each of its keys changes what its base resolves to
        base = resolved(chain[-2])
        own = leaves(yaml.safe_load(path.read_text()))
        same = {k for k, v in own.items() if holds(get(base, k), v)} - RESTATED.get(name, set())
        assert not same, f"{path} writes its base's value again for {sorted(same)}"


def test_shipped_overlays_name_their_base_on_the_first_line():
    """The paper's settings, the reproduce grid and the variants of raf are overlays; the experiments are whole."""
    overlays = {name for name in SHIPPED if len(overlay_chain(find_config(name))) > 1}
    assert {n for n in SHIPPED if n.startswith(("paper/", "reproduce/"))} <= overlays
    assert {"raf_gradient", "attack/callback_raf"} <= overlays
    whole = {"rf", "deep_rf", "raf", "relu_raf", "encoder_classifier", "attack/fig4", "attack/fig5", "ws/zoo"}
    whole |= {"finetune/imdb", "words/classifier"}
    whole |= {f"ws/{m}" for m in ("rf", "deep_rf", "raf", "relu_raf")}
    whole |= {f"words/{m}" for m in ("rf", "raf", "zoo", "trained_head", "encoder_classifier", "encoder")}
    whole |= {f"probes/{p}" for p in ("attention_edit", "attention_under_delta", "layerwise_change")}
    assert whole == set(SHIPPED) - overlays
    assert {t for t in TINY if len(overlay_chain(CONF / f"{t}.yaml")) > 1} == set(TINY)
    for t in TINY:  # a tiny setting of each shipped name, composed with it
        assert find_config(t) == overlay_chain(CONF / f"{t}.yaml")[-2]


def test_a_name_expands_into_its_base_and_overlay():
    root = configs_dir()
    ws, paper, h200 = root / "ws/deep_rf.yaml", root / "paper/ws/deep_rf.yaml", root / "paper/ws/deep_rf_h200.yaml"
    args = ["test", "--config", "paper/ws/deep_rf_h200", "--model.init_args.grid.trials", "2"]
    expanded = ["test", "--config", str(ws), "--config", str(paper), "--config", str(h200)]
    assert resolve_config_args(args) == [*expanded, "--model.init_args.grid.trials", "2"]
    assert resolve_config_args(["--config=reproduce/ws_raf"]) == [
        f"--config={root / 'ws/raf.yaml'}",
        f"--config={root / 'reproduce/ws_raf.yaml'}",
    ]
    given = str(CONF / "ws" / "raf.yaml")  # a path stays as typed, so messages name it so
    assert resolve_config_args(["-c", given]) == ["-c", str(root / "ws/raf.yaml"), "-c", given]
    assert resolve_config_args(["--config", "ws/raf"]) == ["--config", str(root / "ws/raf.yaml")]  # a whole config


def test_an_overlay_of_an_unknown_or_circular_base_is_one_error(tmp_path, monkeypatch):
    bad = tmp_path / "mine.yaml"
    bad.write_text("# overlay of: ws/rff\nmodel:\n  init_args: {trials: 2}\n")
    unknown = rf"{re.escape(str(bad))}, line 1: overlay of ws/rff: no such file, .*did you mean ws/rf"
    with pytest.raises(UnknownConfigError, match=unknown):
        resolve_config_args(["--config", str(bad)])
    import wslight.app.config_files as config_files

    monkeypatch.setattr(config_files, "configs_dir", lambda: tmp_path)  # two shipped configs naming each other
    (tmp_path / "a.yaml").write_text("# overlay of: b\nseed_everything: 1\n")
    (tmp_path / "b.yaml").write_text("# overlay of: a\nseed_everything: 2\n")
    circle = f"{tmp_path / 'a.yaml'} -> {tmp_path / 'b.yaml'} -> {tmp_path / 'a.yaml'}"
    with pytest.raises(UsageError, match=f"overlays in a circle \\({re.escape(circle)}\\)"):
        overlay_chain(tmp_path / "a.yaml")


def test_checks_before_parsing_read_the_files_in_order(tmp_path):
    """seed_everything: the value of the last file that writes it (the overlay's), as jsonargparse keeps it."""
    overlay = tmp_path / "seed.yaml"
    overlay.write_text("# overlay of: ws/raf\nseed_everything: 4294967296\n")
    args = resolve_config_args(["test", "--config", str(overlay)])
    assert [v for _, v in given_values(args, "seed_everything")] == [0, 4294967296]
    with pytest.raises(UsageError, match=r"seed_everything must be an integer in \[0, 4294967295\]"):
        check_command(args, evaluate=True)
    assert given_values([*args, "--seed_everything", "3"], "seed_everything")[-1] == ("the command line", "3")


def test_an_overlay_given_to_the_other_entry_point_is_named_as_given(cli_fails):
    err = cli_fails(["evaluate", "--config", "paper/raf"])
    assert f"{configs_dir() / 'paper/raf.yaml'} is a training config" in err
    assert f"python train.py fit --config {configs_dir() / 'paper/raf.yaml'}" in err
    tiny = str(CONF / "ws" / "raf.yaml")
    err = cli_fails(["fit", "--config", tiny])
    assert f"{tiny} is an evaluation config (wslight.tasks.WordSensitivitySweep)" in err


# ------------------------------------------------------------------------------------------- the results contract
def run(tiny, tmp_path, subcommand="test"):
    args = [subcommand, "--config", str(CONF / tiny), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    if subcommand == "test":  # the fit setting lists a progress bar among its callbacks, as its shipped config
        return main([*args, "--trainer.enable_progress_bar", "false"], evaluate=True)
    return main(args)


def records(cli):
    return [json.loads(x) for x in Path(cli.model.results_path).read_text().splitlines()]


@pytest.mark.parametrize("name", ["rf", "deep_rf", "raf", "relu_raf"])
def test_ws_tiny_setting_writes_the_contract(tmp_path, capsys, name):
    cli = run(f"ws/{name}.yaml", tmp_path)
    recs = records(cli)
    sweep = cli.model
    expected = len(sweep.grid.cells()) * sweep.grid.trials
    assert len(recs) == expected and len({r["trial_key"] for r in recs}) == expected
    assert len({r["L"] for r in recs}) == len(sweep.grid.depths_of(name))
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


def test_words_tiny_setting_writes_the_contract_and_the_exact_best_words(tmp_path):
    """Every record's best word is the brute force's.

    The brute force is the full forward of the trial's map on the review with each admissible vocabulary word at the
    position (the whole vocabulary, through `nn.Module.forward`).
    """
    import torch

    cli = run("words/raf.yaml", tmp_path)
    recs = records(cli)
    sweep = cli.model
    assert len(recs) == len(sweep.grid.cells()) * sweep.grid.trials
    rows = sweep.words.rows(sweep.position, 384).double()
    for r in recs:
        assert WORDS_FIELDS <= set(r) and r["experiment"] == "words" and r["position"] == 1
        assert r["admissible"] > 20_000 and r["word"] == sweep.words.text(r["word_id"]) != r["token"]
        for training in ("min_norm", "finetune", "retrain"):
            assert r[f"flipped_{training}"] == (r[f"flips_{training}"] > 0) == (r[f"flip_word_{training}"] != "")
        assert r["ws_ratio"] == pytest.approx(r["ws_words"] / r["ws"])
    for r in recs[:: len(recs) - 1]:  # the first and the last record
        m = sweep.grid.map_entries[r["map"]].build(r["n"], r["d"], r["map_seed"], dtype="float64")
        index = int((sweep.store.sample_ids == r["sample_id"]).nonzero()[0, 0])
        X = sweep.store.samples([index], r["n"], r["d"])[0].double()
        mask, _ = sweep.admissible(index)
        words = mask.nonzero()[:, 0]
        with torch.no_grad():
            phi0 = m(X)
            best = torch.empty(len(words), dtype=torch.float64)
            for s in range(0, len(words), 2048):
                Xp = X.repeat(len(words[s : s + 2048]), 1, 1)
                Xp[:, 1] = rows[words[s : s + 2048]]
                best[s : s + 2048] = (m(Xp) - phi0).norm(dim=-1) / phi0.norm()
        assert r["ws_words"] == pytest.approx(float(best.max()), rel=1e-6)
        assert r["word_id"] == int(words[best.argmax()])
    out_dir = Path(cli.model.results_path).parent
    assert "Most frequent words per map" in (out_dir / "summary.md").read_text()
    assert (out_dir / "words_vs_n.png").exists() and (out_dir / "words_flip_rates.pdf").exists()


def test_words_without_the_continuous_search_give_the_same_words_and_a_summary(tmp_path):
    """continuous: false leaves S out and nothing else: the same maps, the same best words, flips and S_words."""
    with_s = records(run("words/raf.yaml", tmp_path / "with"))
    args = ["test", "--config", str(CONF / "words/raf.yaml"), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = main(
        [*args, "--trainer.enable_progress_bar", "false", "--model.init_args.continuous", "false"], evaluate=True
    )
    alone = records(cli)
    assert len(alone) == len(with_s)
    for a, b in zip(alone, with_s, strict=True):
        assert a["ws"] is a["ws_ratio"] is a["chains"] is a["near_best"] is None and b["ws"] > 0
        same = ("trial_key", "map_seed", "ws_words", "word", "flips_retrain", "flips_min_norm", "flip_word_finetune")
        assert {k: a[k] for k in same} == {k: b[k] for k in same}
    out_dir = Path(cli.model.results_path).parent
    summary = (out_dir / "summary.md").read_text()
    assert "| raf | 384 | 4 | 1 | 2 |" in summary and "None" not in summary.split("Slope")[0]
    assert (out_dir / "words_vs_n.png").exists()


@pytest.mark.parametrize(
    "override, key",
    [
        ("--model.init_args.continuous=1", "continuous"),
        ("--model.init_args.embeddings.layer=2", "embeddings.layer"),
        ("--model.init_args.embeddings.source=synthetic", "embeddings.source"),
        ("--model.init_args.position=0", "position"),
        ("--model.init_args.N=100", "N"),
    ],
)
def test_words_bad_settings_name_the_key(cli_fails, override, key):
    assert key in cli_fails(["test", "--config", str(CONF / "words/raf.yaml"), override], evaluate=True)


@pytest.mark.parametrize("name", ["fig4", "fig5"])
def test_attack_tiny_setting_writes_the_contract(tmp_path, name):
    cli = run(f"attack/{name}.yaml", tmp_path)
    recs = records(cli)
    sweep = cli.model
    assert len(recs) == len(sweep.trial_specs()) * len(sweep.objectives()) * sweep.contexts
    assert {r["p"] for r in recs} == ({1.0, 0.1} if name == "fig5" else {0.0})  # the penalties, in the field `p`
    for r in recs:
        assert ATTACK_FIELDS <= set(r) and r["experiment"] == "attack"
        assert r["seed"] == sweep.seed and r["map_seed"] == r["trial_seed"] != r["attack_seed"]
        assert abs(r["t1"] - r["y"]) < 1e-6  # both heads interpolate the context sample (docs/theory/checks.md §8.8)
        assert r["err"] == pytest.approx((r["D1"] + r["y"]) ** 2, rel=1e-9, abs=1e-12)
        assert r["gamma"] == pytest.approx(max(abs(r["t0"]), abs(r["D0"])))
    out_dir = Path(cli.model.results_path).parent
    assert (out_dir / "summary.md").exists()
    stem = "attack_penalized" if name == "fig5" else "attack_scatter"
    assert (out_dir / f"{stem}.png").exists() and (out_dir / f"{stem}.pdf").exists()


def test_callback_tiny_setting_writes_the_records_of_the_attack_sweep(tmp_path):
    cli = run("attack/callback_raf.yaml", tmp_path, subcommand="fit")
    (cb,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "DeltaAttackCallback"]
    assert len(cb.records) == cb.num_contexts * len(cb.trainings) * len(cb.losses)
    for r in cb.records:
        assert ATTACK_FIELDS <= set(r) and r["experiment"] == "attack" and r["map"] == "raf"
        assert r["seed"] == cb.seed and r["map_seed"] == 0 and abs(r["t1"] - r["y"]) < 1e-6
    assert set(cb.metrics) == {f"attack/{k}_{t}" for k in ("err", "flip_rate") for t in cb.trainings}
    out_dir = cb.results_path.parent
    assert (out_dir / "attack_scatter.png").exists() and (out_dir / "attack_scatter.pdf").exists()


@pytest.mark.parametrize("name", ["attention_edit", "attention_under_delta", "layerwise_change"])
def test_probe_tiny_setting_writes_records_and_its_figure(tmp_path, name):
    cli = run(f"probes/{name}.yaml", tmp_path)
    recs = records(cli)
    assert recs and all(r["trial_key"] == name and r["probe"] for r in recs)
    out_dir = Path(cli.model.results_path).parent
    assert (out_dir / f"{name}.png").stat().st_size > 1000 and (out_dir / f"{name}.pdf").exists()
