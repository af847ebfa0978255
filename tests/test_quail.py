"""QUAIL (--model quail): the budget split, the DP-SGD label model and its accounting, the
synthesizer trained without the label, labelled synthetic rows, resume and bad settings."""
import copy
import math
import shutil
from pathlib import Path

import dp_accounting
import pandas as pd
import pytest
import torch
import yaml
from dp_accounting.rdp import rdp_privacy_accountant
from torch.nn import Linear, ReLU

from lightning_dpgan.cli import main
from lightning_dpgan.config import resolve
from lightning_dpgan.data.schema import Column, TableSchema
from lightning_dpgan.datamodules.adult import SCHEMA as ADULT_SCHEMA, AdultDataModule
from lightning_dpgan.datamodules.king import SCHEMA as KING_SCHEMA
from lightning_dpgan.error_text import SET_BY
from lightning_dpgan.privacy.dp_label_model import DPSGDSettings, fold_into_last_layer, label_network, train_dp_label_model
from lightning_dpgan.privacy.dp_standardization import LocationScale, scale_noise_std
from lightning_dpgan.quail import QUAIL, QuailLabeler, check_log_features, label_model_budget, label_model_inputs, log_scaled, log_unscaled
from lightning_dpgan.sampling import load_module, read_run_info, sample_to_file, table_decoder
from run_helpers import read_json, record_calls

FIXTURES = Path(__file__).parent / "fixtures"
DATA = {"adult": (FIXTURES / "adult_tiny", ADULT_SCHEMA), "king": (FIXTURES / "king_tiny", KING_SCHEMA)}
TINY = {
    "dpctgan": ["--model.generator_hidden", "[16,16]", "--model.discriminator_hidden", "[16,16]", "--data.max_modes", "3"],
    "pategan": ["--privacy.num_teachers", "3", "--privacy.teacher_batch_size", "8", "--privacy.lap_inverse_scale", "0.05"],
    "dpgan": [],
}


def quail_args(output, synthesizer="dpctgan", dataset="adult", steps=4, epsilon=8.0, *extra):
    data_dir, _ = DATA[dataset]
    return ["train", "--model", "quail", "--quail-synthesizer", synthesizer, "--quail-split", "0.5",
            "--dataset", dataset, "--data-dir", str(data_dir), "--output-dir", str(output), "--max-steps", str(steps),
            "--batch-size", "8", "--model.latent_dim", "8", "--epsilon", str(epsilon), "--delta", "1e-3",
            "--quail.batch_size", "8", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            *TINY[synthesizer], *extra]


# --- the split -------------------------------------------------------------------------------


def test_the_label_model_gets_its_share_of_epsilon_and_delta_for_add_remove_neighbours():
    assert label_model_budget(0.3, 2.0, 1e-5, "add-remove") == pytest.approx((0.6, 3e-6))


def test_for_replace_one_neighbours_the_share_holds_after_restating_the_label_models_guarantee():
    epsilon, delta = label_model_budget(0.4, 2.0, 1e-5, "replace-one")
    # group privacy for two records: (2 eps, (1 + e^eps) delta) must be 0.4 of the total
    assert 2 * epsilon == pytest.approx(0.8)
    assert (1 + math.exp(epsilon)) * delta == pytest.approx(4e-6)


def test_an_epsilon_whose_restated_delta_underflows_is_refused_clearly():
    """(1 + e^(eps/2)) overflows past eps ~ 1420; the label model's delta is then 0."""
    assert label_model_budget(0.5, 2000.0, 1e-5, "replace-one")[1] > 0  # e^500: still a number
    with pytest.raises(ValueError, match="too large for QUAIL"):
        label_model_budget(0.5, 5000.0, 1e-5, "replace-one")


# --- the DP-SGD label model ------------------------------------------------------------------


def separable(n, seed, width=5):
    generator = torch.Generator().manual_seed(seed)
    features = torch.rand(n, width, generator=generator)
    labels = (features[:, 0] - features[:, 1] > 0).long()
    return features, torch.nn.functional.one_hot(labels, 2).float(), labels


def dp_accounting_epsilon(sigma, rate, steps, delta):
    """The subsampled Gaussian's epsilon by dp_accounting's RDP accountant (independent of Opacus)."""
    accountant = rdp_privacy_accountant.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(delta)


def test_the_label_models_epsilon_is_within_its_share_and_matches_an_independent_accountant():
    features, targets, _ = separable(2000, 0)
    network = label_network("logistic", 5, 2, [])
    cost = train_dp_label_model(network, features, targets, 0.8, 1e-5, DPSGDSettings(epochs=3, batch_size=100), noise_seed=0)
    assert cost["epsilon"] <= 0.8
    assert cost["epsilon"] > 0.75  # the noise is calibrated to the share, not far below it
    assert cost["steps"] == 3 * 20
    independent = dp_accounting_epsilon(cost["noise_multiplier"], cost["sample_rate"], cost["steps"], 1e-5)
    assert cost["epsilon"] == pytest.approx(independent, rel=1e-6)


def test_the_label_models_batches_and_noise_come_from_its_own_source_not_the_run_seed():
    """--seed fixes torch's global generator and config.yaml publishes it: batches drawn from it
    could be replayed, and subsampling's amplification would not hold. With its noise seed fixed,
    two different run seeds train the same model."""
    features, targets, _ = separable(200, 0)
    start = label_network("logistic", 5, 2, [])
    trained = []
    for run_seed, noise_seed in ((1, 5), (2, 5), (1, None), (1, None)):
        torch.manual_seed(run_seed)
        network = copy.deepcopy(start)
        train_dp_label_model(network, features, targets, 3.0, 1e-4, DPSGDSettings(epochs=2, batch_size=20),
                             noise_seed=noise_seed)
        trained.append(torch.cat([parameter.detach().flatten() for parameter in network.parameters()]))
    assert torch.equal(trained[0], trained[1])
    assert not torch.equal(trained[2], trained[3])  # no noise seed: OS entropy, never a fixed default


def test_the_label_model_refuses_a_delta_of_one_over_n_and_never_reports_past_its_share(monkeypatch):
    from lightning_dpgan.privacy import dp_label_model

    features, targets, _ = separable(200, 0)
    settings = DPSGDSettings(epochs=2, batch_size=20)
    with pytest.raises(ValueError, match=r"label model delta must be in \(0, 1/n = 0.005\)"):
        train_dp_label_model(label_network("logistic", 5, 2, []), features, targets, 3.0, 1 / 200, settings)
    # a calibration that missed (a tenth less noise than the share needs) is caught, not reported
    calibrated = dp_label_model.calibrate_noise_multiplier
    monkeypatch.setattr(dp_label_model, "calibrate_noise_multiplier", lambda *args: 0.9 * calibrated(*args))
    with pytest.raises(RuntimeError, match="the label model spent epsilon .*, above its share 3.0000"):
        train_dp_label_model(label_network("logistic", 5, 2, []), features, targets, 3.0, 1e-4, settings, noise_seed=0)


