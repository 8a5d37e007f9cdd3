"""A catalogue of bad inputs: each fails with a message naming the key, before any heavy work, leaving no output.

Configs go through `evaluate.py`'s entry point (`main([...], evaluate=True)`): LightningCLI instantiates the sweep
while parsing, so a bad value ends in a ValueError from the sweep's constructor (inside jsonargparse's report) or, for
a value of the wrong type or outside a Literal, in SystemExit with the report on stderr; both come before any Trainer,
log folder, results.jsonl or cache file exists. Pure functions and modules raise the ValueError directly.
Not repeated here: missing or corrupt cache files are rebuilt with a warning (tests/data/test_data.py:
test_truncated_cache_is_rebuilt_with_a_warning, test_corrupt_bytes_are_detected_by_the_checksum,
test_edited_manifest_is_a_mismatch_and_rebuilt, test_data_without_manifest_is_rebuilt) and the data module's bad input
(tests/data/test_data.py::test_bad_input_raises_before_the_encoder, test_more_samples_than_the_filtered_source_holds).
"""

import errno
import os
import re
from pathlib import Path

import pytest
import torch

import wslight.tasks  # noqa: F401  imported before any monkeypatch: the probes bind the real load_encoder
from wslight.app.cli import main
from wslight.attack import delta_attack
from wslight.features import DeepRandomFeatures, RandomAttentionFeatures, RandomFeatures, ReLUAttentionFeatures
from wslight.records import results as results_mod
from wslight.search.sensitivity import word_sensitivity
from wslight.tasks.classifier import FeatureMapClassifier

# The tiny test settings (tests/conf) of the shipped configs, with what these tests need: one cell, texts of 16 tokens.
WS = (
    "ws/rf",
    {
        "grid.d_values": [8],
        "grid.n_values": [4],
        "search.chains_per_round": 2,
        "search.max_steps": 10,
        "embeddings.max_length": 16,
    },
)
ATTACK = (
    "attack/fig4",
    {
        "cases": [{"map": "raf", "n": 6}],
        "N_values": [10],
        "losses": ["err"],
        "attack.steps": 10,
        "embeddings.max_length": 16,
    },
)
PROBE = ("probes/attention_under_delta", {})

TEXT = {"embeddings.source": "imdb_offline", "embeddings.encoder": "bundled-minilm"}


@pytest.fixture
def command(tmp_path, cpu_trainer, tiny):
    """A function of (setting, settings=None) giving evaluate.py's arguments for a tiny test setting.

    Its changes, then `settings`, on the CPU trainer with logs (and caches) under tmp_path.
    """

    def args(setting, settings=None):
        name, changes = setting
        where = {"output_dir": str(tmp_path / "out")} if name.startswith("probes/") else {}
        where = where or {"embeddings.cache_dir": str(tmp_path / "cache")}
        logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "logs"), "--trainer.logger.init_args.name", "bad"]
        return ["test", *tiny(name, {**changes, **where, **(settings or {})}), *cpu_trainer.args, *logs]

    return args


def overrides(settings: dict) -> list[str]:
    out = []
    for key, value in settings.items():
        out += [f"--model.init_args.{key}", str(value)]
    return out


def no_output_left(tmp_path):
    left = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "config.yaml"]
    assert left == [], f"partial output left behind: {left}"


# ---------------------------------------------------------------------------------------- sweeps through the CLI

