"""``PrivateDDPStrategy``: what ``--strategy ddp`` runs, for private and non-private models alike.

Lightning's DDP wraps the module in ``torch.nn.parallel.DistributedDataParallel``, which
averages every gradient across processes during ``backward``. That is wrong for private
training twice over: DP-SGD must add noise once to the *sum* of clipped gradients of the
global batch (an average formed in backward would reach Opacus already mixed, and each rank
would noise it again), and PATE-style teachers are sharded (each rank trains its own slice of
the ensemble; there is nothing to average). A GAN also leaves the discriminator unused in the
generator step, which plain DDP refuses ("parameters that were not used").

So this strategy keeps Lightning's process group, launcher, distributed samplers and rank-0
checkpointing, but does not wrap the module. It broadcasts rank 0's parameters once at the
start and, at each ``optimizer.step()``, averages the gradients of that optimizer's parameters
across ranks -- except where the gradient is the privacy mechanism's to combine:

- an optimizer with ``reduces_gradients = True`` (Opacus' distributed DP optimizers: clipped
  sums added up, noise from rank 0 only) reduces its own gradients;
- parameters the module lists in ``process_local_parameters()`` (its shard of teachers) are
  never averaged nor broadcast.

Everything public (generator, PATE student, critics of a sanitizer model) is averaged, which is
exact data parallelism for the parts that need no privacy.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.optim import Optimizer

from lightning_dpgan.distributed import average_gradients, is_distributed

#: what ``--strategy`` values mean this strategy
DDP_NAMES = ("ddp",)
#: ``--strategy`` values a private run accepts: one process, or PrivateDDPStrategy
PRIVATE_TRAINER_STRATEGIES = ("auto", "single_device", *DDP_NAMES)


def process_local_parameters(module: Any) -> set[int]:
    """Ids of the parameters each rank owns alone (its shard of teachers)."""
    local = getattr(module, "process_local_parameters", None)
    return {id(p) for p in local()} if callable(local) else set()


class PrivateDDPStrategy(DDPStrategy):
    """Lightning DDP without the DistributedDataParallel wrapper; gradients are combined at each
    optimizer step, by the privacy mechanism where it owns them (see the module docstring)."""

    def configure_ddp(self) -> None:
        """No wrapper: every rank starts from rank 0's parameters and buffers instead."""
        module = self.lightning_module
        local = process_local_parameters(module)
        if is_distributed():
            with torch.no_grad():
                for tensor in [*module.parameters(), *module.buffers()]:
                    if id(tensor) not in local:
                        torch.distributed.broadcast(tensor.data, src=0)

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any],
                       model: L.LightningModule | torch.nn.Module | None = None, **kwargs: Any) -> Any:
        """Average the public gradients of ``optimizer``'s parameters across ranks, then step."""
        inner = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer's optimizer
        if not getattr(inner, "reduces_gradients", False):
            local = process_local_parameters(self.lightning_module)
            params = [p for group in inner.param_groups for p in group["params"] if id(p) not in local]
            average_gradients(params)
        return super().optimizer_step(optimizer, closure, model, **kwargs)


def resolve_strategy(name: Any) -> Any:
    """``--strategy ddp`` → :class:`PrivateDDPStrategy`; any other value goes to Lightning as given
    (a privacy strategy refuses other multi-process strategies: see ``PrivacyStrategy.setup``)."""
    return PrivateDDPStrategy() if isinstance(name, str) and name in DDP_NAMES else name


__all__ = ["DDP_NAMES", "PRIVATE_TRAINER_STRATEGIES", "PrivateDDPStrategy", "process_local_parameters", "resolve_strategy"]