def test_the_label_model_learns_a_separable_label_and_a_linear_target():
    features, targets, labels = separable(3000, 1)
    network = label_network("logistic", 5, 2, [])
    train_dp_label_model(network, features, targets, 4.0, 1e-5, DPSGDSettings(epochs=5, batch_size=100, lr=0.05), noise_seed=0)
    test_features, _, test_labels = separable(1000, 2)
    with torch.no_grad():
        accuracy = (network(test_features).argmax(1) == test_labels).float().mean().item()
    assert accuracy > 0.9  # the classes are balanced: chance is 0.5

    target = (0.2 + 0.6 * features[:, :1]).clamp(0, 1)
    regressor = label_network("mlp", 5, 1, [8])
    train_dp_label_model(regressor, features, target, 4.0, 1e-5, DPSGDSettings(epochs=5, batch_size=100, lr=0.02), noise_seed=0)
    with torch.no_grad():
        predicted = regressor(features)
    r2 = 1 - ((predicted - target) ** 2).sum() / ((target - target.mean()) ** 2).sum()
    assert r2 > 0.8


def test_a_row_whose_label_is_outside_the_schema_teaches_the_label_model_nothing(tmp_path, caplog):
    """Such a row is kept with its label block blank (the record count must not depend on it):
    its loss and gradient are 0, not those of the first class (argmax of zeros), and the data
    holder is told how many rows it was. Before, 40 % of rows in an unknown class taught a
    QUAIL label model that they were the rarest listed class."""
    from lightning_dpgan.privacy.dp_label_model import per_record_loss

    outputs = torch.tensor([[2.0, -1.0], [0.5, 0.5]], requires_grad=True)
    loss = per_record_loss(outputs, torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    assert loss[1].item() == 0.0 and loss[0].item() > 0
    loss.sum().backward()
    assert torch.equal(outputs.grad[1], torch.zeros(2)) and outputs.grad[0].abs().sum() > 0

    from lightning_dpgan.datamodules.csv import CSVDataModule

    schema = TableSchema(columns=(Column("x", "continuous", bounds=(0.0, 1.0)),
                                  Column("ward", "categorical", categories=("cardio", "neuro", "ortho"))), label="ward",
                         label_kind="categorical")
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema.to_dict()))
    wards = ["cardio", "neuro", "ortho", "icu"] * 50  # "icu" is no class of the schema
    pd.DataFrame({"x": [i / 200 for i in range(200)], "ward": wards}).to_csv(tmp_path / "data.csv", index=False)
    datamodule = CSVDataModule(csv=tmp_path / "data.csv", schema=tmp_path / "schema.yaml", exclude_label=True)
    datamodule.unknown_categories = "blank"  # as a run sets it
    with caplog.at_level("WARNING"):
        _, labels = datamodule.labelled_records()
    icu = int((datamodule.train_frame["ward"] == "icu").sum())
    assert icu > 0 and (labels.sum(dim=1) == 0).sum().item() == icu
    assert f"{icu} training rows hold a label outside the schema's classes" in caplog.text


