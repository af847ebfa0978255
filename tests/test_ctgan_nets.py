"""CTGAN / DP-SACTGAN networks: span activations, shapes, packing, and Opacus per-sample gradients."""
import copy

import pytest
import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator
from torch import nn

from lightning_dpgan.nets import (
    AuxiliaryMLP,
    CTGANDiscriminator,
    CTGANGenerator,
    SACTGANDiscriminator,
    SACTGANGenerator,
    apply_span_activations,
    span_logits,
)
from lightning_dpgan.nets import sactgan
from lightning_dpgan.nets.sactgan import LinearSelfAttention

SPANS = [(1, "tanh"), (3, "softmax"), (1, "tanh"), (2, "softmax"), (4, "softmax")]
DATA_DIM = 11
SOFTMAX_SLICES = [slice(1, 4), slice(5, 7), slice(7, 11)]
TANH_COLUMNS = [0, 4]
GENERATORS = [CTGANGenerator, SACTGANGenerator]
DISCRIMINATORS = [CTGANDiscriminator, SACTGANDiscriminator]


def small_generator(cls, latent_dim=6, cond_dim=3, spans=SPANS):
    if cls is CTGANGenerator:
        return cls(latent_dim, cond_dim, spans, hidden=(16, 8))
    return cls(latent_dim, cond_dim, spans, tokens=4, token_dim=8, heads=2, depth=2, ff_dim=16)


def small_discriminator(cls, data_dim=DATA_DIM, cond_dim=3, pac=1):
    if cls is CTGANDiscriminator:
        return cls(data_dim, cond_dim, hidden=(16, 8), pac=pac)
    return cls(data_dim, cond_dim, tokens=4, token_dim=8, heads=2, depth=2, ff_dim=16, pac=pac)


def assert_valid_record(x, one_hot):
    tanh = x[:, TANH_COLUMNS]
    assert (tanh > -1).all() and (tanh < 1).all()
    for block in SOFTMAX_SLICES:
        values = x[:, block]
        assert torch.allclose(values.sum(dim=1), torch.ones(len(x)), atol=1e-5)
        assert (values >= 0).all()
        if one_hot:
            assert ((values == 0) | (values == 1)).all()


def test_span_logits_splits_by_width_and_checks_it():
    parts = span_logits(torch.randn(5, DATA_DIM), SPANS)
    assert [p.shape for p in parts] == [(5, 1), (5, 3), (5, 1), (5, 2), (5, 4)]
    with pytest.raises(ValueError, match="shape"):
        span_logits(torch.randn(5, DATA_DIM + 1), SPANS)
    with pytest.raises(ValueError, match="activation"):
        span_logits(torch.randn(5, 1), [(1, "sigmoid")])


@pytest.mark.parametrize("hard", [False, True])
def test_apply_span_activations_per_span(hard):
    torch.manual_seed(0)
    logits = 2 * torch.randn(64, DATA_DIM)  # float32 tanh rounds to +-1 beyond |logit| ~ 9
    x = apply_span_activations(logits, SPANS, tau=0.2, hard=hard)
    assert x.shape == (64, DATA_DIM)
    assert torch.equal(x[:, TANH_COLUMNS], torch.tanh(logits[:, TANH_COLUMNS]))
    assert_valid_record(x, one_hot=hard)


def test_soft_gumbel_softmax_is_not_one_hot_and_keeps_gradients():
    torch.manual_seed(0)
    logits = torch.zeros(64, DATA_DIM, requires_grad=True)
    x = apply_span_activations(logits, SPANS, tau=1.0)
    assert not ((x[:, 1:4] == 0) | (x[:, 1:4] == 1)).all()
    (x[:, 1:4] * torch.arange(3.0)).sum().backward()
    assert logits.grad[:, 1:4].abs().sum() > 0


@pytest.mark.parametrize("cls", GENERATORS)
def test_generator_shapes_and_activations(cls):
    torch.manual_seed(0)
    generator = small_generator(cls)
    z, cond = torch.randn(8, 6), torch.eye(3)[torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])]
    assert generator.logits(z, cond).shape == (8, DATA_DIM)
    train_out = generator(z, cond)
    assert train_out.shape == (8, DATA_DIM)
    assert_valid_record(train_out, one_hot=False)
    generator.eval()
    assert_valid_record(generator(z, cond), one_hot=True)
    torch.manual_seed(1)
    via_logits = generator.activate(generator.logits(z, cond))  # the split that CTGAN's condition loss needs
    torch.manual_seed(1)
    assert torch.equal(via_logits, generator(z, cond))


