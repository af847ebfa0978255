"""benchmarks/peers/smartnoise_synth.py after ``import snsynth``, run in-process against a small stand-in
for smartnoise-synth 1.0.8 (not installed here; the peers suite runs the script in its own venv).

The stand-in mirrors only what the script touches, with smartnoise's own logic where the script relies on
it: the column-transformer protocol (``fit`` = ``_clear_fit`` + ``_fit`` per value + ``_fit_finish``, a
transformer with declared bounds is "fit" without data), ``TableTransformer`` (``fit_complete``,
``cardinality``, ``odometer.spent``, ``inverse_transform`` to a DataFrame) and
``Synthesizer._get_train_data`` (refit only when some column is not fit, then ``self.epsilon -= spent``).
Bounds that smartnoise would estimate privately come out as the data's min and max here.
"""
import importlib.util
import json
import math
import random
import sys
import types
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "peers" / "smartnoise_synth.py"


# ---------------------------------------------------------------- stand-in for smartnoise-synth 1.0.8
class Odometer:
    def __init__(self):
        self.epsilon = 0.0

    def spend(self, epsilon):
        self.epsilon += epsilon

    @property
    def spent(self):
        return self.epsilon, 0.0


class ColumnTransformer:
    def __init__(self):
        self._fit_complete = False
        self.output_width = 0
        self._clear_fit()

    fit_complete = property(lambda self: self._fit_complete)
    needs_epsilon = property(lambda self: False)
    cardinality = property(lambda self: [])

    def allocate_privacy_budget(self, epsilon, odometer):
        pass

    def fit(self, data):
        self._clear_fit()
        for val in data:
            self._fit(val)
        self._fit_finish()

    def fit_transform(self, data):
        if not self.fit_complete:
            self.fit(data)
        return [self._transform(v) for v in data]

    def _fit_finish(self):
        self._fit_complete = True

    def _reset_fit(self):
        self._fit_complete = False
        self.output_width = 0


class CachingColumnTransformer(ColumnTransformer):
    def __init__(self):
        super().__init__()
        self._fit_vals = []

    def _fit(self, val):
        self._fit_vals.append(val)  # every value the transformer was fit on

    def _reset_fit(self):
        super()._reset_fit()
        self._fit_vals = []


class LabelTransformer(ColumnTransformer):
    def __init__(self, nullable=True):
        super().__init__()
        self.nullable = nullable

    cardinality = property(lambda self: [len(self.categories)])

    def _clear_fit(self):
        self._reset_fit()
        self.labels, self.categories, self.category = {}, {}, 0

    def _fit(self, val):  # learns the categories from the data
        if val not in self.labels:
            self.labels[val] = self.category
            self.category += 1
            self.output_width = 1

    def _fit_finish(self):
        self._fit_complete = True
        self.categories = sorted(self.labels)
        self.labels = {v: i for i, v in enumerate(self.categories)}

    def _transform(self, val):
        return self.labels[val]

    def _inverse_transform(self, val):
        return self.categories[val]


class OneHotEncoder(ColumnTransformer):
    cardinality = property(lambda self: [2] * (self.max + 1))

    def _clear_fit(self):
        self._fit_complete = False
        self.max = -1

    def _fit(self, val):  # learns the width from the largest label seen
        self.max = max(self.max, val)

    def _fit_finish(self):
        self.output_width = self.max + 1
        super()._fit_finish()

    def _transform(self, val):
        if self.max == 0:
            return 1
        bits = [0] * (self.max + 1)
        bits[val] = 1
        return tuple(bits)

    def _inverse_transform(self, val):
        return int(np.argmax(val))


class ChainTransformer(CachingColumnTransformer):
    def __init__(self, transformers):
        self.transformers = transformers
        super().__init__()

    fit_complete = property(lambda self: all(t.fit_complete for t in self.transformers))
    needs_epsilon = property(lambda self: any(t.needs_epsilon for t in self.transformers))
    cardinality = property(lambda self: [c for t in self.transformers for c in t.cardinality])

    def _clear_fit(self):
        for t in self.transformers:
            t._clear_fit()
        if self.fit_complete:
            self.output_width = self.transformers[-1].output_width

    def _fit_finish(self):
        vals = self._fit_vals
        for t in self.transformers:
            vals = t.fit_transform(vals)
        self._fit_vals = []
        self.output_width = self.transformers[-1].output_width

    def _transform(self, val):
        for t in self.transformers:
            val = t._transform(val)
        return val

    def _inverse_transform(self, val):
        for t in reversed(self.transformers):
            val = t._inverse_transform(val)
        return val


