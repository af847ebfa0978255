"""QUAIL (Rosenblatt et al. 2020, "Differentially Private Synthetic Data: Applied Evaluations
and Enhancements", Algorithm 1): spend part of the budget on a DP model of the label, the rest
on a DP synthesizer of the other columns, and label the synthetic rows with the model.

1. **Split.** The label model gets ``split`` of (ε, δ), the synthesizer what is left. The paper
   is inconsistent about which side ``p`` is (Algorithm 1 gives ε·p to the synthesizer; its
   text says a higher p "assigns more budget to the differentially private classifier"); here,
   as in the text, ``split`` is the label model's share.
2. **Train both.** The label model C (features -> label) by DP-SGD on the real rows
   (:mod:`lightning_dpgan.privacy.dp_label_model`; a continuous label is first standardized by
   its DP location and scale, a tenth of C's share by default, and with ``log_label`` C learns it
   in log space); the synthesizer M -- any private table
   model of this package -- on the rows without the label (``--data.exclude_label``).
3. **Sample.** M's rows get a label from C, in the label's place: a full synthetic table. A class
   label is drawn from C's predicted class probabilities (``labels="sample"``, the default; a
   departure from the paper, whose Algorithm 1 sets r_i = C(s_i)), so the table is a sample of
   M's features times C's conditional -- taking the most likely class instead (``"most-likely"``,
   the paper's) collapses every uncertain row onto the majority class and skews
   the label's marginal (on Adult: 3.5 % of rows ">50K" against about 25 % in the data). A
   continuous label is C's prediction either way. Drawing is post-processing: it costs nothing.

Privacy: C and M both read the training rows; by basic composition (the paper's Theorem 3.1)
the release is (ε_C + ε_M, δ_C + δ_M)-DP. C is trained first and its *measured* cost is
composed into the synthesizer's strategy as a release made before training, so the strategy
stops the synthesizer when the total would pass ``--epsilon``. For a strategy whose guarantee
is for replace-one neighbours (PATE), C's add/remove share is halved so that restated for
replace-one (2ε, (1 + e^ε)δ) it is still ``split`` of the total.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

from lightning_dpgan.config import DEFAULT_QUAIL_SYNTHESIZER
from lightning_dpgan.data.schema import TableSchema, column_names
from lightning_dpgan.privacy.accountants.opacus_adapter import UnreachableEpsilon, floor_reason, rdp_epsilon_floor
from lightning_dpgan.privacy.composition import release_fields
from lightning_dpgan.privacy.dp_label_model import ARCHITECTURES, DPSGDSettings, label_network, train_dp_label_model


LABEL_DRAWS = ("sample", "most-likely")
#: The MLP label model's hidden widths unless ``--quail.hidden`` says otherwise.
DEFAULT_HIDDEN = (64,)


def check_label_draw(labels: str) -> None:
    if labels not in LABEL_DRAWS:
        raise ValueError(f"--quail.labels must be one of {LABEL_DRAWS}, got {labels!r}")


def check_log_features(schema: TableSchema, names: Sequence[str]) -> None:
    """Refuse ``--quail.log_features`` that are not numeric feature columns of ``schema``."""
    numeric = [c.name for c in schema.columns if c.is_numeric and c.name != schema.label]
    wrong = [name for name in names if name not in numeric]
    if wrong:
        raise ValueError(f"--quail.log_features names {wrong}, which are not numeric feature columns of the table "
                         f"(the label cannot be one); its numeric features: {numeric}")


def log_scaled(encoded: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """A column's min-max encoding ``t`` (in [0, 1]) re-scaled to ``log(x - low + 1) / log(high - low + 1)``,
    where ``x = low + t (high - low)``: still in [0, 1], but a long tail spread over it."""
    low, high = bounds
    scaled = torch.log1p(encoded.double().clamp(0.0, 1.0) * (high - low)) / math.log1p(high - low)
    return scaled.to(encoded.dtype)


def log_unscaled(scaled: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """Inverse of :func:`log_scaled`, ``scaled`` clipped to [0, 1] first (a model's output may leave it)."""
    low, high = bounds
    encoded = torch.expm1(scaled.double().clamp(0.0, 1.0) * math.log1p(high - low)) / (high - low)
    return encoded.to(scaled.dtype)


def label_model_inputs(encoded: torch.Tensor, features: TableSchema, log_features: Sequence[str]) -> torch.Tensor:
    """The label model's input: the features' min-max encoding, with each ``log_features`` column
    re-scaled to ``log(x - low + 1) / log(high - low + 1)`` (still in [0, 1], :func:`log_scaled`).

    Why: a linear model trained by DP-SGD takes small, clipped steps, and a long-tail column
    (Adult's capital gain, bounds 0..99,999) min-max encoded puts nearly every row within 0.05
    of 0: its weight would have to grow past what the steps reach before the column could count.
    In log space the same column spreads over the unit interval. The map reads the column's
    public bounds only (no statistic of any row), so it is free: a function of each record
    before DP-SGD sees it. ``features`` is the schema without its label column.
    """
    if not log_features:
        return encoded
    inputs = encoded.clone()
    for name in log_features:
        position = features.column_slices[name].start
        inputs[:, position] = log_scaled(inputs[:, position], features.column(name).bounds)
    return inputs


def check_log_label(schema: TableSchema, log_label: bool) -> None:
    """Refuse ``--quail.log_label`` for a table whose label is not numeric."""
    if log_label and not schema.label_column.is_numeric:
        raise ValueError(f"--quail.log_label models a continuous label in log space, and the label "
                         f"'{schema.label}' is categorical: drop --quail.log_label")


def label_model_budget(split: float, epsilon: float, delta: float, neighbours: str) -> tuple[float, float]:
    """The label model's add/remove (ε, δ): ``split`` of the total once stated for the
    synthesizer's ``neighbours`` (for replace-one: ε/2, and δ with the group factor removed)."""
    epsilon_share, delta_share = split * epsilon, split * delta
    if neighbours == "add-remove":
        return epsilon_share, delta_share
    if neighbours == "replace-one":
        half = epsilon_share / 2.0
        label_delta = delta_share * math.exp(-half) / (1.0 + math.exp(-half))  # = δ/(1 + e^half), no overflow
        if label_delta == 0.0:
            raise ValueError(
                f"--epsilon {epsilon:g} is too large for QUAIL with this synthesizer (replace-one neighbours): its "
                f"label model's delta, {delta_share:g}/(1 + e^{half:g}), is 0 in floating point. Use a smaller --epsilon")
        return half, label_delta
    raise ValueError(f"unknown neighbouring relation {neighbours!r}")


class QUAIL:
    """QUAIL: a DP-SGD label model plus any private table synthesizer trained without the label

    Args:
        synthesizer: the registered private table model that generates the features.
        split: the label model's share of ε and δ, in (0, 1).
        label_model: ``logistic`` (a linear layer: logistic regression for a class label,
            linear regression for a continuous one) or ``mlp``.
        hidden: the MLP's hidden widths.
        epochs: passes over the training rows the label model's noise is calibrated for.
        batch_size: expected records per DP-SGD batch (Poisson rate batch_size / N).
        lr: the label model's Adam learning rate.
        max_grad_norm: per-record gradient clipping norm.
        scale_share: for a continuous label, the part of the label model's ε that releases the
            target's location and scale, by which it is standardized before DP-SGD (0: none).
        labels: how a synthetic row's class is drawn from the label model: ``sample`` (from its
            predicted probabilities) or ``most-likely`` (the class of highest score).
        log_features: numeric feature columns the label model reads in log space
            (:func:`label_model_inputs`; a list or a comma-separated string): a public choice,
            free of budget. The synthesizer's encoding is not affected (``--data.log_columns`` is its own).
        log_label: for a continuous label, the label model learns it in log space
            (:func:`log_scaled`, public bounds: free) and its predictions are mapped back. Why: a
            long-tail target (King's prices) is heavy-tailed once standardized (its largest value 14
            standard deviations out), a linear model of it fits the mass poorly, and DP-SGD's clipped
            steps spend themselves on the tail; its log is close to linear in the features.
    """

    def __init__(
        self,
        synthesizer: str = DEFAULT_QUAIL_SYNTHESIZER,
        split: float = 0.5,
        label_model: str = "logistic",
        hidden: int | Sequence[int] = DEFAULT_HIDDEN,
        epochs: int = 10,
        batch_size: int = 256,
        lr: float = 0.01,
        max_grad_norm: float = 1.0,
        scale_share: float = 0.1,
        labels: str = "sample",
        log_features: Sequence[str] | str = (),
        log_label: bool = False,
    ) -> None:
        if isinstance(split, bool) or not isinstance(split, (int, float)) or not 0.0 < split < 1.0:
            raise ValueError(f"--quail-split must be in (0, 1) (the label model's share of epsilon), got {split!r}")
        if label_model not in ARCHITECTURES:
            raise ValueError(f"--quail.label_model must be one of {ARCHITECTURES}, got {label_model!r}")
        check_label_draw(labels)
        hidden = [hidden] if isinstance(hidden, int) else list(hidden)
        if not hidden or not all(isinstance(width, int) and width > 0 for width in hidden):
            raise ValueError(f"--quail.hidden must be a list of positive widths, got {hidden!r}")
        if label_model != "mlp" and hidden != list(DEFAULT_HIDDEN):  # else taken, recorded, and unused
            raise ValueError(f"--quail.hidden {hidden} sets the hidden layers of --quail.label_model mlp; the "
                             f"{label_model} label model has none: add --quail.label_model mlp, or leave --quail.hidden out")
        self.synthesizer = synthesizer
        self.split = float(split)
        self.label_model = label_model
        self.hidden = hidden
        self.labels = labels
        self.log_features = column_names(log_features, "--quail.log_features")
        if not isinstance(log_label, bool):
            raise ValueError(f"--quail.log_label must be true or false, got {log_label!r}")
        self.log_label = log_label
        self.settings = DPSGDSettings(epochs=epochs, batch_size=batch_size, lr=lr, max_grad_norm=max_grad_norm,
                                     scale_share=scale_share)

    def check_share_certifiable(self, epsilon: float, delta: float, neighbours: str) -> None:
        """Refuse, before any row is read, a --quail-split whose share of (ε, δ) is at or below
        what the RDP accountant certifies with infinite noise (its floor, set by δ alone): the
        label model refused it only once it trained, after the DP modes had spent their budget.
        (A share just above the floor may still be refused then, once the share of a continuous
        label's DP standardization is taken from it.)"""
        label_epsilon, label_delta = label_model_budget(self.split, epsilon, delta, neighbours)
        floor = rdp_epsilon_floor(label_delta)
        if label_epsilon <= floor:
            share = self._share_unreachable(epsilon, delta, label_epsilon, label_delta, floor_reason("rdp", floor))
            raise ValueError(f"{share}. Refused before any row was read: nothing was spent")

    def _share_unreachable(self, epsilon: float, delta: float, label_epsilon: float, label_delta: float,
                           reason: str) -> str:
        """Why the label model's share (``label_epsilon``, ``label_delta``) of the user's target
        cannot be met, naming the settings that set it."""
        return (f"QUAIL's label model gets --quail-split {self.split:g} of --epsilon {epsilon:g} and --delta {delta:g} "
                f"(epsilon {label_epsilon:.3g}, delta {label_delta:.3g}), and at that share {reason}. Raise "
                "--quail-split, or --epsilon")

    def fit_labeler(
        self, datamodule: Any, epsilon: float, delta: float, neighbours: str, seed: int = 0
    ) -> QuailLabeler:
        """Train the label model on the datamodule's train split at ``split`` of (ε, δ).

        ``seed`` sets the initial weights only (public); the DP noise and sampling draw from OS
        entropy (:func:`train_dp_label_model`)."""
        schema = datamodule.schema
        if schema.label is None:
            raise ValueError(f"QUAIL labels synthetic rows: dataset '{datamodule.name}' has no label column")
        check_log_features(schema, self.log_features)  # before any row is read
        check_log_label(schema, self.log_label)
        features, targets = datamodule.labelled_records()
        features = label_model_inputs(features, schema.without_label(), self.log_features)
        if self.log_label:
            targets = log_scaled(targets, schema.label_column.bounds)
        label_epsilon, label_delta = label_model_budget(self.split, epsilon, delta, neighbours)
        hidden = self.hidden if self.label_model == "mlp" else []
        with torch.random.fork_rng():  # the initial weights from the seed, without touching the run's RNG
            torch.manual_seed(seed)
            network = label_network(self.label_model, features.shape[1], targets.shape[1], hidden)
        try:
            cost = train_dp_label_model(network, features, targets, label_epsilon, label_delta, self.settings)
        except UnreachableEpsilon as error:  # its target is a share of the user's: name the settings that set it
            share = self._share_unreachable(epsilon, delta, label_epsilon, label_delta, error.reason)
            raise ValueError(share) from error
        # the target it had its share of: a resume may raise --epsilon, and split is of this one
        cost = {**cost, "split": self.split, "of_epsilon": epsilon, "of_delta": delta,
                "scale_share": self.settings.scale_share}
        return QuailLabeler(network, self.label_model, hidden, schema, cost, self.labels, self.log_features, self.log_label)


class QuailLabeler:
    """The trained label model with what it takes to label decoded synthetic rows: the table's
    (public) schema, whose min-max encoding of the features (``log_features`` in log space) is
    the model's input, how a class is drawn (``labels``, see :class:`QUAIL`), and whether a
    continuous label's output is in log space (``log_label``)."""

    def __init__(self, network: nn.Module, architecture: str, hidden: list[int], schema: TableSchema, cost: dict[str, Any],
                 labels: str = "sample", log_features: Sequence[str] = (), log_label: bool = False) -> None:
        check_label_draw(labels)
        check_log_features(schema, list(log_features))
        check_log_label(schema, log_label)
        self.log_features = list(log_features)
        self.log_label = log_label
        self.network = network.eval()
        self.labels = labels
        self.architecture = architecture
        self.hidden = list(hidden)
        self.schema = schema
        self.cost = dict(cost)

    @property
    def release(self) -> dict[str, Any]:
        """The label model's DP release as a strategy composes it: pass it to the synthesizer's
        strategy before training, ``strategy.add_prior_release("quail_label_model", labeler.release)``."""
        return release_fields(self.cost)

    @property
    def fits(self) -> str:
        """What the network is, in words, for the privacy report: ``logistic`` is one linear layer,
        which for a continuous label (King's price) is a linear regression, not a logistic one."""
        if self.architecture == "mlp":
            return "MLP regression" if self.schema.label_column.is_numeric else "MLP classifier"
        return "linear regression" if self.schema.label_column.is_numeric else "logistic regression"

    def predict(self, rows: pd.DataFrame) -> torch.Tensor:
        """The model's output for each row: class scores, or the regression value in the label's
        min-max encoding (mapped back from log space under ``log_label``); a label column in
        ``rows`` is ignored."""
        features = self.schema.without_label()
        encoded, _ = features.encode(rows, unknown="error")
        if len(encoded) != len(rows):
            raise ValueError("some rows could not be encoded for labelling")
        with torch.no_grad():
            outputs = self.network(label_model_inputs(encoded, features, self.log_features))
        return log_unscaled(outputs, self.schema.label_column.bounds) if self.log_label else outputs

    def label(self, features: pd.DataFrame, generator: torch.Generator | None = None) -> pd.DataFrame:
        """``features`` (rows without the label) with a label inserted in its column's place: a
        class drawn from the model's probabilities (from ``generator``, else torch's global
        random state) or its most likely class, or the regression output clipped to the bounds."""
        if self.schema.label in features.columns:
            raise ValueError(f"the rows to label hold the label column '{self.schema.label}' already: QUAIL labels "
                             "rows generated without it (a synthesizer trained on a datamodule built with "
                             "exclude_label=True, as train builds it for --model quail), or drop the column first")
        outputs = self.predict(features)
        if self.labels == "sample" and not self.schema.label_column.is_numeric:
            outputs = self._drawn_one_hot(outputs, generator)
        label_only = TableSchema(columns=(self.schema.label_column,))
        labelled = features.reset_index(drop=True).copy()
        labelled.insert(self.schema.names.index(self.schema.label), self.schema.label, label_only.decode(outputs)[self.schema.label])
        return labelled

    @staticmethod
    def _drawn_one_hot(scores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """One class per row, drawn with the softmax of its scores, as a one-hot row."""
        drawn = torch.multinomial(scores.softmax(dim=1), 1, generator=generator)
        return torch.zeros_like(scores).scatter_(1, drawn, 1.0)

    # ------------------------------------------------------------------ checkpoints
    def to_dict(self) -> dict[str, Any]:
        """Plain data for the checkpoint's run information (loadable with ``weights_only``)."""
        return {
            "architecture": self.architecture,
            "hidden": self.hidden,
            "schema": self.schema.to_dict(),
            "state": {name: tensor.tolist() for name, tensor in self.network.state_dict().items()},
            "cost": self.cost,
            "labels": self.labels,
            "log_features": self.log_features,
            "log_label": self.log_label,
        }

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> QuailLabeler:
        schema = TableSchema.from_dict(spec["schema"])
        width = schema.label_column.width
        network = label_network(spec["architecture"], schema.encoded_dim - width, width, spec["hidden"])
        network.load_state_dict({name: torch.tensor(values) for name, values in spec["state"].items()})
        # checkpoints written before labels were drawn took the most likely class, before log
        # features read every feature min-max, and before log labels learnt the label min-max
        return cls(network, spec["architecture"], spec["hidden"], schema, spec["cost"], spec.get("labels", "most-likely"),
                   spec.get("log_features", []), spec.get("log_label", False))
