"""The modules' training steps (base, GAN, WGAN, CTGAN, DP-SACTGAN, the conditional table models),
checked against updates computed outside the module: losses, signs, zero_grad, frozen networks, defaults."""
import pytest
import torch

from lightning_dpgan.modules import GAN, WGAN
from lightning_dpgan.modules.ctgan import CTGAN
from lightning_dpgan.modules.dpsactgan import DPSACTGAN
from lightning_dpgan.modules.wgan import gradient_penalty
from lightning_dpgan.random_streams import seeded_stream
from run_helpers import train_outside_a_trainer
from test_ctgan_models import layout

TABLE = {"latent_dim": 3, "generator_kwargs": {"hidden": (8,)}, "discriminator_kwargs": {"hidden": (8,)}}


def sactgan(**kwargs):
    return DPSACTGAN((7,), table_layout=layout(label={"start": 5, "width": 2, "kind": "binary"}), latent_dim=4,
                     classifier_hidden=(8,), generator_kwargs={"tokens": 2}, discriminator_kwargs={"tokens": 2}, **kwargs)


def table_records(n):
    records = torch.zeros(n, 7)
    records[:, 0] = torch.linspace(-1, 1, n)
    label = (records[:, 0] > 0).long()
    records[torch.arange(n), 2 + torch.arange(n) % 3] = 1
    records[torch.arange(n), 5 + label] = 1
    return records


def params(net):
    return [p.detach().clone() for p in net.parameters()]


def sgd_everywhere(module, lr_d=0.1):
    """The module's optimizers replaced by plain SGD (generator lr 0): a parameter's change is
    then -lr times the gradient the step back-propagated, and nothing else."""
    train_outside_a_trainer(module)
    opt_g = torch.optim.SGD(module.generator.parameters(), lr=0.0)
    opt_d = torch.optim.SGD(module.discriminator.parameters(), lr=lr_d)
    module.optimizers = lambda: [opt_g, opt_d]
    return opt_g, opt_d


# --------------------------------------------------------------------------------- base.py
def assert_the_same_step_twice_moves_it_the_same_way(module, network, batch):
    """One training step, twice from ``network``'s same weights and the same draws: ``network``
    moves, and the same way both times (the second step does not add the first's gradient, as a
    missing ``zero_grad`` would)."""
    start = params(network)
    deltas = []
    for _ in range(2):
        with torch.no_grad():
            for p, q in zip(network.parameters(), start):
                p.copy_(q)
        torch.manual_seed(5)
        module.training_step(batch, 0)
        deltas.append([p.detach() - q for p, q in zip(network.parameters(), start)])
    assert any(d.abs().sum() > 0 for d in deltas[0])
    for first, second in zip(*deltas):
        torch.testing.assert_close(second, first)


def expected_critic_update(module, critic, generator_state, real, labels, seed, lr, penalty=None):
    """-lr * the gradient of the discriminator's loss (real part + generated part, each a mean
    over its records), with the step's own draws, computed on a copy outside the module."""
    reference = type(module)(**dict(module.hparams))
    reference.generator.load_state_dict(generator_state)
    with torch.no_grad():
        for p, q in zip(reference.discriminator.parameters(), critic):
            p.copy_(q)
    torch.manual_seed(seed)
    torch.randint(0, 2**62, (1,))  # the draw that seeds the real records' stream in training_step
    fake_labels = reference.sample_labels(real.shape[0])
    latent = reference.sample_latent(real.shape[0])
    stream_seed = int(torch.randint(0, 2**62, (1,)))  # discriminator_step's own stream for real records
    with torch.no_grad():
        fake = reference.generator(latent, fake_labels)
    d = reference.discriminator
    real_part = reference.discriminator_real_loss(d(real, labels))
    if penalty is not None:
        with seeded_stream(stream_seed, real.device):
            real_part = real_part + penalty(reference, real, labels, fake, fake_labels)
    loss = real_part.mean() + reference.discriminator_fake_loss(d(fake, fake_labels)).mean()
    grads = torch.autograd.grad(loss, list(d.parameters()))
    return [q - lr * g for q, g in zip(critic, grads)]