class _Bounded(CachingColumnTransformer):
    """What MinMaxTransformer and BinTransformer share: declared bounds, or bounds estimated with epsilon."""

    def __init__(self, *, lower=None, upper=None, epsilon=None, nullable=False):
        self.lower, self.upper, self.epsilon, self.nullable, self.odometer = lower, upper, epsilon, nullable, None
        super().__init__()

    needs_epsilon = property(lambda self: self.lower is None or self.upper is None)

    def allocate_privacy_budget(self, epsilon, odometer):
        self.epsilon, self.odometer = epsilon, odometer

    def _clear_fit(self):
        self._reset_fit()
        self.fit_lower = self.fit_upper = None
        if self.lower and self.upper:  # smartnoise's test: a bound of 0 is not "already fit"
            self._fit_complete, self.output_width = True, 1
            self.fit_lower, self.fit_upper = self.lower, self.upper

    def _fit_finish(self):
        if self.epsilon and self.needs_epsilon:
            self.odometer.spend(self.epsilon)
            self.fit_lower, self.fit_upper = min(self._fit_vals), max(self._fit_vals)  # stands in for approx_bounds
        elif self.needs_epsilon:
            raise ValueError("requires either epsilon or min and max")
        else:
            self.fit_lower, self.fit_upper = self.lower, self.upper
        self._fit_complete, self.output_width = True, 1

    def _clamp(self, val):
        return min(max(val, self.fit_lower), self.fit_upper)


class MinMaxTransformer(_Bounded):
    def __init__(self, *, negative=False, **kw):
        self.negative = negative
        super().__init__(**kw)

    cardinality = property(lambda self: [None])

    def _transform(self, val):
        val = (self._clamp(val) - self.fit_lower) / (self.fit_upper - self.fit_lower)
        return val * 2 - 1 if self.negative else val

    def _inverse_transform(self, val):
        val = (1 + val) / 2 if self.negative else val
        return float(np.clip(val * (self.fit_upper - self.fit_lower) + self.fit_lower, self.fit_lower, self.fit_upper))


class BinTransformer(_Bounded):
    def __init__(self, *, bins=10, **kw):
        self.bins = bins
        super().__init__(**kw)

    cardinality = property(lambda self: [self.bins])

    def _transform(self, val):
        return min(self.bins - 1, int(self.bins * (self._clamp(val) - self.fit_lower) / (self.fit_upper - self.fit_lower)))

    def _inverse_transform(self, val):
        return self.fit_lower + (val + 0.5) / self.bins * (self.fit_upper - self.fit_lower)  # bin midpoint


class TableTransformer:
    def __init__(self, transformers=(), *ignore, odometer=None):
        self.transformers = transformers
        self.output_width = sum(t.output_width for t in transformers) if self.fit_complete else 0
        self.odometer = Odometer()
        self._columns = None
        self.fit_on_data = False

    fit_complete = property(lambda self: all(t.fit_complete for t in self.transformers))
    needs_epsilon = property(lambda self: any(t.needs_epsilon for t in self.transformers))
    cardinality = property(lambda self: [c for t in self.transformers for c in t.cardinality])

    def fit(self, data, *ignore, epsilon=None):
        self.fit_on_data = True
        needing = [t for t in self.transformers if t.needs_epsilon]
        for t in needing:
            t.allocate_privacy_budget(epsilon / len(needing), self.odometer)
        self._columns = list(data.columns)
        for t in self.transformers:
            t._clear_fit()
        for row in data.itertuples(index=False, name=None):
            for v, t in zip(row, self.transformers):
                t._fit(v)
        for t in self.transformers:
            t._fit_finish()
        self.output_width = sum(t.output_width for t in self.transformers)

    def transform(self, data):
        self._columns = list(data.columns)
        out = []
        for row in data.itertuples(index=False, name=None):
            encoded = []
            for v, t in zip(row, self.transformers):
                code = t._transform(v)
                encoded.extend([code] if t.output_width == 1 else code)
            out.append(tuple(encoded))
        return out

    def inverse_transform(self, rows):
        decoded = []
        for row in rows:
            row = list(row)
            if len(row) != self.output_width:
                raise ValueError(f"Row has wrong length: got {len(row)}, expected {self.output_width}")
            decoded.append(tuple(t._inverse_transform(row.pop(0) if t.output_width == 1 else
                                                      tuple(row.pop(0) for _ in range(t.output_width)))
                                 for t in self.transformers))
        return pd.DataFrame(decoded, columns=self._columns)


