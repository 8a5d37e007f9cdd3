"""The command line (entry floor).

The verb table behind `wslight`, `python -m wslight`, train.py and evaluate.py (`verbs`), WSLightCLI and its one-block
messages (`cli`, `messages`), shipped configs by name (`config_files`), what a run records beside its scalars
(`run_summary`), `wslight reproduce` (`reproduce`) and `make results-pages` (`results_pages`). Nothing below
imports it.
"""
