"""`--config` given a directory, or a folder of shipped configs: the error says so and what to give."""


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