class Synthesizer:
    """Records what the script hands over; ``seen`` is set per test by the ``fake`` fixture."""
    seen = None

    def _get_train_data(self, data, *ignore, style, transformer, preprocessor_eps):  # smartnoise 1.0.8's logic
        assert isinstance(transformer, TableTransformer)
        self._transformer = transformer
        if not transformer.fit_complete:
            if transformer.needs_epsilon and not preprocessor_eps:
                raise ValueError("Transformer needs some epsilon to infer bounds.")
            transformer.fit(data, epsilon=preprocessor_eps)
            eps_spent, _ = transformer.odometer.spent
            if eps_spent > 0.0:
                self.epsilon -= eps_spent
        return transformer.transform(data)

    def fit(self, data, *ignore, transformer=None, preprocessor_eps=0.0):
        seen = self.seen
        seen.synth, seen.created_epsilon, seen.preprocessor_eps = self, self.epsilon, preprocessor_eps
        self.train_data = self._get_train_data(data, style=self.style, transformer=transformer,
                                               preprocessor_eps=preprocessor_eps)
        seen.train_epsilon = self.epsilon
        self._train(len(self.train_data))

    def _train(self, n_train):
        pass

    def sample(self, n):
        if self.seen.sample is not None:
            return self.seen.sample(self, n)
        rows = np.random.default_rng(0).integers(len(self.train_data), size=n)
        return self._transformer.inverse_transform([self.train_data[i] for i in rows])


class MSTSynthesizer(Synthesizer):
    style = "cube"

    def __init__(self, epsilon=0.1, delta=1e-9, *ignore, verbose=False):
        self.epsilon, self.delta = epsilon, delta

    def _train(self, n_train):
        cards = self._transformer.cardinality
        if None in cards or len(cards) != self._transformer.output_width:
            raise ValueError("MST needs categorical (cube-style) columns only")


class Histogram:
    def __init__(self, data, dimensions, bins, split):
        assert len(dimensions) == len(bins) == len(split) and tuple(data.shape) == tuple(dimensions)
        self.data, self.dimensions, self.bins, self.split = data, dimensions, bins, split

    @classmethod
    def histogramdd_indexes(cls, x, category_lengths):
        flat = np.ravel_multi_index(x.T, category_lengths)
        return np.bincount(flat, minlength=int(np.prod(category_lengths))).reshape(category_lengths)


class MWEMSynthesizer(Synthesizer):
    style = "cube"

    def __init__(self, epsilon=3.0, *ignore, splits=[], split_factor=None):  # no delta: pure epsilon-DP
        self.epsilon, self.splits, self.split_factor = epsilon, splits, split_factor
        self.asked_split_factor = split_factor
        self.mins_maxes, self.scale = {}, {}

    def _train(self, n_train):
        self.data = np.array(self.train_data)
        factor = self.split_factor or self.data.shape[1]
        self.splits = [np.arange(self.data.shape[1])[i:i + factor] for i in range(0, self.data.shape[1], factor)]
        self.histograms = self._histogram_from_data_attributes(self.data, self.splits)

    def _histogram_from_data_attributes(self, data, splits=[]):
        raise AssertionError("smartnoise's data min/max sizing must be overridden by the script")

    def sample(self, n):  # draws each split's histogram cells, as smartnoise's MWEM does
        rng, columns = np.random.default_rng(0), []
        for h in self.histograms:
            p = np.ravel(h.data) / h.data.sum()
            cells = np.unravel_index(rng.choice(p.size, size=n, p=p), h.data.shape)
            columns += [c + self.mins_maxes[str(i)][0] for c, i in zip(cells, h.split)]
        order = np.argsort(np.concatenate([h.split for h in self.histograms]))
        return self._transformer.inverse_transform(np.stack(columns, axis=1)[:, order].tolist())


