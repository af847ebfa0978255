"""``dpsactgan``: DP-SACTGAN ("A self-attention-based differentially private tabular GAN with
high data utility"): self-attention generator and discriminator with LayerNorm, CTAB-GAN+'s
encoding (mixed and long-tail columns), an auxiliary classifier, and DP-HOOK.

Privacy comes from the GradientSanitizer slot (DP-HOOK, ``--privacy sanitizer``): the
discriminator and the auxiliary classifier train on real records *without* noise and are never
released; the generator learns from them only through the gradient with respect to the
generated records, which the hook clips per record and noises once per generator step
(:mod:`lightning_dpgan.privacy.gradient_sanitizer`). Both networks' losses flow through the same
hooked tensor, so one sanitized release per step covers both.

The auxiliary network (CTAB-GAN+; the paper's "four intermediate layers and one output
prediction classification layer") predicts the label column from the other columns. It is
trained on real records in every discriminator step; in the generator step it scores the
generated records against their own generated label (cross-entropy for a categorical label,
squared error for a continuous one, whose encoding is a single scalar), which pushes the
generator to keep features and label consistent. The generated label is the target, held fixed:
the auxiliary term moves the generated features towards their label, never the label towards the
classifier's guess (a categorical label's argmax passes no gradient anyway; CTAB-GAN+'s
regression branch also moves a continuous label, our choice is to leave the label column to the
discriminator alone, as for categories). Tables without a label train without it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dpgan.argument_types import network_settings
from lightning_dpgan.modules.ctgan import CTGAN
from lightning_dpgan.nets.sactgan import AuxiliaryMLP, SACTGANDiscriminator, SACTGANGenerator
from lightning_dpgan.privacy.slots import GradientSanitizer


def label_span(layout: dict[str, Any]) -> tuple[int, int, str] | None:
    """``(start, width, kind)`` of the label's slots in the encoded record, or ``None``."""
    label = layout.get("label")
    if not label:
        return None
    return int(label["start"]), int(label["width"]), str(label["kind"])


#: why dpsactgan refuses a continuous label the encoding holds in several slots (mode-specific)
SCALAR_LABEL_ONLY = ("dpsactgan's auxiliary regressor predicts a continuous label as one scalar, but the encoding gives "
                     "it {slots}: use --data.label_encoding scalar")

class DPSACTGAN(CTGAN):
    """DP-SACTGAN: self-attention CTGAN with an auxiliary classifier, privatized by DP-HOOK."""

    privacy_slot: ClassVar[type | None] = GradientSanitizer
    default_privacy: ClassVar[str] = "sanitizer"

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        pac: int = 1,
        gradient_penalty: float = 10.0,
        classifier_hidden: Sequence[int] = (256, 256, 256, 256),
        classifier_weight: float = 1.0,
        lr_classifier: float = 2e-4,
        generator_kwargs: dict[str, Any] | None = None,
        discriminator_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if classifier_weight < 0:
            raise ValueError(f"classifier_weight must be non-negative, got {classifier_weight}")
        super().__init__(data_shape, num_classes, pac=pac, gradient_penalty=gradient_penalty,
                         generator_kwargs=generator_kwargs, discriminator_kwargs=discriminator_kwargs, **kwargs)
        self.save_hyperparameters()
        self.label = label_span(self.table_layout)
        self.classifier = None
        if self.label is not None:
            start, width, kind = self.label
            if kind == "continuous" and width != 1:
                raise ValueError(SCALAR_LABEL_ONLY.format(slots=f"{width} slots"))
            outputs = 1 if kind == "continuous" else width
            self.classifier = AuxiliaryMLP(self.data_shape[0] - width, outputs, hidden=tuple(classifier_hidden))

    def make_networks(self) -> tuple[nn.Module, nn.Module]:
        h = self.hparams
        if h.pac != 1:
            raise ValueError("dpsactgan's discriminator scores single records: pac must be 1")
        generator = SACTGANGenerator(h.latent_dim, self.cond_dim, self.spans, tau=h.gumbel_tau,
                                     **network_settings("model.generator_kwargs", SACTGANGenerator, h.generator_kwargs, ("tau",)))
        discriminator = SACTGANDiscriminator(self.data_shape[0], self.cond_dim, **network_settings(
            "model.discriminator_kwargs", SACTGANDiscriminator, h.discriminator_kwargs))
        return generator, discriminator

    def private_networks(self) -> dict[str, nn.Module]:
        networks = {"discriminator": self.discriminator}
        if self.classifier is not None:
            networks["classifier"] = self.classifier
        return networks

    # ------------------------------------------------------------- auxiliary net
    def _split_label(self, records: Tensor) -> tuple[Tensor, Tensor]:
        """(features without the label's slots, the label's slots)."""
        start, width, _ = self.label
        features = torch.cat([records[:, :start], records[:, start + width:]], dim=1)
        return features, records[:, start:start + width]

    def classifier_loss(self, records: Tensor) -> Tensor:
        """The auxiliary network's loss at predicting each record's own label from its features."""
        features, label = self._split_label(records)
        prediction = self.classifier(features)
        if self.label[2] == "continuous":
            return F.mse_loss(prediction.reshape(-1), label.detach().reshape(-1))
        return F.cross_entropy(prediction, label.detach().argmax(dim=1))

    def discriminator_step(self, real: Tensor, labels: Tensor | None, n_generated: int) -> Tensor:
        """The discriminator's update, then the auxiliary network's on the same real records."""
        loss = super().discriminator_step(real, labels, n_generated)
        if self.classifier is None:
            return loss
        with self.real_records_stream():  # its dropout masks number one per real record; an empty batch none
            if real.shape[0] > 0:
                opt_c = self.optimizers()[2]
                opt_c.zero_grad()
                classifier_loss = self.classifier_loss(real)
                self.manual_backward(classifier_loss)
                opt_c.step()
                self.log("loss/classifier", classifier_loss.detach(), batch_size=real.shape[0])
        return loss

    def adversarial_generator_loss(self, fake: Tensor, cond: Tensor | None) -> Tensor:
        """Discriminator loss plus the auxiliary loss, both through the one sanitized ``fake``."""
        loss = super().adversarial_generator_loss(fake, cond)
        if self.classifier is not None and self.hparams.classifier_weight > 0:
            loss = loss + self.hparams.classifier_weight * self.classifier_loss(fake)
        return loss

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        optimizers = super().configure_optimizers()
        if self.classifier is not None:
            h = self.hparams
            optimizers.append(torch.optim.Adam(self.classifier.parameters(), lr=h.lr_classifier, betas=(0.5, 0.9),
                                               weight_decay=h.weight_decay))
        return optimizers
