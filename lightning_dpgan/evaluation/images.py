"""Utility of synthetic images: train a classifier on them, test it on real images.

This is the "train on synthetic, test on real" accuracy of G-PATE (Long et al., NeurIPS 2021,
section 6 and Table 2) and of DP-GAN's follow-ups: a data holder publishes synthetic records,
an analyst fits a model on them, and what matters is how well that model does on real data.

The protocol here is deliberately the honest one: the classifier trains on a fixed schedule
(epochs, batch size, learning rate given up front) and the real test split is read exactly once,
after training. Nothing -- no epoch, no stopping point -- is chosen by looking at test accuracy.
(The G-PATE evaluation script reports the *maximum* test accuracy over 600 epochs, which
selects on the test set and flatters every generator; numbers from this module are therefore
not directly comparable to the paper's Table 2.)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from lightning_dpgan.random_streams import seeded_stream

NUM_CLASSES = 10
IMAGE_SHAPE = (1, 28, 28)

ArrayLike = Tensor | np.ndarray


class SmallCNN(nn.Module):
    """The G-PATE evaluation classifier for MNIST and Fashion-MNIST.

    G-PATE, appendix A.5 ("Classification Models for MNIST and Fashion-MNIST"): "two
    convolutional layers with 32 and 64 kernels respectively. We use ReLU as the activation
    function and applies dropout". The layer sizes follow the authors' released script
    (``evaluation/train-classifier-mnist.py``): 3x3 conv (32) -> 2x2 max-pool -> dropout 0.2 ->
    3x3 conv (64) -> dropout 0.25 -> dense 64 -> 10 logits. Input: (N, 1, 28, 28) in [-1, 1].
    """

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3),  # 28 -> 26
            nn.ReLU(),
            nn.MaxPool2d(2),  # 26 -> 13
            nn.Dropout(0.2),
            nn.Conv2d(32, 64, kernel_size=3),  # 13 -> 11
            nn.ReLU(),
            nn.Dropout(0.25),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 11 * 11, 64),
            nn.ReLU(),
            nn.Linear(64, num_classes),
        )

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(self.features(images))


def as_model_input(images: ArrayLike) -> Tensor:
    """Float images in [-1, 1], shape (N, 1, 28, 28); uint8 pixels are mapped by x/127.5 - 1.

    Using the same fixed map as the datamodules means a uint8 ``.npz`` from ``sample`` and
    the float tensors of a datamodule feed the classifier identically.
    """
    images = torch.as_tensor(images)
    if images.dim() == 3:
        images = images.unsqueeze(1)
    if tuple(images.shape[1:]) != IMAGE_SHAPE:
        raise ValueError(f"images must have shape (N, 1, 28, 28), got {tuple(images.shape)}")
    if images.dtype == torch.uint8:
        return images.to(torch.float32) / 127.5 - 1.0
    if not images.is_floating_point():
        raise ValueError(f"images must be uint8 (0..255) or float in [-1, 1], got {images.dtype}")
    if not bool(torch.isfinite(images).all()):  # NaN passes the range check below: it compares False
        raise ValueError(f"float images hold {int((~torch.isfinite(images)).sum())} NaN or infinite values; pass finite "
                         "floats in [-1, 1] (a generator that diverged yields such images: draw them again)")
    if images.numel() and (images.min() < -1.0 - 1e-4 or images.max() > 1.0 + 1e-4):
        raise ValueError(
            f"float images must lie in [-1, 1] (found [{images.min():.3g}, {images.max():.3g}]); "
            "pass uint8 pixels for 0..255 data"
        )
    return images.to(torch.float32)


def as_labels(labels: ArrayLike, n: int, num_classes: int = NUM_CLASSES) -> Tensor:
    """Class indices as int64, checked against the number of images and of classes."""
    labels = torch.as_tensor(labels).reshape(-1).to(torch.int64)
    if len(labels) != n:
        raise ValueError(f"got {len(labels)} labels for {n} images")
    if n and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), found [{labels.min()}, {labels.max()}]")
    return labels


def train_classifier(
    images: Tensor, labels: Tensor, epochs: int, batch_size: int, lr: float, seed: int, device: str
) -> SmallCNN:
    """Fit a fresh SmallCNN with Adam on a fixed schedule; ``seed`` fixes init, order and dropout."""
    torch.manual_seed(seed)
    model = SmallCNN().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    order = torch.Generator().manual_seed(seed)
    loader = DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True, generator=order)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        for batch_images, batch_labels in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(batch_images.to(device)), batch_labels.to(device))
            loss.backward()
            optimizer.step()
    return model


@torch.no_grad()
def evaluate(model: nn.Module, images: Tensor, labels: Tensor, batch_size: int, device: str) -> float:
    """Plain (micro-averaged) accuracy of ``model`` on one pass over the test records."""
    metric = MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro").to(device)
    model.eval()
    for start in range(0, len(images), batch_size):
        batch = images[start : start + batch_size].to(device)
        metric.update(model(batch).argmax(dim=1), labels[start : start + batch_size].to(device))
    return float(metric.compute())


def cnn_accuracy(
    train_images: ArrayLike,
    train_labels: ArrayLike,
    test_images: ArrayLike,
    test_labels: ArrayLike,
    epochs: int = 10,
    batch_size: int = 128,
    lr: float = 1e-3,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Train SmallCNN on the (synthetic) training set, return its accuracy on the test set.

    The schedule is fixed in advance and the test set is read once, after training (see the
    module docstring). The paper's script trains 600 epochs of SGD at lr 1e-3, too slow on a
    CPU; Adam at lr 1e-3 for ``epochs`` epochs reaches the same regime in a fraction of the time.
    The caller's global random state is left untouched.

    Args:
        train_images, test_images: (N, 1, 28, 28) uint8 pixels or floats in [-1, 1].
        train_labels, test_labels: class indices in [0, 10).
    Returns:
        ``{"accuracy", "epochs", "train_records", "test_records"}``.
    """
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1 and lr > 0, got {epochs}, {batch_size}, {lr}")
    train_x, test_x = as_model_input(train_images), as_model_input(test_images)
    train_y, test_y = as_labels(train_labels, len(train_x)), as_labels(test_labels, len(test_x))
    if not len(train_x) or not len(test_x):
        raise ValueError("both the training and the test set need at least one record")
    with seeded_stream(seed, device):  # train_classifier seeds the streams; the caller's are put back
        model = train_classifier(train_x, train_y, epochs, batch_size, lr, seed, device)
    accuracy = evaluate(model, test_x, test_y, max(batch_size, 1024), device)
    return {"accuracy": accuracy, "epochs": epochs, "train_records": len(train_x), "test_records": len(test_x)}


def load_synthetic_npz(path: str | Path) -> tuple[Tensor, Tensor]:
    """Images (uint8, N x 1 x 28 x 28) and labels (int64) of a ``sample --out X.npz`` file.

    Train-on-synthetic needs labels, so files from unconditional models (no ``labels``
    array) are refused rather than evaluated against made-up classes.
    """
    with np.load(path, allow_pickle=False) as arrays:
        if "images" not in arrays:
            raise ValueError(f"{path} holds no 'images' array (keys: {', '.join(arrays.files)})")
        if "labels" not in arrays:
            raise ValueError(
                f"{path} holds no 'labels': it was drawn from an unconditional model, whose records "
                "cannot train a classifier. Use a class-conditional model (--model.conditional true)."
            )
        images, labels = torch.from_numpy(arrays["images"]), torch.from_numpy(arrays["labels"])
    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != IMAGE_SHAPE:
        raise ValueError(f"{path}: expected uint8 images of shape (N, 1, 28, 28), got {images.dtype} {tuple(images.shape)}")
    return images, as_labels(labels, len(images))