class PrivacyEngine:  # opacus 0.14
    def __init__(self, module=None, batch_size=64, sample_size=1, noise_multiplier=1.0, **unused):
        self.sample_rate, self.noise_multiplier, self.steps = batch_size / sample_size, noise_multiplier, 0

    def get_privacy_spent(self, target_delta=None):
        self.asked_delta = target_delta
        return self.steps / 1000, 7.5


class DPCTGANDiscriminator:  # snsynth.pytorch.nn.dpctgan.Discriminator
    def __init__(self, *args):
        torch.manual_seed(0)


class PATECTGANDiscriminator:  # snsynth.pytorch.nn.patectgan.Discriminator
    def __init__(self, *args):
        torch.manual_seed(0)


class _GAN(Synthesizer):
    style = "gan"
    discriminator = None

    def _train(self, n_train):
        if self.discriminator is not None:
            self.discriminator()
            self.draw_after_discriminator = torch.rand(4)  # what training draws next
        if isinstance(self, (DPCTGAN, DPGAN)):
            self.engine = PrivacyEngine(None, batch_size=50, sample_size=n_train, noise_multiplier=1.3)
            self.engine.steps = 12
        if self.seen.fail_fit:
            raise RuntimeError("training failed")
        if self.delta is None:
            self.delta = 1 / (n_train * math.sqrt(n_train))


class DPCTGAN(_GAN):
    discriminator = DPCTGANDiscriminator

    def __init__(self, epsilon=1.0, epochs=300, delta=None):
        self.epsilon, self._epochs, self.delta = epsilon, epochs, delta


class PATECTGAN(_GAN):
    discriminator = PATECTGANDiscriminator

    def __init__(self, epsilon=1.0, epochs=300, delta=None):  # epochs accepted, never read
        self.epsilon, self._epochs, self.delta = epsilon, epochs, delta


class DPGAN(_GAN):
    def __init__(self, epochs=1000, delta=None, epsilon=1.0):
        self.epsilon, self.epochs, self.delta = epsilon, epochs, delta


class PATEGAN(_GAN):
    def __init__(self, epsilon, delta=None):  # no epochs
        self.epsilon, self.delta = epsilon, delta


HOOKED = (DPCTGANDiscriminator, PATECTGANDiscriminator, PrivacyEngine)


@pytest.fixture
def fake(monkeypatch):
    """Install the stand-in as ``snsynth``; returns what it saw (synth, epsilons, ...)."""
    seen = types.SimpleNamespace(synth=None, sample=None, fail_fit=False)
    monkeypatch.setattr(Synthesizer, "seen", seen)
    for cls in HOOKED:  # undo a hook the script failed to undo, so one failure does not leak into other tests
        monkeypatch.setattr(cls, "__init__", cls.__dict__["__init__"])
    nn_modules = {
        "dpctgan": dict(DPCTGAN=DPCTGAN, Discriminator=DPCTGANDiscriminator,
                        opacus=types.SimpleNamespace(PrivacyEngine=PrivacyEngine)),
        "patectgan": dict(PATECTGAN=PATECTGAN, Discriminator=PATECTGANDiscriminator),
        "dpgan": dict(DPGAN=DPGAN, PrivacyEngine=PrivacyEngine),
        "pategan": dict(PATEGAN=PATEGAN)}
    modules = {
        "snsynth": dict(__version__="1.0.8-fake"),
        "snsynth.transform": dict(BinTransformer=BinTransformer, ChainTransformer=ChainTransformer,
                                  LabelTransformer=LabelTransformer, MinMaxTransformer=MinMaxTransformer,
                                  OneHotEncoder=OneHotEncoder, TableTransformer=TableTransformer),
        "snsynth.mst": dict(MSTSynthesizer=MSTSynthesizer),
        "snsynth.mwem": dict(Histogram=Histogram, MWEMSynthesizer=MWEMSynthesizer),
        "snsynth.pytorch": {}, "snsynth.pytorch.nn": {},
        **{f"snsynth.pytorch.nn.{name}": attrs for name, attrs in nn_modules.items()}}
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    return seen


