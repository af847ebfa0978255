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
