"""TensorBoard event files of a run folder: a resume adds one only when it computes."""

from pathlib import Path

from wslight.app.cli import main

SQUARES = """
seed_everything: 0
model:
  class_path: dummy_evaluation.SquaresEvaluation
  init_args: {trials: 5}
"""


def test_a_no_op_resume_adds_no_event_file_and_a_computing_resume_at_most_one(tmp_path, cpu_trainer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tmp_path / "squares.yaml"
    cfg.write_text(SQUARES + cpu_trainer.yaml(tmp_path / "logs", "squares"))

    def evaluate():
        return main(["test", "--config", str(cfg)], evaluate=True)

    def events():
        return sorted(p.name for p in results.parent.glob("events.out.tfevents.*"))

    results = Path(evaluate().model.results_path)
    first = events()
    assert len(first) == 1  # the config, the scalars and the HPARAMS row in one file
    evaluate()  # every trial in the file already: nothing to record
    assert events() == first
    lines = results.read_text().splitlines(keepends=True)
    results.write_text("".join(lines[:3]))  # two trials to compute again
    evaluate()
    assert len(events()) == len(first) + 1 and set(first) <= set(events())
    run = EventAccumulator(str(results.parent), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    assert [e.value for e in run.Scalars("results/records")] == [5.0, 5.0]  # one point per computing invocation
    assert len(run.Tensors("config/text_summary")) == 1  # the config once per folder