CLI_CASES = [
    # data
    ("ws", {"grid.n_values": "[20]"}, [r"grid.n_values: n must be <= 16 \(embeddings.max_length\), got 20"]),
    ("ws", {"grid.d_values": "[32]"}, [r"grid.d_values: d must be <= 16 \(the embeddings' hidden size\), got 32"]),
    (
        "ws",
        {**TEXT, "embeddings.layer": 7},
        [r"embeddings.layer \(.*num_hidden_layers=6\) must be an integer in \[0, 6\], got 7"],
    ),
    (
        "ws",
        {**TEXT, "embeddings.num_samples": 25002},
        [r"embeddings.num_samples \(.*holds 25000 reviews\) must be an integer in \[2, 25000\], got 25002"],
    ),
    ("ws", {"embeddings.num_samples": 7}, [r"num_samples must be even.*got 7"]),
    ("ws", {"embeddings.source": "yelp"}, ["source", "yelp"]),
    # word-sensitivity sweep
    ("ws", {"grid.maps": "[attention]"}, ["maps", "attention"]),
    ("ws", {"grid.maps": "[]"}, [r"maps must be a non-empty list of values in .*got \[\]"]),
    ("ws", {"grid.n_values": "[]"}, [r"n_values must list at least one value, got \[\]"]),
    ("ws", {"grid.d_values": "[0]"}, [r"d_values must hold positive integers, got \[0\]"]),
    # a repeat in a grid would run the same trials twice: refused naming the key and the value
    (
        "ws",
        {"grid.n_values": "[4, 4]"},
        [r"model\.init_args\.grid\.n_values must not repeat a value, got \[4, 4\] \(4 twice\)"],
    ),
    ("ws", {"grid.d_values": "[8, 4, 8, 8]"}, [r"d_values must not repeat a value, got \[8, 4, 8, 8\] \(8 3 times\)"]),
    ("ws", {"grid.depths": "[2, 3, 2]"}, [r"depths must not repeat a value, got \[2, 3, 2\] \(2 twice\)"]),
    ("ws", {"search.radius_scale": 0}, ["radius_scale must be a finite number > 0, got 0"]),
    ("ws", {"search.radius_scale": -1.5}, ["radius_scale must be a finite number > 0, got -1.5"]),
    ("ws", {"grid.trials": 0}, ["grid.trials must be a positive integer, got 0"]),
    ("ws", {"positions": "[99]"}, [r"positions: every position must be an int in \[0, 3\], got 99"]),
    # attack sweep
    ("attack", {"N_values": "[50]"}, ["N_values: N \\+ contexts = 51 exceeds embeddings.num_samples = 40"]),
    ("attack", {"losses": "[hinge]"}, ["losses", "hinge"]),
    # two panels may share an n (Figure 4: rf and raf at one n); a repeated N or panel or penalty is refused
    (
        "attack",
        {"cases": "[{map: rf, n: 6}, {map: raf, n: 6}]", "N_values": "[10, 10]"},
        [r"N_values must not repeat a value, got \[10, 10\] \(10 twice\)"],
    ),
    (
        "attack",
        {"cases": "[{map: raf, n: 6}, {map: raf, n: 6}]"},
        [r"cases must not repeat a value, got \['raf/n6/L2', 'raf/n6/L2'\] \('raf/n6/L2' twice\)"],
    ),
    (
        "attack",
        {"losses": "[penalized]", "penalties": "[0.5, 0.5]"},
        [r"penalties must not repeat a value, got \[0\.5, 0\.5\] \(0\.5 twice\)"],
    ),
    ("attack", {"trainings": "[scratch]"}, ["trainings", "scratch"]),
    ("attack", {"losses": "[penalized]", "penalties": "[-1.0]"}, [r"penalties must be a finite number >= 0, got -1.0"]),
    ("attack", {"attack.position": 6}, [r"position must be an integer in \[0, 5\], got 6"]),
    ("attack", {"d": 17}, [r"d must be <= 16 \(the embeddings' hidden size\), got 17"]),
    ("attack", {"cases": "[{map: rf, n: 20}]"}, [r"cases.n: n must be <= 16 \(embeddings.max_length\), got 20"]),
]


@pytest.mark.parametrize(
    "sweep, settings, patterns", CLI_CASES, ids=[f"{s}-{'-'.join(map(str, k))}" for s, k, _ in CLI_CASES]
)
def test_bad_sweep_config_fails_at_parse_time_naming_the_key(
    tmp_path, capsys, monkeypatch, command, sweep, settings, patterns
):
    from wslight.data import encoders

    def no_encoder(*a, **k):
        raise AssertionError("the encoder must not load for a bad config")

    monkeypatch.setattr(encoders, "load_encoder", no_encoder)
    with pytest.raises((SystemExit, ValueError)) as exc:
        main([*command(WS if sweep == "ws" else ATTACK), *overrides(settings)], evaluate=True)
    if isinstance(exc.value, SystemExit):  # a parse error: jsonargparse reports on stderr and exits non-zero
        assert exc.value.code not in (0, None)
    err = capsys.readouterr().err + str(exc.value)
    for pattern in patterns:
        assert re.search(pattern, err), f"{pattern!r} not in:\n{err[-3000:]}"
    no_output_left(tmp_path)


