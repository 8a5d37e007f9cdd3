"""A tiny Evaluation for machinery tests: trial t records t**2 after an optional sleep."""

import time

from wslight.evaluations import Evaluation


class SquaresEvaluation(Evaluation):
    """Trial t gives value t**2.

    Args:
        trials: number of trials.
        sleep: seconds per step (to interrupt a run mid-way).
        trials_per_step: trials per test step.
        output_dir: where results.jsonl goes (None: the logger's directory).
    """

    def __init__(self, trials: int = 6, sleep: float = 0.0, trials_per_step: int = 1, output_dir: str | None = None):
        super().__init__(trials_per_step, output_dir)
        self.trials = trials
        self.sleep = sleep

    def trial_specs(self):
        return [{"trial_key": f"t{i}", "trial": i} for i in range(self.trials)]

    def run_trials(self, specs):
        time.sleep(self.sleep)
        return [{"trial_key": s["trial_key"], "trial": s["trial"], "value": s["trial"] ** 2} for s in specs]

    def summarize(self, records, out_dir):
        self.log_scalar("squares/count", len(records))
