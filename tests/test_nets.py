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