# A map entry's init_args checked when the sweep is built, named by their key path: before the trainer exists, not
# at the first cell of that map. The tiny zoo setting: synthetic tokens of the bundled encoder's hidden size 384.
ZOO = ("ws/zoo", {"grid.n_values": [3], "grid.trials": 1})
LAYERS = r"must be an integer in \[1, 6\] or None \(encoder 'bundled-minilm' has 6 layers\)"
MAP_ARGS_CASES = [
    (
        "[rf, {class_path: pretrained_encoder, init_args: {layers: 7}}]",
        rf"maps\[1\]\.init_args\.layers {LAYERS}, got 7",
    ),
    (
        "[rf, {class_path: pretrained_encoder, init_args: {layers: 0}}]",
        rf"maps\[1\]\.init_args\.layers {LAYERS}, got 0",
    ),
    (
        "[{class_path: pretrained_encoder, init_args: {pooling: max}}]",
        r"maps\[0\]\.init_args\.pooling must be one of \['tokens', 'mean', 'sentence'\], got 'max'",
    ),
    (
        "[raf, {class_path: pretrained_attn, init_args: {layer: 6}}]",
        r"maps\[1\]\.init_args\.layer must be an integer in \[0, 5\] \(encoder 'bundled-minilm' has 6 layers\), got 6",
    ),
]


@pytest.mark.parametrize("maps, pattern", MAP_ARGS_CASES, ids=["layers-7", "layers-0", "pooling-max", "layer-6"])
def test_a_maps_entrys_bad_argument_is_named_by_its_key_path_before_the_run(
    tmp_path, capsys, monkeypatch, command, maps, pattern
):
    import wslight.tasks.sensitivity_sweep as sweeps_mod

    def no_trials(*a, **k):
        raise AssertionError("no trial may run for a bad map entry")

    monkeypatch.setattr(sweeps_mod, "word_sensitivity", no_trials)
    with pytest.raises(SystemExit) as exc:
        main([*command(ZOO), "--model.init_args.grid.maps", maps], evaluate=True)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and re.search(rf"evaluate\.py: error: model\.init_args\.grid\.{pattern}\n", err), err
    assert "Traceback" not in err and "GPU available" not in err  # before Lightning's trainer starts
    no_output_left(tmp_path)


WIDTH = r"d must equal the hidden size of encoder 'bundled-minilm' \(384\)"


