"""The checks table is computed from records: flat S*sqrt(n) passes, a faster decay fails, and so on.

The paper's claims read PASS / FAIL; the hypotheses this package tests beyond the paper read supported / not supported,
in a part of the report of their own.
"""

import math

import pytest

from wslight.records.attack_claims import (
    ERR_RESOLUTION,
    check_closed_forms,
    check_relu_raf_less_reliable,
    check_rf_cannot_flip,
)
from wslight.records.checks import CLAIM, HYPOTHESIS, Check, checks_report, combined, ordered, tally
from wslight.records.hypotheses import check_words_raf, check_words_rf
from wslight.records.paper_checks import all_checks
from wslight.records.paper_claims import check_attention_edit
from wslight.records.ws_claims import (
    check_deep_rf_decays,
    check_raf_flat,
    check_relu_raf,
    check_rf_bound,
    check_rf_sqrt_n_flat,
)


def ws_rec(m, d, n, ws, **kw):
    return {
        "experiment": "ws",
        "map": m,
        "d": d,
        "n": n,
        "L": 1,
        "ws": ws,
        "ws_sqrt_n": ws * math.sqrt(n),
        "delta_norm": math.sqrt(d),
        "radius": math.sqrt(d),
        "phi_norm": math.sqrt(n * d / 2),
        "trial_key": f"{m}/{d}/{n}",
        **kw,
    }


def test_rf_sqrt_n_law_passes_and_a_1_over_n_law_fails():
    flat = [ws_rec("rf", 8, n, 1.3 / math.sqrt(n)) for n in (10, 20, 40, 80)]
    fast = [ws_rec("rf", 8, n, 1.3 / n) for n in (10, 20, 40, 80)]
    assert check_rf_sqrt_n_flat(flat).status == "PASS"
    assert check_rf_sqrt_n_flat(fast).status == "FAIL"


def test_rf_bound_fails_when_one_trial_exceeds_it():
    recs = [ws_rec("rf", 8, 10, 0.3, bound=0.5), ws_rec("rf", 8, 20, 0.3, bound=0.29)]
    assert check_rf_bound(recs[:1]).status == "PASS"
    assert check_rf_bound(recs).status == "FAIL"


def test_raf_flatness_against_a_decay():
    flat = [ws_rec("raf", 8, n, 2.5) for n in (10, 250)]
    decaying = [ws_rec("raf", 8, n, 2.5 / math.sqrt(n)) for n in (10, 250)]
    assert check_raf_flat(flat).status == "PASS"
    assert check_raf_flat(decaying).status == "FAIL"


def test_closed_form_check_reads_t1_against_y():
    good = {"experiment": "attack", "t1": 1.0 + 1e-9, "y": 1.0, "proj_ratio": 0.3}
    assert check_closed_forms([good]).status == "PASS"
    assert check_closed_forms([good, {**good, "t1": 0.9}]).status == "FAIL"
    # a flagged singular Gram is counted apart, not tested
    flagged = check_closed_forms([good, {**good, "t1": 0.9, "gram_ill_conditioned": True}])
    assert flagged.status == "PASS" and "1 with an ill-conditioned Gram left out" in flagged.measured


def test_each_check_declares_its_kind_and_without_records_none_is_measured():
    """Checks 1-15 are the paper's claims (N/A without records); 16-17 the package's hypotheses (not measured)."""
    rows = all_checks([], [], [], [])
    assert [r.id for r in rows] == [str(i) for i in range(1, 18)]
    assert [r.kind for r in rows] == [CLAIM] * 15 + [HYPOTHESIS] * 2
    assert {r.status for r in rows if r.kind == CLAIM} == {"N/A"}
    assert {r.status for r in rows if r.kind == HYPOTHESIS} == {"not measured"}


