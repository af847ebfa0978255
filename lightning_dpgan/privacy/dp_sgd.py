"""DP-SGD: where the per-record gradient clipping and Gaussian noise of DPGAN happen.

Mechanism (Abadi et al. 2016), applied to every update of a network that reads real records:

- **Sensitivity.** Each real record's gradient is clipped to L2 norm ``C = max_grad_norm``.
  Under add/remove-one-record neighbours, the sum of clipped gradients changes by at most C.
- **Noise.** ``N(0, sigma^2 C^2 I)`` is added to that sum once per step, *always* -- also
  when Poisson sampling drew an empty batch (Opacus' optimizer would skip the noise then).
  It is drawn from the mechanism's own generator, seeded from OS entropy, never from the
  run's ``--seed`` (:mod:`lightning_dpgan.privacy.noise_source`).
- **Averaging.** The noisy sum is divided by the *expected* batch size ``q * N``, a public
  constant, never by the number of records actually sampled.
- **Public part.** The discriminator's loss on generated records involves no real record: its
  gradient is a function of parameters already released privately, so it costs no budget and
  is added after the noise. Each generated record's gradient is still clipped to the same C
  (``backward_public``), for utility, not privacy: much of a critic's per-record gradient does
  not depend on the input (biases, normalisation scales and shifts). Without privacy those
  parts cancel between the real and the generated halves; with only the real half clipped
  they do not, and the critic drifts to a constant (measured on DPGAN's MNIST preset: 99.6 %
  of a generated record's gradient norm was input-independent, and the critic's loss sat at
  0 from step ~1,600). A generated record's gradient must never share a clipped row with a
  real record's, or the sensitivity bound fails; so the two halves are clipped apart.

**Several processes (DDP, ``--strategy ddp``).** Each rank Poisson-samples its own shard of
the records at the same rate ``q`` (together: one Poisson sample of the N records), clips its
records' gradients and sums them; rank 0 alone adds the noise; the ranks' results are added up
and divided by ``q * N``: the single-process release, noise drawn once (Opacus'
``DistributedDPOptimizer``; the public gradients are averaged over the ranks).

Per-sample clipping and noise are Opacus', in one of two modes:

- ``hooks``: ``GradSampleModule`` materialises each record's gradient, ``DPOptimizer`` clips.
- ``ghost``: ``GradSampleModuleFastGradientClipping`` computes each record's gradient *norm*
  without materialising the gradient (ghost clipping, Li et al. 2022; Bu et al. 2023), then a
  second backward pass of the re-weighted losses gives the clipped sum. Opacus 1.6 has ghost
  norms for Linear and Embedding layers only.

``auto`` picks ghost when every layer with parameters has a ghost norm (MLP critics: measured
~2.3x a non-private step against ~23x for hooks) and hooks otherwise (convolutional critics:
~2x). Accounting is the subsampled Gaussian mechanism at sampling rate ``q``
(``OpacusAccountant``), stepped through the optimizer's step hook, so the budget is charged
exactly when noise is released.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from opacus import GradSampleModule
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.optimizers import (
    DistributedDPOptimizer,
    DistributedDPOptimizerFastGradientClipping,
    DPOptimizer,
    DPOptimizerFastGradientClipping,
)
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from torch import Tensor, nn
from torch.optim import Optimizer

from lightning_dpgan.distributed import is_distributed, world_size
from lightning_dpgan.privacy.noise_source import NoiseSource


@contextmanager
def hook_warning_silenced() -> Iterator[None]:
    """PyTorch warns when a full backward hook fires on a module whose inputs need no gradient:
    a first layer fed records, in every network DP-SGD trains. Opacus' per-record hooks read
    the gradient of the layer's output, which is there; the warning says nothing about this use
    and only buried each run's log. Silenced for that message alone, around our backward passes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with "
                                "respect to module outputs since no inputs require gradients", category=UserWarning)
        yield


MODES = ("auto", "hooks", "ghost")


def ghost_clipping_supported(network: nn.Module) -> bool:
    """True when every layer holding parameters has an Opacus ghost-norm function."""
    supported = tuple(GradSampleModuleFastGradientClipping.NORM_SAMPLERS)
    layers = [m for m in network.modules() if any(True for _ in m.parameters(recurse=False))]
    return bool(layers) and all(isinstance(m, supported) for m in layers)