@pytest.fixture
def peer(monkeypatch):
    """The script as a module, loaded without touching this process' environment, seeds or torch threads."""
    spec = importlib.util.spec_from_file_location("smartnoise_synth_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict("os.environ"):
        spec.loader.exec_module(module)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(torch, "set_num_interop_threads", lambda n: None)
    state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng():
        yield module
    random.setstate(state[0])
    np.random.set_state(state[1])


# ---------------------------------------------------------------- inputs and a run
COLUMNS = ["age", "workclass", "hours", "income"]  # the train CSV's order; the spec lists them otherwise
AGE, HOURS = (16.5, 90.2), (0, 99.5)  # hours' lower bound 0 is falsy: smartnoise would not count it as fit


def make_spec(**changes):
    spec = {"categorical": {"income": ["<=50K", ">50K"], "workclass": ["Private", "Gov", "Never-seen"]},
            "continuous": {"hours": list(HOURS), "age": list(AGE)},
            "integer": ["age"], "label": "income", "preprocessor_epsilon": 0.25}
    spec.update(changes)
    return spec


def write_inputs(tmp_path, spec=None, rows=40, frame=None):
    """Train rows use only part of the declared domain: no 'Never-seen', age 20..59, hours 10..49.5."""
    if frame is None:
        i = np.arange(rows)
        frame = pd.DataFrame({"age": 20 + i % 40, "workclass": np.where(i % 2, "Gov", "Private"),
                              "hours": 10 + (i % 80) / 2, "income": np.where(i % 3, "<=50K", ">50K")})
    frame.to_csv(tmp_path / "train.csv", index=False)
    (tmp_path / "spec.json").write_text(json.dumps(make_spec() if spec is None else spec))
    return frame


def run(peer, tmp_path, synthesizer, *extra, epsilon=1.0, n=6, seed=0):
    out, report = tmp_path / "synth.csv", tmp_path / "report.json"
    assert peer.main(["--synthesizer", synthesizer, "--train", str(tmp_path / "train.csv"),
                      "--spec", str(tmp_path / "spec.json"), "--epsilon", str(epsilon), "--n", str(n),
                      "--seed", str(seed), "--out", str(out), "--report", str(report), *extra]) == 0
    return json.loads(report.read_text()), pd.read_csv(out, dtype=str, keep_default_na=False)


def frame_sample(frame):
    """A synthesizer whose sample is exactly `frame` (decoded columns, as smartnoise returns them)."""
    return lambda synth, n: frame.copy()


# ---------------------------------------------------------------- budget and delta
@pytest.mark.parametrize("name", ["mst", "mwem", "dpctgan", "patectgan", "dpgan", "pategan"])
def test_declared_bounds_give_the_synthesizer_epsilon_minus_preprocessor_epsilon(fake, peer, tmp_path, name):
    write_inputs(tmp_path, rows=1000 if name == "pategan" else 40)
    report, _ = run(peer, tmp_path, name, epsilon=1.0)
    assert fake.created_epsilon == pytest.approx(0.75)  # 1.0 - preprocessor_epsilon 0.25
    assert fake.train_epsilon == pytest.approx(0.75)    # and smartnoise spent nothing on preprocessing
    assert fake.preprocessor_eps == 0.25 and not fake.synth._transformer.fit_on_data
    assert report["synthesizer"] == name and report["epsilon"] == 1.0 and report["preprocessor_epsilon"] == 0.25
    assert report["smartnoise_version"] == "1.0.8-fake"
    options = report["options"]
    assert options["synthesizer_epsilon"] == pytest.approx(0.75) and options["undeclared_bounds"] == []
    assert options["preprocessor_epsilon_spent_by_smartnoise"] == 0.0
    assert options["transform_style"] == ("cube" if name in ("mst", "mwem") else "gan")


@pytest.mark.parametrize("name", ["mst", "dpgan"])
def test_undeclared_bounds_leave_the_preprocessor_budget_to_smartnoise(fake, peer, tmp_path, name):
    spec = make_spec(continuous={"hours": [None, None], "age": list(AGE)})
    train = write_inputs(tmp_path, spec)
    fake.sample = frame_sample(pd.DataFrame({"age": [30.0] * 3, "workclass": ["Gov"] * 3,
                                             "hours": [-50.0, 20.25, 500.0], "income": [">50K"] * 3}))
    report, out = run(peer, tmp_path, name, epsilon=1.0, n=3)
    assert fake.created_epsilon == 1.0                   # the whole --epsilon ...
    assert fake.train_epsilon == pytest.approx(0.75)     # ... of which smartnoise took its 0.25
    lo, hi = train["hours"].min(), train["hours"].max()  # what the stand-in "estimates"
    options = report["options"]
    assert options["undeclared_bounds"] == ["hours"] and options["estimated_bounds"] == {"hours": [lo, hi]}
    assert options["preprocessor_epsilon_spent_by_smartnoise"] == pytest.approx(0.25)
    assert out["hours"].astype(float).tolist() == [lo, 20.25, hi]  # clipped to the estimated bounds
    age = fake.synth._transformer.transformers[COLUMNS.index("age")]
    assert (age.fit_lower, age.fit_upper) == AGE  # smartnoise's refit of the table keeps age's declared bounds


@pytest.mark.parametrize("name, delta_arg, delta, rule", [
    ("mst", None, 1e-9, "MSTSynthesizer default 1e-9"),
    ("mst", 1e-6, 1e-6, "--delta"),
    ("dpgan", None, 1 / (40 * math.sqrt(40)), "smartnoise default: 1/(n_train*sqrt(n_train))"),
    ("dpctgan", 2e-5, 2e-5, "--delta"),
    ("patectgan", 3e-7, 3e-7, "--delta"),
    ("pategan", 4e-7, 4e-7, "--delta"),
    ("mwem", 1e-6, None, "none (pure DP)"),
])
def test_delta_reaches_the_synthesizer_and_the_report(fake, peer, tmp_path, name, delta_arg, delta, rule):
    write_inputs(tmp_path, rows=1000 if name == "pategan" else 40)
    extra = [] if delta_arg is None else ["--delta", str(delta_arg)]
    report, _ = run(peer, tmp_path, name, *extra)
    if delta is not None:
        assert fake.synth.delta == pytest.approx(delta)
    assert report["delta"] == (None if delta is None else pytest.approx(delta))
    assert report["options"]["delta_rule"] == rule
    if name == "dpctgan":  # opacus' accountant is read at the delta actually used
        assert fake.synth.engine.asked_delta == pytest.approx(delta)


# ---------------------------------------------------------------- declared domain
@pytest.mark.parametrize("name, encoded, age, hours", [
    ("mst", (9, 2, 0, 1), "87", 4.975),                   # bins: age bin 9, hours bin 0 (midpoints)
    ("dpgan", (1.0, 0, 0, 1, -1.0, 0, 1), "90", 0.0),     # gan: scaled to [-1, 1], one-hot categories
])
def test_declared_transformers_never_see_the_data_and_keep_every_declared_category(
        fake, peer, tmp_path, name, encoded, age, hours):
    write_inputs(tmp_path)
    fake.sample = lambda synth, n: synth._transformer.inverse_transform([encoded] * n)
    report, out = run(peer, tmp_path, name, n=2)
    table = fake.synth._transformer
    assert not table.fit_on_data
    for col, (lo, hi) in (("age", AGE), ("hours", HOURS)):
        t = table.transformers[COLUMNS.index(col)]
        assert t._fit_vals == [lo, hi] and (t.fit_lower, t.fit_upper) == (lo, hi)
    workclass = table.transformers[COLUMNS.index("workclass")]
    label = workclass if name == "mst" else workclass.transformers[0]
    assert label.categories == ["Private", "Gov", "Never-seen"]  # declared order, absent category kept
    assert table.output_width == (4 if name == "mst" else 7)
    if name == "mst":
        assert table.cardinality == [10, 3, 10, 2]
    # the absent category decodes like any other
    assert out.drop(columns="hours").to_dict("list") == {"age": [age] * 2, "workclass": ["Never-seen"] * 2,
                                                         "income": [">50K"] * 2}
    assert out["hours"].astype(float).tolist() == pytest.approx([hours] * 2)
    assert "LabelTransformer" in report["options"]["transformers"]["workclass"]


def test_train_values_outside_the_declared_bounds_are_reported(fake, peer, tmp_path, capsys):
    train = write_inputs(tmp_path)
    train.loc[:2, "age"] = 95
    write_inputs(tmp_path, frame=train)
    run(peer, tmp_path, "mst")
    assert "3 value(s) of 'age' outside the declared [16.5, 90.2] are clipped" in capsys.readouterr().err


# ---------------------------------------------------------------- output
def test_output_has_the_train_columns_n_rows_and_declared_ranges(fake, peer, tmp_path):
    write_inputs(tmp_path)
    sampled = pd.DataFrame({  # smartnoise's order differs from the train CSV's
        "income": ["<=50K", ">50K", ">50K", "<=50K", ">50K"],
        "hours": [-1.0, 50.25, 120.0, 3.0, 99.5],
        "workclass": ["Gov", "Private", "Never-seen", "Gov", "Gov"],
        "age": [16.5, 16.6, 42.5, 200.0, -5.0]})
    fake.sample = frame_sample(sampled)
    run(peer, tmp_path, "mst", n=5)
    text = (tmp_path / "synth.csv").read_text().splitlines()
    assert text[0] == ",".join(COLUMNS) and len(text) == 6
    out = pd.read_csv(tmp_path / "synth.csv", dtype=str)
    assert out["age"].tolist() == ["17", "17", "42", "90", "17"]  # rounded, within [ceil 16.5, floor 90.2]
    assert out["hours"].astype(float).tolist() == [0.0, 50.25, 99.5, 3.0, 99.5]  # clipped to [0, 99.5]
    assert out["workclass"].tolist() == sampled["workclass"].tolist()
    assert out["income"].tolist() == sampled["income"].tolist()


@pytest.mark.parametrize("as_list", [False, True], ids=["positional-frame", "list-of-rows"])
def test_positional_output_is_named_in_the_train_order(fake, peer, tmp_path, as_list):
    write_inputs(tmp_path)
    rows = [(30.0, "Gov", 12.5, ">50K"), (61.0, "Never-seen", 40.0, "<=50K")]
    fake.sample = lambda synth, n: rows if as_list else pd.DataFrame(rows)
    _, out = run(peer, tmp_path, "mst", n=2)
    assert list(out.columns) == COLUMNS
    assert out.values.tolist() == [["30", "Gov", "12.5", ">50K"], ["61", "Never-seen", "40.0", "<=50K"]]


@pytest.mark.parametrize("sampled, message", [
    (pd.DataFrame({"age": [30.0], "workclass": ["Gov"], "hours": [1.0], "income": [">50K"], "extra": [0]}),
     "columns"),
    (pd.DataFrame({"age": [30.0], "workclass": ["Gov"], "hours": [1.0], "income": ["bad"]}).drop(columns="income"),
     "columns"),
    (pd.DataFrame({"age": [30.0] * 2, "workclass": ["Gov"] * 2, "hours": [1.0] * 2, "income": [">50K"] * 2}),
     "rows"),
], ids=["extra-column", "missing-column", "wrong-row-count"])
def test_output_of_the_wrong_shape_is_an_error(fake, peer, tmp_path, sampled, message):
    write_inputs(tmp_path)
    fake.sample = frame_sample(sampled)
    with pytest.raises(RuntimeError, match=message):
        run(peer, tmp_path, "mst", n=3)
    assert not (tmp_path / "synth.csv").exists() and not (tmp_path / "report.json").exists()


# ---------------------------------------------------------------- options of the GAN synthesizers
@pytest.mark.parametrize("name, epochs, used, reported, ignored", [
    ("dpctgan", 3, 3, 3, None),
    ("dpctgan", None, 300, 300, None),
    ("dpgan", 7, 7, 7, None),
    ("dpgan", None, 1000, 1000, None),
    ("patectgan", 5, 300, None, 5),  # accepted by PATECTGAN, never read: not passed, reported as ignored
    ("pategan", 5, None, None, 5),   # PATEGAN has no epochs
    ("pategan", None, None, None, None),
])
def test_epochs_override_and_what_the_report_says(fake, peer, tmp_path, name, epochs, used, reported, ignored):
    write_inputs(tmp_path, rows=2500 if name == "pategan" else 40)
    report, _ = run(peer, tmp_path, name, *([] if epochs is None else ["--epochs", str(epochs)]))
    options = report["options"]
    assert getattr(fake.synth, "epochs", getattr(fake.synth, "_epochs", None)) == used
    assert options["epochs"] == reported and options.get("epochs_ignored") == ignored
    assert any(note.startswith("--epochs ignored") for note in options["notes"]) == (ignored is not None)
    assert ("num_teachers" in options) == (name == "pategan")
    if name == "pategan":
        assert options["num_teachers"] == 2  # int(2500 / 1000)


@pytest.mark.parametrize("name", ["dpctgan", "patectgan"])
def test_torch_is_reseeded_from_seed_after_the_discriminator_and_the_hook_is_undone(fake, peer, tmp_path, name):
    discriminator = DPCTGANDiscriminator if name == "dpctgan" else PATECTGANDiscriminator
    original = discriminator.__dict__["__init__"]
    write_inputs(tmp_path)
    draws = []
    for seed in (3, 4, 3):
        run(peer, tmp_path, name, seed=seed)
        draws.append(fake.synth.draw_after_discriminator)
        assert discriminator.__dict__["__init__"] is original
    assert not torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])
    torch.manual_seed(0)
    assert not torch.equal(draws[0], torch.rand(4))  # not the discriminator's own manual_seed(0)


