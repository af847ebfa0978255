"""Class conditioning shared by every architecture: labels enter as one-hot vectors.

One-hot concatenation (rather than an embedding table) keeps every layer a plain
``nn.Linear``/``nn.Conv2d``, which Opacus can compute per-sample gradients for.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


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


def conv_of_label_planes(conv: nn.Conv2d, images: Tensor, labels: Tensor | None, num_classes: int | None) -> Tensor:
    """``conv(label_planes(images, labels, num_classes))``, without convolving the label planes
    of every record: a constant one-hot plane convolves to the same map for every record of its
    class, so the ``num_classes`` maps are made once per call (one small convolution of a plane of
    ones) and each record gets its class's. For G-PATE's MNIST teachers 10 of the 11 input
    channels are label planes: the convolution does a tenth of the work.

    Only for networks Opacus never wraps (the PATE teachers): the call bypasses the module, so
    per-sample-gradient hooks on it would not see it."""
    condition = one_hot_labels(labels, num_classes, images.shape[0])  # checks the labels too
    if condition is None:
        return conv(images)
    if conv.groups != 1 or conv.padding_mode != "zeros":
        raise ValueError("label-plane maps need an ungrouped, zero-padded convolution")
    channels, weight = images.shape[1], conv.weight
    options = {"stride": conv.stride, "padding": conv.padding, "dilation": conv.dilation}
    on_images = nn.functional.conv2d(images, weight[:, :channels], conv.bias, **options)
    per_class = weight[:, channels:].transpose(0, 1).reshape(-1, 1, *weight.shape[2:])  # [classes x out, 1, k, k]
    maps = nn.functional.conv2d(images.new_ones(1, 1, *images.shape[2:]), per_class, **options).reshape(num_classes, -1)
    # each record's class map as a product with its one-hot row: indexing's backward (index_put
    # with accumulation) measured 30 ms per call for 200 teachers, the product's is a small matmul
    return on_images + (condition.to(maps.dtype) @ maps).reshape(on_images.shape)