def refuse_layers_opacus_cannot_clip(network: nn.Module) -> None:
    """A layer whose output mixes the records of a batch (BatchNorm's batch statistics) has no
    per-record gradient to clip: Opacus refuses it with a list of its own errors. Said here with
    the layer's name and what to use instead."""
    mixing = [f"'{name}' ({type(module).__name__})" for name, module in network.named_modules()
              if isinstance(module, nn.modules.batchnorm._BatchNorm)]  # with or without parameters of its own
    errors = [] if mixing else GradSampleModule.validate(network, strict=False)
    if not mixing and not errors:
        return
    named = (f"{', '.join(mixing)} normalize{'s' if len(mixing) == 1 else ''} with the batch's statistics, which mix "
             "the records, so no record's gradient can be clipped on its own" if mixing
             else "; ".join(str(error).strip() for error in errors))
    raise ValueError(f"DP-SGD cannot train this critic: {named}. Use GroupNorm or LayerNorm, or no normalization "
                     "(opacus.validators.ModuleValidator.fix(network) replaces BatchNorm with GroupNorm)")


def _same_gradient(grad: Tensor | None, kept: Tensor | None) -> bool:
    """Whether a parameter's gradient is still ``kept`` (None and all zeros count as none)."""
    if grad is None or kept is None:
        other = kept if grad is None else grad
        return other is None or not bool(other.ne(0).any())
    return bool(((grad == kept) | (grad.isnan() & kept.isnan())).all())  # a diverged critic's NaN is still its own


class _PublicGradientMixin:
    """The step of both Opacus DP optimizers, plus the public gradient and empty batches:
    ``pre_step`` (sum of clipped gradients + noise, divided by the expected batch size),
    then the public gradient added whole, then the wrapped optimizer's step."""

    _mechanism: DPSGDMechanism
    #: True for the distributed variants: they combine the ranks' gradients themselves (read
    #: by ``PrivateDDPStrategy``, which then leaves them alone)
    reduces_gradients: bool = False

    def _fill_empty_batch(self) -> None:
        raise NotImplementedError

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        if closure is not None:
            with torch.enable_grad():
                closure()
        self._mechanism.check_real_passes()
        self._fill_empty_batch()
        if not self.pre_step():
            return None
        for p, public in zip(self.params, self._mechanism.pop_public_gradients()):
            if public is not None:
                p.grad.add_(public)
        if self.reduces_gradients:
            self.reduce_gradients()  # Opacus' distributed optimizers: sum over ranks, / world size
        return self.original_optimizer.step()

    def zero_grad(self, set_to_none: bool = False) -> None:
        super().zero_grad(set_to_none)
        if self._mechanism.inside_real_pass:  # Opacus' ghost clipping, between its two passes: a public
            return  # gradient set aside before the real pass stays, as in hooks mode
        self._mechanism.pop_public_gradients()
        self._mechanism.forget_real_passes()  # a real pass thrown away may be made again


def _refuse_partial(missing: list, total: int) -> None:
    if missing and len(missing) < total:
        raise RuntimeError(
            "some discriminator parameters have no per-sample gradient: a real-data pass "
            "bypassed the DP-SGD hooks (is a layer unsupported by Opacus?)"
        )


class _HooksDPOptimizer(_PublicGradientMixin, DPOptimizer):
    def __init__(self, optimizer: Optimizer, mechanism: DPSGDMechanism, **kwargs) -> None:
        super().__init__(optimizer, **kwargs)
        self._mechanism = mechanism

    def _fill_empty_batch(self) -> None:
        """No real record: zero rows of per-sample gradients, so the sum is 0 and the noise
        is still drawn (Opacus would otherwise skip the noise)."""
        missing = [p for p in self.params if p.grad_sample is None]
        _refuse_partial(missing, len(self.params))
        for p in missing:
            p.grad_sample = torch.zeros((0, *p.shape), device=p.device, dtype=p.dtype)


