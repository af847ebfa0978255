"""A supervised model of a table's label trained by DP-SGD: QUAIL's classifier C(D, ε_C, r').

The mechanism is the one DPGAN's critic uses (:mod:`lightning_dpgan.privacy.dp_sgd`), run to
completion once, before the synthesizer trains:

- **Sensitivity.** Each real record's gradient is clipped to L2 norm ``max_grad_norm`` (Opacus'
  per-sample hooks); one record added or removed moves the sum of clipped gradients by at most
  that much.
- **Noise.** ``N(0, σ² C² I)`` on the sum at every step, empty batches included; σ is
  calibrated (Opacus' search) so that the planned ``epochs`` spend at most ``epsilon``.
- **Sampling.** Poisson, rate ``q = batch_size / N``: each record joins each batch independently
  with probability ``q`` (:class:`~lightning_dpgan.privacy.poisson_batches.PoissonBatches`, the
  law of Opacus' sampler at the cost of a batch instead of the table).
- **Accounting.** :class:`OpacusAccountant` (RDP of the subsampled Gaussian), charged at each
  noisy step; the cost returned is what it reports, never the target.

- **Target scale** (continuous labels only). ``scale_share`` of ε first releases the target's
  location and scale (:mod:`lightning_dpgan.privacy.dp_standardization`, Laplace, ε-DP); DP-SGD
  trains on the standardized target with the rest, and the released pair is folded back into
  the last layer's weights. The two parts compose by basic composition: the cost reported is
  their sum.

The model itself is public once trained: a linear layer (``logistic``: logistic regression
for a categorical label, linear regression for a continuous one, as the paper's DP logistic
regression) or a small MLP (``mlp``, the paper's DP-SGD neural network).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_dpgan.privacy.accountants.opacus_adapter import OpacusAccountant, calibrate_noise_multiplier
from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism
from lightning_dpgan.privacy.dp_standardization import LocationScale, dp_location_scale
from lightning_dpgan.privacy.noise_source import NoiseSource
from lightning_dpgan.privacy.poisson_batches import PoissonBatches
from lightning_dpgan.privacy.validation import validate_positive

ARCHITECTURES = ("logistic", "mlp")


def label_network(architecture: str, in_features: int, out_features: int, hidden: list[int]) -> nn.Sequential:
    """The label model's layers: one linear map, or an MLP with ReLU between ``hidden`` layers."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"label model must be one of {ARCHITECTURES}, got {architecture!r}")
    widths = [in_features, *(hidden if architecture == "mlp" else []), out_features]
    layers: list[nn.Module] = []
    for index, (width_in, width_out) in enumerate(zip(widths[:-1], widths[1:])):
        if index:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(width_in, width_out))
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class DPSGDSettings:
    """How the label model is trained; ``epochs`` is what σ is calibrated for, ``scale_share`` the
    part of ε a continuous target's location and scale cost (0: train on the raw encoding).

    They are QUAIL's ``quail`` settings, so a refusal names the ``--quail.*`` flag that gave them."""

    epochs: int = 10
    batch_size: int = 256
    lr: float = 0.01
    max_grad_norm: float = 1.0
    scale_share: float = 0.1

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--quail.{name} must be an integer >= 1, got {value!r}")
        validate_positive("--quail.lr", self.lr)
        validate_positive("--quail.max_grad_norm", self.max_grad_norm)
        share = self.scale_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share < 1.0:
            raise ValueError(f"--quail.scale_share must be in [0, 1), got {share!r}")


def per_record_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy against a one-hot label block; squared error against a scalar label.

    A blank label block (all zeros: a class outside the schema, kept so that the record count
    does not depend on it) has no class to learn: its loss is 0, so the record's gradient is
    0, rather than the first class's (``argmax`` of zeros)."""
    if targets.shape[1] == 1:
        return (outputs - targets).pow(2).squeeze(1)
    return nn.functional.cross_entropy(outputs, targets.argmax(dim=1), reduction="none") * targets.sum(dim=1)


