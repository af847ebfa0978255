"""Class conditioning shared by every architecture: labels enter as one-hot vectors.

One-hot concatenation (rather than an embedding table) keeps every layer a plain
``nn.Linear``/``nn.Conv2d``, which Opacus can compute per-sample gradients for.
"""
from __future__ import annotations

import torch
from torch import Tensor


def one_hot_labels(labels: Tensor | None, num_classes: int | None, batch_size: int) -> Tensor | None:
    """Return float one-hot rows for ``labels``, or ``None`` for an unconditional net."""
    if not num_classes:
        return None
    if labels is None:
        raise ValueError("this network is class-conditional: pass the class labels")
    if labels.shape != (batch_size,):
        raise ValueError(f"expected {batch_size} labels, got a tensor of shape {tuple(labels.shape)}")
    return torch.nn.functional.one_hot(labels.long(), num_classes).float()


def concat_condition(features: Tensor, labels: Tensor | None, num_classes: int | None) -> Tensor:
    """Append the one-hot label to a batch of flat feature vectors (no-op when unconditional)."""
    condition = one_hot_labels(labels, num_classes, features.shape[0])
    if condition is None:
        return features
    return torch.cat([features, condition.to(features.dtype)], dim=1)


def label_planes(images: Tensor, labels: Tensor | None, num_classes: int | None) -> Tensor:
    """Append the one-hot label as constant channels of an image batch (no-op when unconditional)."""
    condition = one_hot_labels(labels, num_classes, images.shape[0])
    if condition is None:
        return images
    planes = condition.to(images.dtype)[:, :, None, None].expand(-1, -1, *images.shape[2:])
    return torch.cat([images, planes], dim=1)
