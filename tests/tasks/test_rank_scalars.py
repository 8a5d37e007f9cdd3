"""Scalars computed identically on every rank are logged as computed, without a `sync_dist` warning."""

from pathlib import Path

import pytest

from wslight.app.cli import main


def test_attack_sweep_under_a_process_group_logs_its_scalars_without_a_sync_dist_warning(tmp_path, recwarn):
    """Under DDP (here one process) the attack's scalars draw no Lightning `sync_dist` warning.

    They are computed identically on every rank, and are logged as computed.
    """
    import json

    from lightning.pytorch.trainer.connectors.logger_connector import result

    from wslight.records.summary import attack_scalars

    result.warning_cache.clear()  # Lightning shows each warning once per process: a test before this one may have
    conf = Path(__file__).resolve().parents[1] / "conf" / "attack" / "fig4.yaml"
    args = ["test", "--config", str(conf), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    args += ["--trainer.enable_progress_bar", "false", "--trainer.strategy", "ddp", "--trainer.devices", "1"]
    cli = main(args, evaluate=True)
    assert cli.trainer.world_size == 1 and type(cli.trainer.strategy).__name__ == "DDPStrategy"
    messages = [str(w.message) for w in recwarn]
    assert not [m for m in messages if "sync_dist=True" in m], messages
    records = [json.loads(x) for x in Path(cli.model.results_path).read_text().splitlines()]
    expected = attack_scalars(records, cli.model.trainings)
    assert len(expected) == 4
    for name, value in expected.items():
        assert float(cli.trainer.callback_metrics[name]) == pytest.approx(value, rel=1e-6)
