"""``gswgan``: a WGAN-GP whose generator learns only through sanitized gradients (GS-WGAN,
Chen, Orekondy & Fritz, NeurIPS 2020; the same hook is DP-SACTGAN's DP-HOOK).

The critic trains on real records without noise (WGAN-GP: gradient penalty 10, Adam with
betas (0, 0.9), 5 critic steps per generator step) and is never released. The generator's only
contact with it is the gradient of its loss with respect to the generated records, which the
GradientSanitizer slot clips per record and noises (``lightning_dpgan.privacy.gradient_sanitizer``).

GS-WGAN's amplified mode (``--privacy sanitizer --privacy.num_critics N``): the strategy has the
module build N critics (:meth:`GSWGAN.build_critics`), critic j trains only on partition j of the
training records, and every training step t is one iteration (:meth:`GSWGAN.training_step`):
critic ``t mod N`` (a public round-robin) takes ``discriminator_steps`` steps on minibatches of
its own partition, then one generator step queries, alone and through the sanitizer, a critic
the strategy's loader drew uniformly and secretly -- usually another one, answering with the
state its own round-robin turns left it in. Unlike GS-WGAN, which trains the selected critic
right before it answers, no critic's state then depends on the secret selections: that is what
makes the amplified guarantee compose (the analysis is the strategy's,
``callbacks/gradient_sanitizer.py``), at the price of answers from critics up to N - 1 generator
steps stale. With one critic (the default) the module is a plain WGAN-GP with the base class's
alternation.
"""
from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lightning_dpgan.distributed import from_rank_zero
from lightning_dpgan.modules.wgan import WGAN
from lightning_dpgan.privacy.slots import GradientSanitizer


#: where a CriticBank's critics are in the module's state dict
CRITICS_PREFIX = "discriminator.critics."


