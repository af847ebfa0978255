"""``dpctgan``: DP-CTGAN (Rosenblatt et al. 2020, "Differentially private synthetic data:
applied evaluations and enhancements") -- CTGAN whose discriminator trains with DP-SGD.

Defaults are the paper's appendix: embedding (latent) 128, generator and discriminator (256, 256),
weight decay 1e-6, batch 500, ``pac = 1``, Wasserstein loss, sigma 5 and per-record clipping
norm 1 (the latter two are the DP-SGD strategy's, set in the presets). The gradient penalty is
off: DP-SGD clips per-record gradients, and a penalty's gradient-of-gradient is not one
(``--privacy dp-sgd`` refuses it); ``pac`` stays 1 because packing would let one record move
many clipped "samples" (see :meth:`CTGAN.setup`).

Everything else -- the mode-specific encoding's DP histogram, the conditions of real records,
training-by-sampling on the generator side -- is CTGAN's as adapted in
:mod:`lightning_dpgan.modules.conditional_table`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from lightning_dpgan.modules.ctgan import CTGAN


class DPCTGAN(CTGAN):
    """DP-CTGAN: CTGAN with its discriminator trained by DP-SGD (Opacus)."""

    default_privacy: ClassVar[str] = "dp-sgd"

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        pac: int = 1,
        gradient_penalty: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(data_shape, num_classes, pac=pac, gradient_penalty=gradient_penalty, **kwargs)
        self.save_hyperparameters()
