"""Train-synthetic-test-real CNN accuracy on a tiny, easily separable 10-class dataset."""
import numpy as np
import pytest
import torch
from idx_fixture import tiny_image_dataset
from torch import nn

from lightning_dpgan.evaluation import SmallCNN, cnn_accuracy, load_synthetic_npz
from lightning_dpgan.evaluation.images import evaluate

SCHEDULE = {"epochs": 4, "batch_size": 32, "lr": 1e-3}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Batches of 32 gain nothing from intra-op threads; on a busy 2-core machine they thrash (5x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bars():
    """300 train / 100 test uint8 images, shape (N, 1, 28, 28): one bar position per class plus noise."""
    train_images, train_labels = tiny_image_dataset(300, seed=1)
    test_images, test_labels = tiny_image_dataset(100, seed=2)
    return train_images[:, None], train_labels, test_images[:, None], test_labels


def test_small_cnn_has_the_papers_layers():
    """G-PATE A.5: two conv layers with 32 and 64 kernels, ReLU, dropout."""
    model = SmallCNN()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [conv.out_channels for conv in convs] == [32, 64]
    assert [conv.kernel_size for conv in convs] == [(3, 3), (3, 3)]
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.2, 0.25]  # the authors' script
    assert [m.kernel_size for m in model.modules() if isinstance(m, nn.MaxPool2d)] == [2]
    assert [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)] == [(64 * 11 * 11, 64),
                                                                                                     (64, 10)]
    assert sum(p.numel() for p in model.parameters()) == 515_146  # as the released script's model
    assert sum(isinstance(m, nn.ReLU) for m in model.modules()) == 3
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_separable_data_is_learned_and_shuffled_labels_are_not(bars):
    train_images, train_labels, test_images, test_labels = bars
    learned = cnn_accuracy(train_images, train_labels, test_images, test_labels, **SCHEDULE)
    assert learned == {"accuracy": learned["accuracy"], "epochs": 4, "train_records": 300, "test_records": 100}
    assert learned["accuracy"] >= 0.9

    shuffled = np.random.default_rng(0).permutation(train_labels)
    chance = cnn_accuracy(train_images, shuffled, test_images, test_labels, **SCHEDULE)
    assert chance["accuracy"] <= 0.3


def test_uint8_and_float_inputs_give_the_same_result(bars):
    train_images, train_labels, test_images, test_labels = bars
    as_float = lambda pixels: torch.from_numpy(pixels).float() / 127.5 - 1.0  # noqa: E731
    schedule = {**SCHEDULE, "epochs": 2, "seed": 3}
    from_uint8 = cnn_accuracy(train_images, train_labels, test_images, test_labels, **schedule)
    from_float = cnn_accuracy(as_float(train_images), train_labels, as_float(test_images), test_labels, **schedule)
    assert from_uint8 == from_float


def test_float_images_outside_minus_one_one_are_refused(bars):
    train_images, train_labels, test_images, test_labels = bars
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        cnn_accuracy(train_images.astype(np.float32), train_labels, test_images, test_labels, epochs=1)


def test_load_synthetic_npz_round_trip(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, size=(20, 1, 28, 28), dtype=np.uint8)
    labels = np.arange(20) % 10
    path = tmp_path / "synthetic.npz"
    np.savez_compressed(path, images=images, labels=labels)
    loaded_images, loaded_labels = load_synthetic_npz(path)
    assert loaded_images.dtype == torch.uint8 and loaded_labels.dtype == torch.int64
    assert np.array_equal(loaded_images.numpy(), images) and np.array_equal(loaded_labels.numpy(), labels)


def test_load_synthetic_npz_refuses_float_images(tmp_path):
    path = tmp_path / "floats.npz"
    np.savez_compressed(path, images=np.zeros((4, 1, 28, 28), dtype=np.float32), labels=np.arange(4))
    with pytest.raises(ValueError, match="expected uint8 images"):
        load_synthetic_npz(path)


def test_load_synthetic_npz_refuses_unlabelled_records(tmp_path):
    path = tmp_path / "unconditional.npz"
    np.savez_compressed(path, images=np.zeros((4, 1, 28, 28), dtype=np.uint8))
    with pytest.raises(ValueError, match="unconditional"):
        load_synthetic_npz(path)


def test_cnn_accuracy_is_measured_on_the_test_records(bars):
    train_images, train_labels, test_images, test_labels = bars
    wrong = (test_labels + 1) % 10  # every test label wrong: a classifier that learnt the bars scores ~0
    assert cnn_accuracy(train_images, train_labels, test_images, wrong, **SCHEDULE)["accuracy"] <= 0.1


class FirstPixelClassifier(nn.Module):
    """Predicts the class written in an image's first pixel."""

    def forward(self, images):
        return nn.functional.one_hot(images[:, 0, 0, 0].long(), 10).float()


def test_accuracy_accumulates_over_uneven_batches_record_by_record():
    """250 records in batches of 100, 100 and 50, right on 100 + 0 + 50 of them: 150 / 250 = 0.6
    (a mean of the batches' accuracies would say 2 / 3)."""
    labels = torch.arange(250) % 10
    images = torch.zeros(250, 1, 28, 28)
    images[:, 0, 0, 0] = labels.float()
    images[100:200, 0, 0, 0] = ((labels[100:200] + 1) % 10).float()  # the second batch all wrong
    assert evaluate(FirstPixelClassifier(), images, labels, batch_size=100, device="cpu") == pytest.approx(0.6)