def att_rec(N, d, D1, y=1.0, n=40, loss="err", m="rf", p=0.0):
    return {
        "experiment": "attack",
        "map": m,
        "p": p,
        "N": N,
        "n": n,
        "d": d,
        "D1": D1,
        "y": y,
        "loss": loss,
        "err": (D1 + y) ** 2,
        "sign_err": float(D1 * y > 0),  # 1: no flip
        "gamma": 1.0,
    }


def test_rf_flip_check_reads_the_papers_range_of_n_over_d():
    """Check 9 tests the trials with N / D <= 1300 / (40 * 768); flips beyond that range are reported, not tested."""
    inside = [att_rec(100, 384, 0.8), att_rec(1300, 768, 0.7)]  # N / D = 0.016 and 0.042
    beyond = [att_rec(1300, 384, -0.9), att_rec(700, 384, -0.5)]  # 0.085 and 0.046
    check = check_rf_cannot_flip(inside + beyond)
    assert check.status == "PASS"
    assert "flip rate 0.00" in check.measured and "0.046-0.085" in check.measured and "flip rate 1.00" in check.measured
    assert check_rf_cannot_flip(inside + [att_rec(100, 384, -0.9)] * 3).status == "FAIL"  # a flip inside fails
    assert check_rf_cannot_flip(beyond).status == "N/A"


def words_rec(m, n, ws_words, ws, flipped, d=384, N=40):
    return {
        "experiment": "words",
        "map": m,
        "d": d,
        "n": n,
        "L": 1,
        "N": N,
        "ws_words": ws_words,
        "distance": 1.4,
        "ws": ws,
        "flipped_retrain": flipped,
    }


def raf_words(decay):
    """RAF's one-word records at n = 10 and 100 whose S_words falls as (10 / n) ** decay; half the reviews flip."""
    return [words_rec("raf", n, 0.9 * (10 / n) ** decay, 3.4, t < 5) for n in (10, 100) for t in range(10)]


def test_one_real_word_hypotheses_read_order_one_and_flip_rates_as_findings():
    """Checks 16-17 are hypotheses: their verdict is supported / not supported (not measured without records)."""
    flat = raf_words(0)
    assert check_words_raf(flat).status == "supported"
    row = check_words_raf(raf_words(0.5))
    assert row.kind == HYPOTHESIS and row.status == "not supported" and "ratio 0.32" in row.measured
    rare = [words_rec("raf", n, 0.9, 3.4, t < 2) for n in (10, 100) for t in range(10)]  # flip rate 0.2 < 0.25
    assert check_words_raf(rare).status == "not supported"
    like_s = [words_rec("rf", n, 0.3 / n**0.5, 1.0 / n**0.5, False, d=96) for n in (10, 80) for _ in range(3)]
    assert check_words_rf(like_s).status == "supported"
    flips = [words_rec("rf", n, 0.3 / n**0.5, 1.0 / n**0.5, True, d=96) for n in (10, 80) for _ in range(3)]
    row = check_words_rf(flips)
    assert row.kind == HYPOTHESIS and row.status == "not supported"
    beyond = [words_rec("rf", n, 0.3 / n**0.5, 1.0 / n**0.5, n == 10, d=96, N=200) for n in (10, 80) for _ in range(3)]
    row = check_words_rf(beyond)  # flips where N / D = 0.21 are reported, not tested (as check 9)
    assert row.status == "supported" and "(n = 10: N / D beyond 0.042, not tested)" in row.measured
    assert check_words_rf(flat).status == "not measured" and check_words_raf([]).status == "not measured"


def test_a_hypothesis_never_reads_pass_or_fail_and_a_claim_never_reads_as_a_finding():
    with pytest.raises(ValueError, match="a hypothesis's status is one of"):
        Check("16", "what", "measured", "expected", "FAIL", HYPOTHESIS)
    with pytest.raises(ValueError, match="a claim's status is one of"):
        Check("3", "what", "measured", "expected", "not supported")


