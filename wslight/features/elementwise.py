"""Random attention with an element-wise score function.

Linear (un-normalised) and sigmoid attention (docs/theory/maps.md §12.2).

RAF's scores S = X W X^T / sqrt(d) and W (same seed, same W as RAF), with the row-wise softmax replaced by a function
applied to each score on its own, so a row of the attention matrix is not normalised.
"""

from __future__ import annotations

import math

import torch

from .attention import _RandomAttentionBase
from .attention_starts import rows_dot
from .base import register_map
from .move import TokenMove, per_trial


class _ElementwiseAttention(_RandomAttentionBase):
    """phi(X) = f(S) X with f applied entrywise to S = X W X^T / sqrt(d), (B, n, d) -> (B, n d); f may use n."""

    def score(self, S: torch.Tensor, n: int) -> torch.Tensor:
        """The attention weight of each score for n keys (entrywise)."""
        raise NotImplementedError

    def attention(self, S: torch.Tensor) -> torch.Tensor:
        return self.score(S, S.shape[-1])


@register_map("linear_raf")
class LinearAttentionFeatures(_ElementwiseAttention):
    """Linear (un-normalised) random attention: phi(X) = (S / n) X, S = X W X^T / sqrt(d), W_jl ~ N(0, 1/d).

    No softmax and no normalisation of the rows: key j's weight in row l is s_lj / n. The 1/n keeps an output row an
    average over the keys (it does not change S, which is scale-free). Input (B, n, d) for any n, output (B, n d);
    buffer `W` (d, d), RAF's for the same seed.
    """

    def score(self, S: torch.Tensor, n: int) -> torch.Tensor:
        """The un-normalised weight S / n of each score."""
        return S / n


@register_map("sigmoid_raf")
class SigmoidAttentionFeatures(_ElementwiseAttention):
    """Sigmoid random attention: phi(X) = sigmoid(S - log n) X, S = X W X^T / sqrt(d), W_jl ~ N(0, 1/d).

    Each weight is a sigmoid of its own score, rows not normalised; the bias -log n (the usual choice for sigmoid
    attention) makes a row's weights sum to about sum_j e^{s_lj} / n, of order 1 for every n, as a softmax row.
    Input (B, n, d) for any n, output (B, n d); buffer `W` (d, d), RAF's for the same seed.
    """

    def score(self, S: torch.Tensor, n: int) -> torch.Tensor:
        """The weight sigmoid(S - log n) of each score."""
        return torch.sigmoid(S - math.log(n))


# Sigmoid attention's switch-on starts: steps of their projected ascent, and the soft minimum's temperature (in units
# of the margin, a distance in the token space of norm about sqrt(d))
SWITCH_STEPS = 200
SWITCH_TEMPERATURE = 0.5