@pytest.mark.parametrize("cls", GENERATORS)
def test_generator_cond_none_when_unconditional(cls):
    generator = small_generator(cls, cond_dim=0)
    assert generator(torch.randn(4, 6), None).shape == (4, DATA_DIM)
    assert generator(torch.randn(4, 6)).shape == (4, DATA_DIM)


@pytest.mark.parametrize("cls", GENERATORS)
def test_conditional_generator_rejects_missing_or_misshaped_cond(cls):
    generator = small_generator(cls, cond_dim=3)
    with pytest.raises(ValueError, match="conditional"):
        generator(torch.randn(4, 6))
    with pytest.raises(ValueError, match="conditional vector of shape"):
        generator(torch.randn(4, 6), torch.zeros(4, 2))


@pytest.mark.parametrize("cls", GENERATORS)
def test_eval_sampling_follows_the_category_probabilities(cls):
    """Eval draws one-hot samples from softmax(logits), not the argmax: a 70/30 column stays 70/30."""
    torch.manual_seed(0)
    generator = small_generator(cls, cond_dim=0, spans=[(1, "tanh"), (2, "softmax")]).eval()
    nn.init.zeros_(generator.head.weight)
    with torch.no_grad():
        generator.head.bias.copy_(torch.tensor([0.0, 0.7, 0.3]).log().nan_to_num(neginf=0.0))  # tanh logit 0
        x = generator(torch.randn(4000, 6))
    assert ((x[:, 1:] == 0) | (x[:, 1:] == 1)).all()
    assert x[:, 2].mean().item() == pytest.approx(0.3, abs=0.03)


def test_ctgan_generator_residual_width_grows():
    """CTGAN's Residual concatenates its input: the last Linear reads latent + cond + sum(hidden) features."""
    generator = CTGANGenerator(latent_dim=10, cond_dim=4, spans=SPANS, hidden=(32, 16))
    assert generator.head.in_features == 10 + 4 + 32 + 16
    seen = []
    generator.head.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape))
    generator(torch.randn(5, 10), torch.zeros(5, 4))
    assert seen == [(5, 10 + 4 + 32 + 16)]
    assert sum(isinstance(m, nn.BatchNorm1d) for m in generator.modules()) == 2


@pytest.mark.parametrize("cls", DISCRIMINATORS)
def test_discriminator_scores_per_record(cls):
    discriminator = small_discriminator(cls)
    assert discriminator.pac == 1
    assert discriminator(torch.randn(6, DATA_DIM), torch.zeros(6, 3)).shape == (6,)
    unconditional = small_discriminator(cls, cond_dim=0)
    assert unconditional(torch.randn(6, DATA_DIM), None).shape == (6,)


@pytest.mark.parametrize("cls", [*DISCRIMINATORS, AuxiliaryMLP])
def test_no_batchnorm_in_private_networks(cls):
    net = AuxiliaryMLP(DATA_DIM, 3) if cls is AuxiliaryMLP else small_discriminator(cls, pac=2)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    assert ModuleValidator.validate(net, strict=False) == []


@pytest.mark.parametrize("pac", [1, 3])
@pytest.mark.parametrize("cls", DISCRIMINATORS)
def test_pac_packs_consecutive_records(cls, pac):
    """A pack's score depends on each of its records and on no record of another pack."""
    torch.manual_seed(0)
    discriminator = small_discriminator(cls, pac=pac).eval()
    x, cond = torch.randn(3 * pac, DATA_DIM), torch.randn(3 * pac, 3)
    before = discriminator(x, cond)
    assert before.shape == (3,)
    for record in range(3 * pac):
        changed = x.clone()
        changed[record] = torch.randn(DATA_DIM)
        after = discriminator(changed, cond)
        pack = record // pac
        others = [p for p in range(3) if p != pack]
        assert not torch.allclose(after[pack], before[pack])
        assert torch.equal(after[others], before[others])


@pytest.mark.parametrize("cls", DISCRIMINATORS)
def test_indivisible_batch_raises(cls):
    discriminator = small_discriminator(cls, pac=4)
    with pytest.raises(ValueError, match="not divisible by pac=4"):
        discriminator(torch.randn(6, DATA_DIM), torch.zeros(6, 3))


def test_sactgan_rejects_heads_not_dividing_token_dim():
    with pytest.raises(ValueError, match="divisible by heads"):
        SACTGANDiscriminator(DATA_DIM, 0, token_dim=10, heads=4)