def narrow_target(n, seed):
    """A linear target that fills a twentieth of its encoded range, as King's price does."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.rand(n, 5, generator=generator)
    return features, 0.05 + 0.02 * (features[:, :1] - features[:, 1:2])


def r_squared(network, features, target):
    with torch.no_grad():
        predicted = network(features)
    return (1 - ((predicted - target) ** 2).sum() / ((target - target.mean()) ** 2).sum()).item()


def test_a_narrow_continuous_target_is_learnt_once_standardized_by_its_dp_location_and_scale():
    features, target = narrow_target(4000, 4)
    fitted = {}
    for share in (0.0, 0.1):
        torch.manual_seed(0)
        network = label_network("logistic", 5, 1, [])
        settings = DPSGDSettings(epochs=5, batch_size=100, scale_share=share)
        fitted[share] = (network, train_dp_label_model(network, features, target, 1.0, 1e-5, settings, noise_seed=3))
    raw, standardized = (r_squared(fitted[share][0], features, target) for share in (0.0, 0.1))
    assert standardized > 0.8 and raw < 0.3  # Adam's steps on the raw encoding are larger than the target's spread
    network, cost = fitted[0.1]
    released = cost["target_standardization"]
    noise_sd = scale_noise_std(0.1, 4000)  # of each released mean: Lap(2 / 0.1) on a sum of 4000
    assert abs(released["location"] - 0.05) < 4 * noise_sd
    assert abs(released["scale"] - 0.02 / 3) < 4 * noise_sd  # E|U1 - U2| = 1/3
    # the released model predicts in the label's own encoding: the standardization is folded into its weights
    assert r_squared(network, features, target) == standardized
    # basic composition: the Laplace pair's 0.1 of epsilon plus DP-SGD's measured cost on the rest
    assert released["epsilon"] == pytest.approx(0.1) and released["delta"] == 0.0
    assert cost["epsilon"] == pytest.approx(released["epsilon"] + cost["epsilon_dp_sgd"]) and cost["epsilon"] <= 1.0
    independent = dp_accounting_epsilon(cost["noise_multiplier"], cost["sample_rate"], cost["steps"], 1e-5)
    assert cost["epsilon_dp_sgd"] == pytest.approx(independent, rel=0.03) and cost["epsilon_dp_sgd"] <= 0.9
    assert "target_standardization" not in fitted[0.0][1] and fitted[0.0][1]["epsilon"] > 0.9


def test_a_class_label_is_not_standardized_and_its_model_spends_all_of_its_share():
    features, targets, _ = separable(2000, 5)
    cost = train_dp_label_model(label_network("logistic", 5, 2, []), features, targets, 0.8, 1e-5,
                                DPSGDSettings(epochs=3, batch_size=100, scale_share=0.1), noise_seed=0)
    assert "target_standardization" not in cost and cost["epsilon"] > 0.75


@pytest.mark.parametrize("epsilon", [4.0, 0.5])
def test_the_target_scale_costs_its_share_of_epsilon_not_the_share_itself(epsilon):
    features, target = narrow_target(400, 4)
    settings = DPSGDSettings(epochs=1, batch_size=20, scale_share=0.25)
    cost = train_dp_label_model(label_network("logistic", 5, 1, []), features, target, epsilon, 1e-4, settings,
                                noise_seed=0)
    assert cost["target_standardization"]["epsilon"] == pytest.approx(0.25 * epsilon)
    assert cost["epsilon"] <= epsilon and cost["epsilon_dp_sgd"] <= 0.75 * epsilon


def test_folding_the_standardization_rescales_the_last_layers_output():
    torch.manual_seed(0)
    network = label_network("mlp", 3, 1, [4])
    inputs = torch.rand(7, 3)
    with torch.no_grad():
        before = network(inputs)
    fold_into_last_layer(network, LocationScale(location=0.3, scale=0.05, epsilon=0.1, records=10))
    with torch.no_grad():
        assert torch.allclose(network(inputs), 0.3 + 0.05 * before, atol=1e-6)


@pytest.mark.parametrize("share", [1.0, -0.1, 1.5, True])
def test_a_scale_share_outside_0_to_1_is_refused(share):
    with pytest.raises(ValueError, match="scale_share must be in \\[0, 1\\)"):
        DPSGDSettings(scale_share=share)


def test_a_share_too_small_for_a_single_epoch_is_refused_with_the_numbers():
    features, targets, _ = separable(50, 3)
    with pytest.raises(ValueError, match="batch_size 100 exceeds the 50"):
        train_dp_label_model(label_network("logistic", 5, 2, []), features, targets, 1.0, 1e-3, DPSGDSettings(batch_size=100))
    with pytest.raises(ValueError, match="delta"):
        train_dp_label_model(label_network("logistic", 5, 2, []), features, targets, 1.0, 0.1, DPSGDSettings(batch_size=10))


# --- labelling synthetic rows ----------------------------------------------------------------


SCHEMA = TableSchema(
    columns=(Column("x", "continuous", bounds=(0.0, 10.0)), Column("y", "categorical", categories=("no", "yes")),
             Column("c", "categorical", categories=("a", "b"))),
    label="y", label_kind="binary",
)


def test_the_labeler_puts_the_predicted_class_in_the_labels_place_and_survives_a_checkpoint():
    network = label_network("logistic", 3, 2, [])
    with torch.no_grad():  # "yes" exactly when x > 5
        network[0].weight.copy_(torch.tensor([[-10.0, 0, 0], [10.0, 0, 0]]))
        network[0].bias.copy_(torch.tensor([5.0, -5.0]))
    labeler = QuailLabeler(network, "logistic", [], SCHEMA, {"epsilon": 0.5}, labels="most-likely")
    features = pd.DataFrame({"x": [1.0, 9.0, 4.0, 7.5], "c": ["a", "b", "b", "a"]})
    labelled = labeler.label(features)
    assert list(labelled.columns) == ["x", "y", "c"]
    assert list(labelled["y"].astype(str)) == ["no", "yes", "no", "yes"]
    restored = QuailLabeler.from_dict(labeler.to_dict())
    pd.testing.assert_frame_equal(restored.label(features), labelled)
    # rows that hold the label already (a synthesizer trained with it): pandas' "cannot insert y, already exists"
    with pytest.raises(ValueError, match="the rows to label hold the label column 'y' already: QUAIL labels rows "
                                         "generated without it"):
        labeler.label(labelled)


def test_sampled_labels_follow_the_models_probabilities_and_most_likely_takes_the_argmax():
    network = label_network("logistic", 3, 2, [])
    with torch.no_grad():  # logit(yes) - logit(no) = 4 x_enc - 2, x_enc = x / 10
        network[0].weight.copy_(torch.tensor([[0.0, 0, 0], [4.0, 0, 0]]))
        network[0].bias.copy_(torch.tensor([0.0, -2.0]))
    features = pd.DataFrame({"x": [0.0] * 4000 + [10.0] * 4000, "c": ["a"] * 8000})
    sampled = QuailLabeler(network, "logistic", [], SCHEMA, {}, labels="sample")
    labelled = sampled.label(features, torch.Generator().manual_seed(0))
    yes = (labelled["y"].astype(str) == "yes").to_numpy()
    p_low, p_high = torch.sigmoid(torch.tensor([-2.0, 2.0])).tolist()  # x_enc = 0 and 1
    # 4000 draws each: 5 standard errors is under 0.04
    assert yes[:4000].mean() == pytest.approx(p_low, abs=0.04) and yes[4000:].mean() == pytest.approx(p_high, abs=0.04)
    again = sampled.label(features, torch.Generator().manual_seed(0))
    pd.testing.assert_frame_equal(again, labelled)  # the draw is the generator's
    most_likely = QuailLabeler(network, "logistic", [], SCHEMA, {}, labels="most-likely").label(features)
    assert (most_likely["y"].astype(str) == "yes").tolist() == [False] * 4000 + [True] * 4000
    assert QuailLabeler.from_dict(sampled.to_dict()).labels == "sample"
    old_spec = {key: value for key, value in sampled.to_dict().items() if key != "labels"}
    assert QuailLabeler.from_dict(old_spec).labels == "most-likely"  # what checkpoints before the option did
    with pytest.raises(ValueError, match="quail.labels must be one of"):
        QuailLabeler(network, "logistic", [], SCHEMA, {}, labels="mode")


LONG_TAIL = TableSchema(
    columns=(Column("gain", "integer", bounds=(0, 99)), Column("y", "categorical", categories=("no", "yes")),
             Column("z", "continuous", bounds=(10.0, 1010.0))),
    label="y", label_kind="binary",
)


def test_a_log_feature_enters_the_label_model_as_log_x_minus_low_plus_one_over_its_range_in_log_space():
    features = LONG_TAIL.without_label()
    rows = pd.DataFrame({"gain": [0, 9, 99, 500], "z": [10.0, 109.0, 1010.0, 510.0]})
    encoded, _ = features.encode(rows)
    inputs = label_model_inputs(encoded, features, ["gain"])
    # log(9 + 1) / log(99 + 1) = 1/2; the bounds map to 0 and 1; 500 is clipped to 99 first
    assert inputs[:, 0].tolist() == pytest.approx([0.0, 0.5, 1.0, 1.0], abs=1e-6)
    assert torch.equal(inputs[:, 1], encoded[:, 1])  # z stays min-max
    assert encoded[1, 0].item() == pytest.approx(9 / 99)  # the input map leaves the encoding as it was
    logged_z = label_model_inputs(encoded, features, ["gain", "z"])[:, 1]
    assert logged_z.tolist() == pytest.approx([0.0, math.log(100) / math.log(1001), 1.0, math.log(501) / math.log(1001)], abs=1e-6)
    assert label_model_inputs(encoded, features, []) is encoded


def test_the_labeler_reads_its_log_features_in_log_space_and_keeps_them_through_a_checkpoint():
    network = label_network("logistic", 2, 2, [])
    with torch.no_grad():  # logit(yes) - logit(no) = 8 (input of gain) - 4: "yes" above 1/2
        network[0].weight.copy_(torch.tensor([[0.0, 0.0], [8.0, 0.0]]))
        network[0].bias.copy_(torch.tensor([0.0, -4.0]))
    rows = pd.DataFrame({"gain": [3, 20], "z": [10.0, 10.0]})  # min-max 0.03 and 0.2; log space 0.30 and 0.66
    logged = QuailLabeler(network, "logistic", [], LONG_TAIL, {}, labels="most-likely", log_features=["gain"])
    plain = QuailLabeler(network, "logistic", [], LONG_TAIL, {}, labels="most-likely")
    assert list(logged.label(rows)["y"].astype(str)) == ["no", "yes"]
    assert list(plain.label(rows)["y"].astype(str)) == ["no", "no"]
    restored = QuailLabeler.from_dict(logged.to_dict())
    assert restored.log_features == ["gain"]
    pd.testing.assert_frame_equal(restored.label(rows), logged.label(rows))
    older = {key: value for key, value in logged.to_dict().items() if key != "log_features"}
    assert QuailLabeler.from_dict(older).log_features == []  # checkpoints before the option read min-max
    with pytest.raises(ValueError, match="not numeric feature columns"):
        QuailLabeler(network, "logistic", [], LONG_TAIL, {}, log_features=["y"])


def label_model_inputs_seen(monkeypatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Replace QUAIL's DP-SGD training with a recorder: the list it returns gets the
    ``(features, targets)`` of each label model QUAIL would train."""
    trained = []

    def fake_train(network, features, targets, epsilon, delta, settings, noise_seed=None):
        trained.append((features, targets))
        return {"epsilon": epsilon, "delta": delta, "neighbours": "add-remove", "mechanism": "fake"}

    monkeypatch.setattr("lightning_dpgan.quail.train_dp_label_model", fake_train)
    return trained


