"""Train a linear head on a frozen feature map: `python train.py fit --config configs/raf.yaml`."""

import sys

from wslight.app.verbs import main

if __name__ == "__main__":
    sys.exit(main(prog="train.py"))
