"""The search's evidence in the summaries and the checks.

`chains` (ascent chains run) and `near_best` (chains that ended within 1% of the best; >= 2: the best was confirmed by a
second chain) per record.
"""

import pytest

from wslight.records.checks import checks_markdown
from wslight.records.paper_checks import all_checks
from wslight.records.paper_claims import check_tightness
from wslight.records.summary import (
    attack_table,
    cell_table,
    confirmed_share,
    evidence_note,
    markdown_table,
    slope_table,
)


def ws(n, near_best=None, chains=None, m="rf", d=8, value=None):
    S = value if value is not None else n**-0.5
    rec = {"experiment": "ws", "map": m, "d": d, "n": n, "L": 1, "ws": S, "ws_sqrt_n": S * n**0.5, "trial_key": n}
    rec.update(delta_norm=d**0.5, radius=d**0.5, phi_norm=(n * d / 2) ** 0.5)
    if near_best is not None:
        rec["near_best"] = near_best
    if chains is not None:
        rec["chains"] = chains
    return rec


def attack(near_best, chains=8, loss="err"):
    return {
        "experiment": "attack",
        "map": "raf",
        "n": 10,
        "N": 20,
        "training": "finetune",
        "loss": loss,
        "p": 2,
        "y": 1.0,
        "D1": -0.5,
        "D0": 0.2,
        "t1": 1.0,
        "proj_ratio": 0.3,
        "err": 0.25,
        "sign_err": 0.0,
        "gamma": 1.0,
        "near_best": near_best,
        "chains": chains,
    }


# --- confirmed_share --------------------------------------------------------------------------------------------------
def test_confirmed_share_counts_near_best_of_two_or_more():
    recs = [ws(10, 1), ws(10, 2), ws(10, 3), ws(10, 8)]
    assert confirmed_share(recs) == 0.75


def test_confirmed_share_reads_only_the_records_that_carry_the_field():
    assert confirmed_share([ws(10), ws(20)]) is None  # older records: no evidence, not a share of 0
    assert confirmed_share([]) is None
    assert confirmed_share([ws(10), ws(10, 1), ws(10, 2)]) == 0.5  # the old record is not counted as unconfirmed


# --- the tables -------------------------------------------------------------------------------------------------------
def test_cell_table_adds_mean_chains_and_confirmed_share_per_cell():
    recs = [ws(10, 2, 4), ws(10, 1, 8), ws(20, 3, 4), ws(20, 2, 4), ws(20, 2, 12)]
    rows = cell_table(recs, ("map", "n"), "ws")
    assert [list(r) for r in rows] == [["map", "n", "mean", "sd", "chains", "confirmed", "count"]] * 2
    (a, b) = rows
    assert (a["n"], a["chains"], a["confirmed"], a["count"]) == (10, 6.0, 0.5, 2)
    assert (b["n"], b["chains"], b["confirmed"], b["count"]) == (20, pytest.approx(20 / 3), 1.0, 3)
    assert a["mean"] == pytest.approx(10**-0.5)


def test_cell_table_of_old_records_has_no_evidence_columns():
    rows = cell_table([ws(10), ws(10), ws(20)], ("map", "n"), "ws")
    assert [set(r) for r in rows] == [{"map", "n", "mean", "sd", "count"}] * 2
    assert evidence_note(rows) == ""
    assert "confirmed" not in markdown_table(rows)


def test_a_cell_of_old_records_beside_new_ones_shows_a_dash():
    rows = cell_table([ws(10), ws(20, 1, 4), ws(20, 2, 4)], ("map", "n"), "ws")
    assert (rows[0]["chains"], rows[0]["confirmed"]) == (None, None)
    assert rows[1]["confirmed"] == 0.5
    text = markdown_table(rows)
    assert "| rf | 10 | 0.3162 | 0 | - | - | 1 |" in text and "| rf | 20 | 0.2236 | 0 | 4 | 0.5 | 2 |" in text
    note = evidence_note(rows)
    assert note.startswith("chains: mean search chains") and "confirmed: share of the records" in note
    assert "-: records that predate" in note and "predate" not in evidence_note(rows[1:])


def test_slope_rows_carry_the_confirmed_share_of_their_map_and_d():
    recs = [ws(n, 2 if n < 40 else 1) for n in (10, 20, 40, 80)] + [ws(n, 2, m="raf", value=1.0) for n in (10, 40, 80)]
    rows = {r["map"]: r for r in slope_table(recs)}
    assert rows["rf"]["slope"] == pytest.approx(-0.5) and rows["rf"]["confirmed"] == 0.5
    assert rows["raf"]["confirmed"] == 1.0 and "chains" not in rows["raf"]
    assert "confirmed" not in slope_table([ws(n) for n in (10, 20, 40)])[0]
    assert evidence_note(list(rows.values())).startswith("confirmed: share")


def test_attack_table_shows_the_confirmed_share_of_each_objective():
    rows = attack_table([attack(2), attack(1), attack(3), attack(2, chains=4, loss="gamma")])
    by_loss = {r["loss"]: r for r in rows}
    assert by_loss["err"]["confirmed"] == pytest.approx(2 / 3) and by_loss["err"]["chains"] == 8.0
    assert by_loss["gamma"]["confirmed"] == 1.0 and by_loss["gamma"]["count"] == 1
    old = [{k: v for k, v in attack(2).items() if k not in ("near_best", "chains")}]
    assert "confirmed" not in attack_table(old)[0]


# --- check 15 ---------------------------------------------------------------------------------------------------------
def confirmed_of(total, confirmed):
    return [ws(10, 2) for _ in range(confirmed)] + [ws(10, 1) for _ in range(total - confirmed)]


def test_tightness_passes_at_95_percent_and_fails_at_94():
    passing = check_tightness(confirmed_of(100, 95))
    assert passing.status == "PASS" and passing.id == "15"
    assert passing.measured == "95.0% of 100 records" and passing.expected == ">= 95%"
    assert check_tightness(confirmed_of(100, 94)).status == "FAIL"
    just_under = check_tightness(confirmed_of(1000, 949))  # 94.9%: rounded down, never shown as the threshold
    assert just_under.status == "FAIL" and just_under.measured.startswith("94.9% of 1,000 records")


def test_tightness_gates_the_ws_records_and_shows_the_attack_apart():
    recs = confirmed_of(50, 48) + [attack(2)] * 9 + [attack(1)] * 21
    check = check_tightness(recs)
    assert check.measured == "96.0% of 50 records (attack, not gated: 30%)" and check.status == "PASS"
    assert check_tightness([attack(5)] * 40).status == "N/A"  # no word-sensitivity record to gate


def test_tightness_is_not_applicable_without_the_fields():
    check = check_tightness([ws(10), ws(20), {**attack(2), "near_best": None}])
    assert check.status == "N/A" and check.measured == "no word-sensitivity records with the search's evidence fields"
    assert check_tightness([]).status == "N/A"


def test_the_checks_table_ends_with_tightness_then_one_real_word():
    rows = all_checks(confirmed_of(10, 10), [], [attack(1)] * 2, [])
    assert [r.id for r in rows][-4:] == ["14", "15", "16", "17"]
    assert rows[-3].status == "PASS" and rows[-3].measured == "100.0% of 10 records (attack, not gated: 0%)"
    line = checks_markdown(rows).splitlines()[-3]
    assert line.startswith("| 15. Tightness: share of word-sensitivity records whose best was confirmed by a second")
    assert line.endswith("| >= 95% | **PASS** |")
