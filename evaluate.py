"""Run the evaluation a config describes: `python evaluate.py --config configs/ws/raf.yaml [--key value ...]`.

The last line printed is `results: <path to results.jsonl>`. Re-running the same command resumes an interrupted run.
"""

import sys

from wslight.app.verbs import run_verb

if __name__ == "__main__":
    sys.exit(run_verb("evaluate", sys.argv[1:], prog="evaluate.py", program=True))
