"""benchmarks.own_map_price: the user's `token_moves` against the full forward, and the table it writes into a page."""

import pytest
import torch

from benchmarks import own_map_price as price
from wslight.features import make_map
from wslight.records.pages import PageHeader


def _samples(B: int, n: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    X = torch.randn(B, n, d, generator=torch.Generator().manual_seed(5), dtype=dtype)
    return X * d**0.5 / X.norm(dim=-1, keepdim=True)  # rows of norm sqrt(d)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, price.CHECK_TOL), (torch.float64, 1e-12)])
def test_token_moves_equal_the_full_forward_of_every_moved_token(dtype, tol):
    """`OneTokenRAF` gives the full forward's output for moves of every token at the radius (and a far one)."""
    n, d = 7, 32
    raf = make_map("raf", n, d, seed=3).to(dtype)
    X = _samples(3, n, d, dtype)
    assert price.moves_error(raf, X, radius=d**0.5) <= tol
    assert price.moves_error(raf, X, radius=4 * d**0.5, seed=1) <= 4 * tol  # scores far from the clean ones


def test_token_moves_give_the_full_forwards_gradient():
    """The search differentiates `token_moves`: its gradient of the squared change is the full forward's (float64)."""
    n, d = 6, 16
    user = price.WithMoves(make_map("raf", n, d, seed=2).double())
    X = _samples(2, n, d, torch.float64)
    positions = [0, 4]
    one = user.token_moves(X, positions)
    b, j = torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0])
    x = torch.randn(3, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64).requires_grad_(True)
    phi0 = user(X)[b]
    (g_one,) = torch.autograd.grad((one(b, j, x) - phi0).pow(2).sum(), x)
    onehot = torch.eye(n, dtype=torch.float64)[torch.tensor(positions)[j]]  # (3, n)
    (g_full,) = torch.autograd.grad((user(X[b] + onehot[..., None] * x[:, None]) - phi0).pow(2).sum(), x)
    torch.testing.assert_close(g_one, g_full, rtol=1e-10, atol=1e-10)


def test_search_starts_are_the_attracting_then_the_steering_directions():
    """(B, P, n, d): W^T xbar first, then W x_m for every m but the moved token."""
    n, d = 5, 8
    raf = make_map("raf", n, d, seed=1)
    X = _samples(2, n, d, torch.float32)
    s = price.WithStarts(raf).search_starts(X, [0, 3])
    assert s.shape == (2, 2, n, d)
    torch.testing.assert_close(s[1, 1, 0], raf.W.T @ X[1].mean(dim=0))
    torch.testing.assert_close(s[1, 1, 1:], X[1, [0, 1, 2, 4]] @ raf.W.T)


PAGE = "# Your own map\n\nText before.\n\n{start}\nold table\n\nold line\n{end}\n\nText after.\n"


def test_the_table_writer_replaces_exactly_the_marked_block_and_is_idempotent(tmp_path):
    """Only the lines between the markers change; writing the same rows twice gives the same page."""
    path = tmp_path / "own_map.md"
    path.write_text(PAGE.format(start=price.START, end=price.END))
    header = PageHeader("2026-01-01 00:00 UTC", "CPU", 2, "2.13.0", "cpu", "abc1234", False, "python -m x", (3.0, 2, 1))
    rows = [["10", "move class", "0.050", "1.0x", "100% (1.0000)"], ["10", "nothing declared", "1.5", "30x", "-"]]
    price.write_table(path, rows, header, rate=12.5)
    once = path.read_text()
    before, rest = once.split(price.START + "\n")
    block, after = rest.split("\n" + price.END)
    assert before == "# Your own map\n\nText before.\n\n" and after == "\n\nText after.\n"
    assert block.splitlines()[:4] == price.table(rows)
    assert "old" not in block and "`python -m x`" in block and "contended" in block and "`abc1234`" in block
    price.write_table(path, rows, header, rate=12.5)
    assert path.read_text() == once


@pytest.mark.parametrize(
    "text",
    ["no markers", f"{price.START} only", f"{price.END}\n{price.START}", f"{price.START}\n{price.END}\n{price.END}"],
)
def test_the_table_writer_refuses_a_page_without_one_marked_block(text):
    with pytest.raises(ValueError, match="own-map-price:start"):
        price.replace_block(text, ["x"])
