"""G-PATE's student generator for small images (Long et al. 2021, appendix A.5).

"A fully connected layer with 1024 units and a deconvolutional layer with 64 kernels of size
5x5 (strides 2x2) ... All layers are concatenated with the one-hot encoded class label. We
apply batch normalization and Leaky ReLU on all layers." Read as in the DCGAN code G-PATE
builds on: z (+ label) -> FC 1024 -> FC to a 64 x H/4 x W/4 seed -> deconv 64 x 5x5 stride 2
-> deconv to the image (5x5 stride 2, tanh). The label joins every layer: appended to the flat
vectors, and as constant planes before each deconvolution. (The teachers are
:class:`~lightning_dpgan.nets.ensemble.ConvTeacher`.)
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from lightning_dpgan.nets.conditioning import concat_condition, label_planes


class GPATEGenerator(nn.Module):
    """z (+ one-hot class at every layer) -> FC 1024 -> FC seed -> 2 deconvolutions -> tanh image."""

    def __init__(
        self,
        latent_dim: int,
        out_shape: Sequence[int],
        num_classes: int | None = None,
        hidden: int = 1024,
        channels: int = 64,
        kernel_size: int = 5,
    ) -> None:
        super().__init__()
        out_channels, height, width = (int(s) for s in out_shape)
        if height % 4 or width % 4:
            raise ValueError(f"the G-PATE generator needs image sides divisible by 4, got {tuple(out_shape)}")
        self.num_classes = num_classes
        extra = num_classes or 0
        self.seed_shape = (channels, height // 4, width // 4)
        seed_size = channels * (height // 4) * (width // 4)
        self.fc = nn.Sequential(nn.Linear(latent_dim + extra, hidden), nn.BatchNorm1d(hidden), nn.LeakyReLU(0.2))
        self.seed = nn.Sequential(nn.Linear(hidden + extra, seed_size), nn.BatchNorm1d(seed_size), nn.LeakyReLU(0.2))
        padding = kernel_size // 2
        self.deconv = nn.Sequential(
            nn.ConvTranspose2d(channels + extra, channels, kernel_size, 2, padding, output_padding=1),
            nn.BatchNorm2d(channels),
            nn.LeakyReLU(0.2),
        )
        self.out = nn.Sequential(
            nn.ConvTranspose2d(channels + extra, out_channels, kernel_size, 2, padding, output_padding=1), nn.Tanh()
        )

    def forward(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        h = self.fc(concat_condition(z, labels, self.num_classes))
        h = self.seed(concat_condition(h, labels, self.num_classes)).view(z.shape[0], *self.seed_shape)
        h = self.deconv(label_planes(h, labels, self.num_classes))
        return self.out(label_planes(h, labels, self.num_classes))


__all__ = ["GPATEGenerator"]
