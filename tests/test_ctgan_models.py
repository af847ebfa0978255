"""The CTGAN family (ctgan, dpctgan, patectgan, dpsactgan): tiny end-to-end runs through the CLI
on the Adult and King fixtures, and the privacy wiring each model relies on."""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dpgan.cli import main
from lightning_dpgan.config import load_preset, resolve
from lightning_dpgan.datamodules.adult import SCHEMA as ADULT_SCHEMA
from lightning_dpgan.datamodules.king import SCHEMA as KING_SCHEMA
from lightning_dpgan.data.conditional import ConditionalSampler
from lightning_dpgan.error_text import SET_BY
from lightning_dpgan.modules.ctgan import CTGAN
from lightning_dpgan.modules.dpsactgan import DPSACTGAN
from lightning_dpgan.privacy.accountants import OpacusAccountant, calibrate_noise_multiplier
from lightning_dpgan.privacy.gradient_sanitizer import GradientSanitizerMechanism
from lightning_dpgan.sampling import read_run_info, sample_to_file
from preset_helpers import modes_epsilon
from run_helpers import opacus_epsilon, read_json, sanitizer_epsilon, stream_after_training_steps

FIXTURES = Path(__file__).parent / "fixtures"
DATA = {"adult": (FIXTURES / "adult_tiny", ADULT_SCHEMA), "king": (FIXTURES / "king_tiny", KING_SCHEMA)}
TINY_NETS = {
    "ctgan": ["--model.generator_hidden", "[16,16]", "--model.discriminator_hidden", "[16,16]", "--model.pac", "2"],
    "dpctgan": ["--model.generator_hidden", "[16,16]", "--model.discriminator_hidden", "[16,16]"],
    "patectgan": ["--model.generator_hidden", "[16,16]", "--model.discriminator_hidden", "[16,16]",
                  "--privacy.num_teachers", "3", "--privacy.teacher_batch_size", "8",
                  "--privacy.lap_inverse_scale", "0.05", "--model.student_steps", "1"],
    "dpsactgan": ["--model.classifier_hidden", "[16]", "--model.generator_kwargs.tokens", "2",
                  "--model.discriminator_kwargs.tokens", "2"],
}
PRIVATE = {"dpctgan", "patectgan", "dpsactgan"}