class CriticBank(nn.Module):
    """N critics of which one, :attr:`selected`, answers every call (the round-robin critic
    during its steps, the answering critic during the generator step).

    It takes the discriminator's place, so the base class's critic step, gradient penalty and
    generator step reach the selected critic without knowing there are others. One optimizer
    over all critics updates only the selected one: the others get no gradient (``zero_grad``
    sets gradients to None and Adam skips parameters without one), so each critic's Adam state
    advances only on its own steps, as with GS-WGAN's one optimizer per critic.

    Only the selected critic is ever trainable: the others stay frozen (``requires_grad``
    False) until selected, and :meth:`requires_grad_` (the generator step's freeze) acts on the
    selected one. The effect is the same as freezing them all -- they are in no graph -- but
    walking a thousand critics' parameters twice per generator step took ~55 ms on a CPU.
    """

    def __init__(self, critics: Sequence[nn.Module]) -> None:
        super().__init__()
        if len(critics) < 2:
            raise ValueError("a CriticBank holds at least two critics (one critic is the discriminator itself)")
        self.critics = nn.ModuleList(critics)
        self.selected = 0
        self._trainable = True
        for critic in self.critics[1:]:
            critic.requires_grad_(False)

    @property
    def num_critics(self) -> int:
        return len(self.critics)

    def select(self, index: int) -> nn.Module:
        """Make critic ``index`` the one that answers; returns it."""
        if not 0 <= index < self.num_critics:
            raise IndexError(f"critic {index} does not exist: there are {self.num_critics}")
        if index != self.selected:
            self.critics[self.selected].requires_grad_(False)
            self.selected = int(index)
            self.critics[self.selected].requires_grad_(self._trainable)
        return self.critics[self.selected]

    def requires_grad_(self, requires_grad: bool = True) -> CriticBank:
        """Freeze or unfreeze the selected critic (the others are always frozen)."""
        self._trainable = requires_grad
        self.critics[self.selected].requires_grad_(requires_grad)
        return self

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        return self.critics[self.selected](x, labels)

    @contextmanager
    def stepping_selected(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Within: ``optimizer`` (one parameter group over every critic) zeroes and steps the
        selected critic's parameters alone; on leaving, its gradients are dropped and the group
        holds every critic again.

        Why: ``zero_grad`` and Adam's ``step`` walk every tensor of their group to find those
        with a gradient -- 8,000 for the MNIST preset's 1000 critics, six times an iteration,
        about 40 ms of an iteration on a CPU core, whatever the device. What they compute is
        unchanged: the other critics have no gradient, and each critic's Adam state is keyed by
        its own tensors, so it advances only on that critic's steps. Outside the context the
        group is whole, so a checkpoint holds every critic's optimizer state. Select the critic
        before entering and keep it selected inside.
        """
        inner = getattr(optimizer, "optimizer", optimizer)  # Lightning wraps the optimizer it returns
        if len(inner.param_groups) != 1:
            raise ValueError(f"the critics' optimizer must hold one parameter group, not {len(inner.param_groups)}")
        group = inner.param_groups[0]
        every_critic, critic = group["params"], self.critics[self.selected]
        group["params"] = list(critic.parameters())
        try:
            yield
        finally:
            group["params"] = every_critic
            critic.zero_grad(set_to_none=True)


def fresh_copy(network: nn.Module) -> nn.Module:
    """An independently initialised network of the same architecture (every layer that knows
    how to re-initialise itself does; the nets here use PyTorch's default initialisation)."""
    twin = copy.deepcopy(network)
    for layer in twin.modules():
        if hasattr(layer, "reset_parameters"):
            layer.reset_parameters()
    return twin


class GSWGAN(WGAN):
    """GS-WGAN: WGAN-GP critic(s) trained freely; the generator's gradients are sanitized."""

    privacy_slot: ClassVar[type | None] = GradientSanitizer
    default_privacy: ClassVar[str] = "sanitizer"

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        lr_generator: float = 1e-4,
        lr_discriminator: float = 1e-4,
        gradient_penalty: float = 10.0,
        num_critics: int = 1,
        **kwargs: Any,
    ) -> None:
        """``num_critics`` is the sanitizer strategy's to set (``--privacy.num_critics``, through
        :meth:`build_critics`); it is saved with the hyper-parameters so that a checkpoint
        rebuilds its critics when loaded."""
        if gradient_penalty <= 0:
            raise ValueError("gswgan's critic needs a gradient penalty > 0 (it has no weight clipping)")
        super().__init__(data_shape, num_classes, lr_generator=lr_generator, lr_discriminator=lr_discriminator,
                         gradient_penalty=gradient_penalty, **kwargs)
        self.save_hyperparameters()
        self.build_critics(num_critics)

    # ------------------------------------------------------------------ critics
    @property
    def num_critics(self) -> int:
        return self.discriminator.num_critics if isinstance(self.discriminator, CriticBank) else 1

    @property
    def critics(self) -> list[nn.Module]:
        """The critics, in partition order (one: the discriminator)."""
        return list(self.discriminator.critics) if isinstance(self.discriminator, CriticBank) else [self.discriminator]

    def build_critics(self, num_critics: int) -> list[nn.Module]:
        """Give the module ``num_critics`` critics (once; the strategy calls it at install, before
        the optimizers exist). The current discriminator becomes critic 0, the others are fresh,
        independently initialised copies of its architecture. One critic changes nothing.

        A critic's forward pass must not change its state (no BatchNorm running statistics): the
        answering critic, drawn in secret, runs forward in the generator step without training,
        and only its round-robin turns may change it."""
        if isinstance(num_critics, bool) or int(num_critics) != num_critics or num_critics < 1:
            raise ValueError(f"num_critics must be an integer >= 1, got {num_critics}")
        num_critics = int(num_critics)
        if num_critics != self.num_critics:
            if self.num_critics > 1:
                raise ValueError(f"this model already has {self.num_critics} critics, not {num_critics}: give the "
                                 f"strategy as many (--privacy.num_critics {self.num_critics}; from Python "
                                 f"GradientSanitizer(num_critics={self.num_critics}, ...)), or build the module with "
                                 f"num_critics={num_critics}")
            critic = self.discriminator
            if any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in critic.modules()):
                # the answering critic's forward pass would update them: a state that records the secret selection
                raise ValueError("GS-WGAN's critics must not keep running statistics (BatchNorm): use GroupNorm or LayerNorm")
            self.discriminator = CriticBank([critic] + [fresh_copy(critic) for _ in range(num_critics - 1)])
        self.set_hparam("num_critics", num_critics)
        return self.critics

    @classmethod
    def leave_out_for_sampling(cls, checkpoint: dict[str, Any]) -> None:
        """The critics never reach the generator's samples, and a thousand of them (the MNIST
        preset's) are ~600 MB to build and fill: a module loaded to sample keeps critic 0 alone,
        as its single discriminator."""
        checkpoint.setdefault("hyper_parameters", {})["num_critics"] = 1
        first, kept = f"{CRITICS_PREFIX}0.", {}
        for name, value in checkpoint.get("state_dict", {}).items():
            if name.startswith(first):
                kept["discriminator." + name[len(first):]] = value
            elif not name.startswith(CRITICS_PREFIX):
                kept[name] = value
        checkpoint["state_dict"] = kept

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and self.num_critics > 1 and self.privacy is None:
            raise ValueError(f"{self.num_critics} critics train only under their partitions: run with "
                             f"--privacy sanitizer --privacy.num_critics {self.num_critics}")

    # ----------------------------------------------------------------- training
    @property
    def generator_updates(self) -> int:
        """N critics: one generator step per training step (its critic's steps are within it)."""
        return self.train_steps if self.num_critics > 1 else super().generator_updates

    def generator_updates_every_step(self, num_critics: Any = None) -> bool:
        """N critics (the strategy's, built at install, or this model's own)."""
        critics = num_critics if isinstance(num_critics, int) and not isinstance(num_critics, bool) else self.num_critics
        return critics > 1

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One critic: the base class's alternation. N critics: ``batch`` is one GS-WGAN
        iteration from the strategy's loader, ``{"critic": trained, "answer": answering,
        "records": [nD, b, ...], "labels": [nD, b] or None}``, whose ``trained`` must be the
        round-robin critic ``train_steps mod N`` (refused otherwise: the guarantee needs a
        training schedule that does not depend on the secret selection)."""
        if not (isinstance(batch, Mapping) and "critic" in batch):
            if self.num_critics > 1:
                raise RuntimeError("with several critics every batch must name its critic (the sanitizer strategy's loader)")
            return super().training_step(batch, batch_idx)
        trained = int(batch["critic"])
        # under DDP every rank's loader drew its own secret answer: rank 0's answers on all ranks
        answer = int(from_rank_zero(torch.tensor([int(batch["answer"])], device=self.device))[0])
        if trained != self.train_steps % self.num_critics:
            raise RuntimeError(f"training step {self.train_steps} belongs to critic {self.train_steps % self.num_critics} "
                               f"(round-robin over {self.num_critics}), and the batch trains critic {trained}")
        self.selected_critic_iteration(trained, answer, batch["records"], batch.get("labels"))
        return None

    def selected_critic_iteration(self, trained: int, answer: int, records: Tensor, labels: Tensor | None) -> None:
        """Critic ``trained`` takes one step on each of its minibatches ``records[t]`` (all from
        its own partition); then the generator takes one step through critic ``answer`` alone,
        which is not trained here (it may be ``trained`` itself, 1 time in N)."""
        self.discriminator.select(trained)
        n_generated = self.generated_batch_size or records.shape[1]
        with self.discriminator.stepping_selected(self.optimizers()[1]):
            for t in range(records.shape[0]):
                critic_loss = self.discriminator_step(records[t], None if labels is None else labels[t], n_generated)
        self.discriminator.select(answer)
        self.generator_step(n_generated)
        self.train_steps += 1
        # Only the trained critic's loss and the public round-robin index are logged: which critic
        # answered must stay secret from whoever sees the generator, logs travel further than
        # checkpoints (W&B, shared folders), and the generator's loss, computed by the answering
        # critic without noise, would tell critics apart by their output levels.
        self.log("loss/discriminator", critic_loss, prog_bar=True, batch_size=max(records.shape[1], 1))
        self.log("critic/trained", float(trained), batch_size=max(records.shape[1], 1))

    # -------------------------------------------------------------- checkpoints
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse, by name, a checkpoint trained with another number of critics (before Lightning
        fails on the parameter names)."""
        saved = int(checkpoint.get("hyper_parameters", {}).get("num_critics", 1) or 1)
        if saved != self.num_critics:
            raise ValueError(f"the checkpoint trained {saved} critic(s) and this run has {self.num_critics}: "
                             f"resume with --privacy.num_critics {saved} (from Python, GradientSanitizer(num_critics="
                             f"{saved}, ...) and a module built with num_critics={saved})")
        super().on_load_checkpoint(checkpoint)