class ElementwiseMove(TokenMove):
    """Element-wise attention with one token moved: only row i and column i of f(S) change (docs/theory/maps.md §12.2).

    Row l != i: out'_l = u_l + f(t_l) y with u_l = out_l - f(s_li) x_i, t_l = x_l^T W y / sqrt(d), y = x_i + Delta.
    Row i: out'_i = sum_{j != i} f(r_j) x_j + f(r_i) y, r_j = y^T W x_j / sqrt(d), r_i = y^T W y / sqrt(d).
    An evaluation costs O(n d + d^2) per chain instead of the forward's O(n^2 d + n d^2).
    """

    def __init__(self, maps, X, positions, dtype) -> None:
        super().__init__(maps, X, positions, dtype)
        T, B, n, d = X.shape
        self.fmap, self.sq = maps[0], d**0.5
        with torch.no_grad():
            self.W = torch.stack([m.W.to(dtype) for m in maps])  # (T, d, d)
            X0 = self.X0 = X.to(dtype)  # (T, B, n, d)
            self.XW = per_trial(X0, self.W)  # (T, B, n, d): rows x_l^T W
            self.XWt = per_trial(X0, self.W.transpose(1, 2))  # (T, B, n, d): rows (W x_j)^T
            A = self.fmap.score(self.XW @ X0.transpose(-1, -2) / self.sq, n)  # (T, B, n, n)
            out0 = A @ X0  # (T, B, n, d)
            self.phi0 = out0.flatten(-2)  # (T, B, n d)
            pos_t = torch.tensor(positions, device=X.device)
            self.onehot = torch.arange(n, device=X.device)[None, :] == pos_t[:, None]  # (P, n)
            xi = self.xi = X0[:, :, pos_t]  # (T, B, P, d)
            a_i = A[:, :, :, pos_t].permute(0, 1, 3, 2)  # (T, B, P, n): column i, the weight of key i per row
            self.U = out0[:, :, None] - a_i[..., None] * xi[:, :, :, None]  # (T, B, P, n, d)
            if isinstance(self.fmap, SigmoidAttentionFeatures):
                self.starts = self._switch_starts(math.log(n))

    def _switch_starts(self, bias: float) -> torch.Tensor:
        """Sigmoid attention's starts (docs/theory/maps.md §12.2): the move that turns on every weight it controls.

        It turns them on with the widest margin: sigmoid(x_l^T W y / sqrt(d) - log n) of key i in every row l and
        sigmoid(y^T W x_j / sqrt(d) - log n) of row i (its own, quadratic in y, with its first-order margin); then key
        i's column alone. Each linear weight is on in a half-space of y, and the smallest margin over those half-spaces
        is concave in Delta: a short projected ascent of a soft minimum finds its maximum over the ball, where the
        search's ascent stalls once a weight has saturated off. Returns (T, B, P, 2, d) unit directions.
        """
        n = self.X0.shape[2]
        keep = ~self.onehot  # (P, n): the other tokens
        col = self.XW[:, :, None].expand(-1, -1, len(self.positions), -1, -1)  # (T, B, P, n, d): normals x_l^T W
        row = self.XWt[:, :, None].expand_as(col)  # normals (W x_j)^T
        radius = self.sq  # the word-sensitivity ball, ||Delta|| <= sqrt(d)
        Ws = (self.W + self.W.transpose(1, 2)) / 2  # (T, d, d): y^T W y = y^T Ws y
        starts = []
        for normals in (torch.cat([col, row], dim=3), col):
            mask = torch.cat([keep, keep], dim=1) if normals.shape[3] == 2 * n else keep  # (P, K)
            unit = normals / normals.norm(dim=-1, keepdim=True).clamp_min(1e-30)  # (T, B, P, K, d)
            # margin_k = (a_k . y / sqrt(d) - log n) / (|a_k| / sqrt(d)) = unit_k . y - log n sqrt(d) / |a_k|
            offset = bias * self.sq / normals.norm(dim=-1).clamp_min(1e-30) - (unit * self.xi[:, :, :, None]).sum(-1)
            delta = (unit * mask[None, None, :, :, None]).sum(3)  # (T, B, P, d)
            delta = delta * radius / delta.norm(dim=-1, keepdim=True).clamp_min(1e-30)
            with_self = normals.shape[3] == 2 * n  # row i's own weight, sigmoid(y^T W y / sqrt(d) - log n), too
            for k in range(SWITCH_STEPS):
                margin = (unit @ delta[..., None])[..., 0] - offset  # (T, B, P, K)
                margin = margin.masked_fill(~mask[None, None], torch.inf)
                normal = unit
                if with_self:  # its margin to first order: the score's excess over the norm of its gradient
                    y = self.xi + delta
                    q = per_trial(y, Ws) / self.sq  # (T, B, P, d), half the gradient of y^T Ws y / sqrt(d)
                    own = ((q * y).sum(-1) - bias) / (2 * q.norm(dim=-1)).clamp_min(1e-30)
                    margin = torch.cat([margin, own[..., None]], dim=-1)
                    normal = torch.cat([unit, (q / q.norm(dim=-1, keepdim=True).clamp_min(1e-30))[:, :, :, None]], 3)
                weight = torch.softmax(-margin / SWITCH_TEMPERATURE, dim=-1)  # the soft minimum's weights
                step = radius * 0.1 * (1 - k / SWITCH_STEPS)
                grad = (weight[..., None] * normal).sum(3)
                delta = delta + step * grad / grad.norm(dim=-1, keepdim=True).clamp_min(1e-30)
                delta = delta * (radius / delta.norm(dim=-1, keepdim=True).clamp_min(radius))
            starts.append(delta / delta.norm(dim=-1, keepdim=True).clamp_min(1e-30))
        return torch.stack(starts, dim=3)

    @classmethod
    def supports(cls, maps) -> bool:
        """Whether one instance can serve all these maps: they are of one class."""
        return len({type(m) for m in maps}) == 1

    @classmethod
    def chain_elements(cls, maps, B, n, d):
        """Rough working memory, in elements, per chain and per position of one trial (sizes the search's chunks)."""
        return 4 * n * d + 8 * d, B * (3 * n * n + 3 * n * d)

    def features(self, delta: torch.Tensor) -> torch.Tensor:
        """phi(X^i(Delta)) in closed form: (T, B, P, R, d) -> (T, B, P, R, n d)."""
        T, B, P, R, d = delta.shape
        n = self.X0.shape[2]
        y = self.xi[:, :, :, None] + delta  # (T, B, P, R, d)
        f_t = self.fmap.score(rows_dot(self.XW, y) / self.sq, n)  # (T, B, P, R, n): key i's new weight per row
        rows = self.U[:, :, :, None] + f_t[..., None] * y[..., None, :]  # (T, B, P, R, n, d)
        r = rows_dot(self.XWt, y) / self.sq  # (T, B, P, R, n)
        r_ii = (per_trial(y, self.W) * y).sum(-1) / self.sq  # (T, B, P, R)
        onehot = self.onehot[None, None, :, None, :]  # (1, 1, P, 1, n)
        w = self.fmap.score(torch.where(onehot, r_ii[..., None], r), n)  # (T, B, P, R, n), row i's weights
        w_i = (w * onehot).sum(-1, keepdim=True)  # (T, B, P, R, 1)
        w_rest = w.masked_fill(onehot, 0.0)
        row_i = (w_rest.reshape(T, B, P * R, n) @ self.X0).reshape(T, B, P, R, d) + w_i * y  # (T, B, P, R, d)
        out = torch.where(self.onehot[None, None, :, None, :, None], row_i[..., None, :], rows)
        return out.flatten(-2)  # (T, B, P, R, n d)


LinearAttentionFeatures.move_class = ElementwiseMove
SigmoidAttentionFeatures.move_class = ElementwiseMove