@pytest.mark.parametrize(
    "maps, d_values, pattern",
    [
        (
            "[rf, pretrained_attn]",
            "[192, 384]",
            rf"d_values: {WIDTH}, got 192 \(map pretrained_attn\)",
        ),
        (
            "[{class_path: pretrained_encoder, init_args: {layers: 1}}]",
            "[768]",
            rf"d_values: {WIDTH}, got 768 \(map pretrained_encoder\)",
        ),
    ],
    ids=["attention", "encoder"],
)
def test_a_width_a_pretrained_map_cannot_take_is_refused_before_the_run(
    tmp_path, capsys, monkeypatch, command, maps, d_values, pattern
):
    """A pre-trained map takes only its encoder's hidden size: a d_values entry beside it is refused at once."""
    import wslight.tasks.sensitivity_sweep as sweeps_mod

    def no_trials(*a, **k):
        raise AssertionError("no trial may run for a width the map cannot take")

    monkeypatch.setattr(sweeps_mod, "word_sensitivity", no_trials)
    with pytest.raises(SystemExit) as exc:
        main(
            [*command(ZOO), "--model.init_args.grid.maps", maps, "--model.init_args.grid.d_values", d_values],
            evaluate=True,
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and re.search(rf"evaluate\.py: error: model\.init_args\.grid\.{pattern}\n", err), err
    assert "Traceback" not in err and "GPU available" not in err  # before Lightning's trainer starts
    no_output_left(tmp_path)


# ------------------------------------------------------------------------------------------------- probes (CLI)

PROBE_CASES = [
    ({"position": 500}, r"position must be an integer in \[0, \d+\].*got 500"),
    ({"layer": 6}, r"layer must be an integer in \[0, 5\].*got 6"),
    ({"head": 12}, r"head must be an integer in \[0, 11\].*got 12"),
    ({"text": "  "}, "text must be a non-empty string"),
]


@pytest.mark.parametrize("settings, pattern", PROBE_CASES, ids=[next(iter(k)) for k, _ in PROBE_CASES])
def test_bad_probe_fails_before_any_forward_and_writes_no_results(
    tmp_path, capsys, monkeypatch, command, settings, pattern
):
    """Probe keys that need the tokenised text or the encoder's sizes are checked before any forward pass.

    The CLI reports the ValueError as one block naming the key (exit status 2).
    """
    import wslight.probes.attention as attention_mod

    def no_forward(*a, **k):
        raise AssertionError("no encoder forward pass for bad input")

    monkeypatch.setattr(attention_mod, "encoder_forward", no_forward)
    with pytest.raises(SystemExit) as exc:
        main(command(PROBE, settings), evaluate=True)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and re.search(rf"error: model\.init_args\.{pattern}", err), err
    assert "Traceback" not in err
    assert not list(tmp_path.rglob("results.jsonl"))


# ---------------------------------------------------------------------------------- feature maps and functions


@pytest.mark.parametrize(
    "build, pattern",
    [
        (lambda: RandomFeatures(0, 8), "n must be a positive integer, got 0"),
        (lambda: RandomFeatures(4, -2), "d must be a positive integer, got -2"),
        (lambda: RandomFeatures(4, 8, k=0), "k must be a positive integer, got 0"),
        (lambda: RandomFeatures(4, 8, activation="sigmoid"), "activation must be one of .*got 'sigmoid'"),
        (lambda: RandomFeatures(4, 8, dtype="float16"), "dtype must be one of .*got 'float16'"),
        (lambda: DeepRandomFeatures(4, 8, depth=0), "depth must be a positive integer, got 0"),
        # a negative seed: the sweeps' message, checked by every map when it is built
        (lambda: RandomFeatures(4, 8, seed=-1), r"^seed must be an integer >= 0, got -1$"),
        (lambda: RandomFeatures(4, 8, seed=-1, max_stored_bytes=0), r"^seed must be an integer >= 0, got -1$"),
        (lambda: DeepRandomFeatures(4, 8, seed=-1), r"^seed must be an integer >= 0, got -1$"),
        (lambda: RandomAttentionFeatures(8, seed=-2), r"^seed must be an integer >= 0, got -2$"),
        (lambda: RandomAttentionFeatures(0), "d must be a positive integer, got 0"),
        (lambda: ReLUAttentionFeatures(8, n=0), "n must be a positive integer, got 0"),
        (lambda: RandomFeatures(4, 8)(torch.zeros(2, 5, 8)), r"X: the map was built for n=4 tokens.*\(n=5\)"),
        (lambda: RandomFeatures(4, 8)(torch.zeros(2, 4, 9)), r"X: the map was built for d=8.*\(d=9\)"),
        (lambda: RandomAttentionFeatures(8)(torch.zeros(2, 4, 7)), r"X: the map was built for d=8.*\(d=7\)"),
        (lambda: RandomAttentionFeatures(8)(torch.zeros(4, 8)), r"X must be a tensor of shape .* got \(4, 8\)"),
        (lambda: word_sensitivity(RandomFeatures(4, 8), torch.zeros(1, 4, 8), radius=0.0), "radius must be"),
        (lambda: word_sensitivity(RandomFeatures(4, 8), torch.zeros(1, 4, 8), positions=[4]), r"\[0, 3\], got 4"),
        (
            lambda: word_sensitivity(RandomAttentionFeatures(8), torch.zeros(1, 4, 8), chains_per_round=0),
            "chains_per_round must",
        ),
    ],
)
def test_bad_feature_map_or_estimator_argument(build, pattern):
    with pytest.raises(ValueError, match=pattern):
        build()


def _attack_data(M=8, B=1, n=4, d=8):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(M + B, n, d, generator=g)
    y = torch.where(torch.arange(M + B) % 2 == 0, 1.0, -1.0)
    return X[B:], y[B:], X[:B], y[:B]


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"N": 9}, r"N must be an integer in \[1, 8\] \(the training samples available\), got 9"),
        ({"loss": "hinge"}, r"loss must be one of \['err', 'align', 'align_proj', 'penalized'\], got 'hinge'"),
        ({"training": "scratch"}, r"training must be one of \['finetune', 'retrain'\], got 'scratch'"),
        ({"loss": "penalized", "penalty": -0.5}, r"penalty must be a finite number >= 0, got -0.5"),
        ({"position": 4}, r"position must be an integer in \[0, 3\], got 4"),
        (
            {"train_ids": torch.arange(10, 18), "ctx_ids": torch.tensor([13])},
            r"ctx_ids: a context sample must not be one of the N=8 training samples.*shared id\(s\) \[13\]",
        ),
    ],
)
def test_bad_attack_argument_before_the_heads(monkeypatch, kwargs, pattern):
    import wslight.attack.delta as attack_mod

    def no_heads(*a, **k):
        raise AssertionError("the heads must not be fitted for bad input")

    monkeypatch.setattr(attack_mod, "fit_heads", no_heads)
    X, y, Xc, yc = _attack_data()
    with pytest.raises(ValueError, match=pattern):
        delta_attack(RandomFeatures(4, 8), X, y, Xc, yc, **kwargs)