def test_auxiliary_mlp_shapes_and_default_depth():
    assert sactgan.AuxiliaryMLP is AuxiliaryMLP  # DP-SACTGAN's module imports it from nets.sactgan
    classifier = AuxiliaryMLP(DATA_DIM, 5)
    assert classifier(torch.randn(7, DATA_DIM)).shape == (7, 5)
    assert AuxiliaryMLP(DATA_DIM, 1, hidden=(8,))(torch.randn(7, DATA_DIM)).shape == (7, 1)
    # DP-SACTGAN: "four intermediate layers and one output prediction classification layer"
    assert sum(isinstance(m, nn.Linear) for m in classifier.modules()) == 5


def test_linear_self_attention_matches_torch_multihead_attention():
    """The Opacus-friendly attention computes exactly nn.MultiheadAttention (heads split and merged in order)."""
    torch.manual_seed(0)
    ours = LinearSelfAttention(dim=8, heads=2)
    reference = nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([ours.query.weight, ours.key.weight, ours.value.weight]))
        reference.in_proj_bias.copy_(torch.cat([ours.query.bias, ours.key.bias, ours.value.bias]))
        reference.out_proj.weight.copy_(ours.out.weight)
        reference.out_proj.bias.copy_(ours.out.bias)
    x = torch.randn(3, 5, 8)
    assert torch.allclose(ours(x), reference(x, x, x, need_weights=False)[0], atol=1e-6)


def test_sactgan_discriminator_supports_gradient_penalty():
    """Double backward through attention (WGAN-GP, CTGAN's penalty) must work."""
    discriminator = small_discriminator(SACTGANDiscriminator)
    x = torch.randn(4, DATA_DIM, requires_grad=True)
    (grad,) = torch.autograd.grad(discriminator(x, torch.zeros(4, 3)).sum(), x, create_graph=True)
    ((grad.norm(dim=1) - 1) ** 2).mean().backward()
    # biases feeding straight into a linear map do not change dD/dx; every other parameter must get a gradient
    constant_shift = {"encoder.norm.bias", "head.bias"}
    for name, param in discriminator.named_parameters():
        assert (param.grad is None) == (name in constant_shift), name
    assert discriminator.encoder.blocks[0].attention.query.weight.grad.abs().sum() > 0


def private_nets():
    return {
        "ctgan": (small_discriminator(CTGANDiscriminator), lambda net, x, c: net(x, c)),
        "sactgan": (small_discriminator(SACTGANDiscriminator), lambda net, x, c: net(x, c)),
        "auxiliary": (AuxiliaryMLP(DATA_DIM, 4, hidden=(16, 8, 8, 8)), lambda net, x, c: net(x).logsumexp(dim=1)),
    }


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # inputs need no grad; Opacus hooks still fire
@pytest.mark.parametrize("name", ["ctgan", "sactgan", "auxiliary"])
def test_opacus_per_sample_gradients_are_each_samples_own(name):
    """GradSampleModule gives every parameter a per-sample gradient, equal to that sample's loss gradient alone."""
    torch.manual_seed(0)
    net, score = private_nets()[name]
    for module in net.modules():  # Opacus records activations only in training mode,
        if isinstance(module, nn.Dropout):  # so switch off dropout alone to make a sample's loss deterministic
            module.p = 0.0
    reference = copy.deepcopy(net)
    x, cond = torch.randn(5, DATA_DIM), torch.randn(5, 3)
    wrapped = GradSampleModule(net, loss_reduction="sum")
    score(wrapped, x, cond).pow(2).sum().backward()
    params = dict(net.named_parameters())
    for param_name, param in params.items():
        assert param.grad_sample is not None, param_name
        assert param.grad_sample.shape == (5, *param.shape), param_name
    for sample in (0, 3):
        loss = score(reference, x[sample : sample + 1], cond[sample : sample + 1]).pow(2).sum()
        grads = torch.autograd.grad(loss, list(reference.parameters()))
        for (param_name, param), grad in zip(params.items(), grads):
            assert torch.allclose(param.grad_sample[sample], grad, atol=1e-6, rtol=1e-4), param_name
    wrapped.remove_hooks()