def test_accuracy_is_over_records_not_averaged_over_classes():
    """90 records of class 0 right, 10 of class 1 wrong: 0.9 (a per-class average would say 0.5)."""
    labels = torch.tensor([0] * 90 + [1] * 10)
    images = torch.zeros(100, 1, 28, 28)  # first pixel 0: class 0 predicted for every record
    assert evaluate(FirstPixelClassifier(), images, labels, batch_size=64, device="cpu") == pytest.approx(0.9)


class TrainingModeProbe(FirstPixelClassifier):
    """Records whether it was in training mode (dropout on) when scoring."""

    def __init__(self):
        super().__init__()
        self.modes = []

    def forward(self, images):
        self.modes.append(self.training)
        return super().forward(images)


def test_the_classifier_is_scored_with_dropout_off():
    probe = TrainingModeProbe().train()
    evaluate(probe, torch.zeros(10, 1, 28, 28), torch.zeros(10, dtype=torch.long), batch_size=4, device="cpu")
    assert probe.modes == [False, False, False]


def test_the_callers_random_state_is_left_as_it_was(bars):
    train_images, train_labels, test_images, test_labels = bars
    torch.manual_seed(123)
    before = torch.get_rng_state()
    cnn_accuracy(train_images[:20], train_labels[:20], test_images[:10], test_labels[:10], epochs=1, batch_size=8)
    assert torch.equal(torch.get_rng_state(), before)


def test_uint8_pixels_map_onto_the_datamodules_minus_one_to_one_scale():
    """0 -> -1 and 255 -> 1, as the datamodules scale the real images the CNN is tested on."""
    from lightning_dpgan.evaluation.images import as_model_input

    pixels = torch.tensor([0, 51, 255] * 10, dtype=torch.uint8)[:28].repeat(1, 1, 28, 1)
    mapped = as_model_input(pixels)
    assert torch.allclose(mapped, pixels.float() / 127.5 - 1) and (mapped.min(), mapped.max()) == (-1.0, 1.0)


def test_a_label_past_the_last_class_is_refused():
    from lightning_dpgan.evaluation.images import as_labels

    assert as_labels([9], 1).tolist() == [9]
    for outside in (10, -1):
        with pytest.raises(ValueError, match=r"labels must lie in \[0, 10\)"):
            as_labels([outside, 3], 2)


def test_images_without_a_channel_axis_are_given_one():
    from lightning_dpgan.evaluation.images import as_model_input

    assert torch.equal(as_model_input(torch.full((2, 28, 28), 255, dtype=torch.uint8)), torch.ones(2, 1, 28, 28))


def test_cnn_accuracy_trains_the_schedule_asked_and_refuses_none_or_no_test_record(monkeypatch):
    from lightning_dpgan.evaluation import images as module

    seen, train = [], module.train_classifier
    monkeypatch.setattr(module, "train_classifier", lambda *args: seen.append(args[2:5]) or train(*args))
    x, y = torch.zeros(4, 1, 28, 28), torch.arange(4)
    cnn_accuracy(x, y, x, y, epochs=3, batch_size=2, lr=2e-3, seed=1)
    assert seen == [(3, 2, 2e-3)]
    with pytest.raises(ValueError, match="at least one record"):
        cnn_accuracy(x, y, x[:0], y[:0], epochs=1)
    with pytest.raises(ValueError, match="epochs >= 1"):
        cnn_accuracy(x, y, x, y, epochs=0)


def test_the_classifier_trains_its_schedule_in_shuffled_batches_each_from_zero_gradients(monkeypatch):
    """Every epoch, every batch, each gradient its own batch's: a hand-written loop of the same
    schedule (init and order seeded by the seed given, shuffled order, Adam at the rate given)
    ends with the same weights. Neither the seed nor the rate is a default."""
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_dpgan.evaluation.images import train_classifier

    images, labels = torch.rand(40, 1, 28, 28) * 2 - 1, torch.arange(40) % 10
    trained = train_classifier(images, labels, epochs=2, batch_size=16, lr=3e-3, seed=5, device="cpu")
    torch.manual_seed(5)
    reference = SmallCNN()
    optimizer = torch.optim.Adam(reference.parameters(), lr=3e-3)
    loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(5))
    reference.train()
    for _ in range(2):
        for batch_images, batch_labels in loader:
            optimizer.zero_grad()
            nn.CrossEntropyLoss()(reference(batch_images), batch_labels).backward()
            optimizer.step()
    for (name, value), expected in zip(trained.state_dict().items(), reference.state_dict().values()):
        assert torch.allclose(value, expected, atol=1e-6), name


def test_nan_or_infinite_float_images_are_refused_not_scored():
    """NaN compares False with both ends of the [-1, 1] check: such images passed it, and a CNN
    trained on them gave an accuracy that measured nothing."""
    from lightning_dpgan.evaluation.images import as_model_input

    for bad in (float("nan"), float("inf")):
        images = torch.zeros(2, 1, 28, 28)
        images[1, 0, 3, 3] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            as_model_input(images)
    assert as_model_input(torch.zeros(2, 1, 28, 28)).shape == (2, 1, 28, 28)
