"""``ConditionalTableMixin``: CTGAN's conditional vector for the tabular modules (DP-CTGAN,
PATE-CTGAN, DP-SACTGAN).

CTGAN (Xu et al., NeurIPS 2019) feeds the generator and the discriminator a *condition*: the
one-hot of one category of one discrete column. The generator is asked for rows with that
category and pays a cross-entropy when its row does not have it ("training-by-sampling").

The table's layout (spans of the encoded record, the condition columns and their category
frequencies) comes from the datamodule's
:class:`~lightning_dpgan.data.table_transformer.TableTransformer` and is stored in the
hyper-parameters, so a checkpoint samples on its own. The frequencies are the DP histogram's
(public); nothing here reads private rows.

Where the conditions come from, per kind of records:

- real records get *their own* condition (a column drawn uniformly, the record's category in
  it; :meth:`ConditionalSampler.from_records`): a function of the record alone, so the record's
  privacy mechanism (DP-SGD's per-record clipping, a teacher's partition) covers it. CTGAN
  instead draws real *rows* by category, which would make a batch depend on other records and
  void DP-SGD's sampling analysis;
- generated records in a discriminator step get conditions drawn with the same law as the real
  ones (category frequency), so real and generated conditions are alike to the discriminator;
- the generator step draws conditions by log-frequency (CTGAN's emphasis on rare categories)
  and adds the condition cross-entropy to its loss.

Here the module's "labels" are these condition vectors: ``sample_labels`` and
``balanced_labels`` return them, and the networks take ``(records, condition)``.
"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from lightning_dpgan.data.conditional import ConditionalSampler

LAYOUT_KEYS = ("spans", "condition_spans", "condition_frequencies", "label")


def check_table_layout(layout: Any) -> dict[str, Any]:
    """The layout as a dict with every key a CTGAN-style module needs, or a clear error."""
    if not isinstance(layout, dict) or any(key not in layout for key in LAYOUT_KEYS):
        raise ValueError(
            "CTGAN-style models need the table layout of a mode-specific encoding (keys "
            f"{', '.join(LAYOUT_KEYS)}); train them on a table dataset with --data.encoding mode-specific (from Python: "
            "the datamodule's encoding='mode-specific', and the module's table_layout=datamodule.table_layout)"
        )
    return layout


class ConditionalTableMixin:
    """Conditions, condition loss and batch unpacking shared by the CTGAN-style modules.

    Put it before the module base class; the module sets ``self.table_layout`` before the base
    ``__init__`` builds the networks (``make_networks`` reads it).
    """

    table_layout: dict[str, Any]
    #: The datamodule encoding these models need (``train`` selects it for the dataset).
    table_encoding = "mode-specific"

    @property
    def conditions(self) -> ConditionalSampler:
        if getattr(self, "_conditions", None) is None:
            self._conditions = ConditionalSampler.from_layout(self.table_layout)
        return self._conditions

    @property
    def cond_dim(self) -> int:
        return self.conditions.cond_dim

    @property
    def spans(self) -> list[tuple[int, str]]:
        return [(int(width), str(activation)) for width, activation in self.table_layout["spans"]]

    def _on_device(self, cond: Tensor | None) -> Tensor | None:
        return None if cond is None else cond.to(self.device)

    # ------------------------------------------------------------ the module's "labels"
    def sample_labels(self, n: int) -> Tensor | None:
        """Conditions of generated records in a discriminator step: the real records' law."""
        if self.cond_dim == 0:
            return None
        cond, _ = self.conditions.sample(n, log_frequency=False)
        return self._on_device(cond)

    def balanced_labels(self, n: int) -> Tensor | None:
        """Conditions for published samples (the base ``sample`` draws them): the (DP) category
        frequencies, as CTGAN samples. The modules are unconditional to callers: ``sample``
        refuses labels."""
        return self.sample_labels(n)

    def generator_conditions(self, n: int) -> tuple[Tensor | None, Tensor | None]:
        """Conditions of the generator step (log-frequency when ``log_frequency``) and the
        chosen condition column of each record."""
        if self.cond_dim == 0:
            return None, None
        cond, column = self.conditions.sample(n, log_frequency=bool(self.hparams.log_frequency))
        return self._on_device(cond), column.to(self.device)

    def unpack_batch(self, batch: Any) -> tuple[Tensor, Tensor | None]:
        """Real records and each record's own condition (see the module docstring)."""
        records = batch[0] if isinstance(batch, (list, tuple)) else batch
        if self.cond_dim == 0 or records.shape[0] == 0:
            return records, None if self.cond_dim == 0 else records.new_zeros(0, self.cond_dim)
        cond, _ = self.conditions.from_records(records)
        return records, self._on_device(cond)

    def condition_loss(self, logits: Tensor, cond: Tensor | None, column: Tensor | None) -> Tensor:
        """CTGAN's generator cross-entropy between the asked category and the generated logits."""
        if cond is None:
            return logits.new_zeros(())
        return self.conditions.condition_loss(logits, cond, column)