def run_args(model, dataset, output_dir, steps=4, *extra):
    data_dir, _ = DATA[dataset]
    args = ["train", "--model", model, "--dataset", dataset, "--data-dir", str(data_dir), "--output-dir", str(output_dir),
            "--max-steps", str(steps), "--batch-size", "8", "--model.latent_dim", "8", "--data.max_modes", "3",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", *TINY_NETS[model]]
    if model in PRIVATE:
        args += ["--epsilon", "8", "--delta", "1e-3"]
    return args + list(extra)


def check_decoded(frame: pd.DataFrame, schema) -> None:
    """Every column of the schema, in order, with values inside its public domain."""
    assert list(frame.columns) == [column.name for column in schema.columns]
    for column in schema.columns:
        values = frame[column.name]
        assert values.notna().all(), column.name
        if column.is_numeric:
            low, high = column.bounds
            assert values.between(low, high).all(), column.name
            if column.kind == "integer":
                assert (values == values.round()).all(), column.name
        else:
            assert set(values.astype(str)) <= {str(c) for c in column.categories}, column.name


def independent_training_epsilon(model, report):
    """The training part of the bill recomputed outside the product: Opacus for DP-SGD, the
    Gaussian's closed form for the sanitizer. PATE's data-dependent bill needs the private vote
    histogram, which the report does not carry: for PATE-CTGAN this is the data-independent
    bound written out (PATE-GAN's moments, 2 lambda^2 l (l + 1) per query, capped at the pure-DP
    2 lambda l), which its bill may not exceed."""
    if model == "dpctgan":  # Poisson batches of expected size --batch-size 8 over the training rows
        rate = 8 / report["train_records"]
        return opacus_epsilon(report["noise_multiplier"], rate, report["steps"], report["delta_training"])
    if model == "dpsactgan":  # sigma over the sensitivity 2 sqrt(B) of B = 8 generated records' mean gradient
        return sanitizer_epsilon({**report, "effective_noise_multiplier": report["noise_multiplier"] / (2 * math.sqrt(8))})
    orders, lam = np.arange(1, 257, dtype=float), report["lap_inverse_scale"]
    per_query = np.minimum(2 * lam**2 * orders * (orders + 1), 2 * lam * orders)
    return float(np.min((report["queries"] * per_query + math.log(1 / report["delta_training"])) / orders))


@pytest.mark.parametrize("model,dataset", [("ctgan", "king"), ("dpctgan", "adult"), ("dpctgan", "king"),
                                           ("patectgan", "adult"), ("patectgan", "king"), ("dpsactgan", "adult"),
                                           ("dpsactgan", "king")])
def test_each_model_trains_through_the_cli_and_writes_a_decodable_table(model, dataset, tmp_path):
    output = tmp_path / "run"
    assert main(run_args(model, dataset, output)) == 0
    _, schema = DATA[dataset]
    synthetic = pd.read_csv(output / "synthetic.csv")
    check_decoded(synthetic, schema)
    report = json.loads((output / "privacy.json").read_text())
    if model in PRIVATE:
        # the modes' DP histogram is part of the bill, and the total stays within the target
        # (spent for add/remove neighbours: under PATE-CTGAN's replace-one, recorded restated beside it)
        modes = report["preprocessing"]["parts"]["modes"]
        assert modes.get("as_spent", modes)["epsilon"] == pytest.approx(0.1)
        assert modes["epsilon"] == pytest.approx(0.2 if model == "patectgan" else 0.1)
        assert report["epsilon"] == pytest.approx(report["preprocessing"]["epsilon"] + report["epsilon_training"], rel=1e-12)
        assert report["epsilon"] <= 8.0
        independent = independent_training_epsilon(model, report)
        if model == "patectgan":  # the data-independent bound, reported as such, and the bill within it
            training_bound = report["epsilon_data_independent"] - report["preprocessing"]["epsilon"]
            assert training_bound == pytest.approx(independent, rel=1e-9)
            assert report["epsilon_training"] <= independent * (1 + 1e-12)
        else:
            assert report["epsilon_training"] == pytest.approx(independent, rel=1e-9)
    else:
        assert report["epsilon"] is None
    # the checkpoint decodes on its own, with the released (not a re-fitted) transformer
    published = sample_to_file(output / "checkpoints" / "last.ckpt", 12, tmp_path / "published.csv")
    check_decoded(pd.read_csv(published), schema)


def test_dpctgan_trains_on_a_mode_specific_continuous_label_and_dpsactgan_refuses_it(tmp_path, capsys):
    """The generator's label slots are alpha plus a mode softmax; prices decode inside their bounds.
    DP-SACTGAN's auxiliary regressor needs the single scalar, and says so before training."""
    output = tmp_path / "run"
    assert main(run_args("dpctgan", "king", output, 4, "--data.label_encoding", "mode-specific")) == 0
    check_decoded(pd.read_csv(output / "synthetic.csv"), KING_SCHEMA)
    layout = torch.load(output / "checkpoints" / "last.ckpt", weights_only=False)["hyper_parameters"]["table_layout"]
    assert layout["label"]["width"] > 1 and layout["spans"][-1][1] == "softmax"  # price's modes come last
    assert "--data.label_encoding" not in capsys.readouterr().err
    assert main(run_args("dpsactgan", "king", tmp_path / "b", 4, "--data.label_encoding", "mode-specific")) != 0
    assert "use --data.label_encoding scalar" in capsys.readouterr().err
    assert not (tmp_path / "b" / "privacy.json").exists()


def test_dpctgan_trains_with_discrete_columns_as_conditions_and_writes_values_of_their_grid(tmp_path):
    """``--data.discrete_columns``: grade and floors become one-hot blocks the conditional vector
    chooses from, cost nothing beyond the same histogram, and synthetic values lie on the grid
    (floors in half steps, whole grades)."""
    output = tmp_path / "run"
    assert main(run_args("dpctgan", "king", output, 4, "--data.discrete_columns", "grade,floors")) == 0
    synthetic = pd.read_csv(output / "synthetic.csv")
    check_decoded(synthetic, KING_SCHEMA)
    assert set(synthetic["floors"]) <= {1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0}
    layout = torch.load(output / "checkpoints" / "last.ckpt", weights_only=False)["hyper_parameters"]["table_layout"]
    widths = sorted(width for _, width in layout["condition_spans"])
    assert widths == [2, 7, 13, 199]  # waterfront, floors, grade, zipcode
    released = read_run_info(output / "checkpoints" / "last.ckpt")["table_transformer"]
    encodings = {column["name"]: column["encoding"] for column in released["columns"]}
    assert encodings["grade"] == encodings["floors"] == "discrete" and encodings["view"] == "mode-specific"
    report = json.loads((output / "privacy.json").read_text())
    assert report["preprocessing"]["parts"]["modes"]["epsilon"] == pytest.approx(0.1)
    assert report["epsilon"] <= 8.0
    published = sample_to_file(output / "checkpoints" / "last.ckpt", 40, tmp_path / "published.csv")
    assert set(pd.read_csv(published)["floors"]) <= {1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0}


def test_a_resume_under_other_encoding_declarations_is_refused(tmp_path, capsys):
    """Bounds modes are rebuilt from the resuming run's declarations, not restored: other
    discrete columns would give other slots under the checkpoint's network."""
    settings = ("--data.modes", "bounds", "--privacy.noise_multiplier", "5")
    first = tmp_path / "first"
    assert main(run_args("dpctgan", "king", first, 2, *settings, "--data.discrete_columns", "grade")) == 0
    resume = ("--resume", str(first / "checkpoints" / "last.ckpt"))
    assert main(run_args("dpctgan", "king", tmp_path / "other", 4, *settings, *resume)) != 0
    assert "trained on another table encoding" in capsys.readouterr().err
    assert main(run_args("dpctgan", "king", tmp_path / "same", 4, *settings, *resume,
                         "--data.discrete_columns", "grade")) == 0


def test_a_resume_records_the_settings_of_the_dp_modes_it_reuses_not_its_own(tmp_path, capsys):
    """The checkpoint's DP modes are reused at no further cost: a resume's --data.modes_epsilon
    0.5 went unused while its config.yaml recorded it, as if the modes had been estimated again.
    It gives way to the checkpoint's 0.1, which config.yaml records, with a note; a setting that
    post-processes the release (calibrate_marginals) stays the resuming run's own. So do the
    column roles the modes were fitted to: another --data.log_columns leaves the layout as it
    was, and went unused in silence."""
    import yaml

    first = tmp_path / "first"
    assert main(run_args("dpctgan", "king", first, 2)) == 0
    resume = ("--resume", str(first / "checkpoints" / "last.ckpt"))
    other = tmp_path / "other"
    assert main(run_args("dpctgan", "king", other, 4, *resume, "--data.modes_epsilon", "0.5",
                         "--data.histogram_threshold", "3", "--data.calibrate_marginals", "true",
                         "--data.log_columns", "price")) == 0
    err = capsys.readouterr().err
    trained = yaml.safe_load((first / "config.yaml").read_text())["data"]  # the preset's threshold
    assert f"train: note: --data.modes_epsilon 0.5 ({SET_BY}) gave way to the checkpoint's 0.1" in err
    assert f"--data.histogram_threshold 3 ({SET_BY}) gave way to the checkpoint's {trained['histogram_threshold']}" in err
    assert "calibrate_marginals" not in err
    assert f"--data.log_columns price ({SET_BY}) gave way to the checkpoint's price,sqft_lot,sqft_lot15" in err
    recorded = yaml.safe_load((other / "config.yaml").read_text())["data"]
    assert recorded["log_columns"] == ["price", "sqft_lot", "sqft_lot15"]
    assert (recorded["modes_epsilon"], recorded["histogram_threshold"]) == (0.1, trained["histogram_threshold"])
    assert recorded["calibrate_marginals"] is True
    assert read_json(other / "privacy.json")["preprocessing"]["epsilon"] == pytest.approx(0.1)


def test_a_run_too_short_for_a_generator_step_names_trainings_spend_not_the_modes(tmp_path, capsys):
    """Two critic steps and no generator step: the warning said the total (the DP modes' 0.1
    included, and under QUAIL the label model's) was spent "on them", the critic steps."""
    run = tmp_path / "run"
    assert main(run_args("dpctgan", "adult", run, 2, "--model.discriminator_steps", "5")) == 0
    report = read_json(run / "privacy.json")
    assert report["preprocessing"]["epsilon"] > 0
    before, warning = capsys.readouterr().err.split("no generator update was taken")
    # said as training starts too, before the budget was spent on the critic alone
    assert ("--max-steps 2 ends before the first generator update, which comes after --model.discriminator_steps 5 "
            "training steps") in before and "spends its budget on the critic all the same" in before
    assert f"spent epsilon {report['epsilon_training']:.4g} of training's budget on them" in warning
    assert f"{report['epsilon']:.4g}" not in warning
    # sampling it later says so again: the user who samples may not have read train's warning
    assert main(["sample", "--checkpoint", str(run / "checkpoints" / "last.ckpt"), "-n", "5",
                 "--out", str(tmp_path / "drawn.csv")]) == 0
    assert ("sample: warning: the checkpoint's generator took no update in its 2 training steps: these records are "
            "drawn from its random initialisation") in capsys.readouterr().err
    assert main(run_args("dpctgan", "adult", tmp_path / "stepped", 2, "--model.discriminator_steps", "1")) == 0
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(tmp_path / "stepped" / "checkpoints" / "last.ckpt"), "-n", "5",
                 "--out", str(tmp_path / "drawn_stepped.csv")]) == 0
    assert "took no update" not in capsys.readouterr().err