@pytest.mark.parametrize("make", [
    lambda: CTGANGenerator(latent_dim=10, cond_dim=4, spans=SPANS, hidden=(32, 16)),
    lambda: SACTGANGenerator(latent_dim=10, cond_dim=4, spans=SPANS, tokens=2),
], ids=["ctgan", "sactgan"])
def test_categorical_spans_are_soft_gumbel_softmax_in_training_and_one_hot_when_sampling(make):
    """CTGAN trains on Gumbel-softmax samples at tau 0.2 (soft, so the discriminator's gradient
    reaches every category's logit) and publishes one category a record."""
    torch.manual_seed(0)
    generator = make()
    z, cond = torch.randn(64, 10), torch.zeros(64, 4)
    starts = [sum(width for width, _ in SPANS[:i]) for i in range(len(SPANS))]
    softmax = [(start, width) for start, (width, kind) in zip(starts, SPANS) if kind == "softmax"]
    generator.train()
    soft = generator(z, cond)
    values = torch.cat([soft[:, start:start + width].flatten() for start, width in softmax])
    assert ((values > 0.01) & (values < 0.99)).any()
    generator.eval()
    with torch.no_grad():
        hard = generator(z, cond)
    for start, width in softmax:
        block = hard[:, start:start + width]
        assert torch.equal(block.sum(1), torch.ones(64)) and set(block.unique().tolist()) <= {0.0, 1.0}


def test_a_self_attention_block_adds_each_sublayer_to_its_input():
    """Pre-norm residual: x + Attn(LN1(x)), then + FF(LN2(.)). With both sublayers' last layers
    zeroed the block is the identity; with only the attention's, it adds the feed-forward alone."""
    torch.manual_seed(0)
    block = sactgan.SelfAttentionBlock(8, 2, 16, nn.ReLU)
    x = torch.randn(5, 3, 8)
    for layer in (block.attention.out, block.feed_forward[2]):
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
    torch.testing.assert_close(block(x), x)
    torch.manual_seed(1)
    nn.init.normal_(block.feed_forward[2].weight)
    torch.testing.assert_close(block(x), x + block.feed_forward(block.norm2(x)))


@pytest.mark.parametrize("cls", [*DISCRIMINATORS, AuxiliaryMLP])
def test_private_networks_drop_units_in_training_only(cls):
    """CTGAN's discriminator (and DP-SACTGAN's, and the auxiliary classifier) applies Dropout
    (0.5 by default) while training: two passes over the same records differ in training and
    agree in eval; with ``dropout=0`` training passes agree too."""
    torch.manual_seed(0)
    x, cond = torch.randn(8, DATA_DIM), torch.randn(8, 3)
    net = AuxiliaryMLP(DATA_DIM, 3) if cls is AuxiliaryMLP else small_discriminator(cls)
    call = (lambda: net(x)) if cls is AuxiliaryMLP else (lambda: net(x, cond))  # noqa: E731
    assert not torch.allclose(call(), call())
    net.eval()
    assert torch.equal(call(), call())
    if cls is AuxiliaryMLP:
        plain = AuxiliaryMLP(DATA_DIM, 3, dropout=0.0)
        assert torch.equal(plain(x), plain(x))
    else:
        kwargs = {"hidden": (16, 8)} if cls is CTGANDiscriminator else {"tokens": 4, "token_dim": 8, "heads": 2, "ff_dim": 16}
        plain = cls(DATA_DIM, 3, dropout=0.0, **kwargs)
        assert torch.equal(plain(x, cond), plain(x, cond))


@pytest.mark.parametrize("cls", GENERATORS)
def test_generators_default_to_ctgans_gumbel_temperature(cls):
    """CTGAN's tau = 0.2: the training-mode spans are Gumbel-softmax at that temperature."""
    torch.manual_seed(0)
    generator = small_generator(cls).train()
    z, cond = torch.randn(16, 6), torch.randn(16, 3)
    logits = generator.logits(z, cond)
    torch.manual_seed(1)
    got = generator.activate(logits)
    torch.manual_seed(1)
    torch.testing.assert_close(got, apply_span_activations(logits, SPANS, tau=0.2))


@pytest.mark.parametrize("bad", [[(0, "tanh")], [(2, "softmax"), (0, "softmax")], [(1.5, "tanh")], [(1, "relu")], []])
def test_spans_of_no_width_or_unknown_kind_are_refused(bad):
    """A zero-width span would be a column the generator never emits and the encoder never reads."""
    with pytest.raises(ValueError, match="span"):
        CTGANGenerator(4, 0, bad, hidden=(8,))


