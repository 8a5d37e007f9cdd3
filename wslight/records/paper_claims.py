"""The paper's claims (docs/theory/checks.md §8), checked on the records of a run's results.jsonl files.

Checks 1-15: each returns a `Check` row of kind CLAIM (PASS, FAIL, or N/A with the reason when the run holds no records
it could be computed from); `paper_claims` lists them in the paper's order. Never written by hand. The claims on word
sensitivity (1-7) are in `wslight.records.ws_claims`, those on the attack (8-11) in `wslight.records.attack_claims`;
the encoder probes' (12, 14) and the searches' tightness (15) here.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable

from .attack_claims import (  # noqa: F401  (ERR_RESOLUTION, PAPER_MAX_N_OVER_D, attack_of, decisive_setting: re-exported)
    ERR_RESOLUTION,
    PAPER_MAX_N_OVER_D,
    attack_of,
    check_closed_forms,
    check_raf_can_flip,
    check_relu_raf_less_reliable,
    check_rf_cannot_flip,
    decisive_setting,
)
from .checks import Check, ordered, tie_note, unmeasured, verdict
from .summary import confirmed_counts
from .ws_claims import (  # noqa: F401  (WS_RESOLUTION, ws_of: re-exported)
    WS_RESOLUTION,
    check_deep_rf_decays,
    check_on_boundary,
    check_raf_flat,
    check_relu_raf,
    check_rf_bound,
    check_rf_feature_norm,
    check_rf_sqrt_n_flat,
    ws_of,
)

# What the compared quantities are known to (`wslight.records.checks.ordered`): two sides closer than this are not
# distinguishable at the run's grid, and the check says so instead of a verdict that rounding would decide.
ATTENTION_RESOLUTION = 1e-6  # absolute, on attention weights of the float32 encoder (its rounding is ~1e-7)


def check_attention_edit(probes: list[dict]) -> Check:
    """Check 12 (Figure 1 left): the edited word draws more attention from 'love' (love->smile > love->much)."""
    what = "12. Figure 1 left: the edited word draws more attention from 'love' (love->smile > love->much)"
    expected = "contrast > 1 (BERT-Base values +/-0.02 need bert-base-uncased: configs/paper/probes)"
    recs = [r for r in probes if r.get("probe") == "attention_edit" and r.get("query_token_a") == "love"]
    last = [r for r in recs if r["key"] == max(x["key"] for x in recs)] if recs else []
    if not last:
        return unmeasured("12", what, expected, "no attention_edit probe with the default sentences")
    a, b = last[0]["attention_a"], last[0]["attention_b"]
    status = ordered(b, a, ATTENTION_RESOLUTION)
    return Check(
        "12",
        what,
        f"love->{last[0]['key_token_a']} {a:.3f}, love->{last[0]['key_token_b']} {b:.3f}, "
        f"contrast {b / a:.2f} ({last[0].get('encoder', '?')}){tie_note(status)}",
        expected,
        status,
    )


def check_encoder_delta(probes: list[dict]) -> Check:
    """Check 14: Delta's relative change of the encoder beats the Gaussian control at every layer >= 1.

    The perturbed key's column is the largest after Delta.
    """
    what = (
        "14. Encoder: Delta's relative change above the Gaussian control at every layer >= 1; perturbed key dominates"
    )
    expected = "Delta / Gaussian >= 2 at every layer >= 1; the perturbed column is the largest after Delta"
    lw = [r for r in probes if r.get("probe") in ("layerwise", "layerwise_change")]
    ad = [r for r in probes if r.get("probe") == "attention_under_delta"]
    if not lw:
        return unmeasured("14", what, expected, "no layer-wise probe")
    delta = {r["layer"]: r["rel_change"] for r in lw if r["kind"] == "delta" and r.get("method") == "optimised"}
    gauss = {r["layer"]: r["rel_change"] for r in lw if r["kind"] == "gaussian"}
    layers = sorted(k for k in delta if k >= 1 and k in gauss)
    factor = min(delta[k] / gauss[k] for k in layers)
    ok, parts = factor >= 2, [f"min Delta/Gaussian over layers 1..{layers[-1]} = {factor:.1f}"]
    if ad:
        pos = ad[0]["position"]
        col: dict[int, list[float]] = defaultdict(list)
        for r in ad:
            col[r["key"]].append(r["attention_after"])
        means = {k: statistics.fmean(v) for k, v in col.items()}
        top = max(means, key=means.__getitem__)
        ok &= top == pos
        parts.append(f"attention column {pos} ('{ad[0]['token']}') after Delta = {means[pos]:.2f} (largest: {top})")
    return Check("14", what, "; ".join(parts), expected, verdict(ok))


def _floor_percent(part: int, whole: int, decimals: int) -> str:
    """The share part / whole as a percent rounded down.

    A share just under a threshold never shows as the threshold.
    """
    scaled = part * 100 * 10**decimals // whole
    return f"{scaled // 10**decimals}" + (f".{scaled % 10**decimals:0{decimals}d}" if decimals else "") + "%"


TIGHT_SHARE = 95  # percent of the records whose best a second chain confirmed


def check_tightness(records: list[dict]) -> Check:
    """Share of word-sensitivity records whose best a second chain confirmed (docs/theory/search.md §4.3).

    The attack's share is shown beside it, not gated: its restarts descend on a loss whose minimisers are many (any
    Delta that flips the sign ends near 0 loss at its own point), so a lone best restart there is no sign of a loose
    search.
    """
    what = "15. Tightness: share of word-sensitivity records whose best was confirmed by a second chain"
    expected = f">= {TIGHT_SHARE}%"
    # the ws searches and the attack's objectives record `chains` and `near_best` (docs/theory/search.md §4.3)
    ws = [r for r in records if r.get("experiment") == "ws" and r.get("near_best") is not None]
    attack = [r for r in records if r.get("experiment") == "attack" and r.get("near_best") is not None]
    if not ws:
        return unmeasured("15", what, expected, "no word-sensitivity records with the search's evidence fields")
    confirmed, total = confirmed_counts(ws)
    measured = f"{_floor_percent(confirmed, total, 1)} of {total:,} records"
    if attack:
        c, t = confirmed_counts(attack)
        measured += f" (attack, not gated: {_floor_percent(c, t, 0)})"
    return Check("15", what, measured, expected, verdict(confirmed * 100 >= TIGHT_SHARE * total))


WS_CHECKS: list[Callable[[list[dict]], Check]] = [
    check_rf_feature_norm,
    check_rf_sqrt_n_flat,
    check_rf_bound,
    check_deep_rf_decays,
    check_raf_flat,
    check_relu_raf,
]
ATTACK_CHECKS: list[Callable[[list[dict]], Check]] = [
    check_closed_forms,
    check_rf_cannot_flip,
    check_raf_can_flip,
    check_relu_raf_less_reliable,
]


def paper_claims(ws: list[dict], doubled: list[dict], attack: list[dict], probes: list[dict]) -> list[Check]:
    """Every claim of docs/theory/checks.md §8 the records allow, in the paper's order.

    13 (Llama-2) is never applicable; then the tightness of the ws and attack searches (15).
    """
    rows = [c(ws) for c in WS_CHECKS] + [check_on_boundary(ws, doubled)] + [c(attack) for c in ATTACK_CHECKS]
    rows += [check_attention_edit(probes)]
    rows.append(
        unmeasured(
            "13",
            "13. Figure 1 right: Llama-2-7b-chat answers No / Yes",
            "No / Yes",
            "not run: needs Llama-2-7b-chat (gated, GPU)",
        )
    )
    rows.append(check_encoder_delta(probes))
    rows.append(check_tightness(ws + attack))
    return rows