def test_models_that_need_the_mode_specific_encoding_refuse_images_and_other_encodings(tmp_path, capsys):
    assert main(run_args("dpctgan", "adult", tmp_path / "a", 4, "--data.encoding", "minmax")) != 0
    assert "needs --data.encoding mode-specific" in capsys.readouterr().err
    args = ["train", "--model", "dpctgan", "--dataset", "mnist", "--output-dir", str(tmp_path / "b")]
    assert main(args) != 0
    assert "generates tables" in capsys.readouterr().err


def test_packing_under_dp_sgd_is_refused(tmp_path, capsys):
    assert main(run_args("dpctgan", "adult", tmp_path / "run", 4, "--model.pac", "2")) != 0
    assert "pac = 2 under DP-SGD" in capsys.readouterr().err
    assert not (tmp_path / "run" / "synthetic.csv").exists()


def test_dp_sgd_under_a_gradient_penalty_or_packs_is_refused_at_once_before_any_row_is_read(tmp_path, capsys, monkeypatch):
    """CTGAN's defaults (penalty 10, pac 10) under --privacy dp-sgd were refused one after the
    other, and only once the DP modes were drawn; with QUAIL, once its label model had trained
    and spent its share."""
    from lightning_dpgan.datamodules.tabular import TabularDataModule
    from lightning_dpgan.quail import QUAIL

    for reads in ("prepare_data", "setup"):
        monkeypatch.setattr(TabularDataModule, reads, lambda *args, **kwargs: pytest.fail("a row was read"))
    monkeypatch.setattr(QUAIL, "fit_labeler", lambda *args, **kwargs: pytest.fail("the label model trained"))
    args = [a for a in run_args("ctgan", "adult", tmp_path / "run") if a not in ("--model.pac", "2")]
    assert main([*args, "--privacy", "dp-sgd", "--epsilon", "8"]) == 2
    err = capsys.readouterr().err
    assert "cannot clip per-record gradients of a gradient penalty: set --model.gradient_penalty 0" in err
    assert "pac = 10 under DP-SGD" in err
    quail = ["train", "--model", "quail", "--quail-synthesizer", "ctgan", "--privacy", "dp-sgd", "--model.pac", "1",
             "--dataset", "adult", "--data-dir", str(DATA["adult"][0]), "--epsilon", "8", "--output-dir", str(tmp_path / "q")]
    assert main(quail) == 2
    err = capsys.readouterr().err
    assert "set --model.gradient_penalty 0" in err and "pac" not in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "q").exists()


