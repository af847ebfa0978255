"""DP-SGD: where the per-record gradient clipping and Gaussian noise of DPGAN happen.

Mechanism (Abadi et al. 2016), applied to every update of a network that reads real records:

- **Sensitivity.** Each real record's gradient is clipped to L2 norm ``C = max_grad_norm``.
  Under add/remove-one-record neighbours, the sum of clipped gradients changes by at most C.
- **Noise.** ``N(0, sigma^2 C^2 I)`` is added to that sum once per step, *always* -- also
  when Poisson sampling drew an empty batch (Opacus' optimizer would skip the noise then).
- **Averaging.** The noisy sum is divided by the *expected* batch size ``q * N``, a public
  constant, never by the number of records actually sampled.
- **Public part.** Gradients of passes that involve no real record (the discriminator's loss
  on generated records) are added after the noise without clipping: they are a function of
  parameters already released privately, so they cost no budget. They must not be paired
  with a real record's gradient inside one clipped row, or the sensitivity bound fails.

Per-sample gradients, clipping and noise are Opacus' (``GradSampleModule`` hooks and
``DPOptimizer``); this module only arranges where the public part goes. Accounting is the
subsampled Gaussian mechanism at sampling rate ``q`` (``OpacusAccountant``), stepped through
the optimizer's step hook, so the budget is charged exactly when noise is released.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.optim import Optimizer


class _PublicGradientDPOptimizer(DPOptimizer):
    """Opacus' ``DPOptimizer``, plus the public gradient, plus noise on empty batches."""

    def __init__(self, optimizer: Optimizer, mechanism: DPSGDMechanism, **kwargs) -> None:
        super().__init__(optimizer, **kwargs)
        self._mechanism = mechanism

    def _ensure_per_sample_gradients(self) -> None:
        """An empty real batch leaves no per-sample gradients: stand in zero rows so that
        the clipped sum is 0 and the noise is still drawn."""
        missing = [p for p in self.params if p.grad_sample is None]
        if missing and len(missing) < len(self.params):
            raise RuntimeError(
                "some discriminator parameters have no per-sample gradient: a real-data pass "
                "bypassed the DP-SGD hooks (is a layer unsupported by Opacus?)"
            )
        for p in missing:
            p.grad_sample = torch.zeros((0, *p.shape), device=p.device, dtype=p.dtype)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        if closure is not None:
            with torch.enable_grad():
                closure()
        self._ensure_per_sample_gradients()
        if not self.pre_step():  # clip, sum, add noise, divide by the expected batch size
            return None
        for p, public in zip(self.params, self._mechanism.pop_public_gradients()):
            if public is not None:
                p.grad.add_(public)
        return self.original_optimizer.step()

    def zero_grad(self, set_to_none: bool = False) -> None:
        super().zero_grad(set_to_none)
        self._mechanism.pop_public_gradients()


class DPSGDMechanism:
    """Fills a module's ``GradientPrivatizer`` slot (see :mod:`lightning_dpgan.privacy.slots`).

    Args:
        noise_multiplier: sigma; the noise standard deviation is ``sigma * max_grad_norm``.
        max_grad_norm: C, the bound on each real record's gradient norm.
        expected_batch_size: ``q * N``, the divisor of the noisy sum.
        on_noisy_step: called once each time noise is released (the accountant's step).
    """

    def __init__(
        self,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: int,
        on_noisy_step: Callable[[], None] | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if noise_multiplier < 0 or max_grad_norm <= 0 or expected_batch_size < 1:
            raise ValueError("need noise_multiplier >= 0, max_grad_norm > 0 and expected_batch_size >= 1")
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.expected_batch_size = int(expected_batch_size)
        self.on_noisy_step = on_noisy_step
        self.generator = generator
        self._hooks: GradSampleModule | None = None
        self._params: list[nn.Parameter] = []
        self._public: list[torch.Tensor | None] | None = None

    # -------------------------------------------------------- the slot's methods
    def attach(self, network: nn.Module) -> None:
        """Install per-sample-gradient hooks on ``network``'s layers (the network object and
        its parameter names stay as they are, so checkpoints load with or without privacy)."""
        if self._hooks is not None:
            raise RuntimeError("this DP-SGD mechanism is already attached to a network")
        self._hooks = GradSampleModule(network, batch_first=True, loss_reduction="mean", strict=True)
        self._params = [p for p in network.parameters() if p.requires_grad]

    def wrap_optimizer(self, optimizer: Optimizer) -> Optimizer:
        if self._hooks is None:
            raise RuntimeError("attach the DP-SGD mechanism to a network before wrapping its optimizer")
        wrapped = _PublicGradientDPOptimizer(
            optimizer,
            mechanism=self,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=self.expected_batch_size,
            loss_reduction="mean",
            generator=self.generator,
        )
        if self.on_noisy_step is not None:
            callback = self.on_noisy_step
            wrapped.attach_step_hook(lambda _optimizer: callback())
        return wrapped

    @contextmanager
    def public_pass(self) -> Iterator[None]:
        """Passes in here record no per-sample gradients; their ordinary gradients are set
        aside and added to the noisy clipped sum at the next step."""
        assert self._hooks is not None, "attach() first"
        before = [None if p.grad is None else p.grad.detach().clone() for p in self._params]
        self._hooks.disable_hooks()
        try:
            yield
        finally:
            self._hooks.enable_hooks()
            self._set_aside(before)

    def pop_public_gradients(self) -> list[torch.Tensor | None]:
        public, self._public = self._public, None
        return public if public is not None else [None] * len(self._params)

    # ------------------------------------------------------------------ helpers
    def _set_aside(self, before: list[torch.Tensor | None]) -> None:
        """Move what the public pass added to ``.grad`` into the public store."""
        store = self._public if self._public is not None else [None] * len(self._params)
        for index, (p, old) in enumerate(zip(self._params, before)):
            if p.grad is None:
                continue
            added = p.grad.detach() - old if old is not None else p.grad.detach().clone()
            store[index] = added if store[index] is None else store[index] + added
            p.grad = old
        self._public = store
