"""The token-move algebra of RAF and ReLU-RAF: only row i and column i of the scores move (docs/theory/maps.md §3.4)."""

from __future__ import annotations

import torch
from torch import Tensor

from .attention_starts import rows_dot, structured_starts
from .move import TokenMove, per_trial, stack_trials


class AttentionMove(TokenMove):
    """RAF / ReLU-RAF with one token moved: only row i and column i of the scores change (docs/theory/maps.md §3).

    For a query row l != i, key i's new score is t_l = x_l^T W y / sqrt(d) with y = x_i + Delta, and
        softmax:  out'_l = (1 - a_l) u_l + a_l y,  a_l = sigmoid(t_l - m_l),  m_l = logsumexp_{j != i} s_lj,
        ReLU:     out'_l = (1 - a_l) u_l + a_l y,  a_l = relu(t_l) / (c_l + relu(t_l)),  c_l = sum_{j != i} relu(s_lj),
    where u_l is row l's output with key i removed (u_l = 0 and a_l = 0 when all is zero: the authors' divisor 1).
    Row i has the new scores r_j = y^T W x_j / sqrt(d) (j != i) and r_i = y^T W y / sqrt(d). An evaluation costs
    O(n d + d^2) per chain instead of the full O(n^2 d + n d^2); `change_sq` never forms the perturbed output.
    """

    # tensors with a leading trial axis (what `select_trials` keeps of the trials still searched)
    _per_trial = ("Ws", "X0", "phi0", "U", "c", "m", "xi", "Oi", "K", "ee", "eu", "uu")
    # `readout`'s cache for the last H read out: (H, u_l . h_l, H by rows, h_i)
    _readout_of: tuple[Tensor, Tensor, Tensor, Tensor] | None = None

    def __init__(self, maps, X, positions, dtype) -> None:
        super().__init__(maps, X, positions, dtype)
        self.relu = maps[0].relu_scores
        T, B, n, d = X.shape
        P = len(positions)
        self.sq = d**0.5
        with torch.no_grad():
            W = stack_trials([m.W.to(dtype) for m in maps])  # (T, d, d)
            # y^T W y = y^T Ws y: one d x d product per chain gives the score r_ii and its gradient 2 Ws y
            self.Ws = (W + W.transpose(1, 2)) / 2  # (T, d, d)
            X0 = self.X0 = X.to(dtype)  # (T, B, n, d)
            # rows x_l^T W (scores of the moved key) and (W x_j)^T (scores of the moved query)
            XW = per_trial(X0, W)  # (T, B, n, d)
            XWt = per_trial(X0, W.transpose(1, 2))  # (T, B, n, d)
            S = XW @ X0.transpose(-1, -2) / self.sq  # (T, B, n, d) @ (T, B, d, n) -> (T, B, n, n)
            out0 = maps[0].attention(S) @ X0  # (T, B, n, n) @ (T, B, n, d) -> (T, B, n, d), the clean output
            self.phi0 = out0.flatten(-2)  # (T, B, n d)
            pos_t = torch.tensor(positions, device=X.device)
            self.onehot = onehot = torch.arange(n, device=X.device)[None, :] == pos_t[:, None]  # (P, n)
            col_mask = onehot[None, None, :, None, :]  # (1, 1, P, 1, n): key i in every row
            if self.relu:
                Rm = torch.relu(S)[:, :, None].masked_fill(col_mask, 0.0)  # (T, B, P, n, n), key i removed
                c = Rm.sum(-1)  # (T, B, P, n)
                Am = Rm / torch.where(c > 0, c, torch.ones_like(c))[..., None]
            else:
                Sm = S[:, :, None].masked_fill(col_mask, -torch.inf)  # (T, B, P, n, n)
                m = torch.logsumexp(Sm, dim=-1)  # (T, B, P, n)
                Am = torch.softmax(Sm, dim=-1)
            U = Am @ X0[:, :, None]  # (T, B, P, n, n) @ (T, B, 1, n, d) -> (T, B, P, n, d)
            row_i = onehot[None, None, :, :, None]  # (1, 1, P, n, 1): row i is recomputed; zero it (n = 1: NaN)
            self.U = torch.where(row_i, torch.zeros_like(U), U)
            self.c = torch.where(onehot[None, None], torch.zeros_like(c), c) if self.relu else None
            self.m = None if self.relu else torch.where(onehot[None, None], torch.zeros_like(m), m)
            self.xi = X0[:, :, pos_t]  # (T, B, P, d), the clean token i
            self.Oi = out0[:, :, pos_t]  # (T, B, P, d), clean output row i
            # ||(1 - a) u + a y - o||^2 = e.e + 2 a (e.y - e.u) + a^2 (y.y - 2 u.y + u.u) with e = u - o: O(n) per
            # chain once e.y and u.y are known, so the (T, B, P, R, n, d) perturbed output is never formed
            Ed = self.U - out0[:, :, None]  # (T, B, P, n, d)
            # every product with the moved token in one batched matmul, y . [x_l^T W / sqrt(d) ; e_l ; u_l ;
            # (W x_l)^T / sqrt(d)]: the scores and the rows' terms; K^T also carries their gradients back to y
            key, query = (M[:, :, None].expand(-1, -1, P, -1, -1) / self.sq for M in (XW, XWt))
            self.K = torch.cat([key, Ed, self.U, query], dim=3)  # (T, B, P, 4n, d)
            self.keep = (~onehot)[None, None, :, None, :].to(dtype)  # (1, 1, P, 1, n), rows l != i
            self.ee = Ed.pow(2).sum(-1)[:, :, :, None]  # (T, B, P, 1, n)
            self.eu = (Ed * self.U).sum(-1)[:, :, :, None]
            self.uu = self.U.pow(2).sum(-1)[:, :, :, None]
            # the search's own starts are computed when it first reads them (the attack never does)
            self._starts_from: tuple[Tensor, Tensor] | None = (W, XWt)

    _starts: Tensor | None = None

    @property
    def starts(self) -> Tensor | None:
        """The attention maps' own starts of the search (`structured_starts`), computed once, on first use."""
        source = getattr(self, "_starts_from", None)
        if self._starts is None and source is not None:
            with torch.no_grad():
                self._starts = structured_starts(self, *source)
            self._starts_from = None
        return self._starts

    @starts.setter
    def starts(self, value: Tensor | None) -> None:
        self._starts, self._starts_from = value, None

    @classmethod
    def chain_elements(cls, maps, B, n, d):
        """Rough working memory, in elements, per chain and per position of one trial (sizes the search's chunks)."""
        return 12 * n + 8 * d, B * (3 * n * n + 5 * n * d)

    def _project(self, y: torch.Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The products of y with the rows of K in one matmul.

        The scores t_l = x_l^T W y / sqrt(d) of the moved key, e_l.y and u_l.y, and the scores r_j = (W x_j)^T y /
        sqrt(d) of the moved query: (T, B, P, R, d) -> 4 x (T, B, P, R, n).
        """
        T, B, P, R, d = y.shape
        K = self.K.reshape(T * B * P, -1, d)
        proj = (y.reshape(T * B * P, R, d) @ K.transpose(1, 2)).reshape(T, B, P, R, 4, -1)
        t, ey, uy, r = proj.unbind(-2)
        return t, ey, uy, r

    def _back(self, coef: torch.Tensor) -> torch.Tensor:
        """sum_rows coef . K, the transpose of `_project`: (T, B, P, R, 4n) -> (T, B, P, R, d)."""
        T, B, P, R, _ = coef.shape
        return (coef.reshape(T * B * P, R, -1) @ self.K.reshape(T * B * P, *self.K.shape[-2:])).reshape(T, B, P, R, -1)

    def _key_weight(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """a_l, the weight of the moved key i in every row l != i, and da_l / dt_l, from its scores t_l.

        (T, B, P, R, n) -> (T, B, P, R, n) twice.
        """
        if self.relu:
            assert self.c is not None  # set for ReLU-RAF
            c = self.c[:, :, :, None, :]
            rho = torch.relu(t)
            den = c + rho
            den = torch.where(den > 0, den, torch.ones_like(den))
            a = rho / den
            return a, torch.where(t > 0, c / den.pow(2), torch.zeros_like(t))
        assert self.m is not None  # set for softmax RAF
        a = torch.sigmoid(t - self.m[:, :, :, None, :])
        return a, a * (1 - a)

    def _row_i(self, r: Tensor, y: Tensor, delta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The new output row i, sum_j w_j x'_j with x'_i = y, from the query's scores r (entry i unused).

        Also its attention row w, Ws y and (ReLU) 1 / row sum: (T, B, P, R, n), (T, B, P, R, d) x 2 -> (T, B, P, R, d),
        (T, B, P, R, n), (T, B, P, R, d), (T, B, P, R, 1) or None.
        """
        T, B, P, R, d = y.shape
        n = self.X0.shape[2]
        h = per_trial(y, self.Ws)  # (T, B, P, R, d) @ (T, d, d) -> (T, B, P, R, d)
        r_ii = (h * y).sum(-1) / self.sq  # (T, B, P, R)
        onehot = self.onehot[None, None, :, None, :]  # (1, 1, P, 1, n)
        r = torch.where(onehot, r_ii[..., None], r)
        if self.relu:
            rr = torch.relu(r)
            s = rr.sum(-1, keepdim=True)
            inv_s = 1 / torch.where(s > 0, s, torch.ones_like(s))
            w = rr * inv_s  # (T, B, P, R, n)
        else:
            w, inv_s = torch.softmax(r, dim=-1), None  # (T, B, P, R, n)
        w_i = (w * onehot).sum(-1, keepdim=True)  # (T, B, P, R, 1)
        out = (w.reshape(T, B, -1, n) @ self.X0).reshape(delta.shape) + w_i * delta  # (T, B, PR, n) @ (T, B, n, d)
        return out, w, h, inv_s

    def _parts(self, delta: torch.Tensor):
        """What value and gradient share: y, the key weights a (and a'), the rows' terms and row i."""
        y = self.xi[:, :, :, None, :] + delta  # (T, B, P, R, d), the perturbed token
        t, ey, uy, r = self._project(y)
        a, da = self._key_weight(t)
        # ||(1 - a) u + a y - o||^2 = e.e + 2 a (e.y - e.u) + a^2 (y.y - 2 u.y + u.u), rows l != i
        lin, quad = ey - self.eu, y.pow(2).sum(-1, keepdim=True) - 2 * uy + self.uu
        rows = (self.ee + 2 * a * lin + a.pow(2) * quad) * self.keep  # (T, B, P, R, n)
        return y, a, da, lin, quad, rows, self._row_i(r, y, delta)

    def change_sq(self, delta: torch.Tensor) -> torch.Tensor:
        """||phi(X^i(Delta)) - phi(X)||^2 in closed form: (T, B, P, R, d) -> (T, B, P, R)."""
        # Paper: Eq. (raf), softmax(X' W X'^T / sqrt(d)) X' with X' = X + e_i Delta^T (ReLU-RAF: its normalisation)
        _, _, _, _, _, rows, (out_i, _, _, _) = self._parts(delta)
        f_i = (out_i - self.Oi[:, :, :, None]).pow(2).sum(-1)  # (T, B, P, R)
        return rows.sum(-1) + f_i  # the expansion may round a zero to a tiny negative: callers clamp before a sqrt

    def value_and_grad(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`change_sq` and its gradient in Delta in closed form, one d x d product per chain (docs/theory/maps.md §3.4).

        (T, B, P, R, d) -> (T, B, P, R), (T, B, P, R, d).
        """
        y, a, da, lin, quad, rows, (out_i, w, h, inv_s) = self._parts(delta)
        e_i = out_i - self.Oi[:, :, :, None]  # (T, B, P, R, d)
        f = rows.sum(-1) + e_i.pow(2).sum(-1)
        # row i: out_i = sum_j w_j x'_j, x'_i = y; dL/dw_j = g_o . x'_j with g_o = 2 e_i
        onehot = self.onehot[None, None, :, None, :]
        g_o = 2 * e_i
        q = rows_dot(self.X0, g_o) + onehot * (g_o * delta).sum(-1, keepdim=True)  # (T, B, P, R, n)
        dr = self._weights_back(w, inv_s, q)
        # rows l != i reach y through t_l, e.y, u.y and y.y; row i through r_j (j != i), r_ii = y^T Ws y / sqrt(d)
        # and the value x'_i = y
        keep = self.keep
        coef = torch.cat(
            [keep * 2 * (lin + a * quad) * da, keep * 2 * a, keep * -2 * a.pow(2), dr.masked_fill(onehot, 0.0)], -1
        )
        g = self._back(coef) + 2 * y * (keep * a.pow(2)).sum(-1)[..., None]
        w_i = (w * onehot).sum(-1, keepdim=True)
        g = g + w_i * g_o + (dr * onehot).sum(-1, keepdim=True) * 2 * h / self.sq
        return f, g

    def curvature_product(self, v: torch.Tensor) -> torch.Tensor:
        """H v for the Hessian H = 2 J^T J of `change_sq` at Delta = 0, in closed form, O(n d + d^2) per vector.

        J is the Jacobian of the features in Delta there: (T, B, P, R, d) -> (T, B, P, R, d).
        """
        zero = torch.zeros_like(v)
        y, a, da, _, quad, _, (_, w, h, inv_s) = self._parts(zero)  # at the clean token: quad_l = ||x_i - u_l||^2
        tv, _, uv, rv = self._project(v)
        keep, onehot = self.keep, self.onehot[None, None, :, None, :]
        # rows l != i: J_l v = c_l (x_i - u_l) + a_l v with c_l = a'_l x_l^T W v / sqrt(d); J_l^T J_l v gathered
        c = da * tv
        ev = (y * v).sum(-1, keepdim=True) - uv  # (x_i - u_l) . v
        dt = keep * da * (c * quad + a * ev)  # along x_l^T W / sqrt(d)
        # row i: J_i v = X^T (M dr) + w_i v with dr the change of its scores; then J_i^T along the scores
        dr = torch.where(onehot, 2 * (h * v).sum(-1, keepdim=True) / self.sq, rv)
        w_i = (w * onehot).sum(-1, keepdim=True)
        s_i = (self._weights_forward(w, inv_s, dr).reshape(*w.shape[:2], -1, w.shape[-1]) @ self.X0).reshape(v.shape)
        s_i = s_i + w_i * v
        dq = self._weights_back(w, inv_s, rows_dot(self.X0, s_i))
        coef = torch.cat([dt, torch.zeros_like(dt), -keep * a * c, dq.masked_fill(onehot, 0.0)], dim=-1)
        Hv = self._back(coef) + y * (keep * a * c).sum(-1, keepdim=True)
        Hv = Hv + (keep * a.pow(2)).sum(-1, keepdim=True) * v + w_i * s_i
        Hv = Hv + (dq * onehot).sum(-1, keepdim=True) * 2 * h / self.sq
        return 2 * Hv

    def _weights_forward(self, w: Tensor, inv_s: Tensor | None, dr: Tensor) -> Tensor:
        """M dr for the Jacobian M = dw/dr of the attention row w.

        Softmax diag(w) - w w^T; ReLU (diag(m) - w m^T) / s with m = 1[r > 0] and s the row sum: (..., n) -> (..., n).
        """
        if self.relu:
            assert inv_s is not None  # `_row_i` gives it for ReLU-RAF
            dr = torch.where(w > 0, dr, torch.zeros_like(dr))
            return (dr - w * dr.sum(-1, keepdim=True)) * inv_s
        return w * (dr - (w * dr).sum(-1, keepdim=True))

    def _weights_back(self, w: Tensor, inv_s: Tensor | None, q: Tensor) -> Tensor:
        """M^T q for the same Jacobian: (..., n) -> (..., n)."""
        centred = q - (w * q).sum(-1, keepdim=True)
        if self.relu:
            assert inv_s is not None  # `_row_i` gives it for ReLU-RAF
            return torch.where(w > 0, centred * inv_s, torch.zeros_like(w))
        return w * centred

    def select_trials(self, idx: torch.Tensor) -> AttentionMove:
        """The same algebra for the trials idx only (their tensors copied).

        For a search that has finished the others.
        """
        move = AttentionMove.__new__(AttentionMove)
        move.__dict__.update(self.__dict__)
        idx = idx.to(self.X0.device)
        for name in self._per_trial:
            value = getattr(self, name)
            setattr(move, name, None if value is None else value[idx])
        move.maps, move.starts, move._readout_of = [self.maps[i] for i in idx.tolist()], None, None
        return move

    def change_sq_and_readout(self, delta: torch.Tensor, H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both closed forms from one pass over the moved token's products (no features formed).

        The same numbers as `change_sq` and `readout` called apart.
        """
        y, a, _, _, _, rows, (out_i, _, _, _) = self._parts(delta)
        f_i = (out_i - self.Oi[:, :, :, None]).pow(2).sum(-1)
        read, h_i = self._rows_read(y, a * self.keep, H)
        return rows.sum(-1) + f_i, read + out_i @ h_i

    def readout(self, delta: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
        """phi(X^i(Delta))^T h without forming the features (docs/theory/maps.md §3.4).

        Row l != i gives u_l.h_l + a_l (y.h_l - u_l.h_l), row i its new output . h_i: (T, B, P, R, d), H (T, B, n d, C)
        -> (T, B, P, R, C).
        """
        y = self.xi[:, :, :, None, :] + delta
        t, _, _, r = self._project(y)
        a = self._key_weight(t)[0] * self.keep  # (T, B, P, R, n), 0 in row i
        # the rows l != i before row i: the attack differentiates this, and the order fixes how y's gradient sums
        read, h_i = self._rows_read(y, a, H)
        out_i = self._row_i(r, y, delta)[0]  # (T, B, P, R, d)
        return read + out_i @ h_i  # (T, B, P, R, d) @ (T, B, P, d, C)

    def _rows_read(self, y: Tensor, a: Tensor, H: Tensor) -> tuple[Tensor, Tensor]:
        """The read-out of the rows l != i from the moved token y and its key weights a, and h_i for row i.

        y (T, B, P, R, d), a 0 in row i: -> (T, B, P, R, C), and h_i (T, B, P, d, C).
        """
        T, B, P, R, d = y.shape
        n, C = self.X0.shape[2], H.shape[-1]
        cached = getattr(self, "_readout_of", None)
        if cached is None or cached[0] is not H:  # an attack reads out the same H at every step
            Hl = H.reshape(T, B, n, d, C)
            uh = torch.einsum("tbpld,tbldc->tbplc", self.U, Hl)  # (T, B, P, n, C), u_l . h_l (u_i = 0)
            Hd = Hl.permute(0, 1, 3, 2, 4).reshape(T, B, d, n * C)  # (T, B, d, n C)
            self._readout_of = cached = (H, uh, Hd, Hl[:, :, self.positions])  # h_i: (T, B, P, d, C)
        _, uh, Hd, h_i = cached
        yh = (y.reshape(T, B, P * R, d) @ Hd).reshape(T, B, P, R, n, C)  # y . h_l
        return uh.sum(3)[:, :, :, None] + (a[..., None] * (yh - uh[:, :, :, None])).sum(4), h_i

    def features(self, delta: torch.Tensor) -> torch.Tensor:
        """phi(X^i(Delta)) in closed form: (T, B, P, R, d) -> (T, B, P, R, n d).

        Row i is recomputed, the other rows are updated.
        """
        y = self.xi[:, :, :, None, :] + delta  # (T, B, P, R, d)
        t, _, _, r = self._project(y)
        a = self._key_weight(t)[0][..., None]  # (T, B, P, R, n, 1)
        rows = (1 - a) * self.U[:, :, :, None] + a * y[..., None, :]  # (T, B, P, R, n, d), rows l != i
        row_i = self.onehot[None, None, :, None, :, None]  # (1, 1, P, 1, n, 1)
        out = torch.where(row_i, self._row_i(r, y, delta)[0][..., None, :], rows)
        return out.flatten(-2)  # (T, B, P, R, n d), row-major as the map's forward