def test_a_strategy_the_model_cannot_take_is_named_before_its_presets_settings(tmp_path, capsys):
    """patectgan on adult with --privacy dp-sgd was refused for the preset's PATE keys
    (privacy.num_teachers, ...), which the user cannot drop, not for the model."""
    args = ["train", "--model", "patectgan", "--dataset", "adult", "--data-dir", str(DATA["adult"][0]), "--privacy",
            "dp-sgd", "--epsilon", "8", "--output-dir", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--privacy dp-sgd needs a model with a GradientPrivatizer slot, and PATECTGAN has LabelAggregator" in err
    assert "unknown key" not in err


def test_a_first_step_the_budget_cannot_pay_says_what_was_spent_before_training(tmp_path, capsys):
    """The refusal priced the step with the releases before it (DP modes, QUAIL's label model)
    and named only the step's own settings as the remedy; before the DP modes are drawn, as the
    settings price PATE's cheapest step."""
    args = run_args("patectgan", "adult", tmp_path / "run", 2, "--data.modes_epsilon", "0.3")
    args[args.index("--epsilon") + 1] = "1.2"
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "a single training step would spend at least epsilon" in err
    assert "Of that, 0.6 would be spent before training (" in err  # 0.3, restated for replace-one
    # the parts are listed restated, adding up to its figure, and the message says from what
    assert "modes 0.6 (" in err and ("; restated for replace-one by group privacy from what each would spend for "
                                     "add/remove neighbours)") in err
    assert "a smaller --data.modes_epsilon" in err and "Refused before any DP release read the rows: nothing was spent" in err


def layout(label=None):
    """Two continuous slots, then a 3-category column and a 2-category column."""
    return {
        "spans": [[1, "tanh"], [1, "tanh"], [3, "softmax"], [2, "softmax"]],
        "condition_spans": [[2, 3], [5, 2]],
        "condition_frequencies": [[0.6, 0.3, 0.1], [0.5, 0.5]],
        "label": label,
    }


@pytest.mark.parametrize("pac", [2, 3])
def test_the_module_itself_refuses_packing_under_dp_sgd(pac):
    """The command line refuses --model.pac 2 first; a module built in Python, with DP-SGD in
    its slot, must refuse it too: one record would move several clipped packs."""
    from lightning_dpgan.modules.dpctgan import DPCTGAN

    module = DPCTGAN((7,), table_layout=layout(), pac=pac)
    module.privacy = object()  # any mechanism in the DP-SGD slot
    with pytest.raises(ValueError, match=f"pac = {pac} under DP-SGD"):
        module.setup("fit")
    module.privacy = None
    module.setup("fit")  # no DP-SGD: packing is CTGAN's own


def test_dp_ctgan_built_in_python_defaults_to_what_dp_sgd_can_train():
    """DP-SGD clips each record's gradient: no packing (pac 1) and no gradient penalty, whose
    mixed real-generated records would tie several records into one gradient. The command line
    gets both from the preset; a module built in Python gets them from its defaults."""
    from lightning_dpgan.modules.dpctgan import DPCTGAN

    module = DPCTGAN((7,), table_layout=layout())
    assert (module.hparams.pac, module.hparams.gradient_penalty, module.discriminator.pac) == (1, 0.0, 1)
    module.privacy = object()  # any mechanism in the DP-SGD slot
    module.setup("fit")
    packed = DPCTGAN((7,), table_layout=layout(), pac=3)  # without DP-SGD: CTGAN's packing, as asked
    assert packed.hparams.pac == packed.discriminator.pac == 3


@pytest.mark.parametrize("loss", ["wasserstein", "cross_entropy"])
def test_ctgans_losses_are_the_critics_and_the_generators_of_its_loss(loss):
    """Per record: Wasserstein -s on real and s on generated records, -mean(s) for the
    generator; cross-entropy softplus(-s) and softplus(s), and the non-saturating softplus(-s)."""
    module = CTGAN((7,), table_layout=layout(), pac=1, loss=loss, gradient_penalty=0.0)
    scores = torch.tensor([1.0, -2.0, 0.5])
    softplus = torch.nn.functional.softplus
    real, fake, generator = ((-scores, scores, -scores.mean()) if loss == "wasserstein"
                             else (softplus(-scores), softplus(scores), softplus(-scores).mean()))
    torch.testing.assert_close(module.discriminator_real_loss(scores), real)
    torch.testing.assert_close(module.discriminator_fake_loss(scores), fake)
    torch.testing.assert_close(module.generator_loss(scores), generator)


def test_generated_records_are_conditioned_on_the_categories_released_frequencies_and_real_ones_on_their_own():
    """The discriminator's generated records, and the published samples, take their conditions at
    the (DP) category frequencies -- not training-by-sampling's log-frequency, which would
    over-represent rare categories in the table -- and each real record its own category."""
    torch.manual_seed(0)
    module = CTGAN((7,), table_layout=layout(), pac=1)
    cond = module.sample_labels(20000)
    first = cond[:, :3].sum(1) == 1  # the rows conditioned on the first column
    shares = cond[first, :3].mean(0)
    torch.testing.assert_close(shares, torch.tensor([0.6, 0.3, 0.1]), atol=0.02, rtol=0)
    records = torch.zeros(30, 7)
    records[torch.arange(30), 2 + torch.arange(30) % 3] = 1
    records[torch.arange(30), 5 + torch.arange(30) % 2] = 1
    _, own = module.unpack_batch((records,))
    for record, condition in zip(records, own):
        block = slice(0, 3) if condition[:3].sum() == 1 else slice(3, 5)
        columns = slice(2, 5) if block.start == 0 else slice(5, 7)
        assert condition.sum() == 1 and torch.equal(condition[block], record[columns])


def test_pate_ctgans_generator_pays_ctgans_condition_loss():
    from lightning_dpgan.modules.patectgan import PATECTGAN

    torch.manual_seed(0)
    module = PATECTGAN((7,), table_layout=layout(), latent_dim=4, generator_hidden=(8,), discriminator_hidden=(8,),
                       num_teachers=2)
    calls = []
    original = module.condition_loss
    module.condition_loss = lambda logits, cond, column: calls.append(original(logits, cond, column)) or calls[-1]
    _, _, extra = module.generated_for_generator_step(16)
    assert len(calls) == 1 and extra is calls[0] and extra.item() > 0


def test_the_generator_learns_to_honour_its_conditions():
    """Training-by-sampling: with a discriminator that gives no signal, the condition
    cross-entropy alone teaches the generator to produce the asked category."""
    torch.manual_seed(0)
    module = CTGAN((7,), table_layout=layout(), latent_dim=4, generator_hidden=(32,), discriminator_hidden=(8,), pac=1,
                   lr_generator=1e-2)
    for p in module.discriminator.parameters():
        torch.nn.init.zeros_(p)  # constant scores: the adversarial term has no gradient
    opt_g, opt_d = module.build_optimizers()
    module.optimizers = lambda: [opt_g, opt_d]
    module.manual_backward = lambda loss: loss.backward()

    def honoured() -> float:
        cond, column = module.conditions.sample(400, log_frequency=False)
        module.generator.eval()
        with torch.no_grad():
            fake = module.generator(module.sample_latent(400), cond)
        first = column == 0  # condition blocks: cond[:, 0:3] <-> record[:, 2:5], cond[:, 3:5] <-> record[:, 5:7]
        asked = torch.where(first, cond[:, 0:3].argmax(1), cond[:, 3:5].argmax(1))
        got = torch.where(first, fake[:, 2:5].argmax(1), fake[:, 5:7].argmax(1))
        module.generator.train()
        return (asked == got).float().mean().item()

    before = honoured()
    for _ in range(150):
        module.generator_step(32)
    assert before < 0.7 and honoured() > 0.95


def test_real_records_get_their_own_category_as_condition():
    sampler = ConditionalSampler(layout()["condition_spans"], layout()["condition_frequencies"])
    records = torch.zeros(50, 7)
    records[torch.arange(50), 2 + torch.arange(50) % 3] = 1
    records[torch.arange(50), 5 + torch.arange(50) % 2] = 1
    cond, column = sampler.from_records(records)
    for i in range(50):
        block = cond[i, :3] if column[i] == 0 else cond[i, 3:]
        own = records[i, 2:5] if column[i] == 0 else records[i, 5:7]
        assert torch.equal(block, own) and cond[i].sum() == 1


def sanitized_generator_gradient(module, max_norm, noise):
    """The generator's gradient after one generator step with the sanitizer in the slot."""
    releases = []
    module.privacy = GradientSanitizerMechanism(max_norm, noise, on_release=releases.append)
    opt_g = torch.optim.SGD(module.generator.parameters(), lr=0.0)
    module.optimizers = lambda: [opt_g, None, None]
    module.manual_backward = lambda loss: loss.backward()
    torch.manual_seed(1)
    module.generator_step(16)
    return [p.grad.clone() for p in module.generator.parameters()], releases


def test_dpsactgan_reaches_the_generator_only_through_one_sanitized_release():
    """The discriminator and the auxiliary classifier both train on real records; with the
    sanitizer clipping to (almost) nothing and no noise, the generator's gradient must be the
    condition loss's alone -- nothing from the private networks bypasses the hook."""
    torch.manual_seed(0)
    module = DPSACTGAN((7,), table_layout=layout(label={"start": 5, "width": 2, "kind": "binary"}), latent_dim=4,
                       classifier_hidden=(8,), generator_kwargs={"tokens": 2}, discriminator_kwargs={"tokens": 2})
    assert set(module.private_networks()) == {"discriminator", "classifier"}
    clipped, releases = sanitized_generator_gradient(module, max_norm=1e-12, noise=0.0)
    assert releases == [16]  # one release per generator step, covering both networks

    module.classifier_loss = lambda records: records.new_zeros(())
    module.discriminator.requires_grad_(False)
    module.privacy = None
    opt_g = torch.optim.SGD(module.generator.parameters(), lr=0.0)
    module.optimizers = lambda: [opt_g, None, None]
    torch.manual_seed(1)
    cond, column = module.generator_conditions(16)
    logits = module.generator.logits(module.sample_latent(16), cond)
    opt_g.zero_grad()
    module.condition_loss(logits, cond, column).backward()
    cond_only = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in module.generator.parameters()]
    for got, expected in zip(clipped, cond_only):
        assert torch.allclose(got, expected, atol=1e-6)


