#!/usr/bin/env python
"""Fit one smartnoise-synth (1.0.8) synthesizer on a train split and write synthetic rows.

Standalone peer-baseline script for the benchmark harness. It runs in its own virtualenv
(smartnoise-synth 1.0.8, opacus 0.14, torch CPU, numpy, pandas) and imports only the standard
library, numpy, pandas and snsynth (torch only through the GAN synthesizers, to seed it and limit
its threads). It does not import lightning_dpgan.

    python benchmarks/peers/smartnoise_synth.py --synthesizer {mst,mwem,pategan,dpgan,dpctgan,patectgan} \\
        --train TRAIN.csv --spec SPEC.json --epsilon E --n N --seed S --out SYNTH.csv \\
        [--report REPORT.json] [--epochs K]

SPEC.json holds the PUBLIC schema of the table::

    {"categorical": {"workclass": ["Private", ...], "income": ["<=50K", ">50K"]},
     "continuous": {"age": [17, 90], ...},
     "integer": ["age", ...],          # continuous columns whose values are whole numbers
     "label": "income",
     "preprocessor_epsilon": 0.0}

Declared bounds and category sets (no budget spent on them)
-----------------------------------------------------------
smartnoise-synth 1.0.8 preprocesses every table through ``snsynth.transform.TableTransformer``;
``Synthesizer.fit(data, transformer=..., preprocessor_eps=...)`` accepts a ready-made one. When every
column transformer is already fit (``TableTransformer.fit_complete``), ``Synthesizer._get_train_data``
skips fitting entirely, spends nothing, and only calls ``transform``. This script builds that
transformer from the spec, mirroring what ``TableTransformer.create(style=...)`` (``TypeMap``) would
build, but with the public values declared instead of read from the data:

* cube style (``mst``, ``mwem``; this is the style their ``fit`` asks for):
    categorical -> ``LabelTransformer`` over the declared category list;
    continuous  -> ``BinTransformer(bins=10, lower=, upper=)`` (10 equal-width bins between the
                   declared bounds: smartnoise's own default for a continuous column in cube style;
                   decoded to the bin midpoint by smartnoise's inverse transform).
* gan style (``dpctgan``, ``patectgan``, ``dpgan``, ``pategan``; likewise their own style):
    categorical -> ``ChainTransformer([LabelTransformer, OneHotEncoder])`` over the declared list;
    continuous  -> ``MinMaxTransformer(lower=, upper=, negative=True)`` (scaled to [-1, 1], clipped
                   back into the declared range by the inverse transform).

Two small subclasses fix the category sets: smartnoise's ``LabelTransformer`` and ``OneHotEncoder``
otherwise learn their categories (and the one-hot width) from the private data, so a category absent
from the train split would vanish from the model's domain. ``DeclaredLabelTransformer`` /
``DeclaredOneHotEncoder`` keep the declared list whatever data they see and raise on a value outside
it (the script also checks the train CSV up front and exits 2 with a clear message). Numeric
transformers with declared bounds are fit on the two bounds alone (``t.fit([lower, upper])``), so
they never look at the data. (smartnoise's own ``_clear_fit`` tests ``if self.lower and self.upper``,
so a declared bound of 0 would not count as "already fit" by itself; pre-fitting sidesteps that.)

A continuous column declared with ``null`` bounds (``[null, null]``) is left to smartnoise, which
estimates its bounds with ``approx_bounds`` from ``preprocessor_eps``; that needs the spec's
``preprocessor_epsilon`` > 0. Categories cannot be estimated privately by smartnoise, so every
categorical column must declare its set. Values of continuous columns outside the declared bounds
are clipped to them (smartnoise's transformers clamp); integer columns are rounded after decoding.

MWEM: smartnoise's ``MWEMSynthesizer._histogram_from_data_attributes`` sizes each histogram from the
min and max label seen in the data (again a data-dependent domain). The subclass used here sizes it
from the declared cardinalities (label 0 .. k-1), which is the declared domain. MWEM keeps its full
histogram in memory; smartnoise's default (``split_factor`` = all columns, one joint histogram) is
used when that histogram has at most 1e6 cells, otherwise ``split_factor=3`` (groups of 3 consecutive
columns, modelled independently of each other; smartnoise's ``split_factor`` option, our choice of 3).

Budget
------
The synthesizer gets ``--epsilon`` minus the spec's ``preprocessor_epsilon``. With everything
declared the preprocessor spends nothing. If some bounds are undeclared, the synthesizer is created
with the full ``--epsilon`` and smartnoise itself subtracts what its preprocessor spent (it does
``self.epsilon -= eps_spent``), which leaves the same ``--epsilon - preprocessor_epsilon`` for training.
delta: ``--delta`` when given (the harness passes the delta our models run at), else smartnoise's
own defaults: MST ``delta=1e-9`` (its constructor default); DP-CTGAN, PATE-CTGAN, DP-GAN and
PATE-GAN ``delta=None``, which they turn into ``1 / (n_train * sqrt(n_train))``. MWEM is pure
epsilon-DP (delta reported as null). The delta used is in REPORT.json.

Other options: smartnoise defaults, except ``--epochs``, which overrides ``epochs`` of ``dpctgan``
and ``dpgan``. PATE-CTGAN accepts an ``epochs`` argument but never reads it, and PATE-GAN has none:
both train until the PATE accountant reaches the budget, so ``--epochs`` is ignored for them (the
report says so). For the opacus-based synthesizers (dpctgan, dpgan) the report also carries the
epsilon that opacus' RDP accountant gives for the steps actually taken at the delta used, read from
the ``PrivacyEngine`` (smartnoise checks the budget at the start of each epoch, so a full default run
can end one epoch past the target; with a small ``--epochs`` it ends below it). That accountant assumes
Poisson sampling at rate batch/n_train, which smartnoise's shuffled / conditional batches are not
(opacus itself warns "The returned privacy budget will be incorrect").

Seeds: ``random``, ``numpy`` and ``torch`` are seeded from ``--seed``. Not everything follows it:
MST and MWEM draw their Gaussian/Laplace noise through OpenDP (OS randomness), opacus 0.14 seeds its
DP-SGD noise generator from ``os.urandom``, and DP-CTGAN's and PATE-CTGAN's ``Discriminator.__init__``
call ``torch.manual_seed(0)``; the script re-seeds torch right after that constructor (from
``--seed``) so the rest of training still depends on the seed, but the discriminator's initial
weights are the same in every run. Runs are therefore not bit-reproducible.

Output: SYNTH.csv with exactly the train CSV's columns, in the same order, ``--n`` rows.
REPORT.json: synthesizer, epsilon (= ``--epsilon``, the total), preprocessor_epsilon, delta,
fit_seconds, sample_seconds, smartnoise_version, options (everything else that was chosen).
Input errors (spec/CSV column mismatch, NaN in train, undeclared categories, unknown synthesizer,
bad epsilon) print a message on stderr and exit with code 2.
"""
import argparse
import contextlib
import json
import math
import os
import random
import sys
import time
import warnings

