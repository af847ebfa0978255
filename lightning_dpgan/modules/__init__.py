"""LightningModules: one model per file, networks kept in :mod:`lightning_dpgan.nets`."""
from lightning_dpgan.modules.base import GANModule
from lightning_dpgan.modules.gan import GAN
from lightning_dpgan.modules.wgan import WGAN

__all__ = ["GAN", "GANModule", "WGAN"]
