"""The search behind the word-sensitivity estimate (docs/theory.md §4).

Monotone projected ascent of ||phi(X^i(Delta)) - phi(X)||^2 for every (trial, sample, position, restart) chain at once,
its starting points, and its result; the chains kept across rounds are `wslight.search.kept`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import Tensor

from ..base import validate
from ..chains.ball import project_ball
from ..chains.engine import MonotoneAscent, autograd_evaluate, more_chains, near_best, run_chains
from ..features.move import GenericMove, TokenMove, trial_selector
from ..features.rows import REMOVAL_ROWS, REMOVAL_SINGULAR, ROW_LIMIT, unit
from .batching import chunk_sizes, generic_chunk
from .kept import KeptChains, candidate_values
from .radius_split import ALLOCATION_RANDOM, allocated_start
from .result import WSResult
from .settings import SearchSettings
from .starts import seeded_draws, top_curvature

# The first round of a map on the generic path (no structured starts of its own) runs this many times `chains_per_round`
# chains, and its last round is a polishing one, started POLISH_JITTER x the radius from the best point (ReLU-RAF as
# a plain module at d = 32, n = 12, 20 reviews within 1% of the best value any run found: 80% with 12 chains a round,
# 90% with the larger first round, 95% (two draws) with the polishing round too; a jitter of 0.05 or 0.1 gave 90-95%)
GENERIC_FIRST_ROUND = 4
POLISH_JITTER = 0.02
# The generic path's homotopy starts: HOMOTOPY_CHAINS random chains climb the same objective on the ball of radius
# s r for each s in HOMOTOPY_SCALES, and the best point of each ball, scaled back to radius r, starts a chain of the
# first round. RAF and ReLU-RAF as plain modules at d = 384, n = 10, 20 bundled reviews, against the best value of
# every run (the closed forms' and 256-chain searches included): RAF 55% -> 90-100% within 1% on two draws of
# reviews and maps (mean ratio 0.979 -> 0.998), ReLU-RAF 70% -> 90% (0.990 -> 0.998); the balls 1.5, 2, 3 r alone
# gave 85-95%, 32 chains a ball no better (docs/theory.md §4.3). 4 chains a ball kept 100% within 1% on one draw of 20
# reviews and maps (n = 10 and 50) but not on a second (RAF, n = 10, tests/search/test_chains.py). These chains search
# other balls: a record's `chains` does not count them
HOMOTOPY_SCALES = (1.25, 1.5, 2.0, 3.0, 4.0)
HOMOTOPY_CHAINS = 16
# The confirmation round's chains start this far (relative to the radius) from the lone best chain's start
CONFIRM_JITTER = 0.3


class _ClosedForm(Protocol):
    """A token-move algebra with its objective's value and gradient in closed form (e.g. RF, attention)."""

    def value_and_grad(self, delta: Tensor) -> tuple[Tensor, Tensor]: ...