PAPER_HEADING = "## The paper's claims (docs/theory/checks.md §8)"
HYPOTHESES_HEADING = "## Beyond the paper: this package's hypotheses (docs/theory/words.md §13)"


def report_parts(rows):
    """The checks' lines of the report, split at the hypotheses' heading: (the paper's claims, the hypotheses)."""
    text = "\n".join(checks_report(rows))
    assert text.count(PAPER_HEADING) == 1 and text.count(HYPOTHESES_HEADING) == 1
    paper, hypotheses = text.split(HYPOTHESES_HEADING)
    return paper, HYPOTHESES_HEADING + hypotheses


def test_the_report_has_the_papers_claims_then_the_hypotheses_each_under_its_heading():
    rows = [
        check_rf_bound([ws_rec("rf", 8, 10, 0.3, bound=0.5)]),  # PASS
        check_raf_flat([ws_rec("raf", 8, n, 2.5 / math.sqrt(n)) for n in (10, 250)]),  # FAIL
        check_words_raf(raf_words(0.5)),  # not supported
        check_words_rf([]),  # not measured
    ]
    paper, hypotheses = report_parts(rows)
    assert paper.startswith(f"{PAPER_HEADING}\n\nWhat the paper claims, and the sanity checks a faithful reproduction")
    assert "| check | measured | expected | status |" in paper
    assert "| 3. RF" in paper and "| 5. RAF" in paper and "| 16. " not in paper and "| 17. " not in paper
    assert "\n1 PASS, 1 FAIL, 0 N/A.\n" in paper  # the paper's FAIL is still counted
    assert hypotheses.startswith(f"{HYPOTHESES_HEADING}\n\nHypotheses this package tests beyond the paper, each with")
    assert "| hypothesis | measured | supported when | finding |" in hypotheses
    row = next(line for line in hypotheses.splitlines() if line.startswith("| 16. One real word, RAF"))
    assert "ratio 0.32" in row and row.endswith("| **not supported** |")
    assert next(line for line in hypotheses.splitlines() if line.startswith("| 17. ")).endswith("| **not measured** |")
    assert "\n0 supported, 1 not supported, 1 not measured." in hypotheses
    assert "FAIL" not in hypotheses and "PASS" not in hypotheses and "| 3. RF" not in hypotheses


def test_a_hypothesis_that_does_not_hold_is_no_fail_of_a_faithful_reproduction():
    """The paper's claims all pass and check 16 does not hold: 0 FAIL, and the hypothesis reads "not supported"."""
    rows = [check_rf_bound([ws_rec("rf", 8, 10, 0.3, bound=0.5)]), check_words_raf(raf_words(0.5))]
    assert tally(rows, CLAIM) == "1 PASS, 0 FAIL, 0 N/A"
    assert tally(rows, HYPOTHESIS) == "0 supported, 1 not supported, 0 not measured"
    paper, hypotheses = report_parts(rows)
    assert "\n1 PASS, 0 FAIL, 0 N/A.\n" in paper and "**FAIL**" not in paper + hypotheses
    assert "**not supported**" in hypotheses


def test_a_comparison_within_its_resolution_is_a_tie_not_a_verdict():
    assert ordered(0.5, 0.1, 1e-6) == "PASS" and ordered(0.1, 0.5, 1e-6) == "FAIL"
    assert ordered(7.531620926502857, 7.531620926502856, 1e-6) == "TIE"  # one rounding apart: either order
    assert ordered(7.531620926502856, 7.531620926502857, 1e-6) == "TIE"
    assert ordered(1.0, 1.0, 0.0, HYPOTHESIS) == "undecided"
    assert combined(["PASS", "TIE", "PASS"]) == "TIE" and combined(["TIE", "FAIL"]) == "FAIL"
    assert combined(["PASS", "PASS"]) == "PASS"
    rows = [Check("11", "w", "m", "e", "TIE"), Check("3", "w", "m", "e", "PASS")]
    assert tally(rows, CLAIM) == "1 PASS, 0 FAIL, 0 N/A, 1 TIE"  # a tie is counted where there is one