@pytest.mark.parametrize("conditional", [False, True])
def test_a_discriminator_step_descends_the_mean_loss_over_real_and_over_the_steps_generated_records(conditional):
    """With SGD, one step moves the critic by -lr * grad(mean real loss + mean generated loss),
    the generated records scored with *their own* labels: an update that skipped the generated
    part, summed instead of averaging, or scored generated records with the real batch's labels
    (a real label reaching an unnoised, public pass) would land elsewhere."""
    torch.manual_seed(0)
    module = GAN((4,), 3 if conditional else None, **TABLE)
    sgd_everywhere(module, lr_d=0.5)
    real = torch.randn(6, 4)
    labels = torch.tensor([0, 1, 2, 0, 1, 2]) if conditional else None
    critic, generator = params(module.discriminator), {k: v.clone() for k, v in module.generator.state_dict().items()}
    torch.manual_seed(5)
    module.training_step((real, labels) if conditional else real, 0)
    expected = expected_critic_update(module, critic, generator, real, labels, seed=5, lr=0.5)
    for got, want in zip(module.discriminator.parameters(), expected):
        torch.testing.assert_close(got.detach(), want)


def test_a_wgan_gp_step_descends_the_critic_loss_plus_the_gradient_penalty():
    """WGAN-GP: the penalty is added to (not subtracted from, not left out of) the real records'
    loss the critic descends."""
    torch.manual_seed(0)
    module = WGAN((4,), None, weight_clip=0.0, gradient_penalty=10.0, **TABLE)
    sgd_everywhere(module, lr_d=0.05)
    real = torch.randn(6, 4) + 1.0
    critic, generator = params(module.discriminator), {k: v.clone() for k, v in module.generator.state_dict().items()}
    torch.manual_seed(5)
    module.training_step(real, 0)
    penalty = lambda m, r, lab, f, flab: gradient_penalty(m.discriminator, r, lab, f, 10.0)  # noqa: E731
    expected = expected_critic_update(module, critic, generator, real, None, seed=5, lr=0.05, penalty=penalty)
    for got, want in zip(module.discriminator.parameters(), expected):
        torch.testing.assert_close(got.detach(), want)


def test_each_step_updates_the_critic_with_its_own_gradient_only():
    """The same step twice from the same weights and draws gives the same update: the second
    must not add the first step's gradient (a missing ``zero_grad``)."""
    torch.manual_seed(0)
    module = WGAN((4,), None, weight_clip=0.0, **TABLE)
    sgd_everywhere(module, lr_d=0.1)
    real = torch.randn(6, 4)
    assert_the_same_step_twice_moves_it_the_same_way(module, module.discriminator, real)  # a critic-only step


@pytest.mark.parametrize("make", [lambda: GAN((4,), None, **TABLE),
                                  lambda: CTGAN((7,), table_layout=layout(), latent_dim=4, generator_hidden=(8,),
                                                discriminator_hidden=(8,), pac=1)],
                         ids=["gan", "ctgan"])
def test_each_generator_step_uses_its_own_gradient_only(make):
    """Two identical generator steps (lr 0, same draws) leave the same gradient: the second does
    not add to the first's (a missing ``zero_grad`` would make every update a running sum)."""
    torch.manual_seed(0)
    module = make()
    opt_g, _ = sgd_everywhere(module)
    grads = []
    for _ in range(2):
        torch.manual_seed(3)
        module.generator_step(8)
        grads.append([p.grad.clone() for p in module.generator.parameters() if p.grad is not None])
    assert grads[0] and any(g.abs().sum() > 0 for g in grads[0])
    for first, second in zip(*grads):
        torch.testing.assert_close(second, first)


def test_a_discriminator_step_generates_the_fixed_generated_batch_size_not_the_real_batchs():
    """Under Poisson sampling the real batch size is private; a strategy fixes
    ``generated_batch_size`` and every step must generate exactly that many records."""
    torch.manual_seed(0)
    module = WGAN((4,), None, **TABLE)
    train_outside_a_trainer(module)
    module.generated_batch_size = 4
    seen = []
    module.generator.register_forward_hook(lambda net, inputs, output: seen.append(output.shape[0]))
    for rows in (0, 3, 9):
        module.training_step(torch.randn(rows, 4), 0)
    assert seen == [4, 4, 4]


