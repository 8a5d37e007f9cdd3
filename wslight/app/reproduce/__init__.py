"""The main job (`make reproduce`): a reduced but faithful offline reproduction of the paper, with a report.

The plan is `configs/reproduce/plan.yaml`: an ordered list of stages, each an `evaluate.py` config under
configs/reproduce/ that a user can also run alone, so every number in the report traces to a config (`--list` and
`--help` name them, from the plan file). A stage's config is an overlay of a shipped config (`# overlay of: ws/rf` on
its first line: the grid of the reproduction and the log folder, every difference stated in its header), which
`--config` composes with its base (wslight.app.config_files). Every stage writes its results.jsonl as trials finish,
in a log directory named by its run key under `reports/<run-id>/tensorboard/<stage>`, so re-running after an
interruption resumes from the finished trials. The report (`reports/<run-id>/report.md`) describes every stage of the
plan whose results are on disk (an `--only` run updates its own stages and keeps the others): figures, per-cell
tables, the checks computed from the results files in two parts (the paper's claims of docs/theory/checks.md §8, PASS or
FAIL; this package's hypotheses beyond the paper, each a finding: supported or not), and a provenance block.

`--full 1` runs the plan's `full` list instead: the paper-size configs under configs/paper/ (a GPU machine with hub
access).

The modules, one job each: `plan` (the plan file and its stages), `stages` (running them, resuming, their results),
`signals` (SIGINT/SIGTERM passed on to a stage once), `report` (report.md), `pages` (the results pages beside it),
`command` (the options, `--list`, `--help`, and `main`).
"""

from .command import main

__all__ = ["main"]
