"""benchmarks/floor.py: the FLOPs it counts, the floor it sets, the page section it writes."""

import pytest
import torch

from benchmarks.floor import Rates, count_flops, floor_lines, floor_seconds, time_shares

RATES = Rates({"float32": (50.0, 90.0), "float64": (20.0, 35.0)}, cores=2)


def test_matrix_products_are_counted_by_dtype_as_two_flops_a_multiply_add():
    a32, b32 = torch.randn(7, 5), torch.randn(5, 3)
    a64 = torch.randn(4, 6, 9, dtype=torch.float64)
    q = torch.randn(1, 2, 8, 16)  # (B, heads, L, E)

    def work():
        a32 @ b32  # mm: 2 * 7 * 5 * 3
        torch.nn.functional.linear(a32, torch.randn(11, 5), torch.randn(11))  # addmm: 2 * 7 * 5 * 11
        a64 @ a64.mT  # bmm: 2 * 4 * 6 * 9 * 6
        torch.nn.functional.scaled_dot_product_attention(q, q, q)  # 2 * (2 * 2 * 8 * 16 * 8): scores and mixing
        torch.exp(a32)  # elementwise: not counted

    flops = count_flops(work)
    assert flops["float32"] == 2 * 7 * 5 * 3 + 2 * 7 * 5 * 11 + 2 * (2 * 2 * 8 * 16 * 8)
    assert flops["float64"] == 2 * 4 * 6 * 9 * 6


def test_counting_leaves_the_results_unchanged():
    a = torch.randn(6, 6, dtype=torch.float64)
    out: list[torch.Tensor] = []
    count_flops(lambda: out.append(a @ a))
    torch.testing.assert_close(out[0], a @ a, rtol=0, atol=0)


def test_the_floor_takes_each_dtype_at_its_rate_and_the_threads_rate():
    flops = {"float32": 100 * 10**9, "float64": 40 * 10**9}
    assert floor_seconds(flops, RATES, threads=1) == pytest.approx(100 / 50 + 40 / 20)
    assert floor_seconds(flops, RATES, threads=2) == pytest.approx(100 / 90 + 40 / 35)


def test_the_floor_table_states_the_fraction_of_the_floor():
    rows = [("cell", {"float64": 10 * 10**9}, 2.0, 1)]  # 0.5 s at 20 GFLOP/s, measured 2 s: 25%
    lines = floor_lines(rows, RATES)
    row = next(line for line in lines if line.startswith("| cell |"))
    assert row.split("|")[-2].strip() == "25.0%"
    assert "float64 20.0" in lines[0] and "on 2 cores" in lines[0]


def test_time_shares_cover_the_call_and_see_its_products():
    a = torch.randn(400, 400)
    shares = dict(time_shares(lambda: [a @ a for _ in range(20)]))
    assert list(shares)[0] == "matrix products" and list(shares)[-1] == "outside torch's operators"
    assert shares["matrix products"] > 0.5  # a loop of large products spends most of its time in them
    assert all(v >= 0 for v in shares.values())