def test_dpsactgan_classifier_learns_the_label_from_real_records():
    torch.manual_seed(0)
    module = DPSACTGAN((7,), table_layout=layout(label={"start": 5, "width": 2, "kind": "binary"}), latent_dim=4,
                       classifier_hidden=(16,), generator_kwargs={"tokens": 2}, discriminator_kwargs={"tokens": 2})
    records = torch.zeros(64, 7)
    records[:, 0] = torch.linspace(-1, 1, 64)
    label = (records[:, 0] > 0).long()
    records[torch.arange(64), 2] = 1
    records[torch.arange(64), 5 + label] = 1
    optimizer = torch.optim.Adam(module.classifier.parameters(), lr=1e-2)
    module.classifier.eval()  # no dropout: a deterministic check
    before = module.classifier_loss(records).item()
    for _ in range(200):
        optimizer.zero_grad()
        module.classifier_loss(records).backward()
        optimizer.step()
    assert module.classifier_loss(records).item() < 0.2 < before
    features = torch.cat([records[:, :5], records[:, 7:]], dim=1)  # the label's slots 5-6 left out
    with torch.no_grad():
        assert torch.equal(module.classifier(features).argmax(1), label)  # the label, not its complement
    # the generator pays the same loss on its own records, weighted, beside the discriminator's
    module.discriminator.eval()
    fake, cond = torch.rand(8, 7), module.sample_labels(8)
    extra = module.adversarial_generator_loss(fake, cond) - CTGAN.adversarial_generator_loss(module, fake, cond)
    torch.testing.assert_close(extra, module.hparams.classifier_weight * module.classifier_loss(fake))
    assert module.hparams.classifier_weight > 0


