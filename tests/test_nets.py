"""Generator/discriminator architectures: shapes, conditioning, DP-compatibility."""
import pytest
import torch
from torch import nn

from lightning_dpgan.nets import build_networks
from lightning_dpgan.nets.factory import resolve_architecture


@pytest.mark.parametrize("arch,shape", [("dcgan", (1, 28, 28)), ("mlp", (1, 28, 28)), ("mlp", (7,))])
@pytest.mark.parametrize("num_classes", [None, 3])
def test_generator_and_discriminator_shapes(arch, shape, num_classes):
    generator, discriminator = build_networks(arch, shape, latent_dim=8, num_classes=num_classes)
    labels = torch.tensor([0, 2, 1, 0]) if num_classes else None
    records = generator(torch.randn(4, 8), labels)
    assert records.shape == (4, *shape)
    assert records.min() >= -1 and records.max() <= 1  # tanh output
    assert discriminator(records, labels).shape == (4,)


def test_conditional_generator_output_depends_on_label():
    generator, discriminator = build_networks("dcgan", (1, 28, 28), latent_dim=8, num_classes=10)
    generator.eval()
    z = torch.randn(1, 8).repeat(2, 1)
    images = generator(z, torch.tensor([0, 7]))
    assert not torch.allclose(images[0], images[1])
    scores = discriminator(images[:1].repeat(2, 1, 1, 1), torch.tensor([0, 7]))
    assert scores[0] != scores[1]


def test_conditional_nets_require_labels():
    generator, _ = build_networks("mlp", (5,), latent_dim=4, num_classes=2)
    with pytest.raises(ValueError, match="labels"):
        generator(torch.randn(3, 4))


@pytest.mark.parametrize("arch", ["mlp", "dcgan"])
def test_discriminators_have_no_batchnorm(arch):
    """BatchNorm mixes records in a batch, which per-sample gradients (DP-SGD) cannot allow."""
    _, discriminator = build_networks(arch, (1, 28, 28), latent_dim=4, num_classes=10)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in discriminator.modules())


def test_discriminator_rows_are_independent():
    """Changing one record must not change another record's score (no batch coupling)."""
    _, discriminator = build_networks("dcgan", (1, 28, 28), latent_dim=4)
    x = torch.randn(3, 1, 28, 28)
    before = discriminator(x)
    x[0] = torch.randn(1, 28, 28)
    after = discriminator(x)
    assert torch.allclose(before[1:], after[1:])
    assert not torch.allclose(before[0], after[0])


def test_architecture_resolution():
    assert resolve_architecture("auto", (1, 28, 28)) == "dcgan"
    assert resolve_architecture("auto", (30,)) == "mlp"
    assert resolve_architecture("auto", (1, 30, 30)) == "mlp"  # sides not divisible by 4
    with pytest.raises(ValueError, match="unknown architecture"):
        resolve_architecture("resnet", (1, 28, 28))
    with pytest.raises(ValueError, match="divisible by 4"):
        build_networks("dcgan", (1, 30, 30), latent_dim=4)


@pytest.mark.parametrize("arch", ["mlp", "dcgan"])
def test_discriminator_label_interacts_with_the_record(arch):
    """The label must change the score by an amount that depends on the record: a label that
    only adds a per-class bias lets the critic ignore whether a record fits its class."""
    torch.manual_seed(0)
    _, discriminator = build_networks(arch, (1, 28, 28), latent_dim=4, num_classes=10)
    x = torch.randn(2, 1, 28, 28)
    score = lambda label: discriminator(x, torch.full((2,), label))  # noqa: E731
    label_effect = score(3) - score(5)
    assert not torch.allclose(label_effect[0], label_effect[1])