@pytest.mark.parametrize("label_model,hidden,layers", [("mlp", [6], [Linear, ReLU, Linear]), ("logistic", [], [Linear])])
def test_fit_labeler_builds_the_label_model_asked_for_without_touching_the_runs_random_state(
        monkeypatch, label_model, hidden, layers):
    """--quail.label_model mlp builds the MLP (a logistic model ignored it unseen), and its seeded
    initial weights leave the run's random state, which trains the synthesizer next, as it was."""
    from lightning_dpgan.quail import QUAIL

    label_model_inputs_seen(monkeypatch)
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8)
    datamodule.setup()
    torch.manual_seed(99)
    before = torch.get_rng_state()
    widths = {"hidden": [6]} if label_model == "mlp" else {}
    labeler = QUAIL(batch_size=8, label_model=label_model, **widths).fit_labeler(datamodule, 8.0, 1e-4, "add-remove")
    assert torch.equal(torch.get_rng_state(), before)
    assert [type(layer) for layer in labeler.network] == layers
    assert labeler.hidden == hidden and labeler.network[0].out_features == (hidden or [2])[0]


def test_hidden_widths_for_a_label_model_without_hidden_layers_are_refused():
    """--quail.hidden with the logistic label model was taken, written to config.yaml and unused
    (privacy.json said hidden []); its default, as a run's config.yaml lists it, still passes."""
    from lightning_dpgan.quail import DEFAULT_HIDDEN, QUAIL

    with pytest.raises(ValueError, match=r"^--quail.hidden \[16\] sets the hidden layers of --quail.label_model mlp; "
                                         r"the logistic label model has none"):
        QUAIL(hidden=[16])
    assert QUAIL(hidden=list(DEFAULT_HIDDEN)).label_model == "logistic"
    assert QUAIL(label_model="mlp", hidden=16).hidden == [16]


def test_fit_labeler_trains_the_label_model_on_the_log_scaled_features(monkeypatch):
    from lightning_dpgan.quail import QUAIL

    trained = label_model_inputs_seen(monkeypatch)
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8)
    datamodule.setup()
    labeler = QUAIL(batch_size=8, log_features="capital-gain, capital-loss").fit_labeler(datamodule, 8.0, 1e-4, "add-remove")
    assert labeler.log_features == ["capital-gain", "capital-loss"]
    features = ADULT_SCHEMA.without_label()
    plain, _ = datamodule.labelled_records()
    gain = features.column_slices["capital-gain"].start
    raw = datamodule.train_frame["capital-gain"].to_numpy(dtype=float)
    assert raw.max() > 0, "the fixture needs a row with a capital gain"
    assert trained[0][0][:, gain].tolist() == pytest.approx((torch.log1p(torch.tensor(raw)) / math.log1p(99_999)).tolist(), abs=1e-5)
    untouched = [i for i in range(plain.shape[1]) if i not in (gain, features.column_slices["capital-loss"].start)]
    assert torch.equal(trained[0][0][:, untouched], plain[:, untouched])


def test_a_continuous_label_is_the_regression_output_clipped_into_its_bounds():
    schema = TableSchema(columns=(Column("x", "continuous", bounds=(0.0, 1.0)), Column("price", "continuous", bounds=(100.0, 200.0))),
                         label="price", label_kind="continuous")
    network = label_network("logistic", 1, 1, [])
    with torch.no_grad():  # encoded price = 2 x - 0.5
        network[0].weight.fill_(2.0)
        network[0].bias.fill_(-0.5)
    labelled = QuailLabeler(network, "logistic", [], schema, {}).label(pd.DataFrame({"x": [0.0, 0.5, 1.0]}))
    assert list(labelled["price"]) == pytest.approx([100.0, 150.0, 200.0])


def test_a_log_label_is_learnt_as_log_price_and_mapped_back_into_its_bounds():
    bounds = (100.0, 1100.0)  # log(x - 100 + 1) / log(1001): 0 at 100, 1/2 at 100 + sqrt(1001) - 1, 1 at 1100
    encoded = torch.tensor([[0.0], [(math.sqrt(1001) - 1) / 1000], [1.0], [1.5]])
    assert log_scaled(encoded, bounds)[:, 0].tolist() == pytest.approx([0.0, 0.5, 1.0, 1.0], abs=1e-6)
    assert log_unscaled(log_scaled(encoded, bounds), bounds)[:3, 0].tolist() == pytest.approx(encoded[:3, 0].tolist(), abs=1e-6)
    assert log_unscaled(torch.tensor([[-3.0], [40.0]]), bounds)[:, 0].tolist() == [0.0, 1.0]  # outputs outside [0, 1] clipped
    schema = TableSchema(columns=(Column("x", "continuous", bounds=(0.0, 1.0)), Column("price", "continuous", bounds=bounds)),
                         label="price", label_kind="continuous")
    network = label_network("logistic", 1, 1, [])
    with torch.no_grad():  # log-scaled price = x
        network[0].weight.fill_(1.0)
        network[0].bias.fill_(0.0)
    rows = pd.DataFrame({"x": [0.0, 0.5, 1.0]})
    logged = QuailLabeler(network, "logistic", [], schema, {}, log_label=True)
    assert list(logged.label(rows)["price"]) == pytest.approx([100.0, 100.0 + math.sqrt(1001) - 1, 1100.0], rel=1e-5)
    assert list(QuailLabeler(network, "logistic", [], schema, {}).label(rows)["price"]) == pytest.approx([100.0, 600.0, 1100.0])
    restored = QuailLabeler.from_dict(logged.to_dict())
    assert restored.log_label is True
    pd.testing.assert_frame_equal(restored.label(rows), logged.label(rows))
    older = {key: value for key, value in logged.to_dict().items() if key != "log_label"}
    assert QuailLabeler.from_dict(older).log_label is False  # checkpoints before the option learnt it min-max
    with pytest.raises(ValueError, match="label 'y' is categorical"):
        QuailLabeler(network, "logistic", [], LONG_TAIL, {}, log_label=True)


def test_fit_labeler_trains_a_log_label_on_the_log_scaled_target(monkeypatch):
    from lightning_dpgan.datamodules.king import KingDataModule
    from lightning_dpgan.quail import QUAIL

    trained = label_model_inputs_seen(monkeypatch)
    datamodule = KingDataModule(data_dir=FIXTURES / "king_tiny", download=False, batch_size=8)
    datamodule.setup()
    assert QUAIL(batch_size=8, log_label=True).fit_labeler(datamodule, 8.0, 1e-4, "add-remove").log_label is True
    low, high = KING_SCHEMA.label_column.bounds
    price = torch.tensor(datamodule.train_frame["price"].to_numpy(dtype=float))
    assert trained[0][1][:, 0].tolist() == pytest.approx((torch.log1p(price - low) / math.log1p(high - low)).tolist(), abs=1e-5)
    with pytest.raises(ValueError, match="is categorical: drop --quail.log_label"):
        QUAIL(log_label=True).fit_labeler(AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False), 8.0, 1e-4,
                                          "add-remove")
    assert len(trained) == 1  # refused before a row was read


