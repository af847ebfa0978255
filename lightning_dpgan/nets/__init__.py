"""Generator and discriminator architectures; modules pick one with :func:`build_networks`."""
from lightning_dpgan.nets.conditioning import one_hot_labels
from lightning_dpgan.nets.dcgan import DCGANDiscriminator, DCGANGenerator
from lightning_dpgan.nets.factory import ARCHITECTURES, build_networks
from lightning_dpgan.nets.mlp import MLPDiscriminator, MLPGenerator

__all__ = [
    "ARCHITECTURES",
    "DCGANDiscriminator",
    "DCGANGenerator",
    "MLPDiscriminator",
    "MLPGenerator",
    "build_networks",
    "one_hot_labels",
]

from lightning_dpgan.nets.ctgan import (  # noqa: E402 - appended: tabular (CTGAN-family) networks
    AuxiliaryMLP,
    CTGANDiscriminator,
    CTGANGenerator,
    apply_span_activations,
    span_logits,
)
from lightning_dpgan.nets.sactgan import SACTGANDiscriminator, SACTGANGenerator  # noqa: E402

__all__ += [
    "AuxiliaryMLP",
    "CTGANDiscriminator",
    "CTGANGenerator",
    "SACTGANDiscriminator",
    "SACTGANGenerator",
    "apply_span_activations",
    "span_logits",
]
