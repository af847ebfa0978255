"""Train a GAN, differentially private or not: ``python train.py --model gan --dataset mnist``.

A thin wrapper over ``python -m lightning_dpgan train``; ``--help`` lists every option.
"""
import sys

from lightning_dpgan.cli import main
from lightning_dpgan.console_log import route_library_log_to_console

if __name__ == "__main__":
    route_library_log_to_console("train")
    sys.exit(main(["train", *sys.argv[1:]]))