@dataclass
class Search:
    """The checked settings of one estimate and the search itself, for T trials x B samples at once."""

    positions: list[int]
    radius: float
    chains_per_round: int
    max_steps: int
    lr: float
    tol: float
    window: int
    chunk_elements: int
    power_iters: int
    max_chains: int
    gain_tol: float

    @classmethod
    def checked(cls, d: int, n: int, positions: Any, radius: float | None, settings: SearchSettings) -> Search:
        """The search of resolved `settings` (no field None) for samples of n tokens of dimension d, at `positions`.

        `radius` None: settings.radius_scale * sqrt(d). The positions and radius are checked here (a ValueError naming
        them), the settings were when they were made.
        """
        s = settings
        radius = s.radius_scale * math.sqrt(d) if radius is None else radius  # type: ignore[operator]
        chains = cast(int, s.chains_per_round)
        return cls(
            positions=validate.positions("positions", positions, n),
            radius=validate.number("radius", radius, 0.0, strict=True),
            chains_per_round=chains,
            max_steps=cast(int, s.max_steps),
            lr=cast(float, s.lr),
            tol=cast(float, s.tol),
            window=cast(int, s.window),
            chunk_elements=cast(int, s.chunk_elements),
            power_iters=cast(int, s.power_iters),
            max_chains=max(chains, cast(int, s.max_chains)),
            gain_tol=cast(float, s.gain_tol),
        )

    def run(
        self,
        build: Callable[[list[int]], TokenMove],
        exact: Callable[[Tensor], Tensor] | None,
        X: Tensor,
        seeds: list[int],
        dt: torch.dtype,
        per_chain: int,
        per_pos: int,
        one_chunk: bool = False,
    ) -> WSResult:
        """Ascend every (trial, sample, position, chain) in rounds until each sample's best is tight.

        Positions (then chains) are chunked for memory.

        Args:
            build: positions -> the token-move algebra of the T trials for them.
            exact: (T, 2B, n, d) float64 -> (T, 2B, p) float64 features, for the final value when the algebra has
                no `exact64`.
            X: (T, B, n, d) samples on the maps' device.
            seeds: T restart seeds.
            dt: working dtype.
            per_chain: working memory, in elements, of one chain.
            per_pos: working memory, in elements, of one position of one trial.
            one_chunk: all positions in one chunk (the algebra draws its map for exactly these positions).
        """
        T, B, n, d = X.shape
        pos_chunk, chain_chunk = chunk_sizes(self, T, B, per_chain, per_pos, one_chunk)
        steps = torch.zeros(T, B, dtype=torch.long)  # most steps of any chain
        # the best chains of every chunk, FINAL_CANDIDATES each: their objective, Delta, position, S, ||phi(X)||,
        # bound factor (S and ||phi(X)|| stay NaN unless the algebra has an exact64)
        cands: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]] = []
        values = []  # per chunk, (T, B, P C) every chain's best objective
        for c0 in range(0, len(self.positions), pos_chunk):
            pos = self.positions[c0 : c0 + pos_chunk]
            token = build(pos)
            generic = isinstance(token, GenericMove)
            chunk = generic_chunk(self.chunk_elements, T * B * len(pos) * per_chain) if generic else chain_chunk
            f_c, delta_c, j_c, steps_c, values_c = self._search(
                token, self._starts(token, pos, seeds, dt, X, chunk), pos, seeds, dt, chunk
            )
            values.append(values_c)
            # Deviation: the ball is centred on the clean token; the authors centre it at the noisy start
            # x_i + 0.1 xi, so their ||Delta|| can reach about 1.1 sqrt(d) (docs/theory.md §9.1); we keep
            # docs/theory.md §1.3's
            delta_c = project_ball(delta_c, self.radius)  # float32 may leave ||Delta|| a hair out
            ws_c, norm_c, factor_c = (torch.full(f_c.shape, math.nan, dtype=torch.float64) for _ in range(3))
            if token.exact64 is not None:  # every candidate in one call (DeepRF reads its weights once)
                ws_c, norm_c = token.exact64(delta_c, j_c)
            for k in range(f_c.shape[-1]):
                factors = token.bound_factors(j_c[..., k])
                if factors is not None:
                    factor_c[..., k] = factors
            cands.append((f_c, delta_c, torch.tensor(pos)[j_c], ws_c, norm_c, factor_c))
            steps = torch.maximum(steps, steps_c)
        f, delta, position, ws, phi_norm, factor = (torch.cat(parts, dim=2) for parts in zip(*cands))
        if bool(ws.isnan().any()):
            ws, phi_norm = candidate_values(exact, X, position, delta)
        # the candidate whose float64 value is largest: a float32 objective can be off at a discontinuity of the map
        # (ReLU-RAF's row whose only positive score is ~0, docs/theory.md §4.3), so the reported S is the best of the
        # best few chains' exact values
        pick = torch.where(f.isfinite(), ws, -math.inf).argmax(dim=-1, keepdim=True)  # (T, B, 1)

        def chosen(t: Tensor) -> Tensor:
            return t.gather(2, pick if t.dim() == 3 else pick[..., None].expand(-1, -1, -1, d))[:, :, 0]

        best_delta = chosen(delta)
        every = torch.cat(values, dim=-1)  # (T, B, chains at every position)
        delta_norm = best_delta.norm(dim=-1)
        factor_best = chosen(factor)
        return WSResult(
            ws=chosen(ws),
            position=chosen(position),
            delta=best_delta,
            delta_norm=delta_norm,
            phi_norm=chosen(phi_norm),
            steps=steps,
            chains=every.isfinite().sum(-1),
            near_best=near_best(every, chosen(f), squared=True),
            bound=None if factor_best.isnan().all() else factor_best * delta_norm / chosen(phi_norm),
        )

    def _starts(
        self, token: TokenMove, pos: list[int], seeds: list[int], dt: torch.dtype, X: Tensor, chain_chunk: int = 64
    ) -> Tensor:
        """The first round's starting points on the sphere, (T, B, P, chains_per_round, d).

        +- the top curvature direction, the map's own constructions, then random ones; on the generic path, after these,
        every direction of the module's `search_starts`, the row starts (`GenericMove.row_starts`), the homotopy starts
        and (GENERIC_FIRST_ROUND - 1) x chains_per_round more random ones. One stream per trial and position (a chain
        does not depend on the chunking or the other trials). X (T, B, n, d) the samples; chain_chunk: chains run
        together by the homotopy starts.
        """
        B, d = X.shape[1], X.shape[3]
        draws = seeded_draws(seeds, pos, B, self.chains_per_round + 1, d).to(
            device=X.device, dtype=dt
        )  # (T, B, P, R + 1, d)
        exact_top = getattr(token, "top_curvature", None)  # e.g. RF: the d x d Hessian in closed form
        if exact_top is not None and self.power_iters > 0:
            top = exact_top(draws[:, :, :, :1])  # (T, B, P, 1, d)
        else:
            product = getattr(token, "curvature_product", None)  # e.g. attention: H v in closed form
            top = top_curvature(token.change_sq, draws[:, :, :, :1], self.power_iters, product)
        none = top.new_zeros(*top.shape[:3], 0, top.shape[-1])
        own = token.starts if token.starts is not None else none
        if getattr(token, "block_move", None) is not None and self.chains_per_round > 2:
            # a change that sums over blocks (multi-head): first the best split of the radius among them (§12.1)
            rand = seeded_draws(seeds, pos, B, ALLOCATION_RANDOM, d, "split").to(device=X.device, dtype=dt)
            split = allocated_start(token, self.radius, self.lr, self.tol, self.window, self.max_steps, rand)  # type: ignore[arg-type]
            own = torch.cat([unit(split).to(own.dtype), own], dim=3)
        struct = torch.cat([top, -top, own.to(dt)], dim=3)[:, :, :, : self.chains_per_round]  # (T, B, P, S, d)
        rand = draws[:, :, :, 1 : 1 + self.chains_per_round - struct.shape[3]]
        usual = torch.cat([struct, unit(rand)], dim=3)
        if isinstance(token, GenericMove):  # the module's `search_starts` (all), row, homotopy, more random starts
            mine = token.own_starts()
            mine = mine if mine is not None else none
            n = X.shape[2]
            power = seeded_draws(seeds, pos, B, min(n, ROW_LIMIT + 1), d, "rows").to(X.device)
            lean = seeded_draws(seeds, pos, B, REMOVAL_ROWS * REMOVAL_SINGULAR, d, "removal").to(X.device)
            rows = token.row_starts(self.radius, power, lean)
            rows = rows if rows is not None else none
            extra = seeded_draws(seeds, pos, B, (GENERIC_FIRST_ROUND - 1) * self.chains_per_round, d, "generic")
            homotopy = self._homotopy_starts(token, pos, seeds, dt, X, chain_chunk)
            usual = torch.cat([usual, mine.to(usual), rows.to(usual), homotopy.to(usual), unit(extra).to(usual)], dim=3)
        return usual * self.radius

    def _homotopy_starts(
        self, token: TokenMove, pos: list[int], seeds: list[int], dt: torch.dtype, X: Tensor, chain_chunk: int
    ) -> Tensor:
        """Unit directions (T, B, P, len(HOMOTOPY_SCALES), d) from chains on smaller balls.

        For each scale s, the best point of HOMOTOPY_CHAINS random chains climbing the objective on the ball of radius s
        r (plain steps), scaled to norm 1.

        A measured heuristic, not a guarantee: in high dimension random chains on the ball of radius r rarely reach
        the basins that the attention maps' own starts aim at (the attracting direction, docs/theory.md §3.5), and
        the best points of larger balls, brought back to radius r, start closer to them (docs/theory.md §4.3).
        """
        T, B, _, d = X.shape
        K = len(HOMOTOPY_SCALES)
        if K == 0:
            return torch.zeros(T, B, len(pos), 0, d, dtype=dt, device=X.device)
        draws = [seeded_draws(seeds, pos, B, HOMOTOPY_CHAINS, d, "homotopy", k) for k in range(K)]
        scales = torch.tensor(HOMOTOPY_SCALES, dtype=dt, device=X.device).repeat_interleave(HOMOTOPY_CHAINS)
        radius = (scales * self.radius)[:, None]  # (K HOMOTOPY_CHAINS, 1): each chain on its scale's ball
        starts = unit(torch.cat(draws, dim=3)).to(device=X.device, dtype=dt) * radius
        # every ball's chains in one round (its chains are independent: the same paths as one round per ball)
        f, x, _ = self._round(token, starts, chain_chunk, radius)
        best = f.unflatten(3, (K, HOMOTOPY_CHAINS)).argmax(dim=-1).to(x.device)  # (T, B, P, K)
        best += torch.arange(K, device=x.device) * HOMOTOPY_CHAINS
        return unit(x.gather(3, best[..., None].expand(*best.shape, d)))

    def _search(
        self, token: TokenMove, starts: Tensor, pos: list[int], seeds: list[int], dt: torch.dtype, chain_chunk: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Rounds of chains for the positions of one chunk.

        The first from `starts`, then `chains_per_round` random ones at a time for the trials whose best is not yet
        tight (`more_chains`), then one confirmation round for the trials with a best that no second chain came within
        1% of (chains started CONFIRM_JITTER x the radius from where that best chain started).

        Returns:
            f (T, B, K) float64 the FINAL_CANDIDATES best chains' objectives (best first), delta (T, B, K, d)
            float64 their Delta, j (T, B, K) their positions' indices, steps (T, B) most steps of a chain, values
            (T, B, P C) every chain's best objective (-inf: not run).
        """
        T, B, P, _, d = starts.shape
        device = starts.device
        kept = KeptChains.empty(T, B, d)
        run = torch.arange(T)  # the trials of this round
        # "search": rounds until each best is tight; "confirm": a round of chains started near the start of a best
        # that stands alone; "polish": the generic path's last round, chains started next to the best point found
        # (its ridge steps end a little short of a kinked maximum; docs/theory.md §4.3)
        phase = "search"
        round_ = 0
        while True:
            ahead = 0  # chains of the next round run together with this one (see `_with_round_ahead`)
            if round_ > 0:
                starts = self._later_starts(phase, run, pos, seeds, round_, kept, device, dt)
            elif starts.shape[3] < self.max_chains:
                starts, ahead = self._with_round_ahead(starts, run, pos, seeds, dt)
            f_r, x_r, steps_r, st_r, sub = self._run_round(token, run, starts, chain_chunk, T, device)
            run, round_ = self._take_round(kept, (f_r, x_r, steps_r, st_r, sub), ahead, run, round_, device)
            round_ += 1
            if len(run) == 0:
                after = self._after_rounds(token, phase, kept, T)
                if after is None:
                    break
                phase, run = after
        return kept.f, kept.x, kept.j, kept.steps, torch.cat(kept.values, dim=-1)

    def _later_starts(
        self,
        phase: str,
        run: Tensor,
        pos: list[int],
        seeds: list[int],
        round_: int,
        kept: KeptChains,
        device: torch.device,
        dt: torch.dtype,
    ) -> Tensor:
        """The starts (T', B, P, chains_per_round, d) of a round after the first, for the trials `run`.

        Next to the best point found (polish), CONFIRM_JITTER x the radius from where a lone best chain started
        (confirm), else random points on the sphere.
        """
        B, d = kept.x.shape[1], kept.x.shape[-1]
        if phase == "polish":
            draws = unit(seeded_draws([seeds[t] for t in run.tolist()], pos, B, self.chains_per_round, d, "polish"))
            best = kept.x[run][:, :, None, None, 0]  # (T', B, 1, 1, d): the best Delta, tried at every position
            return project_ball(best + POLISH_JITTER * self.radius * draws, self.radius).to(device=device, dtype=dt)
        if phase == "confirm":
            draws = unit(seeded_draws([seeds[t] for t in run.tolist()], pos, B, self.chains_per_round, d, "confirm"))
            near_start = kept.s[run][:, :, None, None, 0] + CONFIRM_JITTER * self.radius * draws  # (T', B, P, R, d)
            return unit(near_start).to(device=device, dtype=dt) * self.radius
        draws = seeded_draws([seeds[t] for t in run.tolist()], pos, B, self.chains_per_round, d, round_)
        return unit(draws).to(device=device, dtype=dt) * self.radius

    def _with_round_ahead(
        self, starts: Tensor, run: Tensor, pos: list[int], seeds: list[int], dt: torch.dtype
    ) -> tuple[Tensor, int]:
        """The first round's starts followed by the second round's random ones, and how many those are.

        The first round gains on nothing, so a second round always follows, and its random starts do not depend on
        the first: its chains run in the same batch (half the sequential steps, same chains).
        """
        B, d = starts.shape[1], starts.shape[-1]
        draws = seeded_draws([seeds[t] for t in run.tolist()], pos, B, self.chains_per_round, d, 1)
        ahead = self.chains_per_round
        return torch.cat([starts, unit(draws).to(device=starts.device, dtype=dt) * self.radius], dim=3), ahead

    def _run_round(
        self, token: TokenMove, run: Tensor, starts: Tensor, chain_chunk: int, T: int, device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Run the chains of `starts` for the trials `run`; their best values, points, steps, starts and trials.

        A family that cannot restrict its algebra to some trials runs every trial; the other trials' chains are run
        but not counted, so a trial's result is its own.
        """
        tok = token if len(run) == T else token.select_trials(run.to(device))
        sub = run if tok is not None else torch.arange(T)  # a family that cannot restrict runs every trial
        tok = tok if tok is not None else token
        if len(sub) > len(run):  # the other trials' chains are run but not counted: a trial's result is its own
            full = torch.zeros(T, *starts.shape[1:], dtype=starts.dtype, device=device)
            full[run] = starts
            starts = full
        f_r, x_r, steps_r = self._round(tok, starts, chain_chunk)  # (T', B, P, R) ...
        keep = torch.isin(sub, run)
        return f_r[keep], x_r[keep], steps_r[keep], starts[keep.to(device)], sub[keep]

    def _take_round(
        self,
        kept: KeptChains,
        ran: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
        ahead: int,
        run: Tensor,
        round_: int,
        device: torch.device,
    ) -> tuple[Tensor, int]:
        """Merge a round's chains (and those of the round run ahead) into `kept`; the trials to run on, the round.

        A trial runs on while `more_chains` says its best is not yet tight; the chains run ahead count only for the
        trials the first round sends on.
        """
        f_r, x_r, steps_r, st_r, sub = ran
        split = f_r.shape[-1] - ahead
        parts = [slice(0, split)] + ([slice(split, None)] if ahead else [])  # this round, the round run ahead
        for k, part in enumerate(parts):
            f_k, x_k, steps_k, st_k, sub_k = (
                f_r[..., part],
                x_r[..., part, :],
                steps_r[..., part],
                st_r[..., part, :],
                sub,
            )
            if k > 0:  # the chains run ahead count only for the trials the first round sends on
                on = torch.isin(sub_k, run)
                f_k, x_k, steps_k, st_k, sub_k = f_k[on], x_k[on], steps_k[on], st_k[on.to(device)], sub_k[on]
                if len(sub_k) == 0:
                    break
                round_ += 1
            gain = kept.merge(f_k, x_k, steps_k, st_k, sub_k)
            near = cast(Tensor, kept.near)
            more = more_chains(gain, near, torch.full_like(near, kept.chains), self.gain_tol, self.max_chains)  # (T, B)
            run = run[more[run].any(dim=1)]
        return run, round_

    def _after_rounds(self, token: TokenMove, phase: str, kept: KeptChains, T: int) -> tuple[str, Tensor] | None:
        """The next phase and its trials once no trial needs another round; None when the chunk is done.

        After the search, a best no second chain came within 1% of gets one round started near its own start: a
        chain from elsewhere that ends there says the maximum is no accident of one starting point (§4.3). Then the
        generic path polishes every trial's best; after polishing the chunk is done.
        """
        if phase == "polish":
            return None
        if phase == "search":
            lone = (cast(Tensor, kept.near) < 2) & kept.f[..., 0].isfinite()  # (T, B)
            run = lone.any(dim=1).nonzero()[:, 0]
            if len(run) > 0:
                return "confirm", run
        if self._polishes(token):
            return "polish", torch.arange(T)
        return None

    @staticmethod
    def _polishes(token: TokenMove) -> bool:
        """Whether the search ends with a polishing round: on the generic path (the closed forms' records stay)."""
        return isinstance(token, GenericMove)

    def _round(
        self, token: TokenMove, starts: Tensor, chain_chunk: int, radius: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One round: every chain of `starts` (T, B, P, R, d) run to convergence, `chain_chunk` chains at a time.

        On the ball of the search's radius, or (the homotopy starts, with plain steps) chain r on the ball of radius
        radius[r] ((R, 1)).

        Returns:
            f (T, B, P, R) float64 on the CPU, each chain's best objective; x (T, B, P, R, d) its point; steps.
        """
        closed = getattr(token, "value_and_grad", None)
        evaluate = closed if closed is not None else autograd_evaluate(token.change_sq)

        select = trial_selector(token)

        def restrict(idx: Tensor, columns: Tensor):  # every chain of a sample runs the same objective
            narrowed = select(idx)
            if narrowed is None:
                return None
            return (
                cast(_ClosedForm, narrowed).value_and_grad
                if closed is not None
                else autograd_evaluate(narrowed.change_sq)
            )

        # the generic path (autograd, no structured starts) walks ridges, and so do closed forms with kinks (DeepRF's
        # ReLU layers); the other closed forms keep plain steps
        ridge = (closed is None or getattr(token, "ridges", False)) and radius is None
        live = getattr(token, "live_value_and_grad", None)  # the generic path: only the moving chains are evaluated
        out = []
        for r0 in range(0, starts.shape[3], chain_chunk):
            ball = self.radius if radius is None else radius[r0 : r0 + chain_chunk]
            rule = MonotoneAscent(ball, self.lr, self.tol, self.window, ridge=ridge)
            x0 = starts[:, :, :, r0 : r0 + chain_chunk].contiguous()
            out.append(run_chains(evaluate, x0, rule, self.max_steps, restrict, live))
        return (
            torch.cat([c.best_f for c in out], dim=3).to(torch.float64).cpu(),
            torch.cat([c.best_x for c in out], dim=3),
            torch.cat([c.steps for c in out], dim=3).cpu(),
        )
