"""Encoder probes on the bundled offline MiniLM (6 layers, d = 384, 12 heads): Figure 1 left, Figure 3 panels 3-4."""

import json
import math

import matplotlib.pyplot as plt
import pytest
import torch

from wslight.data.encoders import load_encoder
from wslight.probes import (
    attention_edit,
    attention_mass,
    attention_under_delta,
    closed_form_delta,
    default_probe_text,
    figure_attention_edit,
    figure_attention_under_delta,
    figure_layerwise,
    first_layer_attention,
    layerwise_change,
    optimised_delta,
    vocab_attention_mass,
    vocab_hidden0,
)
from wslight.probes._common import encoder_forward, tokenise

ENC = "bundled-minilm"


@pytest.fixture(scope="module")
def enc():
    return load_encoder(ENC)


@pytest.fixture(scope="module")
def text_state(enc):
    """Clean hidden states and attentions of the bundled probe text."""
    model, tok, _ = enc
    tk = tokenise(tok, default_probe_text())
    hidden, attn = encoder_forward(model, tk.inputs, attentions=True)
    return tk, hidden, attn


@pytest.fixture(scope="module")
def layerwise(enc):
    return layerwise_change(ENC, n_draws=4, steps=10, replacement_k=3, seed=3)


@pytest.fixture(scope="module")
def under_delta(enc):
    return attention_under_delta(ENC)


@pytest.fixture
def forward_counter(enc):
    """Counts forward passes of the encoder (to check that bad input fails before any)."""
    model = enc[0]
    calls = []
    handle = model.register_forward_pre_hook(lambda *a, **k: calls.append(1))
    yield calls
    handle.remove()


# ---------------------------------------------------------------- shared pieces


def test_probe_text_is_about_200_tokens(enc):
    tk = tokenise(enc[1], default_probe_text())
    assert 180 <= tk.n <= 230
    assert tk.tokens[0] == "[CLS]" and tk.tokens[-1] == "[SEP]"


def test_first_layer_attention_matches_encoder(enc, text_state):
    model = enc[0]
    _, hidden, attn = text_state
    A = first_layer_attention(model, hidden[0], heads=[0, 5, 11])  # (1, 3, n, n)
    torch.testing.assert_close(A, attn[0][:, [0, 5, 11]], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- Figure 1 left


def test_attention_edit_default_pair(enc):
    model, tok, info = enc
    res = attention_edit(ENC)
    assert res["tokens_a"] == ["i", "love", "her", "much"]
    assert res["tokens_b"] == ["i", "love", "her", "smile"]
    assert res["attn_a"].shape == res["attn_b"].shape == (4, 4)
    # Same slice and head mean as the authors, rows not renormalised.
    with torch.no_grad():
        out = model(**tok("I love her smile", return_tensors="pt"), output_attentions=True)
    torch.testing.assert_close(res["attn_b"], out.attentions[0][0].mean(0)[1:-1, 1:-1], atol=1e-6, rtol=0)
    assert (res["attn_a"].sum(-1) < 1).all()
    torch.testing.assert_close(res["diff"], res["attn_b"] - res["attn_a"])
    # Only the edited key's column changes by more than the rest: the edit redistributes attention to "smile".
    assert res["diff"][:3, 3].abs().min() > res["diff"][:3, :3].abs().max()
    assert len(res["records"]) == 16
    json.dumps(res["records"])


def test_attention_edit_one_head_and_layer(enc):
    model, tok, _ = enc
    res = attention_edit(ENC, "the cat sat", "the dog sat", layer=2, head=7)
    with torch.no_grad():
        out = model(**tok("the dog sat", return_tensors="pt"), output_attentions=True)
    torch.testing.assert_close(res["attn_b"], out.attentions[2][0, 7][1:-1, 1:-1], atol=1e-6, rtol=0)
    assert res["records"][0]["head"] == 7 and res["records"][0]["layer"] == 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sentence_b": "I love her beautiful smile"}, "same number of tokens"),
        ({"sentence_a": ""}, "sentence_a must be a non-empty"),
        ({"layer": 6}, r"layer must be an integer in \[0, 5\].*got 6"),
        ({"head": 12}, r"head must be an integer in \[0, 11\].*got 12"),
    ],
)
def test_attention_edit_bad_input(enc, forward_counter, kwargs, match):
    with pytest.raises(ValueError, match=match):
        attention_edit(ENC, **kwargs)
    assert forward_counter == []


# ---------------------------------------------------------------- Delta


