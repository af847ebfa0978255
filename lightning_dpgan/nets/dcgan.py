"""DCGAN-style convolutional generator and discriminator for small images (e.g. 28x28).

Two stride-2 (de)convolutions: the image side must be divisible by 4.
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from lightning_dpgan.nets.conditioning import concat_condition, label_planes


def _check_image_shape(shape: Sequence[int]) -> tuple[int, int, int]:
    if len(shape) != 3 or shape[1] % 4 or shape[2] % 4:
        raise ValueError(f"DCGAN nets need (channels, height, width) with sides divisible by 4, got {tuple(shape)}")
    return int(shape[0]), int(shape[1]), int(shape[2])


class DCGANGenerator(nn.Module):
    """z (+ one-hot class) -> FC -> 2 transposed convolutions -> tanh image in [-1, 1]."""

    def __init__(self, latent_dim: int, out_shape: Sequence[int], num_classes: int | None = None, base_channels: int = 64) -> None:
        super().__init__()
        channels, height, width = _check_image_shape(out_shape)
        self.num_classes = num_classes
        self.seed_shape = (2 * base_channels, height // 4, width // 4)
        seed_size = self.seed_shape[0] * self.seed_shape[1] * self.seed_shape[2]
        self.project = nn.Sequential(
            nn.Linear(latent_dim + (num_classes or 0), seed_size), nn.BatchNorm1d(seed_size), nn.ReLU()
        )
        self.upsample = nn.Sequential(
            nn.ConvTranspose2d(2 * base_channels, base_channels, 4, stride=2, padding=1),
            nn.BatchNorm2d(base_channels),
            nn.ReLU(),
            nn.ConvTranspose2d(base_channels, channels, 4, stride=2, padding=1),
            nn.Tanh(),
        )

    def forward(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        seed = self.project(concat_condition(z, labels, self.num_classes))
        return self.upsample(seed.view(z.shape[0], *self.seed_shape))


class DCGANDiscriminator(nn.Module):
    """Image (+ one-hot class planes) -> 2 strided convolutions (GroupNorm) -> FC -> one score.

    The label enters as K constant input channels, so every convolution sees it; joined only
    at the last linear layer it would merely add a per-class bias and the critic could not
    judge whether an image fits its class. GroupNorm instead of BatchNorm keeps per-sample
    gradients (DP-SGD) well defined.
    """

    def __init__(self, in_shape: Sequence[int], num_classes: int | None = None, base_channels: int = 64) -> None:
        super().__init__()
        channels, height, width = _check_image_shape(in_shape)
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(channels + (num_classes or 0), base_channels, 4, stride=2, padding=1),
            nn.LeakyReLU(0.2),
            nn.Conv2d(base_channels, 2 * base_channels, 4, stride=2, padding=1),
            nn.GroupNorm(min(8, 2 * base_channels), 2 * base_channels),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
        )
        feature_size = 2 * base_channels * (height // 4) * (width // 4)
        self.head = nn.Linear(feature_size, 1)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        return self.head(self.features(label_planes(x, labels, self.num_classes))).squeeze(1)


__all__ = ["DCGANDiscriminator", "DCGANGenerator"]
