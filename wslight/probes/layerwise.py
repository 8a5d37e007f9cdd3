"""Layer-wise relative change of a BERT encoder's hidden states when one input token is perturbed (Figure 3, panel 3).

Paper (figure caption, docs/theory/probes.md §7.2): the relative change ||H_l(X') - H_l(X)||_F / ||H_l(X)||_F of every
layer l = 0..L when token 42 of a ~200-token text is moved by the attention-attracting Delta, against Gaussian noise of
the same norm. The paper's injection point, norm and heads are not stated; working definitions implemented here:
Delta is added to hidden_states[0] (the output of the embedding layer, which feeds the first attention layer directly in
a post-LN BERT) with a forward hook, so layer 0 shows the input change itself (= ||Delta|| / ||X||_F); its norm defaults
to ||x_i|| (the analogue of sqrt(d) under the paper's input assumption); it targets all first-layer heads, summed.
[CLS] and [SEP] are part of X and of every norm.
"""

from __future__ import annotations

import torch

from ..base import validate
from ..base.seeding import generator
from ..data.encoders import load_encoder
from ._common import (
    Tokenised,
    check_heads,
    check_index,
    default_probe_text,
    encoder_forward,
    max_positions,
    relative_change,
    tokenise,
)
from .delta import attention_mass, closed_form_delta, optimised_delta
from .replacement import replacement_candidates

DEFAULT_POSITION = 42


def heads_label(heads: list[int], num_heads: int) -> str:
    """'all' or a comma-separated list of head indices (a flat JSON value)."""
    return "all" if len(heads) == num_heads else ",".join(map(str, heads))


def layerwise_change(
    encoder: str = "bundled-minilm",
    text: str | None = None,
    position: int = DEFAULT_POSITION,
    heads: int | list[int] | None = None,
    delta_norm: float | None = None,
    n_draws: int = 10,
    seed: int = 0,
    steps: int = 100,
    lr: float = 0.1,
    replacement_k: int = 8,
) -> dict:
    """Relative change of every hidden layer under the attention-attracting Delta, Gaussian noise and real edits.

    Args:
        encoder: encoder name for `wslight.data.encoders.load_encoder` ('bundled-minilm' offline, 'bert-base-uncased').
        text: input text; None = the bundled probe text (`wslight/assets/probe_text.txt`, ~200 WordPiece tokens).
            Pass the paper's abstract to match the paper's figure.
        position: perturbed token, an index in the tokenised sequence ([CLS] at 0).
        heads: first-layer heads that Delta targets: None = all (summed), an int or a list.
        delta_norm: ||Delta|| and of the Gaussian control; None = ||x_position|| in hidden_states[0].
        n_draws: Gaussian draws (mean and sd reported), seeded by `wslight.base.seeding.generator(seed, ..., draw)`.
        seed: seed of the Gaussian draws.
        steps: projected gradient ascent steps of the optimised Delta.
        lr: its step length as a fraction of ||Delta||.
        replacement_k: size of each pool of real replacement words (0 = skip the replacement probe); the words are
            snapped to x_position + the optimised Delta (see `wslight.probes.replacement`).

    Returns:
        dict with `tokens`, `position`, `token`, `heads`, `delta_norm`, `input_ratio` (= delta_norm / ||X||_F),
        `rel_change` (dict of (L + 1,) tensors `closed_form`, `optimised`, `gaussian_mean`, `gaussian_sd`,
        `replacement_best`, `replacement_nearest`, and `gaussian` (n_draws, L + 1)), `attention_mass` (first layer,
        chosen heads: `clean`, `closed_form`, `optimised`), `delta` ((d,) tensors), `replacement` (candidates with
        their (C, L + 1) `rel_change`, `best`, `nearest`) and `records` (one flat dict per (layer, kind, method)).
    """
    text = default_probe_text() if text is None else text
    _check_arguments(text, n_draws, replacement_k, steps, delta_norm, lr)
    model, tokenizer, info = load_encoder(encoder)
    tk = tokenise(tokenizer, text, max_positions(model))
    check_index("position", position, tk.n, f"tokenised text of {tk.n} tokens, [CLS] at 0")
    heads = check_heads(heads, info.num_heads)

    clean, _ = encoder_forward(model, tk.inputs)  # (L + 1, 1, n, d)
    H0 = clean[0, 0]  # (n, d)
    c = float(H0[position].norm()) if delta_norm is None else float(delta_norm)
    d_cf = closed_form_delta(model, H0, position, heads, c)  # (d,)
    d_opt, opt_info = optimised_delta(model, H0, position, heads, c, steps=steps, lr=lr)  # (d,)
    deltas = torch.cat([d_cf[None], d_opt[None], _gaussian_deltas(seed, n_draws, H0.shape[1], c).to(H0.dtype)])
    P = torch.zeros(deltas.shape[0], tk.n, H0.shape[1], dtype=H0.dtype)  # (2 + n_draws, n, d)
    P[:, position] = deltas
    rc = _delta_changes(model, tk.inputs, P, clean, n_draws)
    mass = _attention_masses(model, H0, P[:2], position, heads)

    replacement = None
    if replacement_k > 0:
        replacement = _replacement_changes(model, tokenizer, tk, clean, position, d_opt, heads, replacement_k)
        rc["replacement_best"] = replacement["rel_change"][replacement["best"]]
        rc["replacement_nearest"] = replacement["rel_change"][replacement["nearest"]]

    out = {
        "encoder": encoder,
        "text": text,
        "tokens": tk.tokens,
        "position": position,
        "token": tk.tokens[position],
        "heads": heads,
        "delta_norm": c,
        "input_ratio": c / float(clean[0].norm()),
        "rel_change": rc,
        "attention_mass": mass,
        "optimiser": opt_info,
        "delta": {"closed_form": d_cf, "optimised": d_opt},
        "replacement": replacement,
        "seed": seed,
        "n_draws": n_draws,
    }
    out["records"] = _records(out, info.num_heads)
    return out


