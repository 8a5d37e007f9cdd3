"""A tiny Evaluation for machinery tests: trial t records t**2 after an optional pause."""

import time

import torch

from wslight.tasks import Evaluation


class SquaresEvaluation(Evaluation):
    """Trial t gives value t**2.

    Args:
        trials: number of trials.
        sleep: seconds per step (to interrupt a run mid-way).
        trials_per_step: trials per test step.
        output_dir: where results.jsonl goes (None: the logger's directory).
        compute: spend the `sleep` seconds computing small matrix products (a step of a search) instead of sleeping.
        fail_trial: a trial whose step raises a RuntimeError (a map that fails), or None.
    """

    def __init__(
        self,
        trials: int = 6,
        sleep: float = 0.0,
        trials_per_step: int = 1,
        output_dir: str | None = None,
        compute: bool = False,
        fail_trial: int | None = None,
    ):
        super().__init__(trials_per_step, output_dir)
        self.trials = trials
        self.sleep = sleep
        self.compute = compute
        self.fail_trial = fail_trial

    def trial_specs(self):
        return [{"trial_key": f"t{i}", "trial": i} for i in range(self.trials)]

    def run_trials(self, specs):
        end = time.time() + self.sleep
        if self.compute:
            x = torch.randn(64, 64)
            while time.time() < end:
                x = torch.tanh(x @ x)
        else:
            time.sleep(self.sleep)
        if any(s["trial"] == self.fail_trial for s in specs):
            raise RuntimeError(f"trial {self.fail_trial} cannot be computed:\n  a made-up failure")
        return [{"trial_key": s["trial_key"], "trial": s["trial"], "value": s["trial"] ** 2} for s in specs]

    def summarize(self, records, out_dir):
        self.log_scalar("squares/count", len(records))
