"""The main job's driver: the shipped plan file, and a tiny plan run end to end (report from results.jsonl, resume).

The tiny plan is made of the shipped stage configs (configs/reproduce/ws_rf.yaml, attack_fig4.yaml) with synthetic data
and small grids: overlays of them written next to their plan, exactly as a user would write their own.
"""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from wslight.app import reproduce
from wslight.app.cli import main
from wslight.app.config_files import base_of
from wslight.app.reproduce import stages
from wslight.app.reproduce.pages import BEYOND_PAGE, REPRODUCTION_PAGE, duration, write_pages
from wslight.app.reproduce.plan import PLAN, Stage, load_plan
from wslight.app.reproduce.report import write_report
from wslight.records.pages import git_commit

SYNTH = {"source": "synthetic", "synthetic_dim": 16, "num_samples": 60}
TINY = {
    "ws_rf": {"grid.d_values": [16], "grid.n_values": [4, 8], "grid.trials": 2, "search.max_steps": 60},
    "attack_fig4": {
        "cases": [{"map": "rf", "n": 30}],  # N / D = 10 / 240, in the range check 9 reads
        "d": 8,
        "N_values": [10],
        "trials": 2,
        "losses": ["err"],
        "attack.steps": 40,
    },
}


def write_tiny_plan(root: Path, one_process: bool = False) -> Path:
    """plan.yaml with the shipped ws_rf and attack_fig4 stages shrunk by an overlay each; returns the plan's path.

    `one_process`: both stages run in this process (`devices: 1`), where the report, not the stage's command, is tested.
    """
    shipped = {s.name: s for s in load_plan("offline")}
    entries = []
    for name, changes in TINY.items():
        # ws_rf keeps the shipped `devices: auto`: one process per core, run as its own command (several cores);
        # attack_fig4 one process, run in this one
        trainer = {} if name == "ws_rf" and not one_process else {"trainer": {"devices": 1}}
        overlay = {"model": {"init_args": {**changes, "embeddings": SYNTH}}, **trainer}
        path = root / "conf" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# overlay of: reproduce/{name}\n" + yaml.safe_dump(overlay, sort_keys=False))
        entries.append({"name": name, "config": str(path), "title": shipped[name].title})
    plan = root / "plan.yaml"
    plan.write_text(yaml.safe_dump({"offline": entries}, sort_keys=False))
    return plan


def resolved(stage: Stage) -> dict:
    """The config a stage runs (its overlay read on top of its base), as `evaluate.py --print_config` shows it."""
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        main(["test", "--config", stage.config, "--print_config"], evaluate=True)
    return yaml.safe_load(out.getvalue())


def test_shipped_plan_names_configs_that_run_alone_into_the_stage_folder():
    offline, full = load_plan("offline"), load_plan("full")
    assert [s.name for s in offline][:6] == [
        "ws_rf",
        "ws_deep_rf",
        "ws_raf",
        "ws_relu_raf",
        "ws_synthetic_768",
        "ws_raf_2x_steps",
    ]
    assert not any(s.shares_maps() for s in offline)  # the paper's protocol: a fresh map per trial everywhere
    assert len(offline) == 14 and len(full) == 10
    assert all(s.config == f"configs/reproduce/{s.name}.yaml" for s in offline)
    assert all(s.config.startswith("configs/paper/") and s.path.is_file() for s in full)
    for stage in offline:
        assert base_of(stage.path) is not None  # an overlay: only what differs from a shipped config
        cfg = resolved(stage)
        logger = cfg["trainer"]["logger"]["init_args"]
        # run alone from the repository root, a stage writes to (and resumes) the folder `make reproduce` uses
        assert (logger["save_dir"], logger["name"]) == ("reports/offline/tensorboard", stage.name)
        assert cfg["seed_everything"] == 0 and cfg["model"]["class_path"].startswith("wslight.tasks.")
        assert f"python evaluate.py --config {stage.config}" in stage.path.read_text()


def test_a_stage_runs_one_process_per_core_unless_its_config_says_otherwise():
    from wslight.app.placement import available_cores, on_cpu

    plan = {s.name: s for s in load_plan("offline")}
    assert plan["probe_attention_edit"].processes() == 1  # `devices: 1`
    assert plan["ws_raf"].processes() == 1  # its overlay: `devices: 1` (a small grid)
    assert plan["ws_rf"].processes() == (available_cores() if on_cpu("auto") else 1)