def _check_arguments(text, n_draws: int, replacement_k: int, steps: int, delta_norm: float | None, lr: float) -> None:
    """Raise ValueError for a bad argument of `layerwise_change`, naming it (before the encoder is loaded)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    validate.integer("n_draws", n_draws, low=1)
    validate.integer("replacement_k", replacement_k, low=0)
    validate.integer("steps", steps, low=0)
    validate.number("delta_norm", delta_norm, low=0, strict=True, allow_none=True)
    validate.number("lr", lr, low=0, strict=True)


def _gaussian_deltas(seed: int, n_draws: int, d: int, norm: float) -> torch.Tensor:
    """The Gaussian control: `n_draws` directions of norm `norm`, draw j seeded by (seed, ..., j); (n_draws, d)."""
    g = torch.stack(
        [torch.randn(d, generator=generator(seed, "probes/layerwise/gaussian", j)) for j in range(n_draws)]
    )  # (n_draws, d)
    return g / g.norm(dim=-1, keepdim=True) * norm


def _delta_changes(model, inputs: dict, P: torch.Tensor, clean: torch.Tensor, n_draws: int) -> dict:
    """Relative change of every layer under the perturbations P (closed form, optimised, then the Gaussian draws).

    Args:
        model: the encoder.
        inputs: the tokenised text, (1, n) tensors.
        P: (2 + n_draws, n, d) perturbations of hidden_states[0].
        clean: (L + 1, 1, n, d) hidden states of the clean text.
        n_draws: number of Gaussian draws (the last n_draws rows of P).

    Returns:
        dict of (L + 1,) tensors `closed_form`, `optimised`, `gaussian_mean`, `gaussian_sd` and the (n_draws, L + 1)
        `gaussian`.
    """
    B = P.shape[0]
    hidden, _ = encoder_forward(model, {k: v.expand(B, -1) for k, v in inputs.items()}, P)  # (L + 1, B, n, d)
    rel = relative_change(hidden, clean)  # (L + 1, B)
    gauss = rel[:, 2:].T  # (n_draws, L + 1)
    return {
        "closed_form": rel[:, 0],
        "optimised": rel[:, 1],
        "gaussian": gauss,
        "gaussian_mean": gauss.mean(0),
        "gaussian_sd": gauss.std(0, unbiased=True) if n_draws > 1 else torch.zeros_like(gauss[0]),
    }


def _attention_masses(model, H0: torch.Tensor, P: torch.Tensor, position: int, heads: list[int]) -> dict:
    """First-layer attention mass on `position` (chosen heads) of the clean text and under the two Deltas.

    Args:
        model: the encoder.
        H0: (n, d) clean hidden_states[0].
        P: (2, n, d) the closed-form and the optimised perturbation.
        position: the perturbed token.
        heads: the first-layer heads summed.

    Returns:
        dict of floats `clean`, `closed_form`, `optimised`.
    """
    with torch.no_grad():
        m_clean = attention_mass(model, H0[None], position, heads)  # (1,)
        m_delta = attention_mass(model, H0[None] + P, position, heads)  # (2, n, d) -> (2,)
    return {"clean": float(m_clean[0]), "closed_form": float(m_delta[0]), "optimised": float(m_delta[1])}


def _replacement_changes(
    model, tokenizer, tk: Tokenised, clean: torch.Tensor, position: int, d_opt: torch.Tensor, heads: list[int], k: int
) -> dict:
    """Real replacement words at `position` snapped to x_position + d_opt, with the relative change each causes.

    Returns:
        the candidates of `replacement_candidates` with their (C, L + 1) `rel_change`, the index `best` (largest change
        at the last layer) and `nearest` (0: the nearest pool comes first, sorted by distance).
    """
    H0 = clean[0, 0]  # (n, d)
    ids = tk.inputs["input_ids"][0]
    tt = int(tk.inputs["token_type_ids"][0, position]) if "token_type_ids" in tk.inputs else 0
    cand = replacement_candidates(model, tokenizer, H0, ids, position, d_opt, heads, k, tt)
    C = len(cand["ids"])
    rep_inputs = {key: v.expand(C, -1).clone() for key, v in tk.inputs.items()}
    rep_inputs["input_ids"][:, position] = torch.tensor(cand["ids"])
    rep_hidden, _ = encoder_forward(model, rep_inputs)  # (L + 1, C, n, d)
    rep_rel = relative_change(rep_hidden, clean).T  # (C, L + 1)
    cand.update(rel_change=rep_rel, best=int(rep_rel[:, -1].argmax()), nearest=0)
    return cand


def _records(res: dict, num_heads: int) -> list[dict]:
    base = {
        "experiment": "probe",
        "probe": "layerwise",
        "encoder": res["encoder"],
        "position": res["position"],
        "token": res["token"],
        "n_tokens": len(res["tokens"]),
        "heads": heads_label(res["heads"], num_heads),
        "seed": res["seed"],
    }
    rc = res["rel_change"]
    rows = []
    for layer in range(len(rc["closed_form"])):
        for method in ("closed_form", "optimised"):
            rows.append(
                base
                | {
                    "layer": layer,
                    "kind": "delta",
                    "method": method,
                    "rel_change": float(rc[method][layer]),
                    "rel_change_sd": 0.0,
                    "delta_norm": float(res["delta"][method].norm()),
                    "attention_mass": res["attention_mass"][method],
                    "word": None,
                }
            )
        rows.append(
            base
            | {
                "layer": layer,
                "kind": "gaussian",
                "method": f"mean_of_{res['n_draws']}",
                "rel_change": float(rc["gaussian_mean"][layer]),
                "rel_change_sd": float(rc["gaussian_sd"][layer]),
                "delta_norm": res["delta_norm"],
                "attention_mass": None,
                "word": None,
            }
        )
        rep = res["replacement"]
        if rep is not None:
            for method in ("best", "nearest"):
                j = rep[method]
                rows.append(
                    base
                    | {
                        "layer": layer,
                        "kind": "replacement",
                        "method": method,
                        "rel_change": float(rep["rel_change"][j, layer]),
                        "rel_change_sd": 0.0,
                        "delta_norm": rep["edit_norm"][j],
                        "attention_mass": rep["mass"][j],
                        "word": rep["tokens"][j],
                    }
                )
    return rows