def test_a_dp_label_model_of_a_long_tail_target_fits_it_better_in_log_space():
    """What ``log_label`` is for: a price-like target, log-linear in the features, with a long
    right tail. DP-SGD on the same noise budget learns its log far better than the raw value."""
    generator = torch.Generator().manual_seed(0)
    n, bounds = 4000, (0.0, 1e6)
    features = torch.rand(n, 3, generator=generator)
    log_price = 9.0 + 3.0 * features[:, 0] - 2.0 * features[:, 1] + 0.3 * torch.randn(n, generator=generator)
    price = log_price.exp().clamp(*bounds)
    encoded = (price / bounds[1]).unsqueeze(1)
    settings = DPSGDSettings(epochs=10, batch_size=256, lr=0.05, max_grad_norm=1.0, scale_share=0.1)

    def r2(prediction):
        return 1.0 - float(((price - prediction) ** 2).sum() / ((price - price.mean()) ** 2).sum())

    scores = {}
    for log_label in (False, True):
        torch.manual_seed(0)
        network = label_network("logistic", 3, 1, [])
        target = log_scaled(encoded, bounds) if log_label else encoded
        train_dp_label_model(network, features, target, 2.0, 1e-5, settings, noise_seed=1)
        with torch.no_grad():
            output = network(features)
        output = log_unscaled(output, bounds) if log_label else output.clamp(0.0, 1.0)
        scores[log_label] = r2(output[:, 0].double() * bounds[1])
    assert scores[True] > 0.6
    assert scores[True] > scores[False] + 0.1


# --- the synthesizer never sees the label ----------------------------------------------------


def test_with_exclude_label_the_encoded_records_do_not_depend_on_the_label(tmp_path):
    flipped = tmp_path / "flipped"
    shutil.copytree(FIXTURES / "adult_tiny", flipped)
    path = flipped / "adult.data"
    text = path.read_text()
    path.write_text(text.replace("<=50K", "@@").replace(">50K", "<=50K").replace("@@", ">50K"))
    encoded, labels_seen = [], []
    for folder in (FIXTURES / "adult_tiny", flipped):
        datamodule = AdultDataModule(data_dir=folder, batch_size=8, download=False, exclude_label=True)
        datamodule.prepare_data()
        datamodule.setup("fit")
        encoded.append(datamodule.train_dataset.tensors[0])
        assert datamodule.data_shape == (ADULT_SCHEMA.without_label().encoded_dim,)
        _, labels = datamodule.labelled_records()
        assert labels.shape == (len(encoded[-1]), 2)
        labels_seen.append(labels)
    assert torch.equal(labels_seen[0], 1 - labels_seen[1])  # every label differs...
    assert torch.equal(encoded[0], encoded[1])  # ...and the records the synthesizer trains on do not


# --- end to end ------------------------------------------------------------------------------


@pytest.mark.parametrize("synthesizer,dataset,neighbours", [("dpctgan", "adult", "add-remove"),
                                                            ("pategan", "adult", "replace-one"),
                                                            ("dpgan", "king", "add-remove")])
def test_quail_writes_a_labelled_table_and_composes_the_two_costs(synthesizer, dataset, neighbours, tmp_path):
    output = tmp_path / "run"
    assert main(quail_args(output, synthesizer, dataset)) == 0
    _, schema = DATA[dataset]
    synthetic = pd.read_csv(output / "synthetic.csv")
    assert list(synthetic.columns) == schema.names and synthetic[schema.label].notna().all()
    if schema.label_kind == "binary":
        assert set(synthetic[schema.label].astype(str)) <= set(schema.label_column.categories)
    report = read_json(output / "privacy.json")
    label_model = report["quail"]["label_model"]
    # "logistic" names one linear layer; on King's price it is a linear regression
    assert label_model["fits"] == ("linear regression" if schema.label_column.is_numeric else "logistic regression")
    assert report["neighbours"] == neighbours and report["quail"]["synthesizer"] == synthesizer
    # the label model's measured cost is one part of what preprocessing spent, and the total stays within target
    part = report["preprocessing"]["parts"]["quail_label_model"]
    assert part.get("as_spent", part)["epsilon"] == label_model["epsilon"]  # restated for replace-one: 2 eps
    share = 0.5 * 8.0 if neighbours == "add-remove" else 0.5 * 8.0 / 2
    assert 0.9 * share < label_model["epsilon"] <= share
    if schema.label_column.is_numeric:  # a tenth of it released the target's location and scale
        assert label_model["target_standardization"]["epsilon"] == pytest.approx(0.1 * share)
    else:
        assert "target_standardization" not in label_model
    assert report["epsilon"] == pytest.approx(report["preprocessing"]["epsilon"] + report["epsilon_training"])
    assert report["epsilon"] <= 8.0
    # metrics.json's figure is the same total, not training's share
    assert read_json(output / "metrics.json")["privacy/epsilon"] == pytest.approx(report["epsilon"], rel=1e-12)
    # delta: the label model's add/remove share, restated for the strategy, is half the target's
    assert label_model["delta"] == pytest.approx(label_model_budget(0.5, 8.0, 1e-3, neighbours)[1])
    assert part["delta"] == pytest.approx(0.5e-3, rel=0.01) and part["delta"] <= 0.5e-3
    assert report["preprocessing"]["delta"] + report["delta_training"] == pytest.approx(1e-3)
    # the checkpoint's synthesizer generates features only; `sample` labels them with the released model
    decoder = table_decoder(read_run_info(output / "checkpoints" / "last.ckpt"))
    decoded_columns = getattr(decoder, "schema", decoder).names
    assert schema.label not in decoded_columns and len(decoded_columns) == len(schema.names) - 1
    assert load_module(output / "checkpoints" / "last.ckpt").hparams.data_shape == (decoder.encoded_dim,)
    published = pd.read_csv(sample_to_file(output / "checkpoints" / "last.ckpt", 20, tmp_path / "published.csv"))
    assert list(published.columns) == schema.names and len(published) == 20


def test_a_resumed_quail_run_reuses_its_label_model_and_pays_for_it_once(tmp_path, monkeypatch, capsys):
    first = tmp_path / "first"
    fixed_noise = ("--privacy.noise_multiplier", "5")  # a sigma calibrated to 4 steps would leave none to resume
    assert main(quail_args(first, "dpctgan", "adult", 4, 8.0, *fixed_noise)) == 0
    checkpoint = str(first / "checkpoints" / "last.ckpt")
    # its synthesizer alone may not continue it: that would drop the label model's cost
    alone = ["train", "--model", "dpctgan", "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"),
             "--output-dir", str(tmp_path / "alone"), "--epsilon", "8", "--delta", "1e-3", "--data.max_modes", "3",
             "--resume", checkpoint]
    assert main(alone) == 2
    assert "is a QUAIL run's checkpoint" in capsys.readouterr().err
    # another synthesizer is named by the flag that chose it
    assert main(quail_args(tmp_path / "other", "dpgan", "adult", 8, 8.0, "--resume", checkpoint)) == 2
    assert ("a checkpoint of --model quail --quail-synthesizer dpctgan --dataset adult, but this run is --model quail "
            "--quail-synthesizer dpgan") in capsys.readouterr().err

    def retrain(*args, **kwargs):
        raise AssertionError("the label model was trained again on resume")

    monkeypatch.setattr("lightning_dpgan.quail.train_dp_label_model", retrain)
    resumed = tmp_path / "resumed"
    # the label model is reused: another setting of it gives way to the checkpoint's, which
    # config.yaml records (it recorded the unused 5, and most-likely, which `sample` would not use)
    assert main(quail_args(resumed, "dpctgan", "adult", 8, 8.0, *fixed_noise, "--resume", checkpoint,
                           "--quail.epochs", "5", "--quail.labels", "most-likely")) == 0
    err = capsys.readouterr().err
    assert f"--quail.epochs 5 ({SET_BY}) gave way to the checkpoint's 10" in err
    assert f"--quail.labels most-likely ({SET_BY}) gave way to the checkpoint's sample" in err
    recorded = yaml.safe_load((resumed / "config.yaml").read_text())["quail"]
    assert recorded["epochs"] == 10 and recorded["labels"] == "sample"
    before, after = read_json(first / "privacy.json"), read_json(resumed / "privacy.json")
    assert after["steps"] == 8 and before["steps"] == 4
    assert after["preprocessing"] == before["preprocessing"]
    label_models = [read_run_info(run / "checkpoints" / "last.ckpt")["quail"] for run in (first, resumed)]
    assert label_models[1]["state"] == label_models[0]["state"]


