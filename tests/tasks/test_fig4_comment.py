"""configs/attack/fig4.yaml: the comment on `trials_per_step` states the steps the sweep forms."""


def test_fig4_comment_on_trials_per_step_states_the_steps_the_sweep_forms():
    """The comment beside `trials_per_step` says how many trials a step holds and how many steps there are."""
    import re

    import yaml

    from wslight.app.config_files import configs_dir
    from wslight.data import EmbeddingSpec
    from wslight.tasks import DeltaAttackSweep

    path = configs_dir() / "attack" / "fig4.yaml"
    text = path.read_text()
    args = yaml.safe_load(text)["model"]["init_args"]
    sweep = DeltaAttackSweep(**{**args, "embeddings": EmbeddingSpec(**args["embeddings"])})
    steps = sweep.step_batches(sweep.trial_specs())
    comment = " ".join(line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line)
    found = re.search(r"here all (\d+), one step per \(case, N\) \((\d+) steps", comment)
    assert found, "the trials_per_step comment should say what a step holds"
    assert int(found.group(1)) == args["trials"] <= args["trials_per_step"]
    assert int(found.group(2)) == len(steps) == len(sweep.cases) * len(args["N_values"])
    assert {len(s) for s in steps} == {args["trials"]}
    assert "half" not in comment