def relu_vs_raf(err_relu, err_raf, loss="err", p=0.0, n=120):
    """Attack records of both maps at n, with their Err (D1 = sqrt(err) - 1 for y = 1: a flip when err < 1)."""
    return [
        att_rec(400, 384, math.sqrt(e) - 1, n=n, loss=loss, m=m, p=p)
        for m, errs in (("relu_raf", err_relu), ("raf", err_raf))
        for e in errs
    ]


def test_check_11_ties_where_both_medians_are_zero_to_rounding_as_the_offline_grid_of_loss_err():
    """Both maps flip every head with loss err: medians 2e-13 against 1e-13 read TIE, in either order."""
    for relu, raf in ((2e-13, 1e-13), (1e-13, 2e-13)):
        check = check_relu_raf_less_reliable(relu_vs_raf([relu] * 3, [raf] * 3))
        assert check.status == "TIE", check
        assert "not distinguishable at this grid" in check.measured


def test_check_11_is_decided_on_the_penalized_loss_at_its_largest_p():
    tied_err = relu_vs_raf([1e-13] * 3, [2e-13] * 3)
    less = relu_vs_raf([0.5] * 3, [0.12] * 3, "penalized", 1.0) + relu_vs_raf([0.02] * 3, [0.01] * 3, "penalized", 0.1)
    check = check_relu_raf_less_reliable(tied_err + less)
    assert check.status == "PASS"
    assert check.measured.startswith("penalized p=1 (decides): ReLU-RAF flip 1.00, median err 0.5; RAF flip 1.00")
    assert "err: ReLU-RAF" in check.measured and "not distinguishable" in check.measured  # loss err reported beside
    more = relu_vs_raf([0.1] * 3, [0.4] * 3, "penalized", 1.0)
    assert check_relu_raf_less_reliable(tied_err + more).status == "FAIL"
    close = relu_vs_raf([0.3] * 3, [0.3 + ERR_RESOLUTION / 2] * 3, "penalized", 1.0)
    assert check_relu_raf_less_reliable(close).status == "TIE"
    assert check_relu_raf_less_reliable(relu_vs_raf([0.5] * 3, [0.1] * 3, n=40)).status == "N/A"  # not at n = 120


def test_comparisons_of_s_and_of_attention_tie_within_their_resolution():
    """Checks 4, 6 and 12 compare two quantities: equal up to rounding reads TIE, a real gap a verdict."""
    tied = [ws_rec("deep_rf", 8, n, 0.3 * (1 + 1e-12 * (n == 10))) for n in (10, 80)]
    assert check_deep_rf_decays(tied).status == "TIE" and "not distinguishable" in check_deep_rf_decays(tied).measured
    assert check_deep_rf_decays([ws_rec("deep_rf", 8, n, 0.3 / n**0.5) for n in (10, 80)]).status == "PASS"
    relu = [ws_rec("relu_raf", 8, n, 0.8) for n in (10, 120)]
    raf = [ws_rec("raf", 8, n, 2.0) for n in (10, 120)]
    assert check_relu_raf(relu + raf).status == "TIE"  # ReLU-RAF flat to rounding in n
    assert check_relu_raf([ws_rec("relu_raf", 8, n, 8 / n) for n in (10, 120)] + raf).status == "PASS"

    def edit(a, b):
        return [
            {"probe": "attention_edit", "query_token_a": "love", "key": 3, "key_token_a": "much",
             "key_token_b": "smile", "attention_a": a, "attention_b": b}
        ]  # fmt: skip

    assert check_attention_edit(edit(0.14, 0.25)).status == "PASS"
    assert check_attention_edit(edit(0.2, 0.2 + 1e-9)).status == "TIE"
    assert check_attention_edit(edit(0.25, 0.14)).status == "FAIL"