def test_the_mlp_generator_has_a_relu_after_each_hidden_layer_and_the_dcgan_one_draws_dark_pixels():
    """PATE-GAN's generator: ReLU hidden layers (without them it is one linear map under its
    output activation). DCGAN's images end in tanh, on the data's [-1, 1]: under a sigmoid no
    pixel could be dark."""
    from lightning_dpgan.nets.dcgan import DCGANGenerator
    from lightning_dpgan.nets.mlp import MLPGenerator

    generator = MLPGenerator(4, (6,), hidden=(8, 8))
    assert sum(isinstance(layer, nn.ReLU) for layer in generator.body) == 2
    torch.manual_seed(0)
    images = DCGANGenerator(16, (1, 28, 28), base_channels=8)(torch.randn(64, 16))
    assert images.min() < -0.1 and images.max() <= 1.0


def test_table_generators_default_to_a_sigmoid_and_keep_an_activation_they_are_given():
    """Tables are scaled to [0, 1] and images to [-1, 1]: a table generator under tanh would draw
    half its values outside the data's range, and an image one under sigmoid no dark pixel. A
    caller's own ``output_activation`` is kept, not overridden by the table default."""
    torch.manual_seed(0)
    z = torch.randn(64, 8)
    table, _ = build_networks("mlp", (7,), latent_dim=8)
    records = table(z)
    assert records.min() >= 0 and records.max() <= 1 and records.std() > 0.05
    assert (records < 0.5).any() and (records > 0.5).any()
    told, _ = build_networks("mlp", (7,), latent_dim=8, generator_kwargs={"output_activation": "tanh"})
    assert (told(z) < 0).any()
    unbounded, _ = build_networks("mlp", (7,), latent_dim=8, generator_kwargs={"output_activation": "none"})
    assert (unbounded(z).abs() > 1).any() or (unbounded(z) < 0).any()
    images, _ = build_networks("mlp", (1, 4, 4), latent_dim=8)
    assert (images(z) < 0).any() and images(z).min() >= -1


def test_an_mlp_discriminator_normalises_each_record_alone_and_refuses_batchnorm():
    """``norm="layer"`` must give LayerNorm, which keeps records independent (DP-SGD's per-sample
    gradients); BatchNorm, asked for or slipped in, would couple the records of a batch."""
    from lightning_dpgan.nets.mlp import MLPDiscriminator

    torch.manual_seed(0)
    discriminator = MLPDiscriminator((6,), hidden=(8, 8), norm="layer")
    assert sum(isinstance(m, nn.LayerNorm) for m in discriminator.modules()) == 2
    # leaky activations: a ReLU critic passes no gradient back through its dead units
    assert [m.negative_slope for m in discriminator.modules() if isinstance(m, nn.LeakyReLU)] == [0.2, 0.2]
    x = torch.randn(4, 6)
    before = discriminator(x)
    x[0] = torch.randn(6)
    torch.testing.assert_close(discriminator(x)[1:], before[1:])
    with pytest.raises(ValueError, match="must not use BatchNorm"):
        MLPDiscriminator((6,), norm="batch")
    with pytest.raises(ValueError, match="unknown norm"):
        MLPDiscriminator((6,), norm="group")


@pytest.mark.parametrize("shape", [(1, 28, 30), (1, 30, 28), (28, 28)])
def test_dcgan_nets_refuse_images_whose_sides_do_not_divide_by_4(shape):
    """Two stride-2 layers: a side not divisible by 4 would come out of the generator rounded
    down (28 wide for 30), records of another shape than the data's."""
    with pytest.raises(ValueError, match="divisible by 4"):
        build_networks("dcgan", shape, latent_dim=4)