@pytest.mark.parametrize("name", ["dpctgan", "dpgan"])
def test_the_opacus_engine_is_recorded_and_the_hook_is_undone(fake, peer, tmp_path, name):
    original = PrivacyEngine.__dict__["__init__"]
    write_inputs(tmp_path)
    report, _ = run(peer, tmp_path, name)
    assert PrivacyEngine.__dict__["__init__"] is original
    engine, options = fake.synth.engine, report["options"]
    assert options["opacus_steps"] == 12 and options["epsilon_spent_opacus_rdp"] == pytest.approx(0.012)
    assert options["opacus_best_alpha"] == 7.5 and options["opacus_noise_multiplier"] == 1.3
    assert options["opacus_sample_rate"] == pytest.approx(50 / 40)
    assert engine.asked_delta == pytest.approx(report["delta"])


@pytest.mark.parametrize("name", ["dpctgan", "patectgan", "dpgan"])
def test_hooks_are_undone_when_fit_raises(fake, peer, tmp_path, name):
    originals = {cls: cls.__dict__["__init__"] for cls in HOOKED}
    write_inputs(tmp_path)
    fake.fail_fit = True
    with pytest.raises(RuntimeError, match="training failed"):
        run(peer, tmp_path, name)
    assert {cls: cls.__dict__["__init__"] for cls in HOOKED} == originals


