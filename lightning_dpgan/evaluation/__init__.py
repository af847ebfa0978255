"""Measuring how useful synthetic data is: train on synthetic records, test on real ones."""
from lightning_dpgan.evaluation.images import SmallCNN, cnn_accuracy, load_synthetic_npz

__all__ = ["SmallCNN", "cnn_accuracy", "load_synthetic_npz"]
