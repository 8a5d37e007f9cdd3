"""What a sweep's step costs: its trials' own work, the embeddings opened once a run before the first trials."""

import json
import time
from pathlib import Path

import pytest

import wslight.data
from wslight.app.cli import main
from wslight.tasks import WordSensitivitySweep

OPEN_S = 2.0  # a slow opening of the embeddings (a large cache's checksum)


@pytest.fixture
def slow_opening(monkeypatch):
    """Opening the embeddings takes OPEN_S seconds; returns the list of the times it was opened."""
    real = wslight.data.load_token_embeddings
    opened = []

    def load(*args, **kwargs):
        opened.append(time.perf_counter())
        time.sleep(OPEN_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(wslight.data, "load_token_embeddings", load)
    return opened


@pytest.fixture
def steps_saw_the_store(monkeypatch):
    """Whether the store was open when each step started (one bool a step)."""
    real = WordSensitivitySweep.run_trials
    seen = []

    def run_trials(self, specs):
        seen.append(self._store is not None)
        return real(self, specs)

    monkeypatch.setattr(WordSensitivitySweep, "run_trials", run_trials)
    return seen


def test_the_embeddings_open_once_before_the_trials_and_stay_out_of_their_seconds(
    tmp_path, cpu_trainer, tiny, slow_opening, steps_saw_the_store
):
    args = [
        "test",
        *tiny("ws/raf", {"grid.d_values": [8], "grid.n_values": [4], "grid.trials": 3, "trials_per_step": 2}),
    ]
    args += [*cpu_trainer.args, "--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = main(args, evaluate=True)
    records = [json.loads(x) for x in Path(cli.model.results_path).read_text().splitlines()]
    assert len(slow_opening) == 1 and steps_saw_the_store == [True, True]  # once, before both steps' trials
    assert sum(r["seconds"] for r in records) < OPEN_S  # the steps' seconds are the trials' own work

    again = main(args, evaluate=True)  # every trial finished: nothing to open
    assert len(slow_opening) == 1 and again.model._store is None
    assert [json.loads(x) for x in Path(again.model.results_path).read_text().splitlines()] == records
