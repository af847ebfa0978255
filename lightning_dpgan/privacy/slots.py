"""Privacy slots: what a GAN module offers a privacy strategy to plug into.

A module names the one slot it has in ``GANModule.privacy_slot``. A strategy callback
(``lightning_dpgan.callbacks``) checks at ``setup`` that the module has its slot, then puts
its mechanism there (``module.privacy = mechanism``). The module calls the mechanism at the
single place where real records influence what is trained; with the slot empty
(``module.privacy is None``) it trains without privacy, and reports no epsilon (``null``).
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from torch import Tensor, nn
from torch.optim import Optimizer


class PrivacyBudgetExhausted(Exception):
    """Raised by a mechanism *instead of* answering when the answer would pass the privacy
    target; nothing was released. The module stops training when it sees it."""


@runtime_checkable
class GradientPrivatizer(Protocol):
    """DP-SGD on the networks that read real records (DPGAN, DP-CTGAN).

    The strategy ``attach``es the mechanism to the module's ``private_networks()``; the
    module passes their optimizer through ``wrap_optimizer`` (which adds Gaussian noise at
    ``step``), back-propagates per-record losses on real data through ``backward_real``
    (which clips each record's gradient), then per-record losses on generated data through
    ``backward_public`` (clipped alike, never noised), and runs every other pass that involves
    no real record (the generator's, through a frozen discriminator) inside ``public_pass()``.
    """

    def attach(self, network: nn.Module) -> None: ...

    def backward_real(self, per_record_losses: Tensor) -> None: ...

    def backward_public(self, per_record_losses: Tensor) -> None: ...

    def wrap_optimizer(self, optimizer: Optimizer) -> Optimizer: ...

    def public_pass(self) -> AbstractContextManager[None]: ...


@runtime_checkable
class LabelAggregator(Protocol):
    """Noisy aggregation of teacher votes into labels (PATE-GAN, PATE-CTGAN).

    ``aggregate`` may raise :class:`PrivacyBudgetExhausted` instead of answering."""

    def aggregate(self, votes: Tensor) -> Tensor: ...


@runtime_checkable
class GradientAggregator(Protocol):
    """Private aggregation of teachers' input-gradients (G-PATE)."""

    def aggregate(self, teacher_gradients: Tensor) -> Tensor: ...


@runtime_checkable
class GradientSanitizer(Protocol):
    """Clip + noise on the gradient flowing from the discriminator into the generator
    (GS-WGAN, DP-SACTGAN)."""

    def sanitize(self, generated: Tensor) -> Tensor: ...

