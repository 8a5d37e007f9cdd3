"""Closed-form linear heads on frozen features: min-norm, fine-tuned and re-trained interpolators.

See docs/theory/attack.md §5.2.

Everything lives in N x N space: with the Gram matrix G = Phi Phi^T (N x N, float64),

    theta*  = Phi^+ Y = Phi^T G^{-1} Y,
    P v     = v - Phi^T G^{-1} Phi v          (projector onto the complement of the row span of Phi),
    theta_f = theta* + phi (y - phi^T theta*) / ||phi||^2,
    theta_r = theta* + P phi (y - phi^T theta*) / ||P phi||^2.

No p x p matrix and no explicit pseudo-inverse of Phi is ever formed (p = k for RF, n d for RAF). All functions accept
optional leading batch dimensions (e.g. trials T, each with its own training set): Phi (..., N, p), phi (..., B, p).
Pure maths: no Lightning import.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..base import validate
from ..base.names import TRAININGS
from ..base.numerics import gram, sum_last

# A Gram condition number above this is reported: the normal equations lose about log10(cond) of float64's 16 digits.
GRAM_COND_WARN = 1e10
# Above this condition number (or when the factorisation fails) G is treated as singular and jittered.
GRAM_COND_SINGULAR = 1e15
# Relative jitter (times mean(diag G)) tried, in this order, when the Cholesky factorisation of G fails.
_JITTERS = (1e-14, 1e-12, 1e-10, 1e-8, 1e-6)


@dataclass
class HeadScalars:
    """The per-sample scalars of the heads, all the Delta-attack objectives read (`Heads` without its matrices).

    Attributes:
        y, t0, phi_sq, Pphi_sq, cond, jitter, ill_conditioned: as in `Heads`.
    """

    y: Tensor
    t0: Tensor
    phi_sq: Tensor
    Pphi_sq: Tensor
    cond: Tensor
    jitter: Tensor
    ill_conditioned: Tensor

    @property
    def proj_ratio(self) -> Tensor:
        """||P phi|| / ||phi||, (..., B): reading (a) of the uncertainty assumption (docs/theory/attack.md §5.4)."""
        return (self.Pphi_sq / self.phi_sq).sqrt()

    def coef(self, training: Literal["finetune", "retrain"]) -> Tensor:
        """Scalar of the rank-one update, (..., B): (y - t0) / ||phi||^2 or (y - t0) / ||P phi||^2."""
        validate.choice("training", training, TRAININGS)
        # Paper (docs/theory/attack.md §5.2): theta_f = theta* + phi (y - phi^T theta*) / ||phi||^2, theta_r with P phi
        # in place of phi
        return (self.y - self.t0) / (self.phi_sq if training == "finetune" else self.Pphi_sq)


@dataclass
class Heads(HeadScalars):
    """The min-norm interpolator of a training set and its fine-tuned / re-trained updates for B context samples.

    Holds only what the closed forms need (no p x p matrix): the training features, the Cholesky factor of their
    Gram matrix, theta*, and for each context sample phi, P phi and the scalars of the rank-one updates. The heads
    themselves are theta_{f/r}[b] = theta* + coef(training)[b] * direction(training)[b].

    Shapes below use `...` for optional leading batch dimensions (trials), all float64.

    Attributes:
        Phi: (..., N, p) training features.
        chol: (..., N, N) lower Cholesky factor of G = Phi Phi^T (plus `jitter` * mean(diag G) * I if it was needed).
        theta_star: (..., p) minimum-norm interpolator Phi^+ Y.
        phi: (..., B, p) features of the context samples.
        Pphi: (..., B, p) their projections P phi.
        y: (..., B) context labels.
        t0: (..., B) phi^T theta*, the pre-trained output on the context sample.
        phi_sq: (..., B) ||phi||^2.
        Pphi_sq: (..., B) ||P phi||^2.
        cond: (...) condition number of G (inf when G is numerically singular).
        jitter: (...) relative jitter added to G (0 when the plain Cholesky succeeded).
        ill_conditioned: (...) bool, cond > cond_warn or a jitter was needed: the caller can record this flag.
    """

    # y, t0, phi_sq, Pphi_sq, cond, jitter, ill_conditioned: the fields of HeadScalars
    Phi: Tensor
    chol: Tensor
    theta_star: Tensor
    phi: Tensor
    Pphi: Tensor

    def direction(self, training: Literal["finetune", "retrain"]) -> Tensor:
        """Direction of the rank-one update, (..., B, p): phi (fine-tuned) or P phi (re-trained)."""
        validate.choice("training", training, TRAININGS)
        return self.phi if training == "finetune" else self.Pphi

    def theta(self, training: Literal["finetune", "retrain"]) -> Tensor:
        """The heads theta_f or theta_r themselves, (..., B, p), one per context sample."""
        return self.theta_star.unsqueeze(-2) + self.coef(training).unsqueeze(-1) * self.direction(training)

    def project(self, v: Tensor) -> Tensor:
        """P v = v - Phi^T G^{-1} Phi v applied implicitly, (..., M, p) -> (..., M, p)."""
        return project(self.Phi, self.chol, v)

    def outputs(self, phi_new: Tensor, training: Literal["finetune", "retrain"]) -> tuple[Tensor, Tensor]:
        """Outputs of theta* and of theta_{f/r} on new features phi_new (..., B, p), one per context sample.

        Returns:
            (phi_new^T theta*, phi_new^T theta_{f/r}), each (..., B); only inner products, no head is formed.
        """
        s = sum_last(phi_new * self.theta_star.unsqueeze(-2))  # (..., B, p) . (..., 1, p) -> (..., B)
        a = sum_last(phi_new * self.direction(training))  # (..., B)
        return s, s + self.coef(training) * a


def _cholesky(G: Tensor, singular: Tensor) -> tuple[Tensor, Tensor]:
    """Cholesky factor of G (..., N, N), with a growing relative jitter on the batch members where it fails.

    `singular` (...) marks members whose G is numerically singular: their factor is jittered even when the plain
    factorisation happens to succeed (a rounding-level pivot would make the solves meaningless).
    """
    chol, info = torch.linalg.cholesky_ex(G)
    info = torch.where(singular, torch.ones_like(info), info)
    jitter = torch.zeros(G.shape[:-2], dtype=G.dtype, device=G.device)
    if not bool((info > 0).any()):
        return chol, jitter
    scale = G.diagonal(dim1=-2, dim2=-1).mean(-1)  # (...)
    eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    for eps in _JITTERS:
        failed = info > 0  # (...)
        if not bool(failed.any()):
            break
        chol_j, info_j = torch.linalg.cholesky_ex(G + (eps * scale)[..., None, None] * eye)
        chol = torch.where(failed[..., None, None], chol_j, chol)
        jitter = torch.where(failed, torch.full_like(jitter, eps), jitter)
        info = torch.where(failed, info_j, info)
    if bool((info > 0).any()):
        raise ValueError(
            "Phi: the Gram matrix Phi Phi^T is not positive definite even with a relative jitter of "
            f"{_JITTERS[-1]:g}; the training features must be linearly independent (N <= rank), got a singular Gram"
        )
    return chol, jitter


def _solve(chol: Tensor, b: Tensor) -> Tensor:
    """G^{-1} b from the Cholesky factor, b (..., N, M) -> (..., N, M)."""
    return torch.cholesky_solve(b, chol)


def project(Phi: Tensor, chol: Tensor, v: Tensor) -> Tensor:
    """P v = v - Phi^T G^{-1} Phi v without forming P, (..., M, p) -> (..., M, p).

    The projection is applied twice ("twice is enough" re-orthogonalisation): the second pass removes the component
    along the row span of Phi left by rounding in the first, so P is idempotent and Phi P v ~ 0 to high accuracy even
    when G is poorly conditioned. Cost: 4 N M p flops per pass, memory (..., N, M).
    """
    for _ in range(2):
        c = _solve(chol, Phi @ v.mT)  # (..., N, p) @ (..., p, M) -> (..., N, M), then G^{-1}
        v = v - c.mT @ Phi  # (..., M, N) @ (..., N, p) -> (..., M, p)
    return v


def min_norm(Phi: Tensor, Y: Tensor, chol: Tensor, refine: int = 1) -> Tensor:
    """theta* = Phi^T G^{-1} Y with `refine` steps of iterative refinement on the residual, (..., p)."""
    theta = (_solve(chol, Y.unsqueeze(-1)).mT @ Phi).squeeze(-2)  # (..., 1, N) @ (..., N, p) -> (..., p)
    for _ in range(refine):
        r = Y - (Phi @ theta.unsqueeze(-1)).squeeze(-1)  # (..., N) residual of Phi theta = Y
        theta = theta + (_solve(chol, r.unsqueeze(-1)).mT @ Phi).squeeze(-2)
    return theta


def min_norm_and_projection(Phi: Tensor, Y: Tensor, chol: Tensor, v: Tensor, refine: int = 1) -> tuple[Tensor, Tensor]:
    """`min_norm(Phi, Y, chol, refine)` and `project(Phi, chol, v)` together, in four passes over Phi instead of seven.

    The two share their products with Phi: one product Phi @ [theta, v]^T gives both the residual of theta* and the
    coefficients of the second projection, one product c^T Phi both corrections. The same operations as the two
    functions called apart, up to the rounding of the matrix products (equal to about 1e-15 relatively).

    Args:
        Phi: (..., N, p) training features.
        Y: (..., N) labels.
        chol: (..., N, N) Cholesky factor of G = Phi Phi^T.
        v: (..., M, p) the vectors to project (the context features).
        refine: steps of iterative refinement of theta* (>= 1); the projection is applied twice either way.

    Returns:
        theta* (..., p) and P v (..., M, p).
    """
    rhs = torch.cat([Y.unsqueeze(-1), Phi @ v.mT], dim=-1)  # (..., N, 1 + M): Y and Phi v
    back = _solve(chol, rhs).mT @ Phi  # (..., 1 + M, N) @ (..., N, p) -> (..., 1 + M, p)
    theta, v = back[..., 0, :], v - back[..., 1:, :]
    for step in range(refine):
        if step == 0:  # theta's residual and the second projection's coefficients from one product
            prod = Phi @ torch.cat([theta.unsqueeze(-2), v], dim=-2).mT  # (..., N, 1 + M)
            rhs = torch.cat([(Y - prod[..., 0]).unsqueeze(-1), prod[..., 1:]], dim=-1)
            back = _solve(chol, rhs).mT @ Phi  # (..., 1 + M, p)
            theta, v = theta + back[..., 0, :], v - back[..., 1:, :]
        else:
            r = Y - (Phi @ theta.unsqueeze(-1)).squeeze(-1)  # (..., N)
            theta = theta + (_solve(chol, r.unsqueeze(-1)).mT @ Phi).squeeze(-2)
    return theta, v


def gram_condition(G: Tensor) -> Tensor:
    """Condition number of the symmetric PSD matrix G (..., N, N) from its eigenvalues; inf if singular, (...)."""
    ev = torch.linalg.eigvalsh(G)  # (..., N), ascending
    lo, hi = ev[..., 0], ev[..., -1]
    return torch.where(lo > 0, hi / lo.clamp_min(torch.finfo(G.dtype).tiny), torch.full_like(hi, float("inf")))


def gram_factor(Phi: Tensor, cond_warn: float = GRAM_COND_WARN) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Cholesky factor of G = Phi Phi^T (float64, jittered where needed) with its condition number and flags.

    A RuntimeWarning naming the condition number is issued when cond(G) > cond_warn or a jitter was needed.

    Returns:
        chol (..., N, N), cond (...), jitter (...) relative jitter used, ill_conditioned (...) bool.
    """
    G = gram(Phi)  # (..., N, N)
    cond = gram_condition(G)
    chol, jitter = _cholesky(G, cond > GRAM_COND_SINGULAR)
    ill = (cond > cond_warn) | (jitter > 0)
    if bool(ill.any()):
        worst = float(cond.max())
        warnings.warn(
            f"Gram matrix Phi Phi^T is ill-conditioned: condition number {worst:.3g} (threshold {cond_warn:.0e}) in "
            f"{int(ill.sum())} of {ill.numel()} training set(s); relative jitter used: {float(jitter.max()):g}. "
            "The closed-form heads may be inaccurate (see Heads.ill_conditioned).",
            RuntimeWarning,
            stacklevel=3,
        )
    return chol, cond, jitter, ill