def test_resume_and_evaluate_reuse_the_released_transformer_and_pay_for_it_once(tmp_path, monkeypatch):
    """The modes' DP histogram is fitted once; a resumed run and ``evaluate`` restore it from the
    checkpoint (a second fit would spend modes_epsilon again, unreported)."""
    from lightning_dpgan.data.table_transformer import TableTransformer
    from lightning_dpgan.evaluate import evaluate_run

    first = tmp_path / "first"
    fixed_noise = ("--privacy.noise_multiplier", "5")  # a sigma calibrated to 4 steps would leave none to resume
    assert main(run_args("dpctgan", "adult", first, 4, *fixed_noise)) == 0
    released = json.loads((first / "privacy.json").read_text())

    def no_second_fit(*args, **kwargs):
        raise AssertionError("the mode-specific encoding was fitted on the private rows again")

    monkeypatch.setattr(TableTransformer, "fit_dp", no_second_fit)
    resumed = tmp_path / "resumed"
    assert main(run_args("dpctgan", "adult", resumed, 8, *fixed_noise,
                         "--resume", str(first / "checkpoints" / "last.ckpt"))) == 0
    report = json.loads((resumed / "privacy.json").read_text())
    assert report["preprocessing"] == released["preprocessing"] and report["steps"] == 8
    assert report["epsilon"] > released["epsilon"]
    results = evaluate_run(first, data_dir=str(DATA["adult"][0]))
    assert "fidelity/wasserstein_mean" in results


TRAINING_ROWS = {"adult": 30_162, "king": 17_290}  # adult.data without missing values; King's train split


