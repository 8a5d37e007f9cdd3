"""The maps beyond the paper.

Multi-head RAF, linear and sigmoid attention, a random transformer block, a pre-trained attention layer: shapes, seeds,
fast paths against the generic path, the reductions they promise, bad arguments, and the slope table and figure of the
zoo sweep.
"""

import math
import random

import pytest
import torch

from wslight.base.seeding import generator
from wslight.features import MAPS, RandomAttentionFeatures, make_map
from wslight.features.generic_move import GenericMove, move_class_for, token_move
from wslight.records.summary import slope_table

pytestmark = pytest.mark.usefixtures("one_thread")

RANDOM = ["raf_mh", "raf_mh12", "linear_raf", "sigmoid_raf", "transformer"]
FAST = ["raf_mh", "raf_mh12", "linear_raf", "sigmoid_raf"]  # the maps with their own token-move algebra
D = 24  # divisible by 4 and 12


@pytest.mark.parametrize("name", RANDOM)
def test_shapes_and_any_n(rows, name):
    fmap = make_map(name, 5, D, seed=0)
    for n in (1, 5, 9):
        out = fmap(rows(3, n, D))
        assert out.shape == (3, fmap.out_dim(n)) == (3, n * D) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="X"):
        fmap(rows(2, 4, D + 1))


@pytest.mark.parametrize("name", RANDOM)
def test_seeds(rows, name):
    a, b, c = (make_map(name, 5, D, seed=s) for s in (3, 3, 4))
    torch.manual_seed(0)
    b2 = make_map(name, 5, D, seed=3)  # the global RNG plays no part
    torch.rand(100)
    for (key, x), y, y2, z in zip(a.named_buffers(), b.buffers(), b2.buffers(), c.buffers(), strict=True):
        assert torch.equal(x, y) and torch.equal(x, y2), key
        assert not torch.equal(x, z), key
    X = rows(2, 6, D)
    assert torch.equal(a(X), b(X)) and not torch.equal(a(X), c(X))


def test_one_head_is_raf(rows):
    """H = 1: the buffer is RAF's W for the same seed, and the map equals RAF."""
    X = rows(3, 7, D, dtype=torch.float64)
    raf = RandomAttentionFeatures(D, seed=5, dtype="float64")
    mh = make_map("raf_mh", 7, D, seed=5, heads=1, dtype="float64")
    assert torch.equal(mh.W[0], raf.W)
    assert torch.allclose(mh(X), raf(X), rtol=1e-12, atol=1e-12)


