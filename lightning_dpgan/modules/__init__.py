"""LightningModules: one model per file, networks kept in :mod:`lightning_dpgan.nets`.

Every model ``--model`` names is offered here by its class name (``DPCTGAN``, ``PATEGAN``, ...),
imported on first use (:mod:`lightning_dpgan.lazy_exports`).
"""
from lightning_dpgan import registry
from lightning_dpgan.lazy_exports import lazy_exports, registry_targets
from lightning_dpgan.modules.base import GANModule
from lightning_dpgan.modules.gan import GAN
from lightning_dpgan.modules.wgan import WGAN

__all__ = ["GAN", "GANModule", "WGAN"]
_LAZY = {name: target for name, target in registry_targets(registry.MODELS.values(), __name__).items()
         if name not in __all__}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ += list(_LAZY)