def test_a_stage_shares_maps_when_its_overlay_says_so(tmp_path):
    overlay = tmp_path / "shared.yaml"
    overlay.write_text("# overlay of: reproduce/ws_raf\nmodel:\n  init_args: {shared_weights: true}\n")
    assert Stage("shared", str(overlay)).shares_maps()
    assert not Stage("ws_raf", "reproduce/ws_raf").shares_maps()  # its base leaves the default


def test_report_checks_come_from_the_results_and_a_rerun_resumes(tmp_path):
    plan = write_tiny_plan(tmp_path)
    argv = ["--reports", str(tmp_path), "--plan", str(plan)]
    report = reproduce.main(argv)
    assert report == tmp_path / "offline" / "report.md"
    text = report.read_text()
    assert "## Provenance" in text
    # the paper's claims, then the package's hypotheses (no one-word stage here: not measured)
    paper, hypotheses = text.index(PAPER_HEADING), text.index(HYPOTHESES_HEADING)
    assert paper < hypotheses < text.index("## Provenance")
    assert text.index("| 3. RF") < hypotheses < text.index("| 16. One real word") < text.index("| 17. One real word")
    assert "\n0 supported, 0 not supported, 2 not measured.\n" in text
    results = {p.parent.parent.name: p for p in (tmp_path / "offline" / "tensorboard").rglob("results.jsonl")}
    ws = [json.loads(x) for x in results["ws_rf"].read_text().splitlines()]
    worst = max(r["ws"] / r["bound"] for r in ws)
    row = next(line for line in text.splitlines() if line.startswith("| 3. RF"))
    assert f"max S / bound = {worst:.3f} over {len(ws)} trials" in row and "**PASS**" in row
    att = [json.loads(x) for x in results["attack_fig4"].read_text().splitlines()]
    row = next(line for line in text.splitlines() if line.startswith("| 9. RF cannot flip"))
    assert f"({len(att)} records)" in row
    assert re.search(r"figures/ws_rf__ws_rf\.png", text)
    # each stage's section names its config; the shared-map note only where the config sets shared_weights
    sections = {s.split("\n", 1)[0]: s for s in text.split("\n## ")}
    ws_sec, att_sec = sections["Word sensitivity of RF (Figure 2 left)"], sections["The Delta attack (Figure 4 style)"]
    assert f"Config `{tmp_path / 'conf' / 'ws_rf.yaml'}`" in ws_sec and "share one random map" not in ws_sec
    assert f"Config `{tmp_path / 'conf' / 'attack_fig4.yaml'}`" in att_sec and "share one random map" not in att_sec
    assert_pages(tmp_path / "offline", {k: len(p.read_text().splitlines()) for k, p in results.items()})
    before = {k: p.read_text() for k, p in results.items()}
    reproduce.main(argv)
    assert {k: p.read_text() for k, p in results.items()} == before  # nothing recomputed
    times = json.loads((tmp_path / "offline" / "stage_times.json").read_text())
    assert set(times) == {"ws_rf", "attack_fig4"}
    assert_pages(tmp_path / "offline", {k: len(p.read_text().splitlines()) for k, p in results.items()})


def assert_pages(report_dir: Path, counts: dict[str, int]) -> None:
    """reproduction.md beside the report: the header (this checkout's commit), the stage table, the checks, figures."""
    page = (report_dir / REPRODUCTION_PAGE).read_text()
    assert page.startswith("# Reproduction\n\nWritten by the run below, not by hand")
    assert f"- commit: `{git_commit()[0]}`" in page  # dirty or not: tests/records/test_pages.py
    assert f"- command: `wslight reproduce --reports {report_dir.parent}" in page
    times = json.loads((report_dir / "stage_times.json").read_text())  # summed over the resumed runs
    titles = {"ws_rf": "Word sensitivity of RF (Figure 2 left)", "attack_fig4": "The Delta attack (Figure 4 style)"}
    for name, count in counts.items():
        assert f"\n| {name} | {titles[name]} | {count} | {duration(times[name])} |\n" in page
    assert f"| **all** | | {sum(counts.values())} | **{duration(sum(times.values()))}** |" in page
    assert page.index("## Wall time per stage") < page.index(PAPER_HEADING) < page.index(HYPOTHESES_HEADING)
    figures = re.findall(r"\]\((figures/[^)]+)\)", page)
    assert "figures/ws_rf__ws_rf.png" in figures and all((report_dir / f).is_file() for f in figures)
    assert not (report_dir / BEYOND_PAGE).exists()  # no one-word stage in the plan


PAPER_HEADING = "## The paper's claims (docs/theory/checks.md §8)"
HYPOTHESES_HEADING = "## Beyond the paper: this package's hypotheses (docs/theory/words.md §13)"