def test_a_discriminator_step_leaves_the_generator_without_gradients():
    """The generated records the critic trains on are constants to it: no gradient reaches the
    generator from a discriminator step."""
    torch.manual_seed(0)
    module = WGAN((4,), None, **TABLE)
    train_outside_a_trainer(module)
    module.training_step(torch.randn(6, 4), 0)  # a critic-only step (5 to a generator step)
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in module.generator.parameters())


def test_sample_without_labels_draws_balanced_classes():
    """``sample(n)`` of a conditional model uses the balanced labels 0, 1, ..., K-1, 0, ...:
    the same records as asking for them explicitly with the same seed."""
    module = GAN((4,), 3, **TABLE)
    torch.manual_seed(7)
    default = module.sample(9)
    torch.manual_seed(7)
    explicit = module.sample(9, torch.arange(9) % 3)
    torch.testing.assert_close(default, explicit)


# --------------------------------------------------------------------------------- wgan.py
def test_wgan_per_record_losses_are_the_scores_themselves():
    """The critic's per-record losses are exactly -D(real) and D(fake), unbounded, and the
    generator's -mean D(fake) (Arjovsky et al.): no clamping or rescaling of the scores."""
    module = WGAN((4,), None, **TABLE)
    scores = torch.tensor([-5.0, -1.5, 0.0, 2.0, 7.0])
    torch.testing.assert_close(module.discriminator_real_loss(scores), -scores)
    torch.testing.assert_close(module.discriminator_fake_loss(scores), scores)
    torch.testing.assert_close(module.generator_loss(scores), -scores.mean())


def test_wgan_defaults_are_the_papers_clip_and_critic_schedule():
    """Arjovsky et al.'s c = 0.01 and n_critic = 5 for a WGAN built in Python."""
    module = WGAN((4,), None, **TABLE)
    assert module.hparams.weight_clip == 0.01 and module.hparams.discriminator_steps == 5


def test_a_negative_gradient_penalty_is_refused_and_any_positive_one_takes_wgan_gps_adam():
    with pytest.raises(ValueError, match="non-negative"):
        WGAN((4,), None, gradient_penalty=-1.0, **TABLE)
    small = WGAN((4,), None, gradient_penalty=0.5, **TABLE).build_optimizers()
    assert all(isinstance(o, torch.optim.Adam) and o.defaults["betas"] == (0.0, 0.9) for o in small)


def test_the_gradient_penalty_cycles_a_short_generated_batch_over_the_real_records():
    """A fixed generated batch smaller than the real one (Poisson sampling drew more): each real
    record still gets one penalty term, from a generated record reused in turn."""
    class Quadratic(torch.nn.Module):
        def forward(self, x, labels=None):
            return 0.5 * (x * x).sum(1)

    real, fake = torch.ones(5, 3), torch.ones(2, 3)  # every interpolate is (1, 1, 1): |grad| = sqrt 3
    penalty = gradient_penalty(Quadratic(), real, None, fake, 2.0)
    torch.testing.assert_close(penalty, torch.full((5,), 2.0 * (3 ** 0.5 - 1) ** 2))


# --------------------------------------------------------------------------------- ctgan.py
def test_ctgan_refuses_a_penalty_with_cross_entropy_and_a_negative_penalty():
    with pytest.raises(ValueError, match="belongs to the wasserstein loss"):
        CTGAN((7,), table_layout=layout(), pac=1, loss="cross_entropy", gradient_penalty=10.0)
    with pytest.raises(ValueError, match="--model.gradient_penalty must be 0 or more, got -1.0"):
        CTGAN((7,), table_layout=layout(), pac=1, gradient_penalty=-1.0)


def test_ctgans_generator_step_leaves_the_private_networks_without_gradients():
    """As the base module's: the generator step must not deposit gradients on the discriminator
    (under DP-SGD, the mechanism would add them to the next private update unclipped)."""
    torch.manual_seed(0)
    module = CTGAN((7,), table_layout=layout(), latent_dim=4, generator_hidden=(8,), discriminator_hidden=(8,), pac=1)
    sgd_everywhere(module)
    module.generator_step(8)
    assert all(p.grad is None for p in module.discriminator.parameters())
    assert all(p.requires_grad for p in module.discriminator.parameters())