# ---------------------------------------------------------------- MWEM
def test_mwem_histogram_is_sized_from_the_declared_domain(fake, peer, tmp_path):
    train = write_inputs(tmp_path)  # no 'Never-seen', age and hours cover only some bins
    report, out = run(peer, tmp_path, "mwem", n=50)
    synth = fake.synth
    assert synth.asked_split_factor is None and report["options"]["split_factor"] == 4
    (h,) = synth.histograms
    assert list(h.dimensions) == [10, 3, 10, 2] and h.data.shape == (10, 3, 10, 2)
    assert synth.mins_maxes == {"0": (0, 9), "1": (0, 2), "2": (0, 9), "3": (0, 1)}
    assert h.data.sum() == len(train) and h.data[:, 2].sum() == 0  # 'Never-seen' is a cell, empty in the data
    codes = np.array(synth.train_data)
    assert h.data[tuple(codes[0])] == (codes == codes[0]).all(axis=1).sum()
    assert report["options"]["joint_histogram_cells"] == 600.0
    assert set(out["workclass"]) <= {"Private", "Gov"} and len(out) == 50


@pytest.mark.parametrize("flag, split_factor, dims", [
    (False, None, [[10] * 6]),                         # 10**6 cells: one joint histogram (smartnoise's default)
    (True, 3, [[10, 10, 10], [10, 10, 10], [2]]),      # 2 * 10**6 cells: groups of 3 columns
])
def test_mwem_splits_only_above_a_million_cells(fake, peer, tmp_path, flag, split_factor, dims):
    i = np.arange(30)
    frame = pd.DataFrame({f"c{k}": (i * (k + 1)) % 10 / 10 for k in range(6)})
    spec = {"categorical": {}, "continuous": {f"c{k}": [0, 1] for k in range(6)}}
    if flag:
        frame["flag"] = np.where(i % 2, "y", "n")
        spec["categorical"] = {"flag": ["n", "y"]}
    write_inputs(tmp_path, spec, frame=frame)
    report, _ = run(peer, tmp_path, "mwem", n=5)
    assert fake.synth.asked_split_factor == split_factor
    assert report["options"]["split_factor"] == (split_factor or 6)
    assert report["options"]["joint_histogram_cells"] == 10.0 ** 6 * (2 if flag else 1)
    assert [list(h.dimensions) for h in fake.synth.histograms] == dims