def test_map_built_for_other_sizes_than_the_data():
    model = FeatureMapClassifier(RandomFeatures(4, 8), n=4)
    with pytest.raises(ValueError, match="d: the feature map was built for d=8 but the data serves d=16"):
        model.check_data(4, 16)
    with pytest.raises(ValueError, match="n: the feature map was built for n=4 but the data serves n=6"):
        model.check_data(6, 8)
    model.check_data(4, 8)  # the matching sizes pass


# ----------------------------------------------------------------------------------------- output and disk errors


def _read_only_cases(tmp_path):
    cases = [("under-a-file", tmp_path / "a_file" / "out", "is not a directory")]
    if os.geteuid() != 0:  # root writes through permission bits
        ro = tmp_path / "read_only"
        ro.mkdir()
        ro.chmod(0o555)
        cases.append(("chmod-555", ro / "out", "Permission denied"))
    (tmp_path / "a_file").write_text("not a folder")
    return cases


def test_unwritable_output_dir_fails_before_any_trial(tmp_path, monkeypatch, command, capsys):
    import wslight.tasks.sensitivity_sweep as sweeps_mod

    def no_trials(*a, **k):
        raise AssertionError("no trial may run when the results cannot be written")

    monkeypatch.setattr(sweeps_mod, "word_sensitivity", no_trials)
    for name, out, reason in _read_only_cases(tmp_path):
        with pytest.raises(SystemExit) as exc:  # one block naming the key, exit 2
            main([*command(WS), "--model.init_args.output_dir", str(out)], evaluate=True)
        assert exc.value.code == 2, name
        err = capsys.readouterr().err
        key = rf"model\.init_args\.output_dir={re.escape(str(out))}"
        assert re.search(rf"{key}: cannot .*{out.parent.name}.*{reason}", err), (name, err)
        assert not out.exists(), name
    assert not list(tmp_path.rglob("results.jsonl"))


def test_disk_full_fails_clearly_and_leaves_no_partial_line(tmp_path, monkeypatch, command, capsys):
    args = [*command(WS), "--model.init_args.grid.trials", "3"]
    real_open = open
    calls = []

    class HalfThenFull:
        """A results file whose third append writes half of its bytes, then fails with ENOSPC."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def fileno(self):
            return self.f.fileno()

        def write(self, data):
            if len(calls) < 3:
                return self.f.write(data)
            self.f.write(bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        if Path(path).name == "results.jsonl" and "a" in mode:
            calls.append(path)
            return HalfThenFull(f)
        return f

    monkeypatch.setattr(results_mod, "open", fake_open, raising=False)
    with pytest.raises(SystemExit) as exc:  # one block, exit 1: the run failed, not the command
        main(args, evaluate=True)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    assert re.search(r"error: could not append 1 record\(s\) to .*results.jsonl \(No space left on device\)", err)
    (path,) = tmp_path.rglob("results.jsonl")
    data = path.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 2  # the two finished trials, no partial third line
    monkeypatch.undo()
    cli = main(args, evaluate=True)  # space is back: the same command resumes and finishes
    assert Path(cli.model.results_path) == path
    assert path.read_bytes().startswith(data) and path.read_bytes().count(b"\n") == 3