def papers_sigma(sample_rate: float) -> OpacusAccountant:
    """An accountant of DP-CTGAN's appendix noise (dpctgan.yaml's sigma 5) at ``sample_rate``, to
    ask how long that sigma lasts."""
    accountant = OpacusAccountant()
    accountant.step(noise_multiplier=load_preset("dpctgan.yaml")["privacy"]["noise_multiplier"], sample_rate=sample_rate)
    return accountant


@pytest.mark.parametrize(("dataset", "epsilon", "sigma"),
                         [("adult", 0.1, 41.6), ("adult", 1.0, 5.0), ("adult", 10.0, 0.88),
                          ("king", 0.1, 37.5), ("king", 1.0, 5.0), ("king", 10.0, 0.89)])
def test_dpctgan_presets_keep_one_schedule_and_calibrate_sigma(dataset, epsilon, sigma):
    """At every epsilon the presets train as long as the paper's sigma 5 lasts at epsilon 1 and
    calibrate sigma to the budget, so the grid's cells differ in their noise only, and a run on
    part of the budget (QUAIL's synthesizer) is as long as one on all of it. (King at 0.1 takes its
    modes from public bounds, which cost nothing.)"""
    config = resolve({"model": "dpctgan", "dataset": dataset, "epsilon": epsilon}, {})
    assert config["privacy"]["noise_multiplier"] is None
    bounds = config["data"].get("modes") == "bounds"
    assert bounds == ((dataset, epsilon) == ("king", 0.1))
    steps, modes = config["max_steps"], modes_epsilon(config)
    sample_rate = config["data"]["batch_size"] / TRAINING_ROWS[dataset]

    at_one = resolve({"model": "dpctgan", "dataset": dataset, "epsilon": 1.0}, {})
    assert at_one["max_steps"] == steps
    paper = papers_sigma(sample_rate)
    training_budget = 1.0 - modes_epsilon(at_one)
    assert paper.epsilon_if(1e-5, steps - 1) <= training_budget < paper.epsilon_if(1e-5, steps + 100)

    calibrated = calibrate_noise_multiplier(epsilon - modes, 1e-5, sample_rate, steps)
    assert calibrated == pytest.approx(sigma, rel=0.05)


@pytest.mark.parametrize(("epsilon", "sigma"), [(0.1, 30.6), (1.0, 3.7), (10.0, 0.74)])
def test_dpctgan_on_credit_keeps_the_papers_300_epochs_and_calibrates_sigma(epsilon, sigma):
    """On credit the paper's sigma 5 outlasts its 300 epochs at epsilon 1, so the cap is the
    schedule; sigma is calibrated to it at every epsilon (a fixed 5 stopped epsilon 0.1 after a
    few steps)."""
    train_rows = 284_807 - round(0.2 * 284_807)  # the seeded 80/20 split of the 284,807 transactions
    config = resolve({"model": "dpctgan", "dataset": "kaggle-credit", "epsilon": epsilon}, {})
    assert config["privacy"]["noise_multiplier"] is None and config["max_epochs"] == 300
    assert config.get("max_steps") is None
    batch = config["data"]["batch_size"]
    sample_rate, steps = batch / train_rows, 300 * int(train_rows / batch)  # an epoch of the Poisson loader
    paper = papers_sigma(sample_rate)
    assert paper.epsilon_if(1e-5, steps) < 1.0 - 0.1  # the paper's run at epsilon 1 ends at its cap
    calibrated = calibrate_noise_multiplier(epsilon - modes_epsilon(config), 1e-5, sample_rate, steps)
    assert calibrated == pytest.approx(sigma, rel=0.05)


def test_draws_on_real_records_leave_the_runs_stream_where_a_batch_of_any_size_would():
    """CTGAN's real conditions and its critic's dropout masks take draws per real record; under
    Poisson sampling the count is private, and on the run's (seeded, public) stream it would
    move the next generated records and latents by a private amount. After a discriminator
    step on 0, 5 or 9 real records, the run's stream is at the same place."""
    module = CTGAN((7,), table_layout=layout(), latent_dim=4, generator_hidden=(8,), discriminator_hidden=(8,), pac=1)
    empty, five, nine = stream_after_training_steps(module, torch.rand(9, 7))
    assert torch.equal(five, nine) and torch.equal(empty, nine)  # an empty Poisson batch as well


def test_dp_sactgans_classifier_draws_on_real_records_leave_the_runs_stream_in_place():
    """DP-SACTGAN's auxiliary classifier trains on the same real records, with dropout: its masks
    too come from the stream of the real records, whatever their number."""
    module = DPSACTGAN((7,), table_layout=layout(label={"start": 5, "width": 2, "kind": "binary"}), latent_dim=4,
                       classifier_hidden=(8,), generator_kwargs={"tokens": 2}, discriminator_kwargs={"tokens": 2})
    records = torch.zeros(9, 7)
    records[:, 2] = records[:, 5] = 1  # every record in category 0 of both blocks
    empty, five, nine = stream_after_training_steps(module, records)
    assert torch.equal(five, nine) and torch.equal(empty, nine)