def test_closed_form_delta_norm_and_direction(enc, text_state):
    model = enc[0]
    _, hidden, _ = text_state
    H0 = hidden[0, 0]
    d_default = closed_form_delta(model, H0, 42)
    assert math.isclose(d_default.norm().item(), H0[42].norm().item(), rel_tol=1e-5)
    d3 = closed_form_delta(model, H0, 42, heads=[1, 4], norm=3.0)
    assert math.isclose(d3.norm().item(), 3.0, rel_tol=1e-5)
    # It maximises the first-order rise of the key's scores: beats random directions of the same norm.
    g = torch.randn(16, H0.shape[1], generator=torch.Generator().manual_seed(0))
    g = g / g.norm(dim=-1, keepdim=True) * d_default.norm()
    e = torch.zeros(H0.shape[0], 1)
    e[42] = 1.0
    m_delta = attention_mass(model, (H0 + e * d_default)[None], 42)
    m_rand = attention_mass(model, H0[None] + e[None] * g[:, None], 42)
    assert m_delta.item() > 10 * m_rand.max().item()


def test_optimised_delta_improves_on_closed_form_within_ball(enc, text_state):
    model = enc[0]
    H0 = text_state[1][0, 0]
    delta, info = optimised_delta(model, H0, 42, heads=[0], norm=5.0, steps=10)
    assert delta.norm().item() <= 5.0 * (1 + 1e-5)
    assert info["mass"] >= info["mass_init"]
    e = torch.zeros(H0.shape[0], 1)
    e[42] = 1.0
    assert math.isclose(attention_mass(model, (H0 + e * delta)[None], 42, [0]).item(), info["mass"], rel_tol=1e-5)


# ---------------------------------------------------------------- Figure 3 panel 3


def test_layerwise_layer0_is_input_ratio(layerwise, text_state):
    _, hidden, _ = text_state
    ratio = layerwise["delta_norm"] / hidden[0].norm().item()
    assert math.isclose(layerwise["input_ratio"], ratio, rel_tol=1e-6)
    rc = layerwise["rel_change"]
    assert abs(rc["closed_form"][0].item() - ratio) < 1e-5
    assert (
        abs(rc["optimised"][0].item() - layerwise["delta"]["optimised"].norm().item() / hidden[0].norm().item()) < 1e-5
    )
    assert (rc["gaussian"][:, 0] - ratio).abs().max().item() < 1e-5
    assert rc["gaussian"].shape == (4, 7)


def test_layerwise_delta_far_above_gaussian(layerwise):
    rc = layerwise["rel_change"]
    for method in ("closed_form", "optimised"):
        assert (rc[method][1:] > 2 * rc["gaussian_mean"][1:]).all(), (method, rc[method], rc["gaussian_mean"])
    m = layerwise["attention_mass"]
    assert m["optimised"] >= m["closed_form"] > 20 * m["clean"]


def test_layerwise_gaussian_draws_are_seeded(layerwise):
    again = layerwise_change(ENC, n_draws=2, steps=0, replacement_k=0, seed=3)
    torch.testing.assert_close(again["rel_change"]["gaussian"], layerwise["rel_change"]["gaussian"][:2])
    other = layerwise_change(ENC, n_draws=2, steps=0, replacement_k=0, seed=4)
    assert not torch.allclose(other["rel_change"]["gaussian"], again["rel_change"]["gaussian"])


def test_layerwise_replacement_words(enc, layerwise, text_state):
    model, tok, _ = enc
    tk, hidden, _ = text_state
    rep = layerwise["replacement"]
    orig = int(tk.inputs["input_ids"][0, 42])
    assert orig not in rep["ids"] and not set(rep["ids"]) & set(tok.all_special_ids)
    assert len(rep["ids"]) == len(set(rep["ids"])) and 3 <= len(rep["ids"]) <= 6
    # Realised edits: layer 0 shows ||h_w - x_i|| / ||X||_F, and the best word is the argmax at the last layer.
    X = hidden[0].norm().item()
    torch.testing.assert_close(rep["rel_change"][:, 0], torch.tensor(rep["edit_norm"]) / X, atol=1e-5, rtol=0)
    assert rep["rel_change"][rep["best"], -1] == rep["rel_change"][:, -1].max()
    # Nearest pool sorted by distance to x_i + Delta.
    near = [d for d, p in zip(rep["dist"], rep["pool"]) if p == "nearest"]
    assert near == sorted(near)
    kinds = {(r["kind"], r["method"]) for r in layerwise["records"]}
    assert ("replacement", "best") in kinds
    best_last = [r for r in layerwise["records"] if r["kind"] == "replacement" and r["method"] == "best"][-1]
    assert best_last["word"] == rep["tokens"][rep["best"]]