def test_ctgans_networks_get_their_own_hidden_sizes_and_gumbel_temperature():
    module = CTGAN((7,), table_layout=layout(), latent_dim=4, generator_hidden=(5,), discriminator_hidden=(11, 13),
                   pac=1, gumbel_tau=0.7)
    widths = lambda net: [m.out_features for m in net.modules() if isinstance(m, torch.nn.Linear)]  # noqa: E731
    assert 11 not in widths(module.generator) and 5 not in widths(module.discriminator)
    assert widths(module.discriminator)[:2] == [11, 13]
    assert module.generator.tau == 0.7
    assert sactgan(gumbel_tau=0.7).generator.tau == 0.7


def test_published_samples_take_conditions_at_the_category_frequencies():
    """``sample`` conditions the records it publishes at the (DP) category frequencies, as
    CTGAN samples: not the generator step's log-frequency, which over-represents rare ones."""
    torch.manual_seed(0)
    module = CTGAN((7,), table_layout=layout(), latent_dim=4, generator_hidden=(8,), discriminator_hidden=(8,), pac=1)
    asked = []
    original = module.generator.forward
    module.generator.forward = lambda z, cond: asked.append(cond) or original(z, cond)
    module.sample(20000)
    (cond,) = asked
    first = cond[:, :3].sum(1) == 1
    torch.testing.assert_close(cond[first, :3].mean(0), torch.tensor([0.6, 0.3, 0.1]), atol=0.02, rtol=0)


def test_a_table_layout_missing_a_key_is_refused():
    incomplete = {k: v for k, v in layout().items() if k != "condition_frequencies"}
    with pytest.raises(ValueError, match="table layout"):
        CTGAN((7,), table_layout=incomplete, pac=1)


# ----------------------------------------------------------------------------- dpsactgan.py
def test_dpsactgan_refuses_a_negative_classifier_weight_and_packing():
    with pytest.raises(ValueError, match="classifier_weight"):
        sactgan(classifier_weight=-1.0)
    with pytest.raises(ValueError, match="pac must be 1"):
        sactgan(pac=2)


def test_dpsactgans_classifier_optimizer_has_its_own_settings():
    module = sactgan(lr_classifier=1e-3, lr_discriminator=3e-4, weight_decay=1e-4)
    opt_g, opt_d, opt_c = module.configure_optimizers()
    assert opt_c.param_groups[0]["params"] == list(module.classifier.parameters())
    assert (opt_c.defaults["lr"], opt_c.defaults["betas"], opt_c.defaults["weight_decay"]) == (1e-3, (0.5, 0.9), 1e-4)


def test_dpsactgans_training_steps_teach_the_classifier_the_label():
    """The classifier's own optimizer steps on its loss in every discriminator step, from that
    step's gradient alone: a few training steps lower the loss on the real records (not raise
    it, not leave the classifier where it was)."""
    torch.manual_seed(0)
    module = sactgan(lr_classifier=1e-1, gradient_penalty=0.0, discriminator_steps=1000)  # critic steps only: fast
    train_outside_a_trainer(module)
    records = table_records(32)

    def loss():
        module.classifier.eval()
        with torch.no_grad():
            value = module.classifier_loss(records).item()
        module.classifier.train()
        return value

    before = loss()
    for step in range(6):
        module.training_step(records, step)
    assert loss() < 0.5 * before


def test_dpsactgans_classifier_steps_use_each_steps_gradient_only():
    """The same step twice (SGD, same weights, same draws) moves the classifier the same way."""
    torch.manual_seed(0)
    module = sactgan()
    train_outside_a_trainer(module)
    opts = [torch.optim.SGD(module.generator.parameters(), lr=0.0),
            torch.optim.SGD(module.discriminator.parameters(), lr=0.0),
            torch.optim.SGD(module.classifier.parameters(), lr=0.1)]
    module.optimizers = lambda: opts
    module.hparams.discriminator_steps = 2  # a critic-only first step
    records = table_records(8)
    assert_the_same_step_twice_moves_it_the_same_way(module, module.classifier, records)


def test_dpsactgans_classifier_is_left_alone_by_an_empty_batch():
    """Poisson sampling can draw no record: the classifier then takes no step (a mean over no
    record is NaN, and Adam would write it into every weight)."""
    torch.manual_seed(0)
    module = sactgan()
    train_outside_a_trainer(module)
    module.generated_batch_size = 4
    before = params(module.classifier)
    module.training_step(table_records(8)[:0], 0)
    assert all(torch.equal(a, p) for a, p in zip(before, module.classifier.parameters()))