def test_ctgan_takes_no_class_labels_even_when_the_data_has_classes():
    """The condition vector replaces class labels: given the dataset's class count, CTGAN stays
    unconditional to callers (``sample`` refuses labels, as its docstring says) and draws
    records with its own conditions."""
    module = CTGAN((7,), 2, table_layout=layout(), latent_dim=4, generator_hidden=(8,), discriminator_hidden=(8,), pac=1)
    assert module.num_classes is None
    assert module.sample(4).shape == (4, 7)
    with pytest.raises(ValueError, match="unconditional"):
        module.sample(4, torch.tensor([0, 1, 0, 1]))


def test_ctgans_optimizers_are_ctgans_adam_with_weight_decay():
    """CTGAN's settings: Adam, betas (0.5, 0.9), each network's learning rate, weight decay on both."""
    module = CTGAN((7,), table_layout=layout(), latent_dim=4, generator_hidden=(8,), discriminator_hidden=(8,), pac=1,
                   lr_generator=1e-3, lr_discriminator=3e-4, weight_decay=1e-4)
    opt_g, opt_d = module.build_optimizers()
    for optimizer, lr in ((opt_g, 1e-3), (opt_d, 3e-4)):
        assert isinstance(optimizer, torch.optim.Adam)
        assert (optimizer.defaults["lr"], optimizer.defaults["betas"], optimizer.defaults["weight_decay"]) == \
            (lr, (0.5, 0.9), 1e-4)


def test_dpsactgans_auxiliary_loss_is_weighted_and_reaches_the_generated_records():
    """The generator's auxiliary term is ``classifier_weight`` times the classifier's loss on the
    generated records, and it is differentiated through those records (the only way it can
    teach the generator): its gradient with respect to ``fake`` is the weighted classifier
    loss's, beside the discriminator's."""
    torch.manual_seed(0)
    module = DPSACTGAN((7,), table_layout=layout(label={"start": 5, "width": 2, "kind": "binary"}), latent_dim=4,
                       classifier_hidden=(8,), classifier_weight=2.5, generator_kwargs={"tokens": 2},
                       discriminator_kwargs={"tokens": 2})
    module.eval()  # no dropout: the two evaluations below see the same networks
    fake, cond = torch.rand(8, 7, requires_grad=True), module.sample_labels(8)
    (total,) = torch.autograd.grad(module.adversarial_generator_loss(fake, cond), fake)
    (adversarial,) = torch.autograd.grad(CTGAN.adversarial_generator_loss(module, fake, cond), fake)
    (auxiliary,) = torch.autograd.grad(module.classifier_loss(fake), fake)
    assert auxiliary.abs().sum() > 0
    torch.testing.assert_close(total - adversarial, 2.5 * auxiliary)


@pytest.mark.parametrize("label", [{"start": 0, "width": 1, "kind": "continuous"},
                                   {"start": 5, "width": 2, "kind": "binary"}])
def test_dpsactgans_auxiliary_loss_moves_the_generated_features_not_the_generated_label(label):
    """The generated label is the auxiliary loss's target, held fixed (the module's docstring:
    our choice, where CTAB-GAN+'s regression branch also moves a continuous label): its slots get
    no gradient from that loss, the other columns do."""
    torch.manual_seed(0)
    module = DPSACTGAN((7,), table_layout=layout(label=label), latent_dim=4, classifier_hidden=(8,),
                       generator_kwargs={"tokens": 2}, discriminator_kwargs={"tokens": 2}).eval()
    fake = torch.rand(8, 7, requires_grad=True)
    (gradient,) = torch.autograd.grad(module.classifier_loss(fake), fake)
    in_label = torch.zeros(7, dtype=torch.bool)
    in_label[label["start"]:label["start"] + label["width"]] = True
    assert torch.equal(gradient[:, in_label], torch.zeros_like(gradient[:, in_label]))
    assert (gradient[:, ~in_label].abs().sum(0) > 0).all()


@pytest.mark.parametrize("log_frequency", [True, False])
def test_the_generator_steps_conditions_follow_the_log_frequency_setting(log_frequency):
    """``--model.log_frequency false`` turns CTGAN's emphasis on rare categories off in the
    generator step: its conditions then follow the category frequencies themselves (0.6, 0.3,
    0.1 in the first column), with it their logarithm (log(1 + 1000 f), normalised)."""
    torch.manual_seed(0)
    module = CTGAN((7,), table_layout=layout(), latent_dim=4, generator_hidden=(8,), discriminator_hidden=(8,), pac=1,
                   log_frequency=log_frequency)
    cond, column = module.generator_conditions(20000)
    first = column == 0
    assert torch.equal(first, cond[:, :3].sum(1) == 1)
    law = torch.tensor([0.6, 0.3, 0.1])
    law = torch.log1p(law * 1000) / torch.log1p(law * 1000).sum() if log_frequency else law
    torch.testing.assert_close(cond[first, :3].mean(0), law, atol=0.02, rtol=0)