def fold_into_last_layer(network: nn.Module, standardization: LocationScale) -> None:
    """Make ``network`` output ``location + scale * output`` (the target's own encoding) by
    rescaling its last linear layer: the released model keeps its architecture."""
    last = [layer for layer in network.modules() if isinstance(layer, nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(standardization.scale)
        last.bias.mul_(standardization.scale).add_(standardization.location)


def check_label_model_batch(batch_size: int, train_records: int) -> None:
    """The Poisson rate batch / records is a probability: a batch above the records has none."""
    if batch_size > train_records:
        raise ValueError(f"--quail.batch_size {batch_size} exceeds the {train_records} training records: "
                         "give QUAIL a smaller --quail.batch_size")


def train_dp_label_model(
    network: nn.Module,
    features: Tensor,
    targets: Tensor,
    epsilon: float,
    delta: float,
    settings: DPSGDSettings,
    noise_seed: int | None = None,
) -> dict[str, Any]:
    """Train ``network`` (features -> label block) in place by DP-SGD at (``epsilon``, ``delta``)
    for add/remove neighbours; return its cost, with what is needed to recompute it.

    A continuous target (one column) is first standardized by its DP location and scale, at
    ``settings.scale_share`` of ``epsilon``, unless that share is 0. The Poisson sampling and all
    noise come from a :class:`NoiseSource` seeded from OS entropy: noise drawn from a published
    seed (the run's ``--seed`` is in its config.yaml) could be replayed and subtracted.
    ``noise_seed`` fixes it, for reproducible tests only."""
    validate_positive("label model epsilon", epsilon)
    n = len(features)
    check_label_model_batch(settings.batch_size, n)
    if not 0.0 < delta < 1.0 / n:
        raise ValueError(f"label model delta must be in (0, 1/n = {1.0 / n:.3g}), got {delta}")
    noise = NoiseSource(noise_seed)
    standardization = None
    if targets.shape[1] == 1 and settings.scale_share > 0:
        standardization = dp_location_scale(targets[:, 0], settings.scale_share * epsilon, noise.generator("cpu"))
        targets = (targets - standardization.location) / standardization.scale
    sgd_epsilon = epsilon - (standardization.epsilon if standardization else 0.0)
    cost = _train_by_dp_sgd(network, features, targets, sgd_epsilon, delta, settings, noise)
    if standardization is None:
        return cost
    fold_into_last_layer(network, standardization)
    return {**cost, "epsilon": standardization.epsilon + cost["epsilon"], "epsilon_dp_sgd": cost["epsilon"],
            "mechanism": f"{cost['mechanism']}, on the target standardized by its DP location and scale (basic composition)",
            "target_standardization": standardization.describe()}


def _train_by_dp_sgd(network: nn.Module, features: Tensor, targets: Tensor, epsilon: float, delta: float,
                     settings: DPSGDSettings, noise: NoiseSource) -> dict[str, Any]:
    """The DP-SGD part of :func:`train_dp_label_model`: σ calibrated so the planned epochs
    spend at most ``epsilon``; the cost the accountant reports."""
    n = len(features)
    sample_rate = settings.batch_size / n
    batches = PoissonBatches(n, sample_rate, noise.generator("cpu"))
    sigma = calibrate_noise_multiplier(epsilon, delta, sample_rate, settings.epochs * len(batches))
    accountant = OpacusAccountant("rdp")
    mechanism = DPSGDMechanism(
        sigma, settings.max_grad_norm, settings.batch_size, noise=noise, mode="hooks",
        on_noisy_step=lambda: accountant.step(noise_multiplier=sigma, sample_rate=sample_rate),
    )
    mechanism.attach(network)
    optimizer = mechanism.wrap_optimizer(torch.optim.Adam(network.parameters(), lr=settings.lr))
    network.train()
    for _ in range(settings.epochs):
        for batch in batches:
            rows = torch.tensor(batch, dtype=torch.long)
            optimizer.zero_grad(set_to_none=True)
            mechanism.backward_real(per_record_loss(network(features[rows]), targets[rows]))
            optimizer.step()
    mechanism.detach()
    network.eval()
    spent = accountant.get_epsilon(delta)
    if spent > epsilon:  # the calibration's tolerance is on the safe side; never report past the target
        raise RuntimeError(f"the label model spent epsilon {spent:.4f}, above its share {epsilon:.4f}")
    return {
        "epsilon": spent,
        "delta": delta,
        "neighbours": "add-remove",
        "mechanism": f"DP-SGD label model (Opacus, Poisson rate {sample_rate:.4g}, sigma {sigma:.4g}, {len(accountant)} steps, RDP)",
        "noise_multiplier": sigma,
        "sample_rate": sample_rate,
        "steps": len(accountant),
        "max_grad_norm": settings.max_grad_norm,
        "accountant": "rdp",
    }