def write_results(path: Path, records: list[dict]) -> Path:
    """A results.jsonl of the records given, one JSON line each; returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_hypothesis_that_does_not_hold_is_a_finding_not_a_fail_of_the_report(tmp_path):
    """The paper's claims the records allow pass; RAF's best real word decays in n (check 16 does not hold).

    The report counts 0 FAIL among the paper's claims and reads check 16 as "not supported" in the hypotheses' part.
    """
    ws = [
        {
            "experiment": "ws",
            "map": "rf",
            "d": 8,
            "n": n,
            "L": 1,
            "ws": 1.3 / n**0.5,
            "ws_sqrt_n": 1.3,
            "bound": 1.0,
            "delta_norm": 8**0.5,
            "radius": 8**0.5,
            "phi_norm": (4 * n) ** 0.5,
            "trial_key": f"rf/8/{n}/{t}",
        }
        for n in (10, 40)
        for t in range(3)
    ]
    words = [
        {
            "experiment": "words",
            "map": "raf",
            "d": 384,
            "n": n,
            "L": 1,
            "N": 40,
            "ws_words": 0.9 * (10 / n) ** 0.5,
            "distance": 1.4,
            "ws": 3.4,
            "flipped_retrain": t < 5,
        }
        for n in (10, 100)
        for t in range(10)
    ]
    plan = [s for s in load_plan("offline") if s.name in ("ws_rf", "words_raf")]
    ran = {
        "ws_rf": write_results(tmp_path / "runs" / "ws_rf" / "results.jsonl", ws),
        "words_raf": write_results(tmp_path / "runs" / "words_raf" / "results.jsonl", words),
    }
    text = write_report(tmp_path / "offline", plan, ran, {}, False).read_text()
    sections = sections_of(text)
    paper, hypotheses = sections[PAPER_HEADING[3:]], sections[HYPOTHESES_HEADING[3:]]
    assert "What the paper claims, and the sanity checks a faithful reproduction of it must pass" in paper
    assert "\n3 PASS, 0 FAIL, 12 N/A.\n" in paper and "**FAIL**" not in text
    assert "Hypotheses this package tests beyond the paper, each with its measured value" in hypotheses
    row = next(line for line in hypotheses.splitlines() if line.startswith("| 16. One real word, RAF"))
    assert "S_words 0.90 (n=10) -> 0.28 (n=100), ratio 0.32" in row and row.endswith("| **not supported** |")
    assert "\n0 supported, 1 not supported, 1 not measured.\n" in hypotheses
    # the results pages: the one-word stage and the hypotheses on a page of their own, linked from the reproduction's
    pages = write_pages(tmp_path / "offline", plan, ran, {"ws_rf": 75.2, "words_raf": 3.0}, ["make", "reproduce"])
    assert [p.name for p in pages] == [REPRODUCTION_PAGE, BEYOND_PAGE]
    reproduction, beyond = (p.read_text() for p in pages)
    words_title = next(s.title for s in plan if s.name == "words_raf")
    assert f"| ws_rf | Word sensitivity of RF (Figure 2 left) | {len(ws)} | 1 min 15 s |" in reproduction
    assert f"| words_raf | {words_title} | {len(words)} | 3 s |" in reproduction
    assert "[beyond the paper](beyond_paper.md)" in reproduction and f"## {words_title}" not in reproduction
    assert beyond.startswith("# Beyond the paper\n") and "- command: `make reproduce`" in beyond
    assert PAPER_HEADING not in beyond and beyond.index(HYPOTHESES_HEADING) < beyond.index(f"## {words_title}")
    assert row in beyond and "\n0 supported, 1 not supported, 1 not measured.\n" in beyond


def test_unknown_stage_is_rejected_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["--reports", str(tmp_path), "--only", "ws_nope"])
    assert re.search(r"only must contain only values in \[.*'ws_rf'.*\], got 'ws_nope'", capsys.readouterr().err)
    assert not (tmp_path / "offline").exists()


def test_bad_plan_file_is_rejected_naming_the_stage(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text("offline:\n  - {name: ws_rf, config: configs/reproduce/nope.yaml}\n")
    with pytest.raises(SystemExit):
        reproduce.main(["--reports", str(tmp_path), "--plan", str(plan)])
    assert "offline[0] (ws_rf): config configs/reproduce/nope.yaml does not exist" in capsys.readouterr().err
    orphan = tmp_path / "orphan.yaml"  # an overlay of no shipped config: named before any stage runs
    orphan.write_text("# overlay of: ws/rff\ntrainer: {devices: 1}\n")
    plan.write_text(f"offline:\n  - {{name: ws_rf, config: {orphan}}}\n")
    with pytest.raises(ValueError, match=r"offline\[0\] \(ws_rf\): .*overlay of ws/rff: .*did you mean ws/rf"):
        load_plan("offline", plan)
    with pytest.raises(ValueError, match="repeated name"):
        plan.write_text(
            "offline:\n  - {name: a, config: configs/reproduce/ws_rf.yaml}\n"
            "  - {name: a, config: configs/reproduce/ws_raf.yaml}\n"
        )
        load_plan("offline", plan)
    with pytest.raises(ValueError, match=r"plan must be one of \['offline', 'full'\], got 'paper'"):
        load_plan("paper", plan)
    assert not (tmp_path / "offline").exists()


def test_the_plan_and_its_stages_resolve_from_any_directory(tmp_path, monkeypatch):
    """`wslight reproduce` from another working directory (or an installed wheel) finds the shipped plan and configs."""
    monkeypatch.chdir(tmp_path)
    stages = load_plan("offline", PLAN)
    assert stages and all(s.path.is_file() for s in stages)
    assert stages[0].path.name == "ws_rf.yaml" and stages[0].path.parent.name == "reproduce"


def sections_of(report: str) -> dict[str, str]:
    """A report's sections by their heading (the stage's title)."""
    return {s.split("\n", 1)[0]: s for s in report.split("\n## ")}


def test_only_one_stage_then_another_keeps_both_in_the_report(tmp_path):
    """`--only ws_rf` then `--only attack_fig4`: the report describes both stages, and its checks read both."""
    plan = write_tiny_plan(tmp_path, one_process=True)
    argv = ["--reports", str(tmp_path), "--plan", str(plan)]
    first = reproduce.main([*argv, "--only", "ws_rf"]).read_text()
    assert "with no results yet (`wslight reproduce --only <stage>` runs one): attack_fig4." in first
    text = reproduce.main([*argv, "--only", "attack_fig4"]).read_text()
    sections = sections_of(text)
    assert {"Word sensitivity of RF (Figure 2 left)", "The Delta attack (Figure 4 style)"} <= set(sections)
    assert "no results yet" not in text
    results = {p.parent.parent.name: p for p in (tmp_path / "offline" / "tensorboard").rglob("results.jsonl")}
    ws = [json.loads(x) for x in results["ws_rf"].read_text().splitlines()]
    att = [json.loads(x) for x in results["attack_fig4"].read_text().splitlines()]
    row = {n: next(line for line in text.splitlines() if line.startswith(f"| {n}. ")) for n in (3, 9)}
    assert f"max S / bound = {max(r['ws'] / r['bound'] for r in ws):.3f} over {len(ws)} trials" in row[3]
    assert f"({len(att)} records)" in row[9]
    assert "no word-sensitivity trial" not in text
    assert "figures/ws_rf__ws_rf.png" in sections["Word sensitivity of RF (Figure 2 left)"]
    # the report names the file each section reads: the ws_rf run of the first command, untouched by the second
    assert f"{len(ws)} records in `{os.path.relpath(results['ws_rf'], tmp_path / 'offline')}`" in text


def test_list_and_help_name_every_stage_of_the_plan(capsys):
    plan = load_plan("offline")
    assert reproduce.main(["--list"]) is None
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in listed] == [[s.name, s.config] for s in plan]
    assert all(line.endswith(s.title) for line, s in zip(listed, plan, strict=True))
    with pytest.raises(SystemExit) as exc:
        reproduce.main(["--help"])
    assert exc.value.code == 0
    shown = capsys.readouterr().out
    assert all(re.search(rf"^  {s.name} +{re.escape(s.title)}$", shown, re.MULTILINE) for s in plan)
    with pytest.raises(SystemExit):
        reproduce.main(["--full", "1", "--help"])
    full = capsys.readouterr().out
    assert "stages of the full plan" in full
    assert all(re.search(rf"^  {s.name} +{re.escape(s.title)}$", full, re.M) for s in load_plan("full"))


# A stage's command stood in for by a script: it exits with the status given, or is killed by the signal -status.
EXIT_WITH = (
    "import os, signal, sys; code = int(sys.argv[1]); signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.kill(os.getpid(), -code) if code < 0 else sys.exit(code)"
)
TWO_STAGES = (
    "offline:\n  - {name: ws_rf, config: configs/reproduce/ws_rf.yaml}\n"
    "  - {name: ws_raf, config: configs/reproduce/ws_raf.yaml}\n"
)


@pytest.mark.parametrize(
    ("code", "status", "says"),
    [
        (130, 130, "stage ws_rf interrupted (SIGINT): its finished trials are saved; run the same command again"),
        (143, 143, "stage ws_rf interrupted (SIGTERM)"),
        (-signal.SIGINT, 130, "stage ws_rf interrupted (SIGINT)"),
        (75, 75, "error: stage ws_rf: its run folder is being written by another process"),
        (2, 2, "error: stage ws_rf: a mistake in its config configs/reproduce/ws_rf.yaml"),
        (3, 1, "error: stage ws_rf failed"),
    ],
)
def test_a_stage_that_stops_stops_reproduce_with_its_status(tmp_path, monkeypatch, capsys, code, status, says):
    plan = tmp_path / "plan.yaml"
    plan.write_text(TWO_STAGES)
    monkeypatch.setattr(stages, "stage_command", lambda stage, log_dir: [sys.executable, "-c", EXIT_WITH, str(code)])
    monkeypatch.setattr(Stage, "processes", lambda self: 2)  # every stage runs as its own command
    with pytest.raises(SystemExit) as exc:
        reproduce.main(["--reports", str(tmp_path), "--plan", str(plan)])
    assert exc.value.code == status
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and says in err, err
    assert "ws_raf" not in out and not (tmp_path / "offline" / "report.md").exists()  # the plan stops there


# Driver of `wslight reproduce` whose one stage is a script that records each SIGINT/SIGTERM it gets (a second one
# would arrive within its half second) and exits as an interrupted evaluation does.
STAGE = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def record(signum, frame):
    with open(out / "signals", "a") as f:
        f.write(f"{signum}\\n")
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, record)
(out / "ready").write_text(str(os.getpid()))
deadline = time.time() + 60
while not (out / "signals").exists() and time.time() < deadline:
    time.sleep(0.05)
time.sleep(0.5)
sys.exit(128 + int((out / "signals").read_text().split()[0]))
"""
DRIVER = f"""
import sys
from wslight.app.reproduce import plan, stages
from wslight.app.verbs import main
stages.stage_command = lambda stage, log_dir: [sys.executable, "-c", {STAGE!r}, sys.argv[1]]
plan.Stage.processes = lambda self: 2
sys.exit(main(["reproduce", "--reports", sys.argv[1], "--plan", sys.argv[2]]))
"""