def min_norm_interpolator(Phi: Tensor, Y: Tensor, cond_warn: float = GRAM_COND_WARN) -> Tensor:
    """theta* = Phi^+ Y = Phi^T (Phi Phi^T)^{-1} Y in N x N space (float64), (..., N, p), (..., N) -> (..., p)."""
    Phi, Y = Phi.to(torch.float64), Y.to(torch.float64)
    chol, _, jitter, _ = gram_factor(Phi, cond_warn)
    # Paper (docs/theory/attack.md §5.2): theta* = Phi^+ Y; two refinement steps when G was jittered
    return min_norm(Phi, Y, chol, refine=2 if bool((jitter > 0).any()) else 1)


def fit_heads(
    Phi: Tensor,
    Y: Tensor,
    phi: Tensor,
    y: Tensor,
    cond_warn: float = GRAM_COND_WARN,
) -> Heads:
    """Fit theta*, and the data theta_f / theta_r need, for B context samples sharing one training set (per trial).

    Computed in float64 through the Cholesky factor of G = Phi Phi^T (N x N). When the factorisation fails or
    cond(G) > 1e15, a growing relative jitter (1e-14 ... 1e-6 times mean(diag G)) is added and theta* is refined on
    the true residual.
    A RuntimeWarning naming the condition number is issued when cond(G) > cond_warn or a jitter was needed, and
    `Heads.ill_conditioned` records it per trial.

    Args:
        Phi: (..., N, p) training features, N < p.
        Y: (..., N) training labels.
        phi: (..., B, p) context features.
        y: (..., B) context labels.
        cond_warn: condition number of G above which the result is flagged.

    Returns:
        Heads with float64 tensors (see its attributes for shapes).
    """
    if Phi.dim() < 2 or phi.dim() != Phi.dim() or Phi.shape[-1] != phi.shape[-1]:
        raise ValueError(
            f"phi: expected Phi (..., N, p) and phi (..., B, p) with the same p and batch dims, "
            f"got Phi {tuple(Phi.shape)} and phi {tuple(phi.shape)}"
        )
    N, p = Phi.shape[-2:]
    if N >= p:
        raise ValueError(f"N: the closed forms need fewer training samples than features, N < p = {p}, got N={N}")
    if Y.shape != Phi.shape[:-1]:
        raise ValueError(f"Y: expected shape {tuple(Phi.shape[:-1])}, got {tuple(Y.shape)}")
    if y.shape != phi.shape[:-1]:
        raise ValueError(f"y: expected shape {tuple(phi.shape[:-1])}, got {tuple(y.shape)}")
    f64 = torch.float64
    Phi, Y, phi, y = Phi.to(f64), Y.to(f64), phi.to(f64), y.to(f64)

    chol, cond, jitter, ill = gram_factor(Phi, cond_warn)
    # Paper (docs/theory/attack.md §5.2): theta* = Phi^+ Y (min-norm interpolator); two refinement steps when G was
    # jittered. Deviation: P phi applied implicitly through G (the authors' code forms the dense p x p projector P_o)
    theta_star, Pphi = min_norm_and_projection(Phi, Y, chol, phi, refine=2 if bool((jitter > 0).any()) else 1)
    t0 = sum_last(phi * theta_star.unsqueeze(-2))  # (..., B)
    return Heads(
        Phi=Phi,
        chol=chol,
        theta_star=theta_star,
        phi=phi,
        Pphi=Pphi,
        y=y,
        t0=t0,
        phi_sq=sum_last(phi * phi),
        Pphi_sq=sum_last(Pphi * Pphi),
        cond=cond,
        jitter=jitter,
        ill_conditioned=ill,
    )


