"""Train a GAN, differentially private or not: ``python train.py --model gan --dataset mnist``.

A thin wrapper over ``python -m lightning_dpgan train``; ``--help`` lists every option.
"""
import sys

from lightning_dpgan.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