def test_a_label_model_is_resumed_with_the_scale_share_and_log_features_it_was_trained_with(tmp_path, capsys):
    """A raised --epsilon resolves another QUAIL preset, with other log features: the resume was
    refused. The checkpoint's settings of its label model now give way to it, with a note."""
    first = tmp_path / "first"
    assert main(quail_args(first, "dpgan", "king", 4, 8.0, "--quail.log_features", "sqft_lot")) == 0
    checkpoint = str(first / "checkpoints" / "last.ckpt")
    resumed = quail_args(tmp_path / "adopted", "dpgan", "king", 8, 9.0, "--resume", checkpoint, "--quail.scale_share", "0",
                         "--quail-split", "0.4")
    assert main(resumed) == 0
    err = capsys.readouterr().err
    for note in (f"--quail.scale_share 0 ({SET_BY}) gave way to the checkpoint's 0.1",
                 f"--quail.log_features [] ({SET_BY}) gave way to the checkpoint's sqft_lot",
                 f"--quail-split 0.4 ({SET_BY}) gave way to the checkpoint's 0.5"):
        assert note in err, note
    recorded = yaml.safe_load((tmp_path / "adopted" / "config.yaml").read_text())["quail"]
    assert (recorded["scale_share"], recorded["log_features"], recorded["split"]) == (0.1, ["sqft_lot"], 0.5)
    report = read_json(tmp_path / "adopted" / "privacy.json")
    # the split is of the first run's target, which the resume raised: said beside it
    assert report["quail"]["split"] == 0.5 and report["quail"]["split_of_epsilon"] == 8.0 and report["target_epsilon"] == 9.0


def test_a_label_model_from_before_its_settings_were_kept_is_resumed_only_with_them(tmp_path, capsys, monkeypatch):
    """A checkpoint whose release settings do not hold the label model's split, log features,
    scale share or labels: a resume with other values is refused, naming the checkpoint's."""
    from lightning_dpgan import run as run_module

    kept = ("quail.split", "quail.scale_share", "quail.labels", "quail.log_features", "quail.log_label")
    recent = run_module.release_settings
    monkeypatch.setattr(run_module, "release_settings",
                        lambda *args: {k: v for k, v in recent(*args).items() if k not in kept})
    first = tmp_path / "first"
    assert main(quail_args(first, "dpgan", "king", 4, 8.0, "--quail.log_features", "sqft_lot")) == 0
    assert read_run_info(first / "checkpoints" / "last.ckpt")["quail"]["log_features"] == ["sqft_lot"]
    assert read_json(first / "privacy.json")["quail"]["label_model"]["log_features"] == ["sqft_lot"]
    checkpoint = str(first / "checkpoints" / "last.ckpt")
    resumed = quail_args(tmp_path / "resumed", "dpgan", "king", 8, 8.0, "--resume", checkpoint,
                         "--quail.log_features", "sqft_lot", "--quail.scale_share", "0")
    assert main(resumed) == 2
    assert "resume with --quail.scale_share 0.1" in capsys.readouterr().err
    assert main(quail_args(tmp_path / "resumed", "dpgan", "king", 8, 8.0, "--resume", checkpoint)) == 2
    assert "resume with --quail.log_features sqft_lot" in capsys.readouterr().err
    second = quail_args(tmp_path / "second", "dpgan", "king")  # a checkpoint without log features, resumed with some
    assert main(second) == 0
    again = quail_args(tmp_path / "again", "dpgan", "king", 8, 8.0, "--quail.log_features", "sqft_lot", "--resume",
                       str(tmp_path / "second" / "checkpoints" / "last.ckpt"))
    assert main(again) == 2
    assert "not sqft_lot: resume with --quail.log_features []" in capsys.readouterr().err
    assert main(again[:-4] + ["--quail.log_features", "[]"] + again[-2:]) == 0  # as the message says
    assert not (tmp_path / "resumed" / "privacy.json").exists()


def test_a_label_model_learnt_in_log_space_is_reported_and_resumed_only_as_such(tmp_path, capsys):
    first = tmp_path / "first"
    assert main(quail_args(first, "dpgan", "king", 4, 8.0, "--quail.log_label", "true")) == 0
    checkpoint = first / "checkpoints" / "last.ckpt"
    assert read_run_info(checkpoint)["quail"]["log_label"] is True
    assert read_json(first / "privacy.json")["quail"]["label_model"]["log_label"] is True
    assert main(quail_args(tmp_path / "resumed", "dpgan", "king", 8, 8.0, "--resume", str(checkpoint))) == 0
    assert f"--quail.log_label false ({SET_BY}) gave way to the checkpoint's true" in capsys.readouterr().err
    # the labels of the synthetic table are the log-space model's: within the price bounds, and the same function of
    # the features as the checkpoint's labeler gives
    table = pd.read_csv(tmp_path / "resumed" / "synthetic.csv")
    low, high = KING_SCHEMA.label_column.bounds
    assert table["price"].between(low, high).all()
    labeler = QuailLabeler.from_dict(read_run_info(tmp_path / "resumed" / "checkpoints" / "last.ckpt")["quail"])
    relabelled = labeler.label(table.drop(columns=["price"]))
    assert relabelled["price"].to_numpy() == pytest.approx(table["price"].to_numpy(), rel=1e-4)


def test_quail_takes_its_synthesizers_presets_then_its_own():
    config = resolve({"model": "quail", "dataset": "adult", "quail_synthesizer": "dpctgan"}, {})
    assert config["presets"][:2] == ["dpctgan.yaml", "dpctgan_adult.yaml"]
    assert config["quail"]["synthesizer"] == "dpctgan"
    assert config["privacy"]["name"] == "dp-sgd"


@pytest.mark.parametrize("synthesizer", ["pategan", "dpgan", "gpate"])
def test_quail_with_another_synthesizer_leaves_out_the_presets_tuned_for_dp_ctgan(synthesizer):
    """King's epsilon-1 QUAIL preset set DP-CTGAN's histogram settings (calibrate_marginals), which
    every other synthesizer refused, though no user had set them."""
    dpctgan = resolve({"model": "quail", "dataset": "king", "epsilon": 1.0}, {})
    assert dpctgan["presets"][-2:] == ["quail_king_eps1.yaml", "quail-dpctgan_king_eps1.yaml"]
    assert dpctgan["data"]["calibrate_marginals"] is True and dpctgan["quail"]["lr"] == 0.05
    other = resolve({"model": "quail", "dataset": "king", "epsilon": 1.0, "quail_synthesizer": synthesizer}, {})
    assert "quail-dpctgan_king_eps1.yaml" not in other["presets"] and other["quail"]["lr"] == 0.05
    assert "calibrate_marginals" not in other["data"] and "histogram_threshold" not in other["data"]