@pytest.mark.parametrize("make", [
    lambda tau: CTGANGenerator(6, 0, [(1, "tanh"), (3, "softmax")], hidden=(8,), tau=tau),
    lambda tau: SACTGANGenerator(6, 0, [(1, "tanh"), (3, "softmax")], tokens=2, token_dim=4, heads=1, depth=1, ff_dim=8, tau=tau),
], ids=["ctgan", "sactgan"])
def test_a_generator_uses_the_gumbel_temperature_it_is_given(make):
    """``tau`` set at construction is the temperature of the training-mode Gumbel-softmax (the
    default 0.2 test cannot tell a given tau from a hard-coded 0.2)."""
    torch.manual_seed(0)
    generator = make(2.0).train()
    logits = generator.logits(torch.randn(16, 6))
    torch.manual_seed(1)
    got = generator.activate(logits)
    torch.manual_seed(1)
    torch.testing.assert_close(got, apply_span_activations(logits, [(1, "tanh"), (3, "softmax")], tau=2.0))
    torch.manual_seed(1)
    assert not torch.allclose(got, apply_span_activations(logits, [(1, "tanh"), (3, "softmax")], tau=0.2))


def test_soft_categorical_spans_are_gumbel_noised_not_a_plain_softmax():
    """Training-mode spans are Gumbel-softmax *samples*: rows with the same logits differ (a
    plain tempered softmax would give every such row the same probabilities), and over many
    draws category i wins as often as softmax(logits)_i says."""
    torch.manual_seed(0)
    logits = torch.tensor([0.1, 0.6, 0.3]).log().repeat(4000, 1)
    x = apply_span_activations(logits, [(3, "softmax")], tau=0.2)
    assert not torch.allclose(x[0], x[1])
    winners = torch.bincount(x.argmax(1), minlength=3).float() / len(x)
    torch.testing.assert_close(winners, torch.tensor([0.1, 0.6, 0.3]), atol=0.03, rtol=0)


def test_a_lower_gumbel_temperature_gives_sharper_soft_spans():
    """``tau`` is the Gumbel-softmax temperature: at 0.1 the soft spans are nearly one-hot, at 5
    nearly uniform."""
    torch.manual_seed(0)
    logits = torch.randn(2000, 4)
    sharp = apply_span_activations(logits, [(4, "softmax")], tau=0.1).max(1).values.mean()
    flat = apply_span_activations(logits, [(4, "softmax")], tau=5.0).max(1).values.mean()
    assert sharp > 0.9 and flat < 0.5


def test_a_ctgan_residual_block_appends_relu_of_batch_normalised_features_to_its_input():
    """CTGAN's Residual: ``cat([ReLU(BN(FC(x))), x])``; in training BN standardises each new
    feature over the batch (BN's initial scale 1 and shift 0)."""
    from lightning_dpgan.nets.ctgan import Residual

    torch.manual_seed(0)
    block = Residual(5, 7).train()
    x = torch.randn(32, 5) * 3 + 2
    y = block.fc(x)
    standardised = (y - y.mean(0)) / torch.sqrt(y.var(0, unbiased=False) + block.bn.eps)
    out = block(x)
    torch.testing.assert_close(out[:, :7], torch.relu(standardised), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out[:, 7:], x)


def test_a_ctgan_discriminator_uses_leaky_relu_0_2():
    """CTGAN's critic: Linear -> LeakyReLU(0.2) -> Dropout per hidden layer: a negative
    pre-activation passes 0.2 of itself (and of its gradient), not zero."""
    torch.manual_seed(0)
    critic = CTGANDiscriminator(4, 0, hidden=(6,), dropout=0.0).eval()
    x = torch.randn(10, 4)
    expected = critic.head(nn.functional.leaky_relu(critic.body[0](x), 0.2)).squeeze(1)
    torch.testing.assert_close(critic(x), expected)
    assert (critic.body[0](x) < 0).any()


def test_a_pack_size_below_one_is_refused_when_the_critic_is_built():
    for cls in (CTGANDiscriminator, SACTGANDiscriminator):
        with pytest.raises(ValueError, match="pac"):
            cls(4, 0, pac=0)


def test_a_sactgan_generator_stacks_depth_attention_blocks():
    """``depth`` attention blocks, as asked: depth 3 has more layers than depth 1, and zeroing
    the last block's sublayers leaves what the first two compute."""
    torch.manual_seed(0)
    deep = SACTGANGenerator(6, 0, [(2, "softmax")], tokens=2, token_dim=4, heads=1, depth=3, ff_dim=8)
    shallow = SACTGANGenerator(6, 0, [(2, "softmax")], tokens=2, token_dim=4, heads=1, depth=1, ff_dim=8)
    assert len(deep.encoder.blocks) == 3 and len(shallow.encoder.blocks) == 1
    assert sum(p.numel() for p in deep.parameters()) > sum(p.numel() for p in shallow.parameters())