@pytest.mark.slow  # a subprocess stopped by a signal
@pytest.mark.parametrize(("sig", "to_group"), [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, True)])
def test_a_signal_to_reproduce_reaches_its_stage_once_and_stops_it(tmp_path, sig, to_group):
    """SIGINT or SIGTERM to `wslight reproduce` reaches the running stage exactly once.

    To reproduce alone, or to its whole process group (Ctrl-C, a scheduler); reproduce exits 128 + the signal's number
    after one line saying how to resume.
    """
    plan = tmp_path / "plan.yaml"
    plan.write_text(TWO_STAGES)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-c", DRIVER, str(tmp_path), str(plan)]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (tmp_path / "ready").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "ready").exists(), proc.communicate()
    os.killpg(proc.pid, sig) if to_group else proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert (tmp_path / "signals").read_text().split() == [str(int(sig))]  # once, also when sent to the group
    assert (
        err.decode()
        .splitlines()[-1]
        .endswith(
            f"stage ws_rf interrupted ({sig.name}): its finished trials are saved; run the same command again to resume"
        )
    )
    assert b"ws_raf" not in out


def test_a_stage_command_starts_as_a_run_of_its_own_whatever_launcher_ran_before():
    """A stage's command inherits no launcher's variables (an earlier in-process DDP run leaves them behind).

    With LOCAL_RANK and MASTER_PORT, Lightning would take the stage for one process of a run started elsewhere and
    wait for the others forever.
    """
    leftover = {"LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "12910", "WORLD_SIZE": "1", "HOME": "/h"}
    env = stages.stage_environment({**leftover, "PYTHONPATH": "/mine"}, threads=1)
    assert not set(env) & set(stages.LAUNCHER_VARIABLES)
    assert env["HOME"] == "/h" and env["OMP_NUM_THREADS"] == "1"
    root = str(Path(stages.__file__).resolve().parents[3])
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/mine"]
    assert "OMP_NUM_THREADS" not in stages.stage_environment(leftover, threads=0)
