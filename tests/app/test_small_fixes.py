"""Small contracts of the command line, the run folder, the probes and the figures."""

from pathlib import Path

import pytest

from wslight.app.cli import main


# ------------------------------------------------------------------------------------------ --config <a directory>
def test_config_given_a_directory_says_so_and_what_to_give(tmp_path, monkeypatch, cli_fails):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "a.yaml").write_text("model: {}\n")
    err = cli_fails(["test", "--config", str(folder)], evaluate=True)
    assert f"--config {folder}: {folder} is a directory, not a config file" in err
    assert str(folder / "a.yaml") in err and "shipped config such as ws/raf" in err
    assert "no such file" not in err
    err = cli_fails(["test", "--config", "mine"], evaluate=True)  # relative to the working directory
    assert "--config mine: mine is a directory" in err and "no such file" not in err


def test_config_given_a_folder_of_shipped_configs_names_them(tmp_path, monkeypatch, cli_fails):
    monkeypatch.chdir(tmp_path)  # no folder `ws` here: the shipped one
    for value in ("ws", "configs/ws"):
        err = cli_fails(["test", "--config", value], evaluate=True)
        assert f"--config {value}: ws is a folder of shipped configs, not a config; give one of" in err
        assert "ws/raf" in err and "no such file" not in err


# ------------------------------------------------------------------------------- configs/attack/fig4.yaml's comment
def test_fig4_comment_on_trials_per_step_states_the_steps_the_sweep_forms():
    """The comment beside `trials_per_step` says how many trials a step holds and how many steps there are."""
    import re

    import yaml

    from wslight.app.config_files import configs_dir
    from wslight.data import EmbeddingSpec
    from wslight.tasks import DeltaAttackSweep

    path = configs_dir() / "attack" / "fig4.yaml"
    text = path.read_text()
    args = yaml.safe_load(text)["model"]["init_args"]
    sweep = DeltaAttackSweep(**{**args, "embeddings": EmbeddingSpec(**args["embeddings"])})
    steps = sweep.step_batches(sweep.trial_specs())
    comment = " ".join(line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line)
    found = re.search(r"here all (\d+), one step per \(case, N\) \((\d+) steps", comment)
    assert found, "the trials_per_step comment should say what a step holds"
    assert int(found.group(1)) == args["trials"] <= args["trials_per_step"]
    assert int(found.group(2)) == len(steps) == len(sweep.cases) * len(args["N_values"])
    assert {len(s) for s in steps} == {args["trials"]}
    assert "half" not in comment


# ----------------------------------------------------------------------------------------- the figures' legends
def test_attack_scatter_gives_align_and_align_proj_each_their_own_legend_entry_and_marker():
    import matplotlib.pyplot as plt

    from wslight.plots.attack import plot_attack_scatter

    losses = ("err", "align", "align_proj")
    recs = [
        {"map": "raf", "n": 6, "N": N, "training": "finetune", "loss": loss, "p": 0.0, "gamma": 0.1 * (i + 1), "err": e}
        for N in (10, 20)
        for loss in losses
        for i, e in enumerate((0.2, 0.5))
    ]
    fig = plot_attack_scatter(recs)
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) == 2 * len(losses)  # one entry per (N, loss)
    assert {"N = 10, alignment loss", "N = 10, projected alignment loss", "N = 10, loss = Err"} <= set(labels)
    markers = {}
    for coll in ax.collections:  # one scatter per (N, loss): the same loss has the same marker at every N
        markers.setdefault(coll.get_label().split(", ", 1)[1], set()).add(coll.get_paths()[0].vertices.tobytes())
    assert len(markers) == len(losses) and all(len(m) == 1 for m in markers.values())
    assert len({next(iter(m)) for m in markers.values()}) == len(losses)  # three distinct markers
    plt.close(fig)


def test_words_flip_rate_figure_draws_no_line_on_top_of_another():
    """Series with equal rates (here RAF's two trainings) share one line whose legend entry names both."""
    import matplotlib.pyplot as plt

    from wslight.plots.words import plot_flip_rates

    flips = {  # (map, training) -> flipped per (n, trial)
        ("raf", "retrain"): {4: (1, 1), 16: (1, 0)},
        ("raf", "finetune"): {4: (1, 1), 16: (1, 0)},
        ("rf", "retrain"): {4: (0, 0), 16: (0, 1)},
        ("rf", "finetune"): {4: (1, 0), 16: (0, 0)},
    }
    recs = [
        {"map": m, "d": 8, "n": n, "L": 1, "trial": t}
        | {f"flipped_{tr}": flips[(m, tr)][n][t] for tr in ("retrain", "finetune")}
        for m in ("raf", "rf")
        for n in (4, 16)
        for t in (0, 1)
    ]
    fig = plot_flip_rates(recs, ["retrain", "finetune"])
    (ax,) = fig.axes
    lines = ax.get_lines()
    data = [(tuple(line.get_xdata()), tuple(line.get_ydata())) for line in lines]
    assert len(set(data)) == len(data) == 3  # every line visible: no two with the same points
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) == len(lines)
    assert "RAF, retrain = finetune" in labels
    plt.close(fig)


