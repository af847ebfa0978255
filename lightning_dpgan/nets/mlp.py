"""Fully connected generator and discriminator, for tables and small images."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lightning_dpgan.nets.conditioning import concat_condition

OUTPUT_ACTIVATIONS = {"tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "none": nn.Identity}


def _hidden_layers(in_features: int, widths: Sequence[int], activation: type[nn.Module], norm: str | None) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for width in widths:
        layers.append(nn.Linear(in_features, width))
        if norm == "layer":
            layers.append(nn.LayerNorm(width))
        elif norm == "batch":
            layers.append(nn.BatchNorm1d(width))
        elif norm is not None:
            raise ValueError(f"unknown norm {norm!r}: use 'layer', 'batch' or None")
        layers.append(activation())
        in_features = width
    return nn.Sequential(*layers), in_features


class MLPGenerator(nn.Module):
    """z (+ one-hot class) -> hidden layers -> a record of ``out_shape``."""

    def __init__(
        self,
        latent_dim: int,
        out_shape: Sequence[int],
        hidden: Sequence[int] = (256, 512),
        num_classes: int | None = None,
        output_activation: str = "tanh",
        norm: str | None = "batch",
    ) -> None:
        super().__init__()
        if output_activation not in OUTPUT_ACTIVATIONS:
            raise ValueError(f"output_activation must be one of {sorted(OUTPUT_ACTIVATIONS)}")
        self.out_shape = tuple(out_shape)
        self.num_classes = num_classes
        self.body, width = _hidden_layers(latent_dim + (num_classes or 0), hidden, nn.ReLU, norm)
        self.head = nn.Sequential(nn.Linear(width, math.prod(self.out_shape)), OUTPUT_ACTIVATIONS[output_activation]())

    def forward(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        h = self.body(concat_condition(z, labels, self.num_classes))
        return self.head(h).view(z.shape[0], *self.out_shape)


class MLPDiscriminator(nn.Module):
    """A record (+ one-hot class) -> hidden layers -> one logit/critic score.

    Uses LayerNorm, never BatchNorm: BatchNorm mixes records within a batch, which breaks
    per-sample gradients and so DP-SGD.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        hidden: Sequence[int] = (512, 256),
        num_classes: int | None = None,
        norm: str | None = None,
    ) -> None:
        super().__init__()
        if norm == "batch":
            raise ValueError("a discriminator must not use BatchNorm (it breaks per-sample gradients)")
        self.num_classes = num_classes
        in_features = math.prod(in_shape) + (num_classes or 0)
        activation = lambda: nn.LeakyReLU(0.2)  # noqa: E731 - a factory, like the nn classes
        self.body, width = _hidden_layers(in_features, hidden, activation, norm)
        self.head = nn.Linear(width, 1)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        flat = torch.flatten(x, start_dim=1)
        return self.head(self.body(concat_condition(flat, labels, self.num_classes))).squeeze(1)
