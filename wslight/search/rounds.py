"""The rounds of chains of the word-sensitivity search and their stop rule (docs/theory/search.md §4.3).

`Rounds` runs every (trial, sample, position, chain) of a chunk of positions at once, round after round, until each
sample's best is tight (`wslight.chains.engine.more_chains`), then a confirmation round for a lone best and, on the
generic path, a polishing round. It reads its `ResolvedSearch` and `StartPlan` whole where it needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from ..chains.ball import project_ball
from ..chains.engine import Evaluate, MonotoneAscent, autograd_evaluate, more_chains, run_chains
from ..chains.settings import ResolvedSearch
from ..features.move import TokenMove, trial_selector
from ..features.rows import unit
from .kept import KeptChains
from .start_plan import StartPlan
from .starts import seeded_draws


@dataclass(frozen=True)
class Rounds:
    """Rounds of chains on the ball of `radius`, as `settings` and `plan` say, for T trials x B samples at once.

    Args:
        settings: the search's settings, every field given (chains per round, stops, steps).
        radius: the ball's radius (> 0, checked by the caller).
        plan: where the rounds after the first start (confirmation and polishing jitters).
    """

    settings: ResolvedSearch
    radius: float
    plan: StartPlan

    def run(
        self, move: TokenMove, starts: Tensor, pos: list[int], seeds: list[int], dt: torch.dtype, chain_chunk: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Rounds of chains for the positions of one chunk.

        The first from `starts`, then `chains_per_round` random ones at a time for the trials whose best is not yet
        tight (`more_chains`), then one confirmation round for the trials with a best that no second chain came within
        1% of (chains started `plan.confirm_jitter` x the radius from where that best chain started).

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
        # (its ridge steps end a little short of a kinked maximum; docs/theory/search.md §4.3)
        phase = "search"
        round_ = 0
        while True:
            ahead = 0  # chains of the next round run together with this one (see `_with_round_ahead`)
            if round_ > 0:
                starts = self._later_starts(phase, run, pos, seeds, round_, kept, device, dt)
            elif starts.shape[3] < self.settings.max_chains:
                starts, ahead = self._with_round_ahead(starts, run, pos, seeds, dt)
            f_r, x_r, steps_r, st_r, sub = self._run_round(move, run, starts, chain_chunk, T, device)
            run, round_ = self._take_round(kept, (f_r, x_r, steps_r, st_r, sub), ahead, run, round_, device)
            round_ += 1
            if len(run) == 0:
                after = self._after_rounds(move, phase, kept, T)
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

        Next to the best point found (polish), `plan.confirm_jitter` x the radius from where a lone best chain started
        (confirm), else random points on the sphere.
        """
        B, d = kept.x.shape[1], kept.x.shape[-1]
        R, trial_seeds = self.settings.chains_per_round, [seeds[t] for t in run.tolist()]
        if phase == "polish":
            draws = unit(seeded_draws(trial_seeds, pos, B, R, d, "polish"))
            best = kept.x[run][:, :, None, None, 0]  # (T', B, 1, 1, d): the best Delta, tried at every position
            polished = project_ball(best + self.plan.polish_jitter * self.radius * draws, self.radius)
            return polished.to(device=device, dtype=dt)
        if phase == "confirm":
            draws = unit(seeded_draws(trial_seeds, pos, B, R, d, "confirm"))
            near_start = (
                kept.s[run][:, :, None, None, 0] + self.plan.confirm_jitter * self.radius * draws
            )  # (T', B, P, R, d)
            return unit(near_start).to(device=device, dtype=dt) * self.radius
        draws = seeded_draws(trial_seeds, pos, B, R, d, round_)
        return unit(draws).to(device=device, dtype=dt) * self.radius

    def _with_round_ahead(
        self, starts: Tensor, run: Tensor, pos: list[int], seeds: list[int], dt: torch.dtype
    ) -> tuple[Tensor, int]:
        """The first round's starts followed by the second round's random ones, and how many those are.

        The first round gains on nothing, so a second round always follows, and its random starts do not depend on
        the first: its chains run in the same batch (half the sequential steps, same chains).
        """
        B, d = starts.shape[1], starts.shape[-1]
        draws = seeded_draws([seeds[t] for t in run.tolist()], pos, B, self.settings.chains_per_round, d, 1)
        ahead = self.settings.chains_per_round
        return torch.cat([starts, unit(draws).to(device=starts.device, dtype=dt) * self.radius], dim=3), ahead

    def _run_round(
        self, move: TokenMove, run: Tensor, starts: Tensor, chain_chunk: int, T: int, device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Run the chains of `starts` for the trials `run`; their best values, points, steps, starts and trials.

        A family that cannot restrict its algebra to some trials runs every trial; the other trials' chains are run
        but not counted, so a trial's result is its own.
        """
        tok = move if len(run) == T else move.select_trials(run.to(device))
        sub = run if tok is not None else torch.arange(T)  # a family that cannot restrict runs every trial
        tok = tok if tok is not None else move
        if len(sub) > len(run):  # the other trials' chains are run but not counted: a trial's result is its own
            full = torch.zeros(T, *starts.shape[1:], dtype=starts.dtype, device=device)
            full[run] = starts
            starts = full
        f_r, x_r, steps_r = self.round(tok, starts, chain_chunk)  # (T', B, P, R) ...
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
            more = more_chains(
                gain, near, torch.full_like(near, kept.chains), self.settings.gain_tol, self.settings.max_chains
            )  # (T, B)
            run = run[more[run].any(dim=1)]
        return run, round_

    def _after_rounds(self, move: TokenMove, phase: str, kept: KeptChains, T: int) -> tuple[str, Tensor] | None:
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
        if move.structure_blind:  # the generic path polishes its best; the closed forms' records stay as they are
            return "polish", torch.arange(T)
        return None

    def round(
        self, move: TokenMove, starts: Tensor, chain_chunk: int, radius: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One round: every chain of `starts` (T, B, P, R, d) run to convergence, `chain_chunk` chains at a time.

        On the ball of the search's radius, or (the homotopy starts, with plain steps) chain r on the ball of radius
        radius[r] ((R, 1)).

        Returns:
            f (T, B, P, R) float64 on the CPU, each chain's best objective; x (T, B, P, R, d) its point; steps.
        """
        closed = move.value_and_grad
        evaluate = closed if closed is not None else autograd_evaluate(move.change_sq)

        select = trial_selector(move)

        def restrict(idx: Tensor, columns: Tensor) -> Evaluate | None:  # every chain of a sample runs one objective
            narrowed = select(idx)
            if narrowed is None:
                return None
            own = narrowed.value_and_grad  # the same family as `move`: a closed form there too
            return own if own is not None else autograd_evaluate(narrowed.change_sq)

        # the generic path (autograd, no structured starts) walks ridges, and so do closed forms with kinks (DeepRF's
        # ReLU layers); the other closed forms keep plain steps
        ridge = (closed is None or move.ridges) and radius is None
        live = move.live_value_and_grad  # the generic path: only the moving chains are evaluated
        out = []
        for r0 in range(0, starts.shape[3], chain_chunk):
            ball = self.radius if radius is None else radius[r0 : r0 + chain_chunk]
            rule = MonotoneAscent(ball, self.settings.lr, self.settings.tol, self.settings.window, ridge=ridge)
            x0 = starts[:, :, :, r0 : r0 + chain_chunk].contiguous()
            out.append(run_chains(evaluate, x0, rule, self.settings.max_steps, restrict, live))
        return (
            torch.cat([c.best_f for c in out], dim=3).to(torch.float64).cpu(),
            torch.cat([c.best_x for c in out], dim=3),
            torch.cat([c.steps for c in out], dim=3).cpu(),
        )