@pytest.mark.parametrize("extra,message", [
    (["--quail-split", "1.5"], "--quail-split must be in (0, 1)"),
    (["--quail-split", "0"], "--quail-split must be in (0, 1)"),
    (["--quail-synthesizer", "ctgan"], "give --epsilon, and a synthesizer with a privacy strategy"),
    (["--quail-synthesizer", "dpctgn"], "--quail-synthesizer dpctgn is not a model. Did you mean 'dpctgan'? It takes a "
                                        "table model that trains privately"),
    (["--quail-synthesizer", "quail"], "it cannot be quail"),
    # the list told apart: ctgan, offered as one that "trains privately", was then refused without --privacy
    (["--quail-synthesizer", "nosuch"], "trains privately: dpgan, pategan, gpate, gswgan, dpctgan, patectgan, "
                                        "dpsactgan; or gan, wgan, ctgan with a privacy strategy (--privacy dp-sgd"),
    (["--quail-synthesizer", ""], "--quail-synthesizer is empty: name the table model that generates the features, "
                                  "or leave it out for dpctgan"),
    # a private synthesizer with its strategy turned off was told to give "a private --quail-synthesizer"
    (["--quail-synthesizer", "dpctgan", "--privacy", "none"], "--privacy none turns a private model's off"),
    (["--quail.label_model", "forest"], "--quail.label_model must be one of"),
    (["--quail.labels", "mode"], "--quail.labels must be one of"),
    (["--quail.epochs", "0"], "--quail.epochs must be an integer >= 1, got 0"),
    (["--quail.lr", "-1"], "--quail.lr must be a finite number > 0"),
    (["--quail.scale_share", "1"], "--quail.scale_share must be in [0, 1)"),
    (["--quail.depth", "3"], "unknown key(s) quail.depth"),
    (["--quail-split", "0.99"], "preprocessing would spend epsilon 8.02 of --epsilon 8"),  # modes' 0.1 + 0.99 x 8 > 8
    (["--quail.log_features", "capital-gain,workclass"], "names ['workclass'], which are not numeric feature columns"),
    (["--quail.log_features", "income"], "names ['income'], which are not numeric feature columns"),
    (["--quail.log_features", "capital_gain"], "names ['capital_gain'], which are not numeric feature columns"),
    (["--quail.log_label", "true"], "the label 'income' is categorical: drop --quail.log_label"),
])
def test_bad_quail_settings_are_refused_before_anything_is_trained(extra, message, tmp_path, capsys):
    args = [arg for arg in quail_args(tmp_path / "run") if arg not in ("--epsilon", "8.0", "--delta", "1e-3")]
    if "ctgan" not in extra:
        args += ["--epsilon", "8.0", "--delta", "1e-3"]
    assert main(args + extra) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "privacy.json").exists()


@pytest.mark.parametrize("data_delta, refused", [(4e-4, False), (5e-4, True)])
def test_a_split_that_leaves_the_synthesizer_no_delta_is_refused_before_the_label_model(data_delta, refused):
    """The data's preprocessing delta plus the label model's half of --delta 1e-3 reaching it
    leaves the synthesizer no delta, though epsilon is to spare: refused before a row is read."""
    from types import SimpleNamespace

    from lightning_dpgan.callbacks.dp_sgd import DPSGD
    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.quail import QUAIL
    from lightning_dpgan.run import Run

    run = SimpleNamespace(strategy=DPSGD(target_epsilon=8.0, delta=1e-3), quail=QUAIL(split=0.5), released_info=None,
                          datamodule=SimpleNamespace(planned_privacy_cost=lambda: {"epsilon": 0.1, "delta": data_delta,
                                                                               "mechanism": "DP bounds"}))
    if refused:
        with pytest.raises(ConfigError, match="preprocessing would spend delta 0.001 of --delta 0.001"):
            Run._check_preprocessing_leaves_a_budget(run)
    else:
        Run._check_preprocessing_leaves_a_budget(run)


def test_a_non_private_synthesizer_is_named_as_the_problem(tmp_path, capsys):
    args = ["train", "--model", "quail", "--quail-synthesizer", "gan", "--dataset", "adult", "--data-dir",
            str(FIXTURES / "adult_tiny"), "--output-dir", str(tmp_path / "run"), "--epsilon", "1"]
    assert main(args) == 2
    assert "QUAIL's synthesizer 'gan' trains with --privacy none" in capsys.readouterr().err


def test_quail_settings_without_model_quail_and_quail_on_images_are_refused(tmp_path, capsys):
    assert main(["train", "--model", "dpgan", "--dataset", "adult", "--quail-split", "0.3"]) == 2
    assert "need --model quail" in capsys.readouterr().err
    assert main(["train", "--model", "dpgan", "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"),
                 "--epsilon", "1", "--delta", "1e-3", "--data.exclude_label", "true", "--output-dir", str(tmp_path)]) == 2
    assert "use it with --model quail" in capsys.readouterr().err
    assert main(["train", "--model", "quail", "--quail-synthesizer", "dpgan", "--dataset", "mnist", "--epsilon", "1"]) == 2
    assert "QUAIL labels table rows" in capsys.readouterr().err


@pytest.mark.parametrize("neighbours", ["add-remove", "replace-one"])
def test_fit_labeler_trains_the_label_model_at_split_of_the_budget(monkeypatch, neighbours):
    """The label model gets p of (epsilon, delta), not 1 - p: the end-to-end runs use p = 0.5,
    where the two are the same."""
    from lightning_dpgan.quail import QUAIL

    seen = []

    def fake_train(network, features, targets, epsilon, delta, settings, noise_seed=None):
        seen.append((epsilon, delta))
        return {"epsilon": epsilon, "delta": delta, "neighbours": "add-remove", "mechanism": "fake"}

    monkeypatch.setattr("lightning_dpgan.quail.train_dp_label_model", fake_train)
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8)
    datamodule.setup()
    QUAIL(split=0.3, batch_size=8).fit_labeler(datamodule, 8.0, 1e-4, neighbours)
    if neighbours == "add-remove":
        expected = (0.3 * 8.0, 0.3 * 1e-4)
    else:  # restated for replace-one (2 eps, (1 + e^eps) delta) it is 0.3 of the total
        expected = (0.3 * 8.0 / 2, 0.3 * 1e-4 / (1 + math.exp(1.2)))
    assert seen == [pytest.approx(expected)]


def test_a_split_too_small_for_any_label_model_names_the_split_not_a_target_the_user_never_set():
    """At --quail-split 1e-9 no noise gets the label model to its share; the accountant's own
    words ("raise the target epsilon", epsilon=1e-09) named a target the user had not given."""
    from lightning_dpgan.quail import QUAIL

    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8)
    datamodule.setup()
    with pytest.raises(ValueError) as refused:
        QUAIL(split=1e-9, batch_size=8).fit_labeler(datamodule, 1.0, 1e-4, "add-remove")
    message = str(refused.value)
    assert message.startswith("QUAIL's label model gets --quail-split 1e-09 of --epsilon 1 and --delta 0.0001 "
                              "(epsilon 1e-09, delta 1e-13), and at that share however much noise is added")
    assert message.endswith("Raise --quail-split, or --epsilon") and "target epsilon" not in message


