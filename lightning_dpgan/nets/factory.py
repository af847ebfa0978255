"""Pick a generator/discriminator pair for a data shape."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from lightning_dpgan.argument_types import network_settings
from lightning_dpgan.nets.dcgan import DCGANDiscriminator, DCGANGenerator
from lightning_dpgan.nets.mlp import MLPDiscriminator, MLPGenerator

ARCHITECTURES = ("auto", "mlp", "dcgan")


def resolve_architecture(arch: str, data_shape: Sequence[int]) -> str:
    """``auto`` means convolutions for images whose sides divide by 4, else an MLP."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    is_image = len(data_shape) == 3 and data_shape[1] % 4 == 0 and data_shape[2] % 4 == 0
    if arch == "dcgan" and not is_image:  # DCGAN's layers refused a table's settings by their keyword names
        shape = "a table's records" if len(data_shape) == 1 else f"records of shape {tuple(data_shape)}"
        raise ValueError(f"model.arch dcgan builds convolutions for images of (channels, height, width) with sides "
                         f"divisible by 4, not {shape}: use model.arch mlp (or auto)")
    if arch != "auto":
        return arch
    return "dcgan" if is_image else "mlp"


def build_networks(
    arch: str,
    data_shape: Sequence[int],
    latent_dim: int,
    num_classes: int | None = None,
    generator_kwargs: dict[str, Any] | None = None,
    discriminator_kwargs: dict[str, Any] | None = None,
) -> tuple[nn.Module, nn.Module]:
    """Return ``(generator, discriminator)`` for records of ``data_shape``.

    Data conventions: images are scaled to [-1, 1] (tanh output), table records to [0, 1]
    (sigmoid output, unless ``generator_kwargs`` says otherwise).
    """
    generator, discriminator = (DCGANGenerator, DCGANDiscriminator) if resolve_architecture(arch, data_shape) == "dcgan" \
        else (MLPGenerator, MLPDiscriminator)
    generator_kwargs = network_settings("model.generator_kwargs", generator, generator_kwargs)
    if len(data_shape) == 1:
        generator_kwargs.setdefault("output_activation", "sigmoid")
    discriminator_kwargs = network_settings("model.discriminator_kwargs", discriminator, discriminator_kwargs)
    return (generator(latent_dim, data_shape, num_classes=num_classes, **generator_kwargs),
            discriminator(data_shape, num_classes=num_classes, **discriminator_kwargs))
