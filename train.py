"""Train a linear head on a frozen feature map: `python train.py fit --config configs/raf.yaml`."""

from wslight.cli import main

if __name__ == "__main__":
    main()