@pytest.mark.parametrize("layer", ["fc", "seed", "deconv", "out"])
def test_the_gpate_generator_sees_the_label_at_every_layer_and_draws_images_in_minus_one_one(layer):
    """G-PATE (appendix A.5): "all layers are concatenated with the one-hot encoded class label".
    With the label's weights zeroed in every layer but ``layer``, the image must still depend on
    the label, so each layer gets it; images end in tanh, on the data's [-1, 1]."""
    from lightning_dpgan.nets.gpate import GPATEGenerator

    torch.manual_seed(0)
    latent, classes, hidden, channels = 4, 3, 16, 8
    generator = GPATEGenerator(latent, (1, 8, 8), num_classes=classes, hidden=hidden, channels=channels).eval()
    label_weights = {  # the weight entries that multiply the one-hot label (or its planes), per layer
        "fc": generator.fc[0].weight[:, latent:],
        "seed": generator.seed[0].weight[:, hidden:],
        "deconv": generator.deconv[0].weight[channels:],
        "out": generator.out[0].weight[channels:],
    }
    with torch.no_grad():
        for name, weight in label_weights.items():
            if name != layer:
                weight.zero_()
    z = torch.randn(1, latent).repeat(classes, 1)
    images = generator(z, torch.arange(classes))
    assert images.shape == (classes, 1, 8, 8)
    assert not torch.allclose(images[0], images[1]) and not torch.allclose(images[1], images[2])
    many = generator.train()(torch.randn(64, latent), torch.randint(0, classes, (64,)))
    assert many.min() < -0.1 and many.max() <= 1 and many.min() >= -1


def test_labels_must_be_one_per_record():
    """Labels shaped (B, 1) (a column sliced from a table) or fewer than the records are refused
    with a clear error, not a shape error deep in a layer or a broadcast to the wrong records."""
    from lightning_dpgan.nets.conditioning import one_hot_labels

    torch.testing.assert_close(one_hot_labels(torch.tensor([2, 0]), 3, 2), torch.tensor([[0.0, 0, 1], [1, 0, 0]]))
    assert one_hot_labels(torch.tensor([2, 0]), None, 2) is None
    generator, discriminator = build_networks("mlp", (5,), latent_dim=4, num_classes=3)
    for bad in (torch.zeros(4, 1, dtype=torch.long), torch.zeros(3, dtype=torch.long)):
        with pytest.raises(ValueError, match="expected 4 labels"):
            generator(torch.randn(4, 4), bad)
        with pytest.raises(ValueError, match="expected 4 labels"):
            discriminator(torch.randn(4, 5), bad)


def test_a_gpate_generator_batch_normalises_and_leaky_relus_every_hidden_layer():
    """G-PATE (appendix A.5): "We apply batch normalization and Leaky ReLU on all layers" --
    the FC, the seed FC and the hidden deconvolution (the output deconvolution ends in tanh)."""
    from lightning_dpgan.nets.gpate import GPATEGenerator

    generator = GPATEGenerator(4, (1, 8, 8), num_classes=3, hidden=16, channels=8)
    for block, norm in ((generator.fc, nn.BatchNorm1d), (generator.seed, nn.BatchNorm1d), (generator.deconv, nn.BatchNorm2d)):
        assert [type(m) for m in block][1:] == [norm, nn.LeakyReLU]
        assert block[2].negative_slope == 0.2


def test_dcgan_nets_follow_dcgans_layer_recipe():
    """DCGAN (Radford et al.): the generator batch-normalises and ReLUs each hidden layer and ends
    in tanh; the critic uses LeakyReLU(0.2) after every convolution (a ReLU critic passes no
    gradient back through its dead units)."""
    from lightning_dpgan.nets.dcgan import DCGANDiscriminator, DCGANGenerator

    generator = DCGANGenerator(8, (1, 8, 8), base_channels=4)
    kinds = [type(m) for m in [*generator.project, *generator.upsample]]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.ConvTranspose2d, nn.BatchNorm2d, nn.ReLU, nn.ConvTranspose2d, nn.Tanh]
    discriminator = DCGANDiscriminator((1, 8, 8), base_channels=4)
    assert [m.negative_slope for m in discriminator.modules() if isinstance(m, nn.LeakyReLU)] == [0.2, 0.2]
    assert not any(isinstance(m, nn.ReLU) for m in discriminator.modules())


def test_auto_takes_an_mlp_for_an_image_with_a_side_not_divisible_by_4():
    """``auto`` must not pick DCGAN nets (which refuse it) when only one side divides by 4."""
    assert resolve_architecture("auto", (1, 28, 30)) == "mlp"
    assert resolve_architecture("auto", (1, 30, 28)) == "mlp"
    generator, _ = build_networks("auto", (1, 28, 30), latent_dim=4)
    assert generator(torch.randn(2, 4)).shape == (2, 1, 28, 30)