def ridge_head(Phi: Tensor, Y: Tensor, ridge: float = 0.0, bias: bool = False) -> tuple[Tensor, Tensor]:
    """The least-squares head with a ridge penalty and an optional unpenalised bias, in N x N space (float64).

    (theta, b) = argmin ||Phi theta + b - Y||^2 + ridge ||theta||^2, the minimum-norm minimiser where there are many.
    With a bias, Phi and Y are centred on their means (b = mean(Y) - mean(Phi) theta); then
    theta = Phi_c^T (Phi_c Phi_c^T + ridge I)^{-1} Y_c. ridge = 0 without a bias is theta* = Phi^+ Y
    (`min_norm_interpolator`, the paper's head); ridge = 0 with one is the minimum-norm least-squares solution of the
    centred problem (rank N - 1 at most: an SVD-based solve rather than the Gram's Cholesky factor).

    Args:
        Phi: (N, p) training features.
        Y: (N,) training labels.
        ridge: the penalty on ||theta||^2, >= 0.
        bias: fit an unpenalised bias b.

    Returns:
        theta (p,) and b (a 0-dim tensor, 0 without a bias), float64.
    """
    validate.number("ridge", ridge, low=0.0)
    Phi, Y = Phi.to(torch.float64), Y.to(torch.float64)
    if not bias and ridge == 0:
        return min_norm_interpolator(Phi, Y), Phi.new_zeros(())
    mu, m = (Phi.mean(0), Y.mean()) if bias else (Phi.new_zeros(Phi.shape[1]), Y.new_zeros(()))
    Pc, Yc = Phi - mu, Y - m
    if ridge == 0:
        theta = torch.linalg.lstsq(Pc, Yc[:, None], driver="gelsd" if Pc.is_cpu else None).solution[:, 0]
    else:
        G = gram(Pc) + ridge * torch.eye(Pc.shape[0], dtype=Pc.dtype, device=Pc.device)  # (N, N)
        theta = Pc.T @ torch.cholesky_solve(Yc[:, None], torch.linalg.cholesky(G))[:, 0]
    return theta, m - mu @ theta
