"""``dpgan``: DPGAN (Xie et al. 2018) -- a WGAN whose critic is trained with DP-SGD.

The paper's Algorithm 1 adds Gaussian noise to the critic's gradients and clips the critic's
*weights*, bounding per-record gradients through the network's Lipschitz constant. Here the
per-record gradients are clipped explicitly (Opacus), which gives the sensitivity bound
directly and needs no assumption about the network; weight clipping stays, as the WGAN
critic's Lipschitz constraint. ``--model wgan --privacy dp-sgd`` composes the same thing.

Other departures from the paper: its Lemma 1 sets the noise for the critic steps of one outer
loop and states the guarantee for the data that loop reads; here every critic step of the run is
composed by the accountant (Opacus' RDP or PRV), which is what a guarantee for the whole
training needs. Its latent code is drawn from a bounded interval and both networks get an L2
weight penalty; here ``z ~ N(0, 1)`` (``--model.latent_distribution uniform`` draws U[0, 1]) and
RMSProp runs without weight decay.
"""
from __future__ import annotations

from typing import ClassVar

from lightning_dpgan.modules.wgan import WGAN


class DPGAN(WGAN):
    """DPGAN: WGAN critic (weight clipping, RMSProp) trained with DP-SGD (Xie et al. 2018)."""

    default_privacy: ClassVar[str] = "dp-sgd"
