"""Gradient sanitizing hook (DP-HOOK of DP-SACTGAN, Algorithm 1; GS-WGAN, Chen et al. 2020):
where the sanitizer's noise is added.

The discriminator trains on real records without noise and is never released; the only path
from it to the generator is the gradient of the generator's loss with respect to the generated
records. A backward hook on those records rewrites that gradient before the generator sees it:

1. each generated record's gradient (one row of ``dL/dx`` for a batch of B records) is clipped
   to L2 norm ``C / B`` (a row holding NaN or inf is replaced by zeros first) -- ``C`` in units
   of a batch-mean loss, whose per-record gradients carry a factor ``1/B``. DP-HOOK's pseudo-code clips the gradient by its one L2 norm; clipping each
   record's row is what its Theorem 1's sensitivity (below) needs, so that is what is done;
2. Gaussian noise of standard deviation ``sigma * C / B`` is added to every entry.

Sensitivity. One real record can change the discriminator arbitrarily, so *every* row of the
released ``B x d`` gradient may change; each row moves by at most ``2C / B`` (from one vector of
norm ``<= C/B`` to another), so the whole tensor moves by at most ``sqrt(B) * 2C / B`` in L2.
With noise ``sigma * C / B`` per entry this Gaussian mechanism is
``(lambda, lambda * (4C^2/B) / (2 sigma^2 C^2 / B^2)) = (lambda, 2 B lambda / sigma^2)``-RDP per
generator step: DP-SACTGAN's Theorem 1. In units of the sensitivity the noise multiplier is
``sigma / (2 sqrt(B))`` (:func:`effective_noise_multiplier`), which is what the strategy charges a
:class:`~lightning_dpgan.privacy.accountants.GaussianAccountant`. Clipping holds whatever the
loss's reduction, so the guarantee does not depend on the loss being a mean.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from lightning_dpgan.privacy.noise_source import NoiseSource


def effective_noise_multiplier(noise_multiplier: float, batch_size: int) -> float:
    """The Gaussian noise multiplier, in units of the L2 sensitivity, of one sanitized batch."""
    return noise_multiplier / (2.0 * math.sqrt(batch_size))


def noise_multiplier_for(effective: float, batch_size: int) -> float:
    """The inverse of :func:`effective_noise_multiplier`: the multiplier whose sanitized batch of
    ``batch_size`` records has the ``effective`` one (a calibration's result)."""
    return effective * 2.0 * math.sqrt(batch_size)


class GradientSanitizerMechanism:
    """Fills a module's ``GradientSanitizer`` slot: ``sanitize(generated)`` before the critic."""

    def __init__(
        self,
        max_norm: float,
        noise_multiplier: float,
        on_release: Callable[[int], None] | None = None,
        noise: NoiseSource | None = None,
    ) -> None:
        if not max_norm > 0 or noise_multiplier < 0:
            raise ValueError(f"need max_norm > 0 and noise_multiplier >= 0, got {max_norm}, {noise_multiplier}")
        self.max_norm, self.noise_multiplier = float(max_norm), float(noise_multiplier)
        self.on_release = on_release
        self.noise = noise or NoiseSource()

    def sanitize(self, generated: Tensor) -> Tensor:
        """Return ``generated`` with the hook attached: its gradient is clipped and noised."""
        if generated.requires_grad:
            generated.register_hook(self._sanitize_gradient)
        return generated

    def _sanitize_gradient(self, gradient: Tensor) -> Tensor:
        batch = gradient.shape[0]
        bound = self.max_norm / batch
        rows = gradient.reshape(batch, -1)
        # a row with NaN or inf (a diverged critic: it trains on real rows without noise) becomes 0,
        # a function of the row alone: clipping it gave NaN, which told such a critic apart from a
        # finite one with certainty and broke the 2C/B bound
        rows = torch.where(rows.isfinite().all(dim=1, keepdim=True), rows, torch.zeros_like(rows))
        scale = (bound / (rows.norm(dim=1, keepdim=True) + 1e-10)).clamp(max=1.0)
        draws = torch.randn(rows.shape, generator=self.noise.generator(rows.device), device=rows.device, dtype=rows.dtype)
        released = rows * scale + self.noise_multiplier * bound * draws
        if self.on_release is not None:
            self.on_release(batch)
        return released.reshape(gradient.shape)


__all__ = ["GradientSanitizerMechanism", "effective_noise_multiplier"]