class _GhostDPOptimizer(_PublicGradientMixin, DPOptimizerFastGradientClipping):
    def __init__(self, optimizer: Optimizer, mechanism: DPSGDMechanism, **kwargs) -> None:
        super().__init__(optimizer, **kwargs)
        self._mechanism = mechanism

    def _fill_empty_batch(self) -> None:
        """No real record: a zero clipped sum, so the noise is still drawn."""
        missing = [p for p in self.params if p.grad is None]
        _refuse_partial(missing, len(self.params))
        for p in missing:
            p.grad = torch.zeros_like(p)


class _DistributedHooksDPOptimizer(_HooksDPOptimizer, DistributedDPOptimizer):
    """Under DDP: noise on rank 0 only, then the ranks' noisy sums added up (Opacus)."""

    reduces_gradients = True


class _DistributedGhostDPOptimizer(_GhostDPOptimizer, DistributedDPOptimizerFastGradientClipping):
    """Under DDP, ghost clipping: noise on rank 0 only, then the ranks' sums added up (Opacus)."""

    reduces_gradients = True


class DPSGDMechanism:
    """Fills a module's ``GradientPrivatizer`` slot (see :mod:`lightning_dpgan.privacy.slots`).

    Args:
        noise_multiplier: sigma; the noise standard deviation is ``sigma * max_grad_norm``.
        max_grad_norm: C, the bound on each real record's gradient norm.
        expected_batch_size: ``q * N``, the divisor of the noisy sum.
        on_noisy_step: called once each time noise is released (the accountant's step).
        noise: where the Gaussian noise is drawn from (default: its own generator seeded from OS
            entropy; see :mod:`lightning_dpgan.privacy.noise_source`).
        mode: ``auto``, ``hooks`` or ``ghost`` (see the module docstring).
    """

    def __init__(
        self,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: int,
        on_noisy_step: Callable[[], None] | None = None,
        noise: NoiseSource | None = None,
        mode: str = "auto",
    ) -> None:
        if noise_multiplier < 0 or max_grad_norm <= 0 or expected_batch_size < 1:
            raise ValueError("need noise_multiplier >= 0, max_grad_norm > 0 and expected_batch_size >= 1")
        if mode not in MODES:
            raise ValueError(f"grad_sample_mode must be one of {MODES}, got {mode!r}")
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.expected_batch_size = int(expected_batch_size)
        self.on_noisy_step = on_noisy_step
        self.noise = noise or NoiseSource()
        self.requested_mode = mode
        self.mode: str | None = None  # the mode that runs, fixed by attach()
        self._hooks: GradSampleModule | GradSampleModuleFastGradientClipping | None = None
        self._optimizer: Optimizer | None = None
        self._params: list[nn.Parameter] = []
        self._public: list[torch.Tensor | None] | None = None
        self._real_passes = 0  # backward_real calls since the last optimizer step
        self.inside_real_pass = False  # while Opacus' ghost clipping runs its two passes
        self._real_gradient: list[Tensor | None] | None = None  # ghost: the gradient backward_real left

    # -------------------------------------------------------- the slot's methods
    def attach(self, network: nn.Module) -> None:
        """Install Opacus' per-sample hooks on ``network``'s layers. The hook holder is kept
        here, not registered on the LightningModule, so parameter names and checkpoints are the
        same with or without privacy."""
        if self._hooks is not None:
            raise RuntimeError("this DP-SGD mechanism is already attached to a network")
        refuse_layers_opacus_cannot_clip(network)
        ghost_ok = ghost_clipping_supported(network)
        if self.requested_mode == "ghost" and not ghost_ok:
            raise ValueError("grad_sample_mode 'ghost' needs a critic made of Linear/Embedding layers; use 'hooks' or 'auto'")
        self.mode = "ghost" if self.requested_mode == "ghost" or (self.requested_mode == "auto" and ghost_ok) else "hooks"
        if self.mode == "ghost":
            self._hooks = GradSampleModuleFastGradientClipping(
                network, batch_first=True, loss_reduction="mean", strict=True,
                max_grad_norm=self.max_grad_norm, use_ghost_clipping=True,
            )
        else:
            self._hooks = GradSampleModule(network, batch_first=True, loss_reduction="mean", strict=True)
            self._hooks.forbid_grad_accumulation()  # a second real pass per step would be mis-clipped
        self._params = [p for p in network.parameters() if p.requires_grad]

    def detach(self) -> None:
        """Remove Opacus' hooks when training is over, so later passes (e.g. predictions of a
        trained model) record nothing."""
        if self._hooks is not None:
            self._hooks.remove_hooks()

    def wrap_optimizer(self, optimizer: Optimizer) -> Optimizer:
        if self._hooks is None:
            raise RuntimeError("attach the DP-SGD mechanism to a network before wrapping its optimizer")
        if is_distributed():
            cls = _DistributedGhostDPOptimizer if self.mode == "ghost" else _DistributedHooksDPOptimizer
        else:
            cls = _GhostDPOptimizer if self.mode == "ghost" else _HooksDPOptimizer
        self._optimizer = cls(
            optimizer,
            mechanism=self,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            # per rank: the ranks' (sum / (qN / W)) are added up and divided by W (Opacus)
            expected_batch_size=self.expected_batch_size / world_size(),
            loss_reduction="mean",
            generator=self.noise.generator(self._params[0].device),  # on the parameters' device, as Opacus draws
        )
        if self.on_noisy_step is not None:
            callback = self.on_noisy_step
            self._optimizer.attach_step_hook(lambda _optimizer: callback())
        return self._optimizer

    def backward_real(self, per_record_losses: Tensor) -> None:
        """Back-propagate the mean loss over real records, clipping each record's share.

        hooks: one backward, per-sample gradients recorded for the optimizer to clip.
        ghost: Opacus' two passes (norms, then the clipped sum into ``.grad``).
        """
        if self._optimizer is None:  # ghost: an AttributeError in Opacus; hooks: "not compatible with grad accumulation"
            raise RuntimeError("backward_real before wrap_optimizer: pass the critic's optimizer through the mechanism's "
                               "wrap_optimizer (in configure_optimizers) and step that one: it clips and noises")
        if self.mode == "ghost" and self._real_passes:  # hooks: Opacus' forbid_grad_accumulation refuses it
            raise RuntimeError("a second real-data pass before the optimizer step: each record's gradient would be "
                               "clipped once a pass, so one record could move the critic by twice the clipping "
                               "bound. Back-propagate all of a step's real records in one backward_real")
        with hook_warning_silenced():
            if self.mode == "ghost":
                self.inside_real_pass = True
                try:
                    DPTensorFastGradientClipping(self._hooks, self._optimizer, per_record_losses, "mean").backward()
                finally:
                    self.inside_real_pass = False
                self._real_gradient = [None if p.grad is None else p.grad.detach().clone() for p in self._params]
            else:
                per_record_losses.mean().backward()
        self._real_passes += 1

    def check_real_passes(self) -> None:
        """At each optimizer step. In ghost mode each record's gradient is clipped in
        ``backward_real`` alone (Opacus' fast gradient clipping clips nothing at the step): a
        gradient that reached the critic by a plain backward would be noised unclipped, and
        charged as private. (In hooks mode any backward records per-record gradients, which the
        step clips.)"""
        passes, real = self._real_passes, self._real_gradient
        self.forget_real_passes()
        if self.mode != "ghost":
            return
        # the clipped real gradient, as backward_real left it (public passes put .grad back as they found it)
        expected = real if passes else [None] * len(self._params)
        if any(not _same_gradient(p.grad, kept) for p, kept in zip(self._params, expected)):
            raise RuntimeError("the critic's gradient at this optimizer step did not come through the DP-SGD mechanism's "
                               "backward_real: in ghost mode each record's gradient is clipped there alone, so it would "
                               "be noised unclipped and charged as private. Back-propagate the real records' per-record "
                               "losses with backward_real, the generated records' with backward_public, and any other "
                               "pass through the critic inside public_pass()")

    def forget_real_passes(self) -> None:
        """The optimizer's step or ``zero_grad``: the real passes made so far are spent or dropped."""
        self._real_passes, self._real_gradient = 0, None

    def backward_public(self, per_record_losses: Tensor) -> None:
        """Back-propagate the mean loss over generated records, each record's gradient clipped
        to C like a real record's, and set it aside as public (no noise, no budget).

        Clipping both halves alike lets their input-independent parts cancel (module docstring).
        One pass with Opacus' hooks on gives each record's gradient norm (its plain gradient is
        thrown away). hooks: that pass also left each record's gradient, so the clipped mean is
        ``sum_i min(1, C / norm_i) * g_i / n`` from them directly. ghost: only the norms are
        there, so a second pass back-propagates the losses re-weighted by ``min(1, C / norm_i)``
        with the hooks off.
        """
        assert self._hooks is not None, "attach() first"
        n = per_record_losses.shape[0]
        if n == 0:
            return
        before = [None if p.grad is None else p.grad.detach().clone() for p in self._params]
        real_state = self._take_per_sample_state()
        try:
            with hook_warning_silenced():
                per_record_losses.mean().backward(retain_graph=self.mode == "ghost")
            factors = (self.max_grad_norm / (self._per_record_norms(n) + 1e-6)).clamp(max=1.0).detach()
            if self.mode == "hooks":
                clipped_mean = [torch.tensordot(factors, p.grad_sample.detach(), dims=1) / n for p in self._params]
        finally:
            self._put_per_sample_state(real_state)
            for p, old in zip(self._params, before):
                p.grad = old
        if self.mode == "hooks":
            self._add_public(clipped_mean)
            return
        with self.public_pass():
            (factors * per_record_losses).sum().div(n).backward()

    @contextmanager
    def public_pass(self) -> Iterator[None]:
        """Passes in here record no per-sample gradients; their ordinary gradients are set
        aside and added to the noisy clipped sum at the next step."""
        assert self._hooks is not None, "attach() first"
        before = [None if p.grad is None else p.grad.detach().clone() for p in self._params]
        self._hooks.disable_hooks()
        try:
            with hook_warning_silenced():
                yield
        finally:
            self._hooks.enable_hooks()
            self._set_aside(before)

    def pop_public_gradients(self) -> list[torch.Tensor | None]:
        public, self._public = self._public, None
        return public if public is not None else [None] * len(self._params)

    # ------------------------------------------------------------------ helpers
    #: What Opacus' hooks leave on each parameter after a backward pass: per-record gradients
    #: (hooks mode) or their norms (ghost mode).
    _PER_SAMPLE_ATTRIBUTES = ("grad_sample", "_norm_sample")

    def _take_per_sample_state(self) -> list[dict[str, Tensor | None]]:
        """Take the real batch's per-record state off the parameters, so that a generated
        batch's backward pass neither mixes with it nor trips Opacus' accumulation check."""
        state = []
        for p in self._params:
            state.append({name: getattr(p, name, None) for name in self._PER_SAMPLE_ATTRIBUTES})
            for name in self._PER_SAMPLE_ATTRIBUTES:
                setattr(p, name, None)
        return state

    def _put_per_sample_state(self, state: list[dict[str, Tensor | None]]) -> None:
        for p, saved in zip(self._params, state):
            for name, value in saved.items():
                setattr(p, name, value)

    def _per_record_norms(self, n: int) -> Tensor:
        """Each record's gradient norm over all parameters, from the last backward pass."""
        if self.mode == "ghost":
            return self._hooks.get_norm_sample()
        per_parameter = [p.grad_sample.reshape(n, -1).norm(dim=1) for p in self._params if p.grad_sample is not None]
        if len(per_parameter) != len(self._params):
            raise RuntimeError("some discriminator parameters have no per-sample gradient for the generated records")
        return torch.stack(per_parameter).norm(dim=0)

    def _set_aside(self, before: list[torch.Tensor | None]) -> None:
        """Move what the public pass added to ``.grad`` into the public store."""
        added = []
        for p, old in zip(self._params, before):
            if p.grad is None:
                added.append(None)
                continue
            added.append(p.grad.detach() - old if old is not None else p.grad.detach().clone())
            p.grad = old
        self._add_public(added)

    def _add_public(self, gradients: list[torch.Tensor | None]) -> None:
        """Add one public gradient per parameter to the store emptied at the next step."""
        store = self._public if self._public is not None else [None] * len(self._params)
        for index, gradient in enumerate(gradients):
            if gradient is not None:
                store[index] = gradient if store[index] is None else store[index] + gradient
        self._public = store
