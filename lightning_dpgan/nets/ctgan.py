"""CTGAN's networks (Xu et al. 2019), the base of DP-CTGAN and PATE-CTGAN, plus the helpers
that every tabular generator here shares.

Record layout. An encoded table row is a concatenation of *spans*, each ``(width, activation)``:
``"tanh"`` for a mode-normalised continuous value alpha (width 1, in (-1, 1)) and ``"softmax"``
for a one-hot block (a categorical column, or the mode indicator beta of a continuous column).
The generator emits raw logits for the whole row and :func:`apply_span_activations` turns each
span into its kind of value, so the discriminator sees what the data encoder produces.

Defaults follow the DP-CTGAN / PATE-CTGAN parameters listed in the last appendix of the QUAIL
paper (dp-synthetic-data-evaluations-quail): ``gen_dim=(256, 256)``, ``dis_dim=(256, 256)``,
``pack=1`` (the latent size, ``embedding_dim=128``, is the caller's choice).

Conditioning. Unlike the image nets (class labels, see ``conditioning.py``), CTGAN conditions on
a float *conditional vector* (the one-hot "column = category" choice of its training-by-sampling),
so the second argument of every net here is that vector, of width ``cond_dim`` (``None`` when
``cond_dim == 0``).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

Span = tuple[int, str]
SPAN_ACTIVATIONS = ("tanh", "softmax")


def validate_spans(spans: Sequence[Span]) -> tuple[Span, ...]:
    """Return ``spans`` as a tuple after checking widths and activation names."""
    checked = []
    for span in spans:
        width, activation = span
        if int(width) != width or width < 1:
            raise ValueError(f"span width must be a positive integer, got {span!r}")
        if activation not in SPAN_ACTIVATIONS:
            raise ValueError(f"span activation must be one of {SPAN_ACTIVATIONS}, got {span!r}")
        checked.append((int(width), activation))
    if not checked:
        raise ValueError("a record needs at least one span")
    return tuple(checked)


def spans_width(spans: Sequence[Span]) -> int:
    """Width of an encoded record: the sum of its span widths."""
    return sum(width for width, _ in validate_spans(spans))


def span_logits(logits: Tensor, spans: Sequence[Span]) -> list[Tensor]:
    """Split a ``(batch, data_dim)`` tensor into one ``(batch, width)`` tensor per span.

    Losses that look at one column (CTGAN's cross-entropy on the conditioned column, CTAB-GAN+'s
    auxiliary target) need the raw logits of a span, not the whole row.
    """
    spans = validate_spans(spans)
    widths = [width for width, _ in spans]
    if logits.dim() != 2 or logits.shape[1] != sum(widths):
        raise ValueError(f"expected logits of shape (batch, {sum(widths)}) for these spans, got {tuple(logits.shape)}")
    return list(torch.split(logits, widths, dim=1))


def apply_span_activations(logits: Tensor, spans: Sequence[Span], tau: float = 0.2, hard: bool = False) -> Tensor:
    """tanh on ``"tanh"`` spans, Gumbel-softmax with temperature ``tau`` on ``"softmax"`` spans.

    Gumbel-softmax (CTGAN, tau = 0.2) keeps the categorical draw differentiable, so the
    generator learns the category *probabilities* through the discriminator. ``hard=True`` gives
    exact one-hot rows (straight-through gradients): a Gumbel-max sample from ``softmax(logits)``.
    """
    pieces = []
    for piece, (_, activation) in zip(span_logits(logits, spans), validate_spans(spans)):
        if activation == "tanh":
            pieces.append(torch.tanh(piece))
        else:
            pieces.append(F.gumbel_softmax(piece, tau=tau, hard=hard, dim=1))
    return torch.cat(pieces, dim=1)


def concat_cond_vector(features: Tensor, cond: Tensor | None, cond_dim: int) -> Tensor:
    """Append the conditional vector to each row; ``cond`` may be ``None`` only when ``cond_dim == 0``."""
    if cond is None:
        if cond_dim:
            raise ValueError(f"this network is conditional: pass a conditional vector of width {cond_dim}")
        return features
    if cond.shape != (features.shape[0], cond_dim):
        raise ValueError(f"expected a conditional vector of shape {(features.shape[0], cond_dim)}, got {tuple(cond.shape)}")
    return torch.cat([features, cond.to(features.dtype)], dim=1)


def check_pac(pac: int) -> None:
    """Refuse a pack size below one (at construction, before any batch is seen)."""
    if pac < 1:
        raise ValueError(f"pac must be at least 1, got {pac}")


def pack_records(rows: Tensor, pac: int) -> Tensor:
    """Concatenate each run of ``pac`` consecutive rows into one row (PacGAN, used by CTGAN).

    A pack is judged as a whole, which penalises a generator that repeats itself (mode
    collapse). Under DP-SGD a pack is then one "sample" for per-sample clipping, which is why
    DP-CTGAN uses ``pac=1``.
    """
    check_pac(pac)
    if rows.shape[0] % pac:
        raise ValueError(f"batch size {rows.shape[0]} is not divisible by pac={pac}")
    return rows.reshape(rows.shape[0] // pac, pac * rows.shape[1])


class Residual(nn.Module):
    """CTGAN's generator block: ``cat([ReLU(BN(Linear(x))), x])``; the width grows by ``out_features``.

    Concatenating (rather than adding) the input lets later layers, and the output layer, still
    see the noise and the conditional vector unchanged.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.bn = nn.BatchNorm1d(out_features)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.relu(self.bn(self.fc(x))), x], dim=1)


