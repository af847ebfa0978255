"""lightning-dpgan: composable differentially private GANs on PyTorch Lightning."""

__version__ = "0.1.0"