# Two CPU cores: keep BLAS / OpenMP / XLA (jax, used by MST's mbi) from spawning more threads.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_var, "2")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

SYNTHESIZERS = ("mst", "mwem", "pategan", "dpgan", "dpctgan", "patectgan")
CUBE = ("mst", "mwem")
N_BINS = 10                  # BinTransformer's default, used by TypeMap for continuous columns in cube style
MWEM_MAX_JOINT_CELLS = 1e6   # above this MWEM's single joint histogram is split into groups of 3 columns
MWEM_SPLIT_FACTOR = 3


class InputError(Exception):
    """Bad input: reported on stderr, exit code 2."""


def fail(message):
    print(f"smartnoise_synth.py: error: {message}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- spec and data
def load_spec(path):
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read spec {path}: {e}")
    if not isinstance(spec, dict):
        raise InputError("spec must be a JSON object")
    cat = spec.get("categorical") or {}
    cont = spec.get("continuous") or {}
    if not isinstance(cat, dict) or not isinstance(cont, dict):
        raise InputError("spec 'categorical' and 'continuous' must be objects")
    both = sorted(set(cat) & set(cont))
    if both:
        raise InputError(f"columns declared both categorical and continuous: {both}")
    categorical = {}
    for col, values in cat.items():
        if not isinstance(values, list) or len(values) == 0:
            raise InputError(f"categorical column '{col}' must declare a non-empty list of categories "
                             "(smartnoise cannot estimate category sets privately)")
        labels = [str(v) for v in values]
        if len(set(labels)) != len(labels):
            raise InputError(f"categorical column '{col}' declares duplicate categories")
        categorical[col] = labels
    continuous = {}
    for col, bounds in cont.items():
        if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
            raise InputError(f"continuous column '{col}' must declare [lower, upper] (use null to let smartnoise estimate)")
        lo, hi = bounds
        if (lo is None) != (hi is None):
            raise InputError(f"continuous column '{col}': declare both bounds or neither")
        if lo is not None:
            try:
                lo, hi = float(lo), float(hi)
            except (TypeError, ValueError):
                raise InputError(f"continuous column '{col}': bounds must be numbers")
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise InputError(f"continuous column '{col}': need finite lower < upper, got {bounds}")
        continuous[col] = (lo, hi)
    integer = spec.get("integer") or []
    bad = [c for c in integer if c not in continuous]
    if bad:
        raise InputError(f"'integer' names columns that are not continuous: {bad}")
    label = spec.get("label")
    if label is not None and label not in categorical and label not in continuous:
        raise InputError(f"label '{label}' is not a column of the spec")
    try:
        pre_eps = float(spec.get("preprocessor_epsilon") or 0.0)
    except (TypeError, ValueError):
        raise InputError("preprocessor_epsilon must be a number")
    if pre_eps < 0 or not math.isfinite(pre_eps):
        raise InputError("preprocessor_epsilon must be >= 0")
    return {"categorical": categorical, "continuous": continuous, "integer": list(integer),
            "label": label, "preprocessor_epsilon": pre_eps}


def load_train(path, spec):
    try:
        df = pd.read_csv(path, dtype={c: str for c in spec["categorical"]})
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read train CSV {path}: {e}")
    header = [str(c) for c in df.columns]
    df.columns = header
    declared = set(spec["categorical"]) | set(spec["continuous"])
    if len(set(header)) != len(header):
        raise InputError("train CSV has duplicate column names")
    missing_in_spec = [c for c in header if c not in declared]
    missing_in_csv = [c for c in declared if c not in header]
    if missing_in_spec:
        raise InputError(f"train CSV columns not in the spec: {missing_in_spec}")
    if missing_in_csv:
        raise InputError(f"spec columns missing from the train CSV: {sorted(missing_in_csv)}")
    if len(df) == 0:
        raise InputError("train CSV has no rows")
    nan_cols = [c for c in header if df[c].isna().any()]
    if nan_cols:
        raise InputError(f"train CSV has missing values (NaN) in columns {nan_cols}")
    for col, labels in spec["categorical"].items():
        df[col] = df[col].str.strip()
        unknown = sorted(set(df[col].unique()) - set(labels))
        if unknown:
            shown = unknown[:10] + (["..."] if len(unknown) > 10 else [])
            raise InputError(f"column '{col}' has values outside its declared category set: {shown}")
    for col in spec["continuous"]:
        values = pd.to_numeric(df[col], errors="coerce")
        if values.isna().any():
            raise InputError(f"continuous column '{col}' has non-numeric values")
        if not np.isfinite(values.to_numpy(dtype=float)).all():
            raise InputError(f"continuous column '{col}' has infinite values")
        df[col] = values.astype(float)
    return df, header


# ---------------------------------------------------------------- transformers with declared domains
def build_transformer(spec, columns, style):
    from snsynth.transform import (BinTransformer, ChainTransformer, LabelTransformer, MinMaxTransformer,
                                   OneHotEncoder, TableTransformer)

    class DeclaredLabelTransformer(LabelTransformer):
        """LabelTransformer whose categories are the declared list, never learnt from the data."""

        def __init__(self, column, categories):
            self._column = column
            self._declared = list(categories)
            super().__init__(nullable=False)

        def _clear_fit(self):
            self._reset_fit()
            self.labels = {v: i for i, v in enumerate(self._declared)}
            self.categories = list(self._declared)
            self.category = len(self._declared)
            self.output_width = 1
            self._fit_complete = True

        def _fit(self, val):
            if val not in self.labels:
                raise ValueError(f"column '{self._column}': value {val!r} is outside the declared category set")

        def _fit_finish(self):
            self._fit_complete = True

        def _transform(self, val):
            try:
                return self.labels[val]
            except KeyError:
                raise ValueError(f"column '{self._column}': value {val!r} is outside the declared category set")

    class DeclaredOneHotEncoder(OneHotEncoder):
        """OneHotEncoder whose width is the declared number of categories, never learnt from the data."""

        def __init__(self, n_categories):
            self._n = int(n_categories)
            super().__init__()

        def _clear_fit(self):
            self.max = self._n - 1
            self.output_width = self._n
            self._fit_complete = True

        def _fit(self, val):
            pass

        def _fit_finish(self):
            self.output_width = self._n
            self._fit_complete = True

    transformers, described = [], {}
    for col in columns:
        if col in spec["categorical"]:
            labels = spec["categorical"][col]
            if style == "cube":
                t = DeclaredLabelTransformer(col, labels)
                described[col] = f"LabelTransformer(declared {len(labels)} categories)"
            else:
                t = ChainTransformer([DeclaredLabelTransformer(col, labels), DeclaredOneHotEncoder(len(labels))])
                described[col] = f"ChainTransformer([LabelTransformer, OneHotEncoder]) (declared {len(labels)} categories)"
        else:
            lo, hi = spec["continuous"][col]
            if style == "cube":
                t = BinTransformer(bins=N_BINS, lower=lo, upper=hi, nullable=False)
                name = f"BinTransformer(bins={N_BINS}, lower={lo}, upper={hi})"
            else:
                t = MinMaxTransformer(lower=lo, upper=hi, negative=True, nullable=False)
                name = f"MinMaxTransformer(lower={lo}, upper={hi}, negative=True)"
            if lo is not None:
                t.fit([lo, hi])  # fit on the declared bounds only: no data, no budget
            else:
                name += " bounds estimated by smartnoise from preprocessor_eps"
            described[col] = name
        transformers.append(t)
    return TableTransformer(transformers), described


def make_mwem_class():
    from snsynth.mwem import Histogram, MWEMSynthesizer

    class DeclaredDomainMWEM(MWEMSynthesizer):
        """MWEM whose histogram sizes come from the declared cardinalities, not from the data's min/max."""

        def _histogram_from_data_attributes(self, data, splits=[]):
            cards = self._transformer.cardinality
            histograms = []
            for split in splits:
                split = np.asarray(split)
                split_data = np.asarray(data[:, split], dtype=np.int64)
                dims = [int(cards[i]) for i in split]
                for i in split:
                    self.mins_maxes[str(i)] = (0, int(cards[i]) - 1)
                    self.scale[str(i)] = 1
                if np.prod(dims, dtype=float) > 1e8:
                    warnings.warn(f"Dimensionality of histogram is {int(np.prod(dims, dtype=float)):,}, consider using splits.")
                hist = Histogram.histogramdd_indexes(split_data, dims).astype(float)
                edges = [np.arange(d + 1) - 0.5 for d in dims]
                histograms.append(Histogram(hist, dims, edges, split))
            return histograms

    return DeclaredDomainMWEM


# ---------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Fit one smartnoise-synth synthesizer with declared (public) bounds.")
    p.add_argument("--synthesizer", required=True, choices=SYNTHESIZERS)
    p.add_argument("--train", required=True, help="train CSV (header row)")
    p.add_argument("--spec", required=True, help="public schema JSON")
    p.add_argument("--epsilon", required=True, type=float, help="total epsilon (preprocessing included)")
    p.add_argument("--n", required=True, type=int, help="number of synthetic rows")
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--out", required=True, help="synthetic CSV to write")
    p.add_argument("--report", help="JSON report to write")
    p.add_argument("--epochs", type=int, help="override epochs of dpctgan/dpgan (ignored by patectgan/pategan)")
    p.add_argument("--delta", type=float, help="delta of the approximate-DP synthesizers (default: smartnoise's own; "
                                               "MWEM is pure DP and ignores it)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        if not (args.epsilon > 0 and math.isfinite(args.epsilon)):
            raise InputError("--epsilon must be a positive number")
        if args.n < 1:
            raise InputError("--n must be >= 1")
        if args.epochs is not None and args.epochs < 1:
            raise InputError("--epochs must be >= 1")
        spec = load_spec(args.spec)
        df, columns = load_train(args.train, spec)
        pre_eps = spec["preprocessor_epsilon"]
        synth_eps = args.epsilon - pre_eps
        if synth_eps <= 0:
            raise InputError(f"--epsilon {args.epsilon} leaves nothing after preprocessor_epsilon {pre_eps}")
        undeclared = [c for c, (lo, _) in spec["continuous"].items() if lo is None]
        if undeclared and pre_eps <= 0:
            raise InputError(f"continuous columns {undeclared} have no declared bounds and preprocessor_epsilon is 0")
        if args.synthesizer == "pategan" and len(df) < 1000:
            raise InputError("smartnoise's PATE-GAN uses int(n_train / 1000) teachers and needs >= 1000 train rows")
    except InputError as e:
        fail(str(e))

    name = args.synthesizer
    random.seed(args.seed)
    np.random.seed(args.seed % 2**32)
    notes = []
    options = {"seed": args.seed, "n": args.n, "n_train": int(len(df)), "label": spec["label"],
               "synthesizer_epsilon": synth_eps, "undeclared_bounds": undeclared}

    import snsynth
    from importlib.metadata import version
    try:
        sn_version = version("smartnoise-synth")
    except Exception:
        sn_version = getattr(snsynth, "__version__", None)

    torch = None
    engines = []
    restore = []
    if name not in CUBE:
        import torch
        torch.set_num_threads(2)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        torch.manual_seed(args.seed)
        options["torch_threads"] = torch.get_num_threads()

    style = "cube" if name in CUBE else "gan"
    transformer, described = build_transformer(spec, columns, style)
    options["transform_style"] = style
    options["transformers"] = described

    # clip continuous values to the declared bounds (the transformers clamp anyway; say so on stderr)
    for col, (lo, hi) in spec["continuous"].items():
        if lo is not None:
            outside = int(((df[col] < lo) | (df[col] > hi)).sum())
            if outside:
                print(f"warning: {outside} value(s) of '{col}' outside the declared [{lo}, {hi}] are clipped",
                      file=sys.stderr)

    init_eps = args.epsilon if undeclared else synth_eps
    delta_kw = {} if args.delta is None else {"delta": args.delta}
    if name == "mst":
        from snsynth.mst import MSTSynthesizer
        synth = MSTSynthesizer(epsilon=init_eps, **delta_kw)
        options["bins"] = N_BINS
    elif name == "mwem":
        cards = transformer.cardinality
        joint = float(np.prod([float(c) for c in cards]))
        split_factor = None if joint <= MWEM_MAX_JOINT_CELLS else MWEM_SPLIT_FACTOR
        synth = make_mwem_class()(epsilon=init_eps, split_factor=split_factor)
        options.update(bins=N_BINS, split_factor=split_factor or len(cards), joint_histogram_cells=joint,
                       domain="declared cardinalities (smartnoise's data min/max sizing overridden)")
    elif name == "dpctgan":
        from snsynth.pytorch.nn import dpctgan as mod
        kw = {} if args.epochs is None else {"epochs": args.epochs}
        synth = mod.DPCTGAN(epsilon=init_eps, **kw, **delta_kw)
        options["epochs"] = synth._epochs
    elif name == "patectgan":
        from snsynth.pytorch.nn import patectgan as mod
        synth = mod.PATECTGAN(epsilon=init_eps, **delta_kw)
        options["epochs"] = None
        if args.epochs is not None:
            options["epochs_ignored"] = args.epochs
            notes.append("--epochs ignored: smartnoise's PATECTGAN never reads epochs; it trains until the PATE accountant reaches epsilon")
    elif name == "dpgan":
        from snsynth.pytorch.nn import dpgan as mod
        kw = {} if args.epochs is None else {"epochs": args.epochs}
        synth = mod.DPGAN(epsilon=init_eps, **kw, **delta_kw)
        options["epochs"] = synth.epochs
    elif name == "pategan":
        from snsynth.pytorch.nn import pategan as mod
        synth = mod.PATEGAN(epsilon=init_eps, **delta_kw)
        options["epochs"] = None
        options["num_teachers"] = int(len(df) / 1000)
        if args.epochs is not None:
            options["epochs_ignored"] = args.epochs
            notes.append("--epochs ignored: smartnoise's PATEGAN has no epochs; it trains until the PATE accountant reaches epsilon")

    def after_init(cls, hook):
        """Run hook(instance) after cls.__init__ (patched on the class itself, undone after fit: smartnoise's
        classes call super(ClassName, self), so a replacement subclass under the same name would recurse)."""
        orig = cls.__dict__["__init__"]

        def __init__(self, *a, **k):
            orig(self, *a, **k)
            hook(self)

        cls.__init__ = __init__
        restore.append((cls, "__init__", orig))

    if name in ("dpctgan", "patectgan"):
        # their Discriminator.__init__ calls torch.manual_seed(0); re-seed from --seed right after it
        reseed = (args.seed + 1) % 2**63
        after_init(mod.Discriminator, lambda _: torch.manual_seed(reseed))
        notes.append("smartnoise's Discriminator.__init__ calls torch.manual_seed(0): its initial weights do not "
                     "depend on --seed; torch is re-seeded from --seed right after it")
    if name in ("dpctgan", "dpgan"):
        # record opacus' PrivacyEngine to report the epsilon actually spent
        engine_cls = mod.opacus.PrivacyEngine if name == "dpctgan" else mod.PrivacyEngine
        after_init(engine_cls, engines.append)

    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # smartnoise's progress prints go to stderr
            synth.fit(df, transformer=transformer, preprocessor_eps=pre_eps)
    finally:
        for obj, attr, val in restore:
            setattr(obj, attr, val)
    fit_seconds = time.perf_counter() - t0

    spent_pre = float(transformer.odometer.spent[0]) if undeclared else 0.0
    options["preprocessor_epsilon_spent_by_smartnoise"] = spent_pre
    if undeclared:
        options["estimated_bounds"] = {c: [float(transformer.transformers[columns.index(c)].fit_lower),
                                           float(transformer.transformers[columns.index(c)].fit_upper)]
                                       for c in undeclared}

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        out = synth.sample(args.n)
    sample_seconds = time.perf_counter() - t0

    if not isinstance(out, pd.DataFrame):
        out = pd.DataFrame(list(out), columns=columns)
    out = out.reset_index(drop=True)
    if set(out.columns) == set(columns):
        out = out[columns]
    elif len(out.columns) == len(columns):  # smartnoise returned positional columns
        out.columns = columns
    else:
        raise RuntimeError(f"smartnoise returned columns {list(out.columns)}, expected {columns}")
    if len(out) != args.n:
        raise RuntimeError(f"smartnoise returned {len(out)} rows, expected {args.n}")
    for col, (lo, hi) in spec["continuous"].items():
        if lo is None:
            lo, hi = transformer.transformers[columns.index(col)].fit_lower, transformer.transformers[columns.index(col)].fit_upper
        vals = np.clip(pd.to_numeric(out[col]).to_numpy(dtype=float), lo, hi)
        if col in spec["integer"]:
            vals = np.clip(np.rint(vals), math.ceil(lo), math.floor(hi)).astype(np.int64)
        out[col] = vals
    for col in spec["categorical"]:
        out[col] = out[col].astype(str)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    out.to_csv(args.out, index=False)

    # delta actually used
    if name == "mwem":
        delta = None
        notes.append("MWEM is pure epsilon-DP (Laplace + exponential mechanism)")
    else:
        delta = float(synth.delta) if synth.delta is not None else None
    options["delta_rule"] = {"mst": "MSTSynthesizer default 1e-9",
                             "mwem": "none (pure DP)"}.get(name, "smartnoise default: 1/(n_train*sqrt(n_train))")
    if args.delta is not None and name != "mwem":
        options["delta_rule"] = "--delta"
    if engines:
        eng = engines[-1]
        eps_spent, alpha = eng.get_privacy_spent(delta)
        options["opacus_steps"] = int(eng.steps)
        options["epsilon_spent_opacus_rdp"] = float(eps_spent)
        options["opacus_best_alpha"] = float(alpha)
        options["opacus_noise_multiplier"] = float(eng.noise_multiplier)
        options["opacus_sample_rate"] = float(eng.sample_rate)
    if name in ("dpctgan", "dpgan", "pategan", "patectgan"):
        notes.append("smartnoise checks the budget before each epoch/iteration, so a run that stops on the budget "
                     "spends up to one epoch/iteration past synthesizer_epsilon")
    if name in ("mst", "mwem"):
        notes.append("noise drawn through OpenDP from OS randomness: not reproducible from --seed")
    if name in ("dpctgan", "dpgan"):
        notes.append("opacus 0.14 seeds its DP noise generator from os.urandom: not reproducible from --seed")
        notes.append("epsilon_spent_opacus_rdp: opacus RDP accountant at sample rate batch/n_train, which assumes "
                     "Poisson sampling; smartnoise draws shuffled (dpgan) or conditional (dpctgan) batches")
    options["notes"] = notes

    report = {"synthesizer": name, "epsilon": args.epsilon, "preprocessor_epsilon": pre_eps, "delta": delta,
              "fit_seconds": round(fit_seconds, 3), "sample_seconds": round(sample_seconds, 3),
              "smartnoise_version": sn_version, "options": options}
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2, default=str)
    print(f"{name}: wrote {len(out)} rows to {args.out} (fit {fit_seconds:.1f}s, sample {sample_seconds:.1f}s, "
          f"epsilon {synth_eps:g} to the synthesizer, delta {delta})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