class SpanGenerator(nn.Module):
    """Shared output side of the tabular generators: ``logits`` (subclasses) -> ``activate`` -> record.

    ``activate`` is separate from ``logits`` because CTGAN's condition loss is a cross-entropy
    on the raw logits of the conditioned span, while the discriminator sees activated records.
    Training mode gives soft Gumbel-softmax spans (differentiable). Eval mode gives *hard
    one-hot* spans drawn with the Gumbel-max trick, i.e. a sample from ``softmax(logits)``, as
    CTGAN does when sampling. A plain argmax of the logits would be deterministic but would
    collapse each categorical to its mode: the generator was trained with Gumbel noise, so its
    logits encode category probabilities, not the category.
    """

    spans: tuple[Span, ...]
    tau: float

    def logits(self, z: Tensor, cond: Tensor | None = None) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def activate(self, logits: Tensor) -> Tensor:
        """Span activations for this mode: soft in training, one-hot samples in eval."""
        return apply_span_activations(logits, self.spans, self.tau, hard=not self.training)

    def forward(self, z: Tensor, cond: Tensor | None = None) -> Tensor:
        return self.activate(self.logits(z, cond))


class CTGANGenerator(SpanGenerator):
    """(z, cond) -> Residual blocks over ``hidden`` -> Linear -> span activations.

    The last Linear reads ``latent_dim + cond_dim + sum(hidden)`` features (every block's output
    plus the input). BatchNorm is fine here: the generator never touches private data, so it
    needs no per-sample gradients. Output modes (soft in training, one-hot samples in eval): see
    :class:`SpanGenerator`.
    """

    def __init__(
        self,
        latent_dim: int,
        cond_dim: int,
        spans: Sequence[Span],
        hidden: Sequence[int] = (256, 256),
        tau: float = 0.2,
    ) -> None:
        super().__init__()
        self.latent_dim, self.cond_dim, self.tau = latent_dim, cond_dim, tau
        self.spans = validate_spans(spans)
        self.data_dim = spans_width(self.spans)
        width = latent_dim + cond_dim
        blocks = []
        for out_features in hidden:
            blocks.append(Residual(width, out_features))
            width += out_features
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(width, self.data_dim)

    def logits(self, z: Tensor, cond: Tensor | None = None) -> Tensor:
        """The raw pre-activation record, ``(batch, data_dim)``."""
        return self.head(self.body(concat_cond_vector(z, cond, self.cond_dim)))


class CTGANDiscriminator(nn.Module):
    """Packs of ``pac`` (record + cond) rows -> [Linear -> LeakyReLU(0.2) -> Dropout] over ``hidden`` -> score.

    Returns ``(batch // pac,)`` scores. Only Linear, LeakyReLU and Dropout: Opacus computes
    per-sample gradients for it (with ``pac=1`` a sample is a record).
    """

    def __init__(
        self,
        data_dim: int,
        cond_dim: int,
        hidden: Sequence[int] = (256, 256),
        pac: int = 1,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        check_pac(pac)
        self.data_dim, self.cond_dim, self.pac = data_dim, cond_dim, pac
        layers: list[nn.Module] = []
        width = pac * (data_dim + cond_dim)
        for out_features in hidden:
            layers += [nn.Linear(width, out_features), nn.LeakyReLU(0.2), nn.Dropout(dropout)]
            width = out_features
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 1)

    def forward(self, x: Tensor, cond: Tensor | None = None) -> Tensor:
        rows = concat_cond_vector(torch.flatten(x, start_dim=1), cond, self.cond_dim)
        return self.head(self.body(pack_records(rows, self.pac))).squeeze(1)


class AuxiliaryMLP(nn.Module):
    """The auxiliary classifier/regressor of CTAB-GAN+ and DP-SACTGAN: [Linear -> LeakyReLU(0.2) -> Dropout] -> Linear.

    DP-SACTGAN: "a series of fully connected layers, comprising four intermediate layers and one
    output prediction classification layer" -- hence four hidden layers of 256 by default (also
    CTAB-GAN's ``class_dim``). It sees a record without its target span and predicts the
    target: ``output_dim`` logits for a class, 1 for a regression value. Returns
    ``(batch, output_dim)`` in both cases. Opacus-compatible (no normalisation layers), as it
    is trained on real records.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        hidden: Sequence[int] = (256, 256, 256, 256),
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        self.input_dim, self.output_dim = input_dim, output_dim
        layers: list[nn.Module] = []
        width = input_dim
        for out_features in hidden:
            layers += [nn.Linear(width, out_features), nn.LeakyReLU(0.2), nn.Dropout(dropout)]
            width = out_features
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, output_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(torch.flatten(x, start_dim=1)))