# ------------------------------------------------------------------------------- scalars computed on every rank
def test_attack_sweep_under_a_process_group_logs_its_scalars_without_a_sync_dist_warning(tmp_path, recwarn):
    """Under DDP (here one process) the attack's scalars draw no Lightning `sync_dist` warning.

    They are computed identically on every rank, and are logged as computed.
    """
    import json

    from lightning.pytorch.trainer.connectors.logger_connector import result

    from wslight.records.summary import attack_scalars

    result.warning_cache.clear()  # Lightning shows each warning once per process: a test before this one may have
    conf = Path(__file__).resolve().parents[1] / "conf" / "attack" / "fig4.yaml"
    args = ["test", "--config", str(conf), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    args += ["--trainer.enable_progress_bar", "false", "--trainer.strategy", "ddp", "--trainer.devices", "1"]
    cli = main(args, evaluate=True)
    assert cli.trainer.world_size == 1 and type(cli.trainer.strategy).__name__ == "DDPStrategy"
    messages = [str(w.message) for w in recwarn]
    assert not [m for m in messages if "sync_dist=True" in m], messages
    records = [json.loads(x) for x in Path(cli.model.results_path).read_text().splitlines()]
    expected = attack_scalars(records, cli.model.trainings)
    assert len(expected) == 4
    for name, value in expected.items():
        assert float(cli.trainer.callback_metrics[name]) == pytest.approx(value, rel=1e-6)


# ------------------------------------------------------------------------------------------ the probes' summary.md
def markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of the (first) markdown table in `text`, as {column: cell text}."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[2:]]


@pytest.mark.parametrize("name", ["attention_edit", "attention_under_delta", "layerwise_change"])
def test_each_probe_writes_a_summary_table_of_its_records(tmp_path, name):
    import json
    import statistics

    conf = Path(__file__).resolve().parents[1] / "conf" / "probes" / f"{name}.yaml"
    args = ["test", "--config", str(conf), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = main([*args, "--trainer.enable_progress_bar", "false"], evaluate=True)
    results = Path(cli.model.results_path)
    records = [json.loads(x) for x in results.read_text().splitlines()]
    summary = results.parent / "summary.md"
    rows = markdown_rows(summary.read_text())
    assert rows
    if name == "attention_edit":  # per token: the mean over the queries of the attention it receives, a and b
        assert len(rows) == len({r["key"] for r in records})
        for row in rows:
            cells = [r for r in records if r["key"] == int(row["key"])]
            assert float(row["b - a"]) == pytest.approx(statistics.fmean(r["diff"] for r in cells), rel=1e-3, abs=1e-6)
        assert [row["token b"] for row in rows if row["token a"] != row["token b"]] == ["smile"]  # the edited word
    elif name == "attention_under_delta":  # the moved token attracts the attention: first row, up from before
        moved = rows[0]
        assert moved["token"].endswith("(moved)") and int(moved["key"]) == records[0]["position"]
        assert float(moved["after"]) > float(moved["before"]) and float(moved["after - before"]) > 0
    else:  # one row per layer; at layer 0 Delta and the Gaussian draws (same norm) change X by the same ratio
        assert [int(row["layer"]) for row in rows] == sorted({r["layer"] for r in records})
        first = rows[0]
        assert float(first["Delta (optimised)"]) == pytest.approx(float(first["Gaussian (mean)"]), rel=1e-3)
        assert all(row["best word"] != "-" for row in rows)  # the replacement words are in the table


# ------------------------------------------------------------------------------ TensorBoard event files of a run
SQUARES = """
seed_everything: 0
model:
  class_path: dummy_evaluation.SquaresEvaluation
  init_args: {trials: 5}
"""


def test_a_no_op_resume_adds_no_event_file_and_a_computing_resume_at_most_one(tmp_path, cpu_trainer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tmp_path / "squares.yaml"
    cfg.write_text(SQUARES + cpu_trainer.yaml(tmp_path / "logs", "squares"))

    def evaluate():
        return main(["test", "--config", str(cfg)], evaluate=True)

    def events():
        return sorted(p.name for p in results.parent.glob("events.out.tfevents.*"))

    results = Path(evaluate().model.results_path)
    first = events()
    assert len(first) == 1  # the config, the scalars and the HPARAMS row in one file
    evaluate()  # every trial in the file already: nothing to record
    assert events() == first
    lines = results.read_text().splitlines(keepends=True)
    results.write_text("".join(lines[:3]))  # two trials to compute again
    evaluate()
    assert len(events()) == len(first) + 1 and set(first) <= set(events())
    run = EventAccumulator(str(results.parent), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    assert [e.value for e in run.Scalars("results/records")] == [5.0, 5.0]  # one point per computing invocation
    assert len(run.Tensors("config/text_summary")) == 1  # the config once per folder
