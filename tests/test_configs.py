"""Every shipped offline config parses, and evaluate.py honours the results.jsonl contract of design.md.

Tiny twins of the real configs: the same YAML with the grid shrunk and synthetic embeddings (no encoder), run through
`main([...])` as `evaluate.py` does.
"""

import json
from pathlib import Path

import pytest

from wslight.cli import main
from wslight.results import ATTACK_FIELDS, WS_FIELDS

ROOT = Path(__file__).resolve().parents[1]
TINY_EMB = [
    "--model.init_args.embeddings.source",
    "synthetic",
    "--model.init_args.embeddings.synthetic_dim",
    "16",
    "--model.init_args.embeddings.num_samples",
    "40",
]


def run(config, tmp_path, *extra, capsys=None):
    args = [
        "test",
        "--config",
        str(ROOT / config),
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
        "--trainer.enable_progress_bar",
        "false",
        *extra,
    ]
    return main(args, evaluate=True)


def records(cli):
    return [json.loads(x) for x in Path(cli.model.results_path).read_text().splitlines()]


@pytest.mark.parametrize(
    "name, extra",
    [
        ("rf", ["--model.init_args.d_values", "[8, 16]", "--model.init_args.n_values", "[4, 8]"]),
        (
            "deep_rf",
            [
                "--model.init_args.d_values",
                "[8]",
                "--model.init_args.n_values",
                "[4, 8]",
                "--model.init_args.depths",
                "[2, 3]",
            ],
        ),
        ("raf", ["--model.init_args.d_values", "[8, 16]", "--model.init_args.n_values", "[4, 12]"]),
        ("relu_raf", ["--model.init_args.d_values", "[16]", "--model.init_args.n_values", "[4, 12]"]),
    ],
)
def test_ws_config_twin_writes_the_contract(tmp_path, capsys, name, extra):
    cli = run(
        f"configs/ws/{name}.yaml",
        tmp_path,
        *TINY_EMB,
        "--model.init_args.trials",
        "2",
        "--model.init_args.max_steps",
        "60",
        *extra,
    )
    recs = records(cli)
    sweep = cli.model
    expected = len(sweep.cells()) * 2
    assert len(recs) == expected and len({r["trial_key"] for r in recs}) == expected
    for r in recs:
        assert WS_FIELDS <= set(r) and r["experiment"] == "ws" and r["map"] == name
        assert 0 < r["ws"] and r["delta_norm"] <= r["d"] ** 0.5 * (1 + 1e-6)
        if name == "rf":
            assert r["ws"] <= r["bound"] * (1 + 1e-9)
    out_dir = Path(cli.model.results_path).parent
    assert (out_dir / "summary.md").exists() and (out_dir / f"ws_{name}.png").exists()
    assert (out_dir / f"ws_{name}.pdf").exists()
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"results: {cli.model.results_path}"


@pytest.mark.parametrize(
    "config, extra",
    [
        (
            "configs/attack/fig4.yaml",
            [
                "--model.init_args.cases",
                '[{"map": "rf", "n": 6}, {"map": "raf", "n": 6}]',
                "--model.init_args.losses",
                "[err, align]",
            ],
        ),
        (
            "configs/attack/fig5.yaml",
            ["--model.init_args.cases", '[{"map": "relu_raf", "n": 6}]', "--model.init_args.p_values", "[1.0, 0.1]"],
        ),
    ],
)
def test_attack_config_twin_writes_the_contract(tmp_path, config, extra):
    cli = run(
        config,
        tmp_path,
        *TINY_EMB,
        "--model.init_args.d",
        "8",
        "--model.init_args.N_values",
        "[10, 20]",
        "--model.init_args.trials",
        "2",
        "--model.init_args.steps",
        "60",
        *extra,
    )
    recs = records(cli)
    sweep = cli.model
    assert len(recs) == len(sweep.trial_specs()) * len(sweep.objectives()) * sweep.contexts
    for r in recs:
        assert ATTACK_FIELDS <= set(r) and r["experiment"] == "attack"
        assert abs(r["t1"] - r["y"]) < 1e-6  # both heads interpolate the context sample (paper.md §12.8)
        assert r["err"] == pytest.approx((r["D1"] + r["y"]) ** 2, rel=1e-9, abs=1e-12)
        assert r["gamma"] == pytest.approx(max(abs(r["t0"]), abs(r["D0"])))
    out_dir = Path(cli.model.results_path).parent
    assert (out_dir / "summary.md").exists() and list(out_dir.glob("attack_*.png"))


def test_every_config_parses(tmp_path):
    """Each shipped config (offline and paper) is accepted by the CLI (parsed, classes resolved, not run)."""
    from wslight.cli import WSLightCLI

    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        evaluate = any(part in path.parts for part in ("ws", "attack", "probes"))
        args = (["test"] if evaluate else ["fit"]) + ["--config", str(path), "--print_config"]
        with pytest.raises(SystemExit) as exit_info:
            WSLightCLI(args=args, evaluate=evaluate, run=True)
        assert exit_info.value.code in (0, None), path