def test_quail_delta_not_below_one_over_n_is_refused_before_the_label_model_trains(tmp_path, capsys, monkeypatch):
    """A QUAIL run with delta >= 1/n is refused before its label model reads a row (the training
    strategy would refuse it too, but only after the label model had trained on the data)."""
    from lightning_dpgan import quail as quail_module

    fitted = record_calls(monkeypatch, quail_module.QUAIL, "fit_labeler")
    args = ["train", "--model", "quail", "--quail-synthesizer", "dpctgan", "--quail-split", "0.5",
            "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"), "--output-dir", str(tmp_path / "run"),
            "--max-steps", "2", "--batch-size", "8", "--model.latent_dim", "8", "--epsilon", "8.0", "--delta", "0.5",
            "--quail.batch_size", "8", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--model.generator_hidden", "[16,16]", "--model.discriminator_hidden", "[16,16]", "--data.max_modes", "3"]
    assert main(args) == 2
    assert "--delta 0.5 (given, or a config file's or the preset's) is not below 1/n" in capsys.readouterr().err
    assert not fitted, "the label model was trained with a delta >= 1/n"
    assert not (tmp_path / "run" / "privacy.json").exists()


def test_a_batch_above_the_training_records_is_refused_before_the_label_model_trains(tmp_path, capsys, monkeypatch):
    """DP-SGD's sample rate (batch / records) must be a probability: its strategy refused the batch
    only when installed, after QUAIL's label model had trained on the rows (wasted work on a run
    refused anyway). A PATE synthesizer takes any batch, so its label model still trains."""
    from lightning_dpgan import quail as quail_module

    fitted = record_calls(monkeypatch, quail_module.QUAIL, "fit_labeler")
    args = quail_args(tmp_path / "run", "dpctgan", "adult", 2, 8.0)
    args[args.index("--batch-size") + 1] = "1000"
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "--batch-size 1000 exceeds the" in error and "or the preset's): pass --batch-size" in error
    assert not fitted, "the label model was trained for a batch the synthesizer refuses"


#: a labelled table small enough to reason about: x in [0, 10], the label y (no/yes), a category c
LABELLED = TableSchema(columns=(Column("x", "continuous", bounds=(0.0, 10.0)), Column("y", "categorical", categories=("no", "yes")),
                                Column("c", "categorical", categories=("a", "b"))), label="y", label_kind="binary")


def threshold_labeler(labels="most-likely"):
    network = label_network("logistic", 3, 2, [])
    with torch.no_grad():  # "yes" exactly when x > 5
        network[0].weight.copy_(torch.tensor([[-10.0, 0, 0], [10.0, 0, 0]]))
        network[0].bias.copy_(torch.tensor([5.0, -5.0]))
    return QuailLabeler(network, "logistic", [], LABELLED, {}, labels=labels)


def test_rows_with_a_non_default_index_are_labelled_not_left_blank():
    """A frame whose index is not 0..n-1 (a filtered table): the labels went in by index, all blank."""
    features = pd.DataFrame({"x": [1.0, 9.0], "c": ["a", "b"]}, index=[10, 11])  # e.g. a filtered frame
    labelled = threshold_labeler().label(features)
    assert list(labelled["y"].astype(str)) == ["no", "yes"]


def test_the_label_is_no_log_feature_even_when_numeric():
    """King's label, price, is numeric: named as a log feature it ended in a bare KeyError."""
    with pytest.raises(ValueError, match="not numeric feature columns"):
        check_log_features(KING_SCHEMA, ["price"])


def test_a_batch_of_all_the_records_is_a_sample_rate_of_one_and_allowed():
    """A batch of every record is a sample rate of 1, a probability: allowed, and charged as such."""
    generator = torch.Generator().manual_seed(0)
    features = torch.rand(50, 3, generator=generator)
    targets = torch.nn.functional.one_hot((features[:, 0] > 0.5).long(), 2).float()
    cost = train_dp_label_model(label_network("logistic", 3, 2, []), features, targets, 5.0, 1e-3,
                                DPSGDSettings(epochs=1, batch_size=50), noise_seed=0)
    assert cost["sample_rate"] == 1.0 and cost["epsilon"] <= 5.0


def test_the_run_seed_alone_sets_the_label_models_initial_weights(monkeypatch):
    """The label model's first weights come from the run's seed, whatever torch's global stream holds."""
    label_model_inputs_seen(monkeypatch)  # no training: the weights stay the initial ones
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8)
    datamodule.setup()
    weights = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        labeler = QUAIL(batch_size=8).fit_labeler(datamodule, 8.0, 1e-4, "add-remove", seed=7)
        weights.append(labeler.network[0].weight.detach().clone())
    assert torch.equal(*weights)


@pytest.mark.parametrize("split", [1.0, 1])
def test_a_split_of_the_whole_budget_is_refused_by_quail_itself(split):
    """A split of 1 leaves the synthesizer nothing: refused where QUAIL is built, not later by the strategy."""
    with pytest.raises(ValueError, match=r"--quail-split must be in \(0, 1\)"):
        QUAIL(split=split)


def test_fit_labeler_refuses_bad_log_features_itself_before_training(monkeypatch):
    """The CLI checks them first only for a public schema; QUAIL's API (and an estimated CSV schema) rely on this."""
    trained = label_model_inputs_seen(monkeypatch)
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8)
    datamodule.setup()
    with pytest.raises(ValueError, match=r"names \['workclass'\], which are not numeric feature columns"):
        QUAIL(batch_size=8, log_features="workclass").fit_labeler(datamodule, 8.0, 1e-4, "add-remove")
    assert not trained


def test_from_python_the_label_models_release_must_be_composed_into_the_synthesizers_strategy():
    """A QUAIL synthesizer trained from Python reported epsilon 1.0 where the label model had spent
    0.5 of it besides: a datamodule that leaves the label to the label model is refused at the
    strategy's setup until the release is added, and then the report composes it."""
    from types import SimpleNamespace

    from lightning_dpgan.callbacks.budget import PrivacyBudgetStopping
    from lightning_dpgan.callbacks.dp_sgd import DPSGD
    from lightning_dpgan.modules.dpgan import DPGAN

    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8, exclude_label=True)
    datamodule.setup("fit")
    labeler = QUAIL(batch_size=8).fit_labeler(datamodule, 8.0, 1e-4, "add-remove")
    strategy = DPSGD(noise_multiplier=1.0, target_epsilon=8.0, delta=1e-4)
    trainer = SimpleNamespace(world_size=1, strategy=None, datamodule=datamodule,
                              callbacks=[strategy, PrivacyBudgetStopping(8.0)])
    synthesizer = DPGAN(datamodule.data_shape, None, arch="mlp", latent_dim=4)
    with pytest.raises(ValueError, match=r"exclude_label=True.*DPSGD.add_prior_release\('quail_label_model', "
                                         r"labeler.release\)"):
        strategy.setup(trainer, synthesizer, "fit")
    assert synthesizer.privacy is None
    strategy.add_prior_release("quail_label_model", labeler.release)
    strategy.check_label_model_composed(datamodule)  # composed: accepted
    composed = strategy.composed_preprocessing(datamodule.privacy_cost())  # a public schema: the label model alone
    assert labeler.cost["epsilon"] > 0 and composed["epsilon"] == pytest.approx(labeler.cost["epsilon"])
    assert labeler.release == {key: labeler.cost[key] for key in ("epsilon", "delta", "neighbours", "mechanism")}
    assert strategy.prior_releases["quail_label_model"] == labeler.release
