"""Run the evaluation a config describes: `python evaluate.py --config configs/ws/raf.yaml [--key value ...]`.

The last line printed is `results: <path to results.jsonl>`. Re-running the same command resumes an interrupted run.
"""

import sys

from wslight.cli import main

if __name__ == "__main__":
    main(["test", *sys.argv[1:]], evaluate=True)
