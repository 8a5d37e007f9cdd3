"""Small contracts of the command line, the run folder, the probes and the figures."""


# ------------------------------------------------------------------------------------------ --config <a directory>
def test_config_given_a_directory_says_so_and_what_to_give(tmp_path, monkeypatch, cli_fails):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "a.yaml").write_text("model: {}\n")
    err = cli_fails(["test", "--config", str(folder)], evaluate=True)
    assert f"--config {folder}: {folder} is a directory, not a config file" in err
    assert str(folder / "a.yaml") in err and "shipped config such as ws/raf" in err
    assert "no such file" not in err
    err = cli_fails(["test", "--config", "mine"], evaluate=True)  # relative to the working directory
    assert "--config mine: mine is a directory" in err and "no such file" not in err


def test_config_given_a_folder_of_shipped_configs_names_them(tmp_path, monkeypatch, cli_fails):
    monkeypatch.chdir(tmp_path)  # no folder `ws` here: the shipped one
    for value in ("ws", "configs/ws"):
        err = cli_fails(["test", "--config", value], evaluate=True)
        assert f"--config {value}: ws is a folder of shipped configs, not a config; give one of" in err
        assert "ws/raf" in err and "no such file" not in err


# ------------------------------------------------------------------------------- configs/attack/fig4.yaml's comment
def test_fig4_comment_on_trials_per_step_states_the_steps_the_sweep_forms():
    """The comment beside `trials_per_step` says how many trials a step holds and how many steps there are."""
    import re

    import yaml

    from wslight.app.config_files import configs_dir
    from wslight.data import EmbeddingSpec
    from wslight.evaluations import DeltaAttackSweep

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
