"""LightningDataModules for the datasets users name with --dataset.

Each is offered here by its class name (``AdultDataModule``, ``MNISTDataModule``, ...), with the
two base classes a dataset of your own can build on, imported on first use
(:mod:`lightning_dpgan.lazy_exports`).
"""
from lightning_dpgan import registry
from lightning_dpgan.lazy_exports import lazy_exports, registry_targets

_LAZY = {
    **registry_targets(registry.DATASETS.values(), __name__),
    "TabularDataModule": "lightning_dpgan.datamodules.tabular:TabularDataModule",
    "IDXImageDataModule": "lightning_dpgan.datamodules.images:IDXImageDataModule",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ = list(_LAZY)