def test_vocab_rows_and_exact_vocab_attention_mass(enc, text_state):
    model = enc[0]
    tk, hidden, _ = text_state
    H0 = hidden[0, 0]
    hw = vocab_hidden0(model, 42)
    ids = tk.inputs["input_ids"][0]
    torch.testing.assert_close(hw[ids[42]], H0[42], atol=1e-5, rtol=0)
    words = torch.tensor([1000, 2054, 7592, 29000])
    fast = vocab_attention_mass(model, H0, 42, hw[words], heads=[0, 3, 9], chunk=3)
    Hs = H0[None].repeat(4, 1, 1)
    Hs[:, 42] = hw[words]
    slow = attention_mass(model, Hs, 42, [0, 3, 9])
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)


def test_layerwise_records(layerwise):
    recs = layerwise["records"]
    assert len(recs) == 7 * 5  # (layer) x (2 Delta, Gaussian, 2 replacement)
    json.dumps(recs)
    g1 = [r for r in recs if r["kind"] == "gaussian" and r["layer"] == 1][0]
    assert g1["experiment"] == "probe" and g1["probe"] == "layerwise" and g1["position"] == 42
    assert g1["rel_change_sd"] > 0 and g1["encoder"] == ENC and g1["seed"] == 3
    assert all(isinstance(v, (int, float, str, type(None))) for r in recs for v in r.values())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"position": 207}, r"position must be an integer in \[0, 206\].*got 207"),
        ({"position": -1}, r"position must be an integer in \[0, 206\].*got -1"),
        ({"heads": [0, 12]}, r"heads must be an integer in \[0, 11\].*got 12"),
        ({"text": "   "}, "text must be a non-empty string"),
        ({"n_draws": 0}, "n_draws must be a positive integer, got 0"),
        ({"delta_norm": -1.0}, r"delta_norm must be a finite number > 0 or None, got -1.0"),
    ],
)
def test_layerwise_bad_input(enc, forward_counter, kwargs, match):
    with pytest.raises(ValueError, match=match):
        layerwise_change(ENC, **kwargs)
    assert forward_counter == []


# ---------------------------------------------------------------- Figure 3 panel 4


def test_attention_under_delta_column_dominates(under_delta):
    res = under_delta
    assert res["tokens"][6] == "of" and res["tokens"][0] == "[CLS]"
    before, after = res["column_mean_before"], res["column_mean_after"]
    assert int(after.argmax()) == 6
    assert after[6] > 5 * before[6] and after[6] > 0.5
    assert after[6] > 5 * torch.cat([after[:6], after[7:]]).max()
    torch.testing.assert_close(res["after"].sum(-1), torch.ones(len(res["tokens"])), atol=1e-5, rtol=0)
    assert len(res["records"]) == len(res["tokens"]) ** 2
    json.dumps(res["records"])


def test_attention_under_delta_before_is_clean(enc, under_delta):
    model, tok, _ = enc
    with torch.no_grad():
        out = model(**tok(under_delta["text"], return_tensors="pt"), output_attentions=True)
    torch.testing.assert_close(under_delta["before"], out.attentions[0][0, 0], atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"position": 16}, r"position must be an integer in \[0, 15\].*got 16"),
        ({"layer": 6}, r"layer must be an integer in \[0, 5\].*got 6"),
        ({"head": -1}, r"head must be an integer in \[0, 11\].*got -1"),
        ({"delta_heads": [99]}, r"delta_heads must be an integer in \[0, 11\].*got 99"),
        ({"text": ""}, "text must be a non-empty string"),
        ({"method": "random"}, "method must be one of"),
    ],
)
def test_attention_under_delta_bad_input(enc, forward_counter, kwargs, match):
    with pytest.raises(ValueError, match=match):
        attention_under_delta(ENC, **kwargs)
    assert forward_counter == []


# ---------------------------------------------------------------- figures saved


def test_probe_figures_saved_as_png_and_pdf(tmp_path):
    from wslight.tasks import save_figure

    edit = attention_edit(ENC)
    under = attention_under_delta(ENC, steps=2)
    layer = layerwise_change(ENC, text="a short text to perturb", position=3, n_draws=2, steps=2, replacement_k=1)
    save_figure(figure_attention_edit(edit, vlim=(0.1, 0.25)), tmp_path, "attention_edit")
    save_figure(figure_attention_under_delta(under), tmp_path, "attention_under_delta")
    save_figure(figure_layerwise(layer), tmp_path, "layerwise_change")
    for stem in ("attention_edit", "attention_under_delta", "layerwise_change"):
        for ext in ("png", "pdf"):
            assert (tmp_path / f"{stem}.{ext}").stat().st_size > 1000
    recs = edit["records"] + under["records"] + layer["records"]
    assert {r["probe"] for r in recs} == {"attention_edit", "attention_under_delta", "layerwise"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{s}.{e}" for s in ("attention_edit", "attention_under_delta", "layerwise_change") for e in ("png", "pdf")
    )
    assert plt.get_fignums() == []  # every figure closed
