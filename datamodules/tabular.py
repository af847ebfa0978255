"""Base LightningDataModule for tables encoded by a public :class:`TableSchema` -- min-max /
one-hot, or CTGAN's mode-specific encoding with modes fitted under DP."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_dpgan.data.download import (
    DATA_DIR_ENV,
    CacheNotWritableError,
    DataIntegrityError,
    DatasetNotFoundError,
    RemoteFile,
    damaged_cache_message,
    data_folder,
    default_cache_dir,
    fetch,
    is_valid_copy,
    locate,
    settings_with_text_paths,
    verify_file,
    warn_downloading,
)
from lightning_dpgan.distributed import rows_per_process
from lightning_dpgan.data.dev_split import check_dev_fraction, check_held_out_split, dev_split
from lightning_dpgan.data.partition import teacher_partitions
from lightning_dpgan.data.dp_histogram import MECHANISM as DP_HISTOGRAM_MECHANISM
from lightning_dpgan.privacy.composition import compose_costs
from lightning_dpgan.privacy.validation import validate_int
from lightning_dpgan.data.schema import (
    EncodingReport,
    SchemaError,
    YAML_BOOLEANS,
    TableSchema,
    column_names,
    encoding_layout,
    missing_value_counts,
    missing_values_remedy,
    row_examples,
)
from lightning_dpgan.data.table_transformer import MODES, TableTransformer, checked_roles

log = logging.getLogger(__name__)

PUBLIC_SCHEMA_COST: dict[str, Any] = {"epsilon": 0.0, "delta": 0.0, "mechanism": "public schema"}
#: a schema file an earlier run's DP estimate released: spent by that run, not by this one
EARLIER_DP_SCHEMA_COST: dict[str, Any] = {
    "epsilon": 0.0, "delta": 0.0,
    "mechanism": "schema file released by an earlier run's DP estimate (its cost is in that run's privacy.json, "
                 "not in this total)"}
BOUNDS_MODES_COST: dict[str, Any] = {"epsilon": 0.0, "delta": 0.0, "mechanism": "modes from public bounds (no data read)"}
ENCODINGS = ("minmax", "mode-specific")
#: ε of the modes' DP histogram unless ``modes_epsilon`` says otherwise.
DEFAULT_MODES_EPSILON = 0.1
#: How the mode-specific encoding holds a continuous label (see ``label_encoding``).
LABEL_ENCODINGS = ("scalar", "mode-specific")
#: Public salt of the draw that assigns each value its mode (CTGAN samples it from the
#: posterior). Not privacy noise: the draw is a hash of the record's own values
#: (:func:`~lightning_dpgan.data.table_transformer.record_uniforms`), so a record's encoding
#: stays a function of that record alone.
ENCODE_SEED = 0


#: the share of a column's training values clipped to its bounds above which setup warns
CLIPPED_SHARE_WARNING = 0.05


class TabularDataModule(L.LightningDataModule):
    """Rows of a table encoded into [0, 1] vectors by a public schema, label included.

    Subclasses say where the raw rows come from (:meth:`_read_split`) and what the schema is
    (:meth:`_build_schema`). The flow keeps the test split away from everything private:

    1. the raw rows are split into train/test -- a dataset's official split, or a seeded
       permutation that depends only on the row count and ``split_seed``;
    2. only the train split is encoded (:meth:`TableSchema.encode`) into ``train_dataset``,
       a ``TensorDataset`` of one tensor, so batches are ``[records]``;
    3. ``test_frame`` stays a raw DataFrame for evaluation; it is never encoded or trained on.
       With ``dev_fraction``, a seeded share of the train split is held out the same way, as
       ``dev_frame`` (:mod:`lightning_dpgan.data.dev_split`): settings are chosen on it, not on
       the test split.

    GANs here generate whole rows (the label is one of the encoded columns), hence
    ``num_classes = None``. ``data_shape`` comes from the schema, without reading records for a
    built-in dataset.

    ``encoding="mode-specific"`` swaps the schema's min-max encoding for CTGAN / CTAB-GAN+'s
    (:class:`~lightning_dpgan.data.table_transformer.TableTransformer`: modes per numeric
    column, mixed and long-tail columns, a min-max scalar for a continuous label). Its modes and
    category frequencies come from an ε-DP histogram of the *train split* (``modes="dp"``,
    ``modes_epsilon`` reported by :meth:`privacy_cost`), or from the public bounds alone
    (``modes="bounds"``, free, no row read). The fit runs once, on first use of
    ``data_shape``, ``table_transformer`` or ``setup``; a resumed run restores the released
    one with :meth:`restore_transformer` instead of paying again.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "table"
    num_classes: ClassVar[int | None] = None
    #: False for a dataset whose file is named by its own setting (``csv``): ``data_dir`` is then
    #: neither read nor checked, and ``$LIGHTNING_DPGAN_DATA_DIR`` not recorded for it.
    reads_data_dir: ClassVar[bool] = True
    #: Subfolders of ``data_dir`` searched (before ``data_dir`` itself) for the raw files.
    subdirs: ClassVar[tuple[str, ...]] = ()
    #: Files downloaded by :meth:`prepare_data` when missing; empty for other sources.
    files: ClassVar[tuple[RemoteFile, ...]] = ()
    #: Mixed columns (CTAB-GAN+) and their special values, used when ``mixed=None``.
    default_mixed: ClassVar[Mapping[str, tuple[float, ...]]] = {}
    #: Long-tail columns encoded in log space, used when ``log_columns=None``.
    default_log_columns: ClassVar[tuple[str, ...]] = ()
    #: Numeric columns encoded one-hot over their public grid, used when ``discrete_columns=None``.
    default_discrete_columns: ClassVar[tuple[str, ...]] = ()
    #: Split settings that choose no records here (a dataset's official split ignores
    #: ``test_fraction``, and ``split_seed`` without dev rows): a checkpoint's are not compared on
    #: them (``run.split_settings``).
    ignored_split_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        download: bool = True,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        encoding: str = "minmax",
        modes: str = "dp",
        modes_epsilon: float = DEFAULT_MODES_EPSILON,
        max_modes: int = 10,
        histogram_bins: int = 64,
        mixed: Mapping[str, Sequence[float]] | None = None,
        log_columns: Sequence[str] | str | None = None,
        exclude_label: bool = False,
        label_encoding: str = "scalar",
        histogram_threshold: float = 0.0,
        dev_fraction: float = 0.0,
        discrete_columns: Sequence[str] | str | None = None,
        calibrate_marginals: bool = False,
    ) -> None:
        """
        Args:
            data_dir: folder holding the raw files (directly or in one of ``subdirs``);
                defaults to ``$LIGHTNING_DPGAN_DATA_DIR``.
            cache_dir: where downloads are stored; defaults to ``$LIGHTNING_DPGAN_CACHE_DIR``
                or ``~/.cache/lightning_dpgan``.
            batch_size: records per training batch.
            num_workers: DataLoader worker processes.
            download: fetch missing files from the canonical source; if False, missing files
                are an error.
            test_fraction: share of rows held out for evaluation (datasets with an official
                split ignore it).
            split_seed: seed of the train/test permutation (ignored with an official split).
            encoding: ``"minmax"`` (the schema's min-max / one-hot encoding) or
                ``"mode-specific"`` (CTGAN / CTAB-GAN+, :class:`TableTransformer`).
            modes: with ``"mode-specific"``: ``"dp"`` fits modes and category frequencies on
                an ε-DP histogram of the train split; ``"bounds"`` reads no row (one mode per
                column over its public bounds, uniform frequencies) and costs nothing.
            modes_epsilon: ε of the DP histogram (``modes="dp"``), added to the run's total.
            max_modes: most mixture components per numeric column (CTGAN: 10).
            histogram_bins: equal-width bins per numeric column of the DP histogram.
            mixed: public declaration of mixed columns, ``{column: [special values]}``;
                ``None`` takes the dataset's ``default_mixed``.
            log_columns: public declaration of long-tail columns (a list or a comma-separated
                string); ``None`` takes the dataset's ``default_log_columns``.
            exclude_label: encode the features alone (:attr:`encoded_schema`): the records a
                synthesizer trains on and generates hold no label. QUAIL sets it; its DP label
                model reads the label (:meth:`labelled_records`). ``schema`` and the raw frames
                keep the label, for evaluation.
            label_encoding: with ``"mode-specific"`` and a continuous label: ``"scalar"`` (one
                min-max tanh slot, what DP-SACTGAN's auxiliary regressor predicts) or
                ``"mode-specific"`` (modes from the same DP histogram, like any numeric column).
            histogram_threshold: with ``modes="dp"``: numeric columns' noisy counts below this
                many Laplace scales are set to 0 before their modes are fitted (free
                post-processing that removes the mass noise invents in empty bins, and drops
                real bins smaller than the cut); category frequencies keep every count; 0 keeps
                every count.
            dev_fraction: share of the train split held out of training (and of everything
                fitted on it) as ``dev_frame``; 0: none. ``evaluate --split dev`` scores a run
                on it.
            discrete_columns: public declaration of numeric columns with few values (integer
                columns, or continuous ones with a step; a list or a comma-separated string)
                to encode one-hot over their grid, like categorical columns and with them in
                the conditional vector (CTGAN's ``discrete_columns``); their value frequencies
                come from the same DP histogram. ``None`` takes the dataset's
                ``default_discrete_columns``. Decoded values and evaluation are unchanged: the
                columns stay numbers.
            calibrate_marginals: with ``modes="dp"``: every batch of generated records is decoded
                with each numeric column moved onto the DP histogram its modes were fitted on,
                the records' order within the column kept
                (:mod:`~lightning_dpgan.data.marginal_calibration`; post-processing, free).
                Training is unchanged; what is sampled (``synthetic.csv``, ``sample``) changes.
        """
        super().__init__()
        validate_int("--batch-size", batch_size, minimum=1)
        validate_int("--data.num_workers", num_workers, minimum=0)
        validate_int("--data.split_seed", split_seed, minimum=0)
        if not (isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1):
            raise ValueError(f"--data.test_fraction must be in (0, 1), got {test_fraction!r}")
        check_dev_fraction(dev_fraction)
        _check_encoding_args(encoding, modes, modes_epsilon, max_modes, histogram_bins, mixed, log_columns,
                             label_encoding, histogram_threshold, discrete_columns, calibrate_marginals)
        if not isinstance(exclude_label, bool):
            raise ValueError(f"--data.exclude_label must be true or false, got {exclude_label!r}")
        self.save_hyperparameters()
        settings_with_text_paths(self.hparams)
        self.mixed = _mixed(mixed) if mixed is not None else _mixed(self.default_mixed)
        self.log_columns = column_names(log_columns, "--data.log_columns") if log_columns is not None else list(self.default_log_columns)
        self.discrete_columns = (column_names(discrete_columns, "--data.discrete_columns") if discrete_columns is not None
                                 else list(self.default_discrete_columns))
        self.data_dir = data_folder(data_dir) if self.reads_data_dir else None
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.train_frame: pd.DataFrame | None = None
        self.test_frame: pd.DataFrame | None = None
        self.dev_frame: pd.DataFrame | None = None
        self.train_dataset: TensorDataset | None = None
        self._schema: TableSchema | None = None
        self._report: EncodingReport | None = None
        self._transformer: TableTransformer | None = None
        self._modes_cost: dict[str, Any] | None = None
        self._resolved: dict[str, Path] = {}  # the local path of each file, once found (see _resolve)

    # --- what subclasses provide -------------------------------------------------------------

    def _read_split(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Raw ``(train, test)`` frames restricted to the schema's columns, not encoded."""
        raise NotImplementedError

    def _build_schema(self) -> TableSchema:
        """The dataset's schema; built-ins return a constant written from public sources."""
        raise NotImplementedError

    # --- schema and shapes -------------------------------------------------------------------

    @property
    def schema(self) -> TableSchema:
        """The schema that encodes and decodes records (built once, on first use)."""
        if self._schema is None:
            self._schema = self._build_schema()
        return self._schema

    @property
    def encoded_schema(self) -> TableSchema:
        """The schema of the encoded records: :attr:`schema`, or its features alone with
        ``exclude_label``."""
        return self.schema.without_label() if self.hparams.exclude_label else self.schema

    @property
    def data_shape(self) -> tuple[int]:
        """Width of an encoded record. With ``encoding="mode-specific"`` and ``modes="dp"`` it
        depends on the number of modes found, so this fits the transformer (once)."""
        if self.mode_specific:
            return (self.table_transformer.encoded_dim,)
        return (self.encoded_schema.encoded_dim,)

    def privacy_cost(self) -> dict[str, Any]:
        """Privacy spent on preprocessing, to add to training's.

        Min-max encoding: the schema's cost (nothing for a public schema). Mode-specific: the
        basic composition -- ε and δ summed -- of the schema's cost and the modes' histogram,
        both for add/remove neighbours; ``parts`` keeps each (a resume restores them apart).
        """
        schema_cost = self._schema_cost()
        if not self.mode_specific:
            return schema_cost
        _ = self.table_transformer  # fits it (and so spends) if it has not run yet
        return compose_costs({"schema": schema_cost, "modes": dict(self._modes_cost)})

    def _schema_cost(self) -> dict[str, Any]:
        """What obtaining the schema cost: nothing for a public one (subclasses estimating it
        under DP override this), nor for one an earlier run released, labelled as such: its
        estimate read these rows, and its cost is in that run's report."""
        return dict(EARLIER_DP_SCHEMA_COST if self.schema.released_by_a_dp_estimate else PUBLIC_SCHEMA_COST)

    def planned_privacy_cost(self) -> dict[str, Any]:
        """What :meth:`privacy_cost` will be, from the settings alone, before any row is read (the
        releases not made yet: the DP schema estimate, the DP modes): a budget they alone would
        use up is refused before they spend it. The releases made already count as made."""
        schema_cost = self._planned_schema_cost()
        if not self.mode_specific:
            return schema_cost
        modes = dict(self._modes_cost) if self._modes_cost is not None else (
            {"epsilon": float(self.hparams.modes_epsilon), "delta": 0.0, "mechanism": DP_HISTOGRAM_MECHANISM,
             "neighbours": "add-remove"} if self.hparams.modes == "dp" else dict(BOUNDS_MODES_COST))
        return compose_costs({"schema": schema_cost, "modes": modes})

    def _planned_schema_cost(self) -> dict[str, Any]:
        """The schema's cost before it is obtained (:meth:`planned_privacy_cost`)."""
        return dict(PUBLIC_SCHEMA_COST)

    # --- mode-specific encoding --------------------------------------------------------------

    @property
    def mode_specific(self) -> bool:
        return self.hparams.encoding == "mode-specific"

    @property
    def fits_encoding(self) -> bool:
        """True while using the encoding would fit it on private rows (mode-specific with DP
        modes, not fitted or restored yet): a resume should :meth:`restore_transformer`."""
        return self.mode_specific and self.hparams.modes == "dp" and self._transformer is None

    @property
    def table_transformer(self) -> TableTransformer | None:
        """The mode-specific transformer (fitted once, on first use); ``None`` with min-max."""
        if not self.mode_specific:
            return None
        if self._transformer is None:
            self._transformer, self._modes_cost = self._fit_transformer()
        return self._transformer

    @property
    def table_layout(self) -> dict[str, Any] | None:
        """:meth:`TableTransformer.layout` for CTGAN-style models; ``None`` with min-max."""
        transformer = self.table_transformer
        return None if transformer is None else transformer.layout()

    def released_transformer(self) -> dict[str, Any] | None:
        """The transformer as stored in a checkpoint (:meth:`TableTransformer.to_dict`), so a
        run can decode later and a resume can reuse it; ``None`` with min-max."""
        transformer = self.table_transformer
        return None if transformer is None else transformer.to_dict()

    def _fit_transformer(self) -> tuple[TableTransformer, dict[str, Any]]:
        """Fit on the DP histogram of the train split (never the test split), or from bounds."""
        h = self.hparams
        schema = self.encoded_schema
        mixed, log_columns, discrete = self._encoded_roles()
        if h.modes == "bounds":
            transformer = TableTransformer.from_bounds(schema, mixed=mixed, log_columns=log_columns,
                                                       label_scalar=self.label_scalar, discrete=discrete)
            return transformer, dict(BOUNDS_MODES_COST)
        checked_roles(schema, mixed, log_columns, self.label_scalar, discrete)  # before any row is read
        self._load_frames()
        transformer, cost = TableTransformer.fit_dp(
            self.train_frame, schema, h.modes_epsilon, max_modes=h.max_modes, bins=h.histogram_bins,
            mixed=mixed, log_columns=log_columns, label_scalar=self.label_scalar,
            threshold=h.histogram_threshold, discrete=discrete, calibrated=h.calibrate_marginals,
        )
        log.info("%s: mode-specific encoding fitted on a DP histogram (%s)", self.name, cost)
        return transformer, cost

    @property
    def label_scalar(self) -> bool:
        """Whether the mode-specific encoding holds a continuous label as one min-max scalar."""
        return self.hparams.label_encoding == "scalar"

    def _encoded_roles(self) -> tuple[dict[str, list[float]], list[str], list[str]]:
        """Mixed, long-tail and discrete declarations for the encoded columns: a dataset's
        defaults may name its label (King's log price), which ``exclude_label`` leaves out of
        the records."""
        if not self.hparams.exclude_label:
            return self.mixed, self.log_columns, self.discrete_columns
        label = self.schema.label
        return ({k: v for k, v in self.mixed.items() if k != label}, [c for c in self.log_columns if c != label],
                [c for c in self.discrete_columns if c != label])

    def restore_transformer(self, transformer: Mapping[str, Any] | TableTransformer, cost: Mapping[str, Any] | None) -> None:
        """Use the transformer an earlier run of the same training released (a resume), and
        what its histogram cost -- spent once, reported again, never spent a second time.

        ``cost`` is the modes' cost or the composed :meth:`privacy_cost` of that run (its
        ``parts["modes"]`` is taken). The schema must already be the run's (restore a DP
        estimated schema first): a transformer for another schema would mis-encode the rows.
        """
        if not self.mode_specific:
            raise ValueError("restore_transformer needs encoding='mode-specific'")
        if getattr(self, "estimates_schema", False):
            raise ValueError("restore the released schema (restore_schema) before the transformer built on it")
        if self._transformer is not None:
            raise RuntimeError("the transformer is already fitted or restored: restoring now would mix two encodings")
        restored = transformer if isinstance(transformer, TableTransformer) else TableTransformer.from_dict(transformer)
        if encoding_layout(restored.schema.to_dict()) != encoding_layout(self.encoded_schema.to_dict()):
            raise ValueError("the checkpoint's transformer was built for another schema than this datamodule's")
        modes_cost = _part(cost, "modes")
        if restored.modes == "dp" and (not modes_cost or "epsilon" not in modes_cost):
            raise ValueError("the checkpoint does not record what its DP modes cost: resuming would under-report "
                             "epsilon. Start a new run, or use --data.modes bounds.")
        # calibration is post-processing of the released histogram: this run's setting applies
        self._transformer = restored.with_calibration(self.hparams.calibrate_marginals)
        self._modes_cost = dict(modes_cost) if modes_cost else dict(BOUNDS_MODES_COST)

    # --- releases in checkpoints -------------------------------------------------------------

    def _released_schema(self) -> dict[str, Any] | None:
        """The schema as released by a DP estimate (a CSV without a schema file), else None."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """The DP releases drawn from the rows (a CSV's estimated schema, the mode-specific
        encoding's DP modes) with their cost, once drawn: Lightning keeps this in every checkpoint,
        whoever trains. A resume restores them (:meth:`restore_releases`) instead of drawing and
        paying for new ones, and :meth:`load_state_dict` refuses a datamodule that drew its own."""
        state: dict[str, Any] = {}
        if (schema := self._released_schema()) is not None:
            state["schema"] = schema
        if self.mode_specific and self.hparams.modes == "dp" and self._transformer is not None:
            state["table_transformer"] = self._transformer.to_dict()
        if state:
            state["preprocessing_cost"] = self.privacy_cost()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Refuse to go on from a checkpoint under other DP releases than its own: a datamodule
        built afresh for a resume from Python drew its own DP modes (a second histogram no report
        counted) and, at the same width, trained on in silence on records encoded otherwise."""
        differing = []
        if "schema" in state and encoding_layout(state["schema"]) != encoding_layout(self.schema.to_dict()):
            differing.append("DP-estimated schema")
        if "table_transformer" in state and (
                _plain_encoding(state["table_transformer"]) != _plain_encoding(self.released_transformer())):
            differing.append("mode-specific encoding (its DP modes)")
        if differing:
            raise ValueError(
                f"{self.name}: this datamodule's {' and '.join(differing)} is not the checkpoint's: built afresh, it "
                f"drew its own from the rows (spending epsilon {self.privacy_cost()['epsilon']:g} that no report "
                "counts) where a resume must reuse the checkpoint's. Build the datamodule anew and call "
                "restore_releases(checkpoint) on it before anything reads its data_shape, table_layout or setup")

    def restore_releases(self, checkpoint: str | os.PathLike[str] | Mapping[str, Any]) -> None:
        """Take the DP releases a checkpoint holds instead of drawing new ones: call it on a
        datamodule built afresh to resume, before anything reads ``data_shape``, ``table_layout``
        or ``setup``. ``checkpoint``: a file or the checkpoint already read (its datamodule state is
        taken, else ``train``'s run information), or either of those mappings itself. Nothing to do
        for releases the datamodule does not draw (a schema file, ``modes="bounds"``)."""
        from lightning_dpgan.modules.base import CHECKPOINT_KEY
        from lightning_dpgan.sampling import read_checkpoint

        read = checkpoint if isinstance(checkpoint, Mapping) else read_checkpoint(checkpoint)
        released = read.get(type(self).__qualname__) or (read.get(CHECKPOINT_KEY) or {}).get("run") or read
        if getattr(self, "estimates_schema", False) and "schema" in released:
            self.restore_schema(TableSchema.from_dict(released["schema"]), released.get("preprocessing_cost"))
        if self.fits_encoding and "table_transformer" in released:
            self.restore_transformer(released["table_transformer"], released.get("preprocessing_cost"))

    # --- Lightning hooks ---------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Make every raw file available locally, downloading into the cache when allowed."""
        for remote in self.files:
            self._resolve(remote)

    #: What training does with a row holding a category outside the schema (see
    #: :meth:`TableSchema.encode`): keep it with that column ``"blank"``, or ``"drop"`` it.
    #: ``"blank"``, always for ``train`` and ``evaluate`` and by default for a library user: were
    #: the row dropped, the number of training records would depend on a value, and it is
    #: released (privacy.json's ``train_records``, DP-SGD's sample rate, synthetic.csv's length);
    #: under replace-one neighbours (PATE's teachers, GS-WGAN's critics) it would also redraw
    #: every teacher's partition. (Until it was the default, a datamodule built by hand dropped
    #: such rows, and a CSV with a category outside its schema trained on 114 of 160 rows.)
    unknown_categories: str = "blank"

    def setup(self, stage: str | None = None) -> None:
        """Split the rows (once) and encode the train split alone into ``train_dataset``."""
        if self.train_dataset is not None:
            return
        self._load_frames()
        records, self._report = self.encode(self.train_frame, unknown=self.unknown_categories)
        if len(records) == self._report.rows_blanked:
            booleans = [name for name in self.schema.boolean_category_columns() if self._report.rejected.get(name)]
            raise SchemaError(f"{self.name}: none of the {len(self.train_frame)} training rows fits the schema "
                              f"({self._report.summary()}): check the category lists against the data"
                              + (f"; {booleans} list booleans: {YAML_BOOLEANS}" if booleans else ""))
        self._refuse_a_single_class()
        self._refuse_held_out_labels_outside_the_classes()
        self._refuse_a_column_wholly_outside_its_bounds()
        self.train_dataset = TensorDataset(records)
        log.info("%s train split: %s", self.name, self._report.summary())
        if self._report.rows_rejected or self._report.rows_blanked:  # for the data holder (private counts)
            what = "were left out" if self._report.rows_rejected else "were kept with that column blank"
            log.warning("%s: %d training rows hold categories outside the schema and %s (%s)%s", self.name,
                        self._report.rows_rejected or self._report.rows_blanked, what, self._report.summary(),
                        self._estimate_hint() or self._spelling_hint())
        clipped = {name: sum(counts.values()) for name, counts in self._report.clipped.items()
                   if sum(counts.values()) > CLIPPED_SHARE_WARNING * self._report.rows_in}
        if clipped:
            log.warning("%s: the bounds clip more than %d%% of the training values of %s (%s)%s", self.name,
                        round(100 * CLIPPED_SHARE_WARNING), ", ".join(clipped),
                        ", ".join(f"{name} {count} of {self._report.rows_in}" for name, count in clipped.items()),
                        self._grid_end_hint(clipped) or self._estimate_hint())
        self._warn_of_bounds_at_the_grids_finest()

    def _warn_of_bounds_at_the_grids_finest(self) -> None:
        """Estimated bounds no wider than the DP grid's finest magnitude (2^-10, about 0.001): the
        column's values may be far smaller (1e-6 learnt within [0, 0.001], drawn a hundred times too
        large), which clips nothing and so went unsaid. Read off the released bounds alone."""
        from lightning_dpgan.data.dp_bounds import GRID_EXPONENTS

        finest = 2.0 ** min(GRID_EXPONENTS)
        tiny = [column.name for column in self.schema.columns if column.is_numeric and column.from_dp_estimate
                and max(map(abs, column.bounds)) <= finest]
        if tiny:
            log.warning("%s: the estimated bounds of %s are the DP estimate's finest (within ±%.3g), which no budget "
                        "narrows: values much smaller than that are learnt and drawn on that coarse scale. Rescale "
                        "those columns (e.g. to other units), or give a schema file with their bounds (--data.schema)",
                        self.name, ", ".join(tiny), finest)

    def _refuse_a_column_wholly_outside_its_bounds(self) -> None:
        """A declared (public) bound that clips every training value of its column: the column is
        learnt as a constant at the bound, a schema mistake (a unit, a typo) that only warned. For
        the data holder: counts read from the private rows, released nowhere. A DP estimate's
        bounds are not refused here (its budget is spent; the clipping warning names them)."""
        rows = self._report.rows_in
        for name, counts in self._report.clipped.items():
            declared = not self.schema.column(name).from_dp_estimate
            if declared and rows and counts["below"] + counts["above"] == rows:
                low, high = self.schema.column(name).bounds
                raise SchemaError(
                    f"{self.name}: every one of the {rows} training values of '{name}' lies outside its declared "
                    f"bounds [{low:g}, {high:g}] ({counts['below']} below, {counts['above']} above): the column would be "
                    "learnt as a constant at a bound. Correct the bounds in the schema (a unit or a typo?)")

    def _refuse_a_single_class(self) -> None:
        """A class label whose training rows all hold the same class: no classifier can be
        trained on the table, nor scored (every setting's accuracy 1 by construction), and a
        class-conditional generator has one class to draw. For the data holder: the count is
        read from the private rows, and the refusal releases nothing."""
        schema = self.schema
        if schema.label is None or schema.label_column.is_numeric:
            return
        held = schema.label_classes_held(self.train_frame)
        if len(held) < 2:
            # none held: the values it does hold, and the classes they missed (unquoted no/yes in a
            # schema file are YAML's booleans; 0.0 and 1.0 are not the classes 0 and 1)
            classes = list(schema.label_column.categories)
            instead = (f" {classes} (it holds {row_examples(self.train_frame[schema.label].drop_duplicates())})"
                       if not held else "")
            booleans = f"; {YAML_BOOLEANS}" if not held and schema.label in schema.boolean_category_columns() else ""
            raise SchemaError(
                f"{self.name}: the label '{schema.label}' holds {f'one class ({held[0]!r})' if held else 'none of its classes'}"
                f"{instead} in all {len(self.train_frame)} training rows: a class label needs rows of at least two "
                f"classes. Check that this is the right file and label column (for a CSV file, --data.target or the "
                f"schema file's label names another){booleans}")

    def _refuse_held_out_labels_outside_the_classes(self) -> None:
        """A binary label holding another value in a held-out row (test or dev) would be refused
        only by ``evaluate``, after the budget was spent; encoding refuses it in the training rows.
        Every row is checked before training, as for gaps; refusing releases nothing."""
        schema = self.schema
        for split, frame in (("test", self.test_frame), ("dev", self.dev_frame)):
            bad = schema.label_values_outside_classes(frame) if frame is not None else ()
            if len(bad):
                error = schema.labels_outside_classes_error(f"{len(bad)} {split} rows", row_examples(bad),
                                                            "every row is checked before training, the held-out ones too")
                raise SchemaError(f"{self.name}: {error}")

    def _estimate_hint(self) -> str:
        """What to do when the schema is a DP estimate: its bounds and category lists are noisy,
        and a small budget over a small file cuts them short."""
        if not self.schema.released_by_a_dp_estimate:
            return ""
        if self.hparams.get("schema") is not None:  # an earlier run's release, given as --data.schema
            return ("; the schema file was released by an earlier run's DP estimate, which a small budget on few rows "
                    "cuts short: estimate it again with a larger --data.bounds_epsilon (without --data.schema; that "
                    "spends again), or give a schema file with public bounds and category lists")
        return ("; the schema is a DP estimate of this file's bounds and categories, which a small budget on few rows "
                "cuts short: raise --data.bounds_epsilon, or give a schema file with public bounds and category "
                "lists (--data.schema)")

    def _spelling_hint(self) -> str:
        """Values outside a declared category list that match one of its categories but for spaces
        or case (``"Male "``, ``"male"`` against ``Male``): a spelling of the file, not another
        category. For the data holder, as the counts beside it: read from the private rows."""
        found = []
        for column in self.schema.columns:
            if column.is_numeric or not self._report.rejected.get(column.name):
                continue
            declared = {str(category).strip().casefold() for category in column.categories}
            known = {str(category) for category in column.categories}
            near = sorted({value for value in self.train_frame[column.name].dropna().unique()
                           if isinstance(value, str) and value not in known and value.strip().casefold() in declared})
            if near:
                found.append(f"{column.name!r} holds {', '.join(map(repr, near[:3]))}")
        if not found:
            return ""
        return (f"; {'; '.join(found)}: declared categories but for spaces or case. Clean the file, or list "
                "those spellings in the schema")

    def _grid_end_hint(self, columns: Sequence[str]) -> str:
        """Where an estimated bound of ``columns`` reached the end of the DP bounds' fixed grid, no
        budget can widen it: say so rather than advise a larger budget (the bounds are public)."""
        from lightning_dpgan.data.dp_bounds import geometric_grid

        end = float(geometric_grid()[-1])
        at_end = [column.name for column in self.schema.columns if column.name in columns and column.is_numeric
                  and column.from_dp_estimate and max(map(abs, column.bounds)) >= end]
        if not at_end:
            return ""
        return (f"; the estimated bounds of {', '.join(at_end)} reached the end of the DP estimate's grid "
                f"(±{end:.3g}), which no budget widens: give a schema file with their bounds (--data.schema), "
                "or rescale those columns")

    def encode(self, frame: pd.DataFrame, unknown: str = "drop") -> tuple[torch.Tensor, EncodingReport]:
        """Rows in the training encoding (mode-specific or min-max, of :attr:`encoded_schema`),
        as ``setup`` encodes the train split; ``unknown`` as in :meth:`TableSchema.encode`."""
        if self.mode_specific:
            return self.table_transformer.encode(frame, seed=ENCODE_SEED, unknown=unknown)
        return self.encoded_schema.encode(frame, unknown=unknown)

    def train_dataloader(self) -> DataLoader:
        """Shuffled batches of encoded train records; full batches only when each process's share
        has enough (else each step takes the whole share: dropping it would leave no batch)."""
        dataset = self._require_dataset()
        workers = self.hparams.num_workers
        processes = self.trainer.world_size if self.trainer is not None else 1
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=True,
            drop_last=rows_per_process(len(dataset), processes) >= self.hparams.batch_size,
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    # --- results -----------------------------------------------------------------------------

    def training_row_count(self) -> int:
        """The training rows, counted before any DP release reads a value (the file is read and
        split, nothing encoded): the ``n`` of ``delta < 1/n`` and of the batch and partition
        checks, which a run makes before its releases. Public: privacy.json's ``train_records``.
        With a public schema the label's checks come now too (one class, a binary label's third
        value in a held-out row): ``setup`` makes them after the DP modes were drawn."""
        self._load_frames()
        if not getattr(self, "estimates_schema", False):  # a public schema decides these: before the DP modes
            self._refuse_a_single_class()
            self._refuse_held_out_labels_outside_the_classes()
        return len(self.train_frame)

    def releases_drawn(self) -> dict[str, dict[str, Any]]:
        """The DP releases drawn from the rows so far (or restored from a checkpoint), by name,
        with their cost: read off what exists, so asking draws nothing (unlike :meth:`privacy_cost`)."""
        drawn = {}
        if (schema_cost := getattr(self, "_bounds_cost", None)) is not None:  # a CSV's DP schema estimate
            drawn["schema"] = dict(schema_cost)
        if self.mode_specific and self.hparams.modes == "dp" and self._modes_cost is not None:
            drawn["modes"] = dict(self._modes_cost)
        return drawn

    @property
    def train_size(self) -> int:
        """Number of encoded training records, the ``n`` in the privacy requirement ``delta < 1/n``."""
        return len(self._require_dataset())

    @property
    def encoding_report(self) -> dict[str, Any]:
        """Clip/reject counts of encoding the train split (private statistics: do not publish)."""
        if self._report is None:
            raise RuntimeError(f"{type(self).__name__}.encoding_report is known only after setup().")
        return self._report.to_dict()

    def decode(self, records: torch.Tensor) -> pd.DataFrame:
        """Encoded (e.g. generated) records back to a DataFrame with the original columns."""
        if self.mode_specific:
            return self.table_transformer.decode(records)
        return self.encoded_schema.decode(records)

    def labelled_records(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The train split as ``(features, label)`` in the schema's min-max / one-hot encoding
        (public), for a DP label model: features are :attr:`schema` without the label's
        block, the label is that block (one-hot, or one scalar in [0, 1]).

        Private rows: only a DP mechanism may read these (QUAIL's label model, trained by DP-SGD).
        """
        if self.schema.label is None:
            raise ValueError(f"{self.name}: the table has no label column")
        self._load_frames()
        records, report = self.schema.encode(self.train_frame, unknown=self.unknown_categories)
        if blank_labels := report.rejected.get(self.schema.label, 0):  # for the data holder (a private count)
            log.warning("%s: %d training rows hold a label outside the schema's classes (%s): kept, they teach the "
                        "label model nothing%s", self.name, blank_labels, report.summary(), self._estimate_hint())
        block = self.schema.label_slice
        features = torch.cat([records[:, : block.start], records[:, block.stop :]], dim=1)
        return features, records[:, block]

    def partitions(self, num_parts: int, seed: int = 0) -> list[torch.Tensor]:
        """Disjoint index sets of the train records that together cover them (PATE teachers).

        A seeded shuffle cut into ``num_parts`` parts whose sizes differ by at most one
        (:func:`~lightning_dpgan.data.partition.disjoint_partitions`); each part is sorted. Each
        record is in exactly one part, which PATE's analysis relies on.
        """
        validate_int("num_parts", num_parts, minimum=1)
        return teacher_partitions(self.train_size, num_parts, seed)

    # --- helpers for subclasses --------------------------------------------------------------

    def _label_name(self) -> Any:
        """The label column's name where it is known without a release: a CSV's --data.target, a
        public schema's label (a CSV's schema may be a DP estimate of the rows: not built here)."""
        if getattr(self, "target", None) is not None:
            return self.target
        return None if getattr(self, "estimates_schema", False) else self.schema.label

    def _load_frames(self) -> None:
        if self.train_frame is None:
            train, test = self._read_split()
            # every row, the held-out ones too: a gap there would surface only at evaluate, after
            # the budget was spent. Both splits in one message: fixed one at a time, the file took
            # two rounds. Refusing reads nothing into any release
            gaps = [(split, counts, frame) for split, frame in (("training", train), ("test", test))
                    if (counts := missing_value_counts(frame))]
            if gaps:
                where = "; ".join(f"in the {split} rows, columns: {counts}" for split, counts, _ in gaps)
                remedy = missing_values_remedy(pd.concat([frame for _, _, frame in gaps]), self._label_name())
                raise SchemaError(f"{self.name}: missing values (NaN) {where}; {remedy} (every row is checked "
                                  "before training, the held-out ones too)")
            self.test_frame = test
            kept, dev = dev_split(len(train), self.hparams.dev_fraction, self.hparams.split_seed)
            if len(dev):
                train, self.dev_frame = train.iloc[kept], train.iloc[dev]
            self.train_frame = train

    def train_rows_digest(self) -> str:
        """SHA-256 of the training rows written as text, with their positions in the file. The
        checkpoint keeps it (private, like the rows: a digest of private data is never released),
        so that ``evaluate`` can tell that the file under a run changed after training."""
        self._load_frames()
        return hashlib.sha256(self.train_frame.to_csv(index=True).encode()).hexdigest()

    def held_out(self, split: str = "test") -> pd.DataFrame:
        """The raw rows a run is scored on: the ``"test"`` split, or the ``"dev"`` rows held out
        of the train split (only when the run was trained with ``dev_fraction``)."""
        check_held_out_split(split, self.hparams.dev_fraction, self.name)
        self._load_frames()
        return self.test_frame if split == "test" else self.dev_frame

    def _seeded_split(self, frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """A fixed train/test split by a permutation seeded with ``split_seed``.

        It depends on the row count alone (not on values), and keeps each frame's index (the
        row number in the file), so the split is reproducible and checkable.
        """
        n_rows = len(frame)
        if n_rows == 0:
            raise DataIntegrityError(f"{self.name}: the data file holds no rows, only its header")
        if n_rows < 2:
            raise DataIntegrityError(f"{self.name}: the data file holds one row; the train and test splits need at "
                                     "least one each: train on more rows")
        n_test = int(round(n_rows * self.hparams.test_fraction))
        if not 0 < n_test < n_rows:
            fractions = ("--data.test_fraction 0.5" if n_rows == 2 else  # one row each way: one fraction, not a range
                         f"a fraction from {1 / n_rows:.6g} to {(n_rows - 1) / n_rows:.6g}")
            raise ValueError(
                f"{self.name}: --data.test_fraction {self.hparams.test_fraction} leaves {n_test} of {n_rows} rows for "
                f"testing; both splits need at least one row: use {fractions}, or train on more rows"
            )
        order = np.random.default_rng(self.hparams.split_seed).permutation(n_rows)
        return frame.iloc[np.sort(order[n_test:])], frame.iloc[np.sort(order[:n_test])]

    def raw_file_names(self) -> list[str]:
        """The files looked up in ``data_dir`` (``sample --out`` refuses those found there)."""
        return [remote.name for remote in self.files]

    def _resolve(self, remote: RemoteFile) -> Path:
        """Local path of ``remote``, downloading it when missing and allowed.

        A file in ``data_dir`` is the user's and is taken as is (its content is still checked
        by the schema), with a warning when it is not the canonical file (a truncated copy trains
        on fewer records, and privacy.json reports that count); cached and downloaded copies are
        verified by md5 and size.
        """
        if remote.name in self._resolved:  # once a run: the check hashes the whole file, and warns
            return self._resolved[remote.name]
        self._resolved[remote.name] = self._locate_or_fetch(remote)
        return self._resolved[remote.name]

    def _locate_or_fetch(self, remote: RemoteFile) -> Path:
        if self.data_dir is not None and (found := locate(remote.name, self.data_dir, self.subdirs)):
            if not is_valid_copy(found, remote):
                log.warning("%s: %s is not the canonical %s (its content's md5 differs from %s): training on it as "
                            "it is", self.name, found, remote.name, remote.md5)
            return found
        cached, damaged = self._cache_folder() / remote.name, None
        if cached.is_file():
            try:
                verify_file(cached, remote)
            except DataIntegrityError as err:
                damaged = err
            else:
                warn_downloading(self.name, [remote.name], self.data_dir, self._cache_folder(), cached=True)
                return cached
        if not self.hparams.download:
            if damaged is not None:
                raise DataIntegrityError(f"{damaged} To fix: delete the cached copy to download it again (with downloads "
                                         f"allowed), or pass `--data-dir DIR` pointing at the official {self.name} files.")
            raise DatasetNotFoundError(self._not_found_message(self._files_not_found(remote), "download=False"))
        warn_downloading(self.name, [remote.name], self.data_dir, self._cache_folder())
        try:
            return fetch(remote, self._cache_folder())
        except CacheNotWritableError as err:  # a cache it cannot write: its damaged copy said too
            if damaged is None:
                raise
            raise CacheNotWritableError(f"{err} {damaged_cache_message(cached, damaged, self.name, False)}") from err
        except DatasetNotFoundError as err:
            said = (damaged_cache_message(cached, damaged, self.name) if damaged is not None
                    else self._not_found_message(self._files_not_found(remote), "download failed"))
            raise DatasetNotFoundError(f"{err} {said}") from err

    def _cache_folder(self) -> Path:
        return self.cache_dir / self.name

    def _files_not_found(self, first: RemoteFile) -> list[str]:
        """``first`` (the file that could not be had) and the dataset's other files that are in
        neither ``data_dir`` nor the cache: named together, so that the user copies them all at
        once (Adult named adult.data, then, on the next run, adult.test)."""
        def held(remote: RemoteFile) -> bool:
            return bool(self.data_dir is not None and locate(remote.name, self.data_dir, self.subdirs)
                        or (self._cache_folder() / remote.name).is_file())

        return [first.name] + [remote.name for remote in self.files if remote.name != first.name and not held(remote)]

    def _not_found_message(self, names: list[str], reason: str) -> str:
        where = [str(self.data_dir)] if self.data_dir else []
        where.append(str(self._cache_folder()))
        return (
            f"{self.name} files not found ({reason}). Expected: {', '.join(names)}. Searched: "
            f"{', '.join(where)}. Pass `--data-dir DIR` (or set {DATA_DIR_ENV}) pointing at a folder "
            f"holding them, directly or in a subfolder named one of {list(self.subdirs)}."
        )

    def _require_dataset(self) -> TensorDataset:
        if self.train_dataset is None:
            raise RuntimeError(f"{type(self).__name__}: the train split is not loaded; call setup() first.")
        return self.train_dataset


def _check_encoding_args(
    encoding: str, modes: str, modes_epsilon: float, max_modes: int, histogram_bins: int,
    mixed: Mapping[str, Sequence[float]] | None, log_columns: Sequence[str] | str | None,
    label_encoding: str, histogram_threshold: float, discrete_columns: Sequence[str] | str | None = None,
    calibrate_marginals: bool = False,
) -> None:
    """Argument checks that need no schema (column names are checked against it at the fit)."""
    if encoding not in ENCODINGS:
        raise ValueError(f"--data.encoding must be one of {ENCODINGS}, got {encoding!r}")
    if modes not in MODES:
        raise ValueError(f"--data.modes must be one of {MODES}, got {modes!r}")
    if isinstance(modes_epsilon, bool) or not isinstance(modes_epsilon, (int, float)) or not (
        math.isfinite(modes_epsilon) and modes_epsilon > 0
    ):
        raise ValueError(f"--data.modes_epsilon must be a finite number > 0, got {modes_epsilon!r}")
    validate_int("--data.max_modes", max_modes, minimum=1)
    validate_int("--data.histogram_bins", histogram_bins, minimum=1)
    if encoding != "mode-specific" and (mixed is not None or log_columns is not None or discrete_columns is not None):
        raise ValueError("--data.mixed, --data.log_columns and --data.discrete_columns declare columns of the "
                         "mode-specific encoding: pass --data.encoding mode-specific with them")
    if label_encoding not in LABEL_ENCODINGS:
        raise ValueError(f"--data.label_encoding must be one of {LABEL_ENCODINGS}, got {label_encoding!r}")
    if label_encoding != "scalar" and encoding != "mode-specific":
        raise ValueError("--data.label_encoding chooses how the mode-specific encoding holds a continuous label: "
                         "pass --data.encoding mode-specific with it")
    if isinstance(histogram_threshold, bool) or not isinstance(histogram_threshold, (int, float)) or not (
        math.isfinite(histogram_threshold) and histogram_threshold >= 0
    ):
        raise ValueError(f"--data.histogram_threshold must be a finite number >= 0, got {histogram_threshold!r}")
    if not isinstance(calibrate_marginals, bool):
        raise ValueError(f"--data.calibrate_marginals must be true or false, got {calibrate_marginals!r}")
    histogram_settings = [flag for flag, given in (("--data.modes_epsilon", modes_epsilon != DEFAULT_MODES_EPSILON),
                                                   ("--data.histogram_threshold", histogram_threshold != 0))
                          if given]
    # else taken and unused. Not refused with --data.modes bounds: the CTGAN models' presets set them
    # for their DP modes, and --data.modes bounds is how a user turns those off
    if histogram_settings and encoding != "mode-specific":
        raise ValueError(f"{' and '.join(histogram_settings)} set{'s' if len(histogram_settings) == 1 else ''} the DP "
                         "histogram of the mode-specific encoding's modes; with --data.encoding "
                         f"{encoding} no histogram is released and nothing is spent on modes: leave "
                         f"{'it' if len(histogram_settings) == 1 else 'them'} out")
    if calibrate_marginals and (encoding != "mode-specific" or modes != "dp"):
        raise ValueError("--data.calibrate_marginals moves generated columns onto the DP histogram of the "
                         "mode-specific encoding: it needs --data.encoding mode-specific with --data.modes dp")
    if mixed is not None:
        _mixed(mixed)


def _mixed(mixed: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """``{column: [special values]}`` as plain lists (a single number is a list of one)."""
    if not isinstance(mixed, Mapping):
        raise ValueError(f"--data.mixed must map column names to lists of special values, got {mixed!r}")
    out = {}
    for name, values in mixed.items():
        values = [values] if isinstance(values, (int, float)) and not isinstance(values, bool) else values
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"--data.mixed['{name}'] must be a non-empty list of special values, got {values!r}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ValueError(f"--data.mixed['{name}'] special values must be numbers, got {list(values)!r}")
        out[str(name)] = [float(v) for v in values]
    return out


def _plain_encoding(transformer: Mapping[str, Any] | None) -> Any:
    """A transformer's stored form without its calibration setting (post-processing that a
    resume may change), as plain JSON values, for comparing two encodings."""
    if transformer is None:
        return None
    return json.loads(json.dumps({k: v for k, v in transformer.items() if k != "calibrated"}, default=list, sort_keys=True))


def _part(cost: Mapping[str, Any] | None, name: str) -> dict[str, Any] | None:
    """One part of a composed cost (:func:`compose_costs`), or the cost itself if not composed."""
    if not cost:
        return None
    parts = cost.get("parts")
    if parts is None:
        return dict(cost)
    return dict(parts[name]) if name in parts else None