def test_heads_are_raf_on_column_blocks(rows):
    X = rows(2, 6, D, dtype=torch.float64)
    mh = make_map("raf_mh", 6, D, seed=2, heads=4, dtype="float64")
    out = mh(X).reshape(2, 6, 4, D // 4)
    for h in range(4):
        raf = RandomAttentionFeatures(D // 4, dtype="float64")
        raf.W = mh.W[h].clone()
        Xh = X[..., h * 6 : (h + 1) * 6]
        assert torch.allclose(out[:, :, h], raf(Xh).reshape(2, 6, 6), atol=1e-12)


@pytest.mark.parametrize("name", FAST)
def test_fast_path_equals_generic_path(rows, name):
    T, B, n, R, positions = 2, 3, 7, 2, [0, 3, 6]
    maps = [make_map(name, n, D, seed=s, dtype="float64") for s in range(T)]
    X = rows(T * B, n, D, seed=4, dtype=torch.float64).reshape(T, B, n, D)
    delta = 2 * torch.randn(T, B, len(positions), R, D, generator=generator(0, "test.delta"), dtype=torch.float64)
    fast = token_move(maps, X, positions, torch.float64)
    generic = GenericMove(maps, X, positions, torch.float64)
    assert type(fast) is not GenericMove and type(fast) is move_class_for(maps)
    assert torch.allclose(fast.phi0, generic.phi0, rtol=1e-6, atol=1e-6)
    assert torch.allclose(fast.features(delta), generic.features(delta), rtol=1e-6, atol=1e-6)
    assert torch.allclose(fast.change_sq(delta), generic.change_sq(delta), rtol=1e-6, atol=1e-6)
    grads = []
    for move in (fast, generic):
        x = delta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(move.change_sq(x).sum(), x)
        grads.append(g)
    assert torch.allclose(grads[0], grads[1], rtol=1e-6, atol=1e-6)
    if fast.starts is not None:
        assert fast.starts.shape[:3] == (T, B, len(positions)) and fast.starts.shape[-1] == D


def test_multi_head_starts_put_the_whole_radius_in_one_head_best_first(rows):
    """MultiHeadMove's first H starts: one head block each (the others zero), the best head first.

    They are ordered by the change that head gives alone with the whole radius (largest first); then come the starts
    with every head along its own direction.
    """
    X = rows(3, 6, 24)
    fmap = make_map("raf_mh", 6, 24, seed=4)  # H = 4 heads of d_h = 6
    move = token_move([fmap], X[None].double(), [0], torch.float64)
    starts = move.starts[0, :, 0]  # (B, H + S, d)
    H, dh = fmap.heads, fmap.dh
    blocks = starts[:, :H].reshape(3, H, H, dh).norm(dim=-1)  # (B, start, head)
    assert ((blocks > 0).sum(-1) == 1).all()  # one head each
    assert (starts[:, H:].reshape(3, -1, H, dh).norm(dim=-1) > 0).all()  # then every head at once
    alone = move.change_sq(starts[None, :, None, :H] * 24**0.5)[0, :, 0]  # (B, H)
    assert (alone[:, :-1] >= alone[:, 1:] * (1 - 1e-9)).all()


def test_mixed_head_counts_fall_back_to_the_generic_path():
    maps = [make_map("raf_mh", 5, D, heads=4), make_map("raf_mh", 5, D, heads=2)]
    assert move_class_for(maps) is GenericMove


def test_transformer_block_output_is_layer_normed(rows):
    fmap = make_map("transformer", 6, D, seed=1, heads=4, dtype="float64")
    Y = fmap(rows(2, 6, D, dtype=torch.float64)).reshape(2, 6, D)
    assert torch.allclose(Y.mean(-1), torch.zeros(2, 6, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(Y.var(-1, unbiased=False), torch.ones(2, 6, dtype=torch.float64), atol=1e-6)
    ffn = make_map("transformer", 6, D, seed=1, heads=4, ffn_ratio=2)
    assert ffn(rows(2, 6, D)).shape == (2, 6 * D) and {"W1", "W2"} <= dict(ffn.named_buffers()).keys()


def test_pretrained_layer_is_the_encoders_first_attention_sublayer():
    from wslight.data.encoders import load_encoder

    model, tokenizer, info = load_encoder("bundled-minilm")
    enc = tokenizer(["a film that one word can change"], return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc, output_hidden_states=True).hidden_states
        ref = model.encoder.layer[0].attention(hidden[0])[0]  # (1, n, d), the encoder's own sublayer
    fmap = make_map("pretrained_attn", hidden[0].shape[1], info.hidden_size)
    out = fmap(hidden[0]).reshape(ref.shape)
    assert (out - ref).abs().max() < 1e-5
    assert fmap.heads == info.num_heads and torch.equal(fmap.Wq, model.encoder.layer[0].attention.self.query.weight)
    # float64 and the same map for every seed (its weights are the encoder's)
    f64 = make_map("pretrained_attn", 3, info.hidden_size, seed=7, dtype="float64")
    assert torch.allclose(f64(hidden[0].double()).reshape(ref.shape).float(), ref, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "kwargs", "key"),
    [
        ("raf_mh", {"heads": 5}, "heads"),
        ("raf_mh", {"heads": 0}, "heads"),
        ("raf_mh12", {"heads": -1}, "heads"),
        ("transformer", {"heads": 7}, "heads"),
        ("transformer", {"ffn_ratio": -1}, "ffn_ratio"),
        ("transformer", {"eps": 0.0}, "eps"),
        ("linear_raf", {"dtype": "float16"}, "dtype"),
        ("sigmoid_raf", {"dtype": "half"}, "dtype"),
    ],
)
def test_bad_arguments_name_the_argument(name, kwargs, key):
    with pytest.raises(ValueError, match=key):
        make_map(name, 5, D, **kwargs)


def test_bad_arguments_of_the_pretrained_layer():
    with pytest.raises(ValueError, match="^d must equal the hidden size"):
        make_map("pretrained_attn", 5, D)
    with pytest.raises(ValueError, match="layer"):
        make_map("pretrained_attn", 5, 384, layer=6)
    with pytest.raises(ValueError, match="encoder"):
        make_map("pretrained_attn", 5, 384, encoder=3)


def test_registered():
    assert set(RANDOM) | {"pretrained_attn", "pretrained_attn_bert"} <= set(MAPS)


# --- the slope table --------------------------------------------------------------------------------------------------
def power_law(exponent, c, ns, trials=5, noise=0.0, seed=0):
    rng = random.Random(seed)
    return [
        {"map": "m", "d": 8, "n": n, "L": 1, "trial": t, "ws": c * n**exponent * math.exp(noise * rng.gauss(0, 1))}
        for n in ns
        for t in range(trials)
    ]


def test_slope_of_an_exact_power_law_is_recovered():
    (row,) = slope_table(power_law(-0.5, 0.8, [10, 20, 50, 100]))
    assert row["slope"] == pytest.approx(-0.5, abs=1e-12)
    assert row["ci_low"] <= -0.5 <= row["ci_high"] and row["ci_high"] - row["ci_low"] < 1e-9
    assert row["points"] == 20


def test_slope_ci_covers_a_noisy_power_law():
    rows = power_law(-0.25, 1.0, [10, 20, 50, 100, 200], trials=10, noise=0.1, seed=3)
    (row,) = slope_table(rows)
    assert row["ci_low"] < -0.25 < row["ci_high"] and row["ci_high"] - row["ci_low"] < 0.2
    two = slope_table(rows + [{**r, "map": "a"} for r in power_law(0.0, 2.0, [10, 100])])
    assert [r["map"] for r in two] == ["a", "m"] and two[0]["slope"] == pytest.approx(0.0, abs=1e-12)


def test_zoo_figure(tmp_path):
    from wslight.plots.ws import plot_ws_maps

    recs = power_law(-0.5, 1.0, [10, 50]) + [{**r, "map": "raf"} for r in power_law(0.0, 1.0, [10, 50])]
    fig = plot_ws_maps(recs)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = [line.get_label() for line in ax.get_lines()]
    assert any("sqrt" in s for s in labels) and "RAF" in labels and "m" in labels
    fig.savefig(tmp_path / "f.png")


def test_zoo_figure_gives_every_map_its_own_colour_and_marker():
    """Every registered map on one figure (two depths for the maps that have one): no two lines look alike."""
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt

    from wslight.plots.ws import plot_ws_maps

    recs = [
        {"map": m, "d": 8, "n": n, "L": L, "ws": (i + 1) / n**0.5}
        for i, m in enumerate(sorted(MAPS))
        for L in ((2, 3) if m == "deep_rf" else (1,))
        for n in (4, 16)
    ]
    lines = plot_ws_maps(recs).axes[0].get_lines()
    looks = [(mcolors.to_hex(line.get_color()), line.get_marker()) for line in lines]
    assert len(lines) == len(MAPS) + 2  # one line per map and depth, and the 1/sqrt(n) reference
    assert len(set(looks)) == len(looks), looks
    plt.close("all")


# --- the zoo config ---------------------------------------------------------------------------------------------------
def test_tiny_zoo_writes_the_figure_and_the_slope_table(tmp_path):
    import json
    from pathlib import Path

    from wslight.app.cli import main

    conf = Path(__file__).resolve().parents[1] / "conf" / "ws" / "zoo.yaml"
    args = ["test", "--config", str(conf), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = main([*args, "--trainer.enable_progress_bar", "false"], evaluate=True)
    recs = [json.loads(x) for x in Path(cli.model.results_path).read_text().splitlines()]
    sweep = cli.model
    assert len(recs) == len(sweep.grid.cells()) * sweep.grid.trials and {r["map"] for r in recs} == set(
        sweep.grid.map_entries
    )
    assert all(r["ws"] > 0 for r in recs)
    out_dir = Path(cli.model.results_path).parent
    assert (out_dir / "ws_maps.png").exists() and (out_dir / "ws_maps.pdf").exists()
    table = (out_dir / "slopes.md").read_text()
    assert all(f"| {m} | 384 |" in table for m in sweep.grid.map_entries)


def test_sigmoid_switch_start_turns_on_every_weight_it_controls(rows):
    """Sigmoid attention's first start turns on every weight it controls; the second the column alone.

    The first moves token i so that key i's weight in every row and every weight of row i (its own included) is on,
    sigmoid > 1/2, where random directions leave most of them off; the second turns on the column alone. Both are unit
    directions; linear attention has no such starts.
    """
    n, d = 6, 192  # Gaussian tokens: at small d the 2n - 1 half-spaces need not meet inside the ball
    X = rows(4, n, d)[None].double()
    fmap = make_map("sigmoid_raf", n, d, seed=3)
    move = token_move([fmap], X, [0], torch.float64)
    assert move.starts.shape == (1, 4, 1, 2, d)
    torch.testing.assert_close(move.starts.norm(dim=-1), torch.ones(1, 4, 1, 2, dtype=torch.float64))

    def weights(delta):  # (B, d) -> row i's and column i's weights after the move, (B, 2n)
        Xp = X[0].clone()
        Xp[:, 0] += delta
        A = torch.sigmoid(Xp @ fmap.W.double() @ Xp.transpose(1, 2) / d**0.5 - math.log(n))
        return torch.cat([A[:, 0], A[:, :, 0]], dim=1)

    on = weights(move.starts[0, :, 0, 0] * d**0.5)
    assert (on > 0.5).all()
    column = weights(move.starts[0, :, 0, 1] * d**0.5)[:, n + 1 :]
    assert (column > 0.5).all()
    noise = torch.randn(4, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert (weights(noise / noise.norm(dim=-1, keepdim=True) * d**0.5) > 0.5).double().mean() < 0.9
    assert token_move([make_map("linear_raf", n, d, seed=3)], X, [0], torch.float64).starts is None
