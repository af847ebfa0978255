"""The batched teacher ensemble behaves exactly like K independent teachers; partitions stay disjoint.

Each batched result is compared with the same computation done teacher by teacher on K
ordinary modules holding the same parameters.
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from lightning_dpgan.data.partition import PartitionedSampler, disjoint_partitions
from lightning_dpgan.nets.ensemble import (
    BatchedLinear,
    ConvTeacher,
    MLPTeacher,
    MLPTeacherEnsemble,
    TeacherEnsemble,
    VmapTeacherEnsemble,
    build_teacher_ensemble,
)

K, B, FEATURES, CLASSES = 4, 6, 5, 3
IMAGE = (1, 12, 12)
TOL = {"atol": 1e-5, "rtol": 1e-4}


def _mlp(
    hidden: tuple[int, ...], num_classes: int | None, chunk_floats: int | None = None
) -> tuple[TeacherEnsemble, list[nn.Module], tuple[int, ...]]:
    teachers = [MLPTeacher(FEATURES, hidden, num_classes) for _ in range(K)]
    ensemble = MLPTeacherEnsemble.from_teachers(teachers)
    if chunk_floats:
        ensemble.CPU_CHUNK_FLOATS = chunk_floats
    return ensemble, teachers, (FEATURES,)


def _conv(num_classes: int | None, chunk: int | None = 1024) -> tuple[TeacherEnsemble, list[nn.Module], tuple[int, ...]]:
    teachers = [ConvTeacher(IMAGE, num_classes, channels=3, kernel_size=3, hidden=4) for _ in range(K)]
    return VmapTeacherEnsemble.from_teachers(teachers, cpu_chunk_records=chunk), teachers, IMAGE


CASES: dict[str, Callable[[], tuple[TeacherEnsemble, list[nn.Module], tuple[int, ...]]]] = {
    "logistic": lambda: _mlp((), None),
    "logistic-labels": lambda: _mlp((), CLASSES),
    "mlp-hidden": lambda: _mlp((7, 3), None),
    "mlp-hidden-labels": lambda: _mlp((7,), CLASSES),
    "mlp-hidden-labels-chunked": lambda: _mlp((7,), CLASSES, chunk_floats=3 * B * 7),  # 3 teachers per pass
    "conv-vmap": lambda: _conv(None),
    "conv-vmap-labels": lambda: _conv(CLASSES),
    "conv-vmap-chunked": lambda: _conv(CLASSES, chunk=2 * B),  # 2 teachers per vmap call
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[TeacherEnsemble, list[nn.Module], tuple[int, ...]]:
    torch.manual_seed(0)
    return CASES[request.param]()


def _labels(ensemble: TeacherEnsemble, *shape: int) -> Tensor | None:
    return torch.randint(0, CLASSES, shape) if ensemble.num_classes else None


def _own_batches(ensemble: TeacherEnsemble, shape: tuple[int, ...]) -> tuple[Tensor, Tensor | None, Tensor]:
    """Each teacher its own records, labels and real/fake targets."""
    return torch.randn(K, B, *shape), _labels(ensemble, K, B), torch.randint(0, 2, (K, B)).float()


def _at(labels: Tensor | None, k: int) -> Tensor | None:
    return None if labels is None else labels[k]


def _ensemble_loss(ensemble: TeacherEnsemble, x: Tensor, labels: Tensor | None, targets: Tensor) -> Tensor:
    """Sum over teachers of each teacher's mean BCE, as a PATE module trains them."""
    logits = ensemble(x, labels)
    return nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(1).sum()


def _teacher_loss(teacher: nn.Module, x: Tensor, labels: Tensor | None, targets: Tensor) -> Tensor:
    return nn.functional.binary_cross_entropy_with_logits(teacher(x, labels), targets)


def _stacked_grads(ensemble: TeacherEnsemble, k: int) -> dict[str, Tensor]:
    """Teacher k's parameter gradients, read from the stacked parameters, named like the teacher's."""
    if isinstance(ensemble, MLPTeacherEnsemble):
        grads = {}
        for i, layer in enumerate(ensemble.layers):
            grads[f"linears.{i}.weight"] = layer.weight.grad[k].T
            grads[f"linears.{i}.bias"] = layer.bias.grad[k, 0]
        return grads
    assert isinstance(ensemble, VmapTeacherEnsemble)
    return {name: ensemble.stacked[name.replace(".", "-")].grad[k] for name in ensemble._names}


def _assert_same_params(ensemble: TeacherEnsemble, teachers: list[nn.Module]) -> None:
    for k, teacher in enumerate(teachers):
        extracted = ensemble.teacher(k).state_dict()
        for name, value in teacher.state_dict().items():
            torch.testing.assert_close(extracted[name], value, **TOL)


def _adam_step(
    ensemble: TeacherEnsemble,
    batched_optimizer: torch.optim.Optimizer,
    teachers: list[nn.Module],
    optimizers: list[torch.optim.Optimizer],
    batch: tuple[Tensor, Tensor | None, Tensor],
) -> None:
    """One update: the ensemble with its single optimizer, each teacher with its own Adam."""
    x, labels, targets = batch
    batched_optimizer.zero_grad()
    _ensemble_loss(ensemble, x, labels, targets).backward()
    batched_optimizer.step()
    for k, (teacher, optimizer) in enumerate(zip(teachers, optimizers, strict=True)):
        optimizer.zero_grad()
        _teacher_loss(teacher, x[k], _at(labels, k), targets[k]).backward()
        optimizer.step()


def test_outputs_match_independent_teachers(case) -> None:
    ensemble, teachers, shape = case
    x, labels, _ = _own_batches(ensemble, shape)
    expected = torch.stack([t(x[k], _at(labels, k)) for k, t in enumerate(teachers)])
    torch.testing.assert_close(ensemble(x, labels), expected, **TOL)
    _assert_same_params(ensemble, teachers)


def test_parameter_gradients_match_independent_teachers(case) -> None:
    ensemble, teachers, shape = case
    x, labels, targets = _own_batches(ensemble, shape)
    _ensemble_loss(ensemble, x, labels, targets).backward()
    for k, teacher in enumerate(teachers):
        _teacher_loss(teacher, x[k], _at(labels, k), targets[k]).backward()
        stacked = _stacked_grads(ensemble, k)
        for name, param in teacher.named_parameters():
            torch.testing.assert_close(stacked[name], param.grad, **TOL)


def test_the_teachers_loss_gives_each_its_gradient_on_its_real_and_the_shared_generated_records(case) -> None:
    """``discriminator_loss``, the PATE modules' teacher update: own real batch labelled 1, the
    generated batch shown to all teachers labelled 0 (chunked by teacher ranges in the CPU cases)."""
    ensemble, teachers, shape = case
    real, real_labels, _ = _own_batches(ensemble, shape)
    fake, fake_labels = torch.randn(B, *shape), _labels(ensemble, B)
    ensemble.discriminator_loss(real, real_labels, fake, fake_labels).backward()
    _assert_each_teacher_got_its_own_gradient(ensemble, teachers, (real, real_labels), (fake, fake_labels))


def _assert_each_teacher_got_its_own_gradient(ensemble, teachers, real_batches, fake_batch) -> None:
    """The stacked gradients are, teacher by teacher, those of each teacher alone trained on its
    real batch (labelled 1) and the shared generated one (labelled 0)."""
    (real, real_labels), (fake, fake_labels) = real_batches, fake_batch
    bce = nn.functional.binary_cross_entropy_with_logits
    for k, teacher in enumerate(teachers):
        on_real, on_fake = teacher(real[k], _at(real_labels, k)), teacher(fake, fake_labels)
        (bce(on_real, torch.ones_like(on_real)) + bce(on_fake, torch.zeros_like(on_fake))).backward()
        stacked = _stacked_grads(ensemble, k)
        for name, param in teacher.named_parameters():
            torch.testing.assert_close(stacked[name], param.grad, **TOL)


@pytest.mark.parametrize("num_classes", [None, CLASSES])
@pytest.mark.parametrize("per_slice", [1, 3, K])
def test_training_a_slice_of_teachers_at_a_time_gives_every_teacher_its_gradient(num_classes, per_slice) -> None:
    """``backward_in_chunks`` (teachers too many for one graph): the loss and every teacher's
    gradient are those of ``discriminator_loss`` over all K at once, and of each teacher alone;
    a second call adds to the gradients, as ``backward`` would."""
    torch.manual_seed(0)
    ensemble, teachers, shape = _conv(num_classes)
    real, real_labels, _ = _own_batches(ensemble, shape)
    fake, fake_labels = torch.randn(B, *shape), _labels(ensemble, B)
    whole = copy.deepcopy(ensemble)
    expected_loss = whole.discriminator_loss(real, real_labels, fake, fake_labels)
    expected_loss.backward()
    ensemble.train_chunk = per_slice
    loss = ensemble.backward_in_chunks(real, real_labels, fake, fake_labels)
    torch.testing.assert_close(loss, expected_loss.detach(), **TOL)
    for name in ensemble._names:
        key = name.replace(".", "-")
        torch.testing.assert_close(ensemble.stacked[key].grad, whole.stacked[key].grad, **TOL)
    _assert_each_teacher_got_its_own_gradient(ensemble, teachers, (real, real_labels), (fake, fake_labels))
    ensemble.backward_in_chunks(real, real_labels, fake, fake_labels)
    for name in ensemble._names:
        key = name.replace(".", "-")
        torch.testing.assert_close(ensemble.stacked[key].grad, 2 * whole.stacked[key].grad, **TOL)


def test_a_loss_scale_scales_the_sliced_gradients_not_the_loss() -> None:
    """Under 16-bit mixed precision the loss is scaled before backward and the optimizer step
    unscales the gradients: the slices' gradients must come scaled the same way."""
    torch.manual_seed(0)
    ensemble, _, shape = _conv(CLASSES)
    real, real_labels, _ = _own_batches(ensemble, shape)
    fake, fake_labels = torch.randn(B, *shape), _labels(ensemble, B)
    scaled = copy.deepcopy(ensemble)
    ensemble.train_chunk = scaled.train_chunk = 3
    loss = ensemble.backward_in_chunks(real, real_labels, fake, fake_labels)
    scaled_loss = scaled.backward_in_chunks(real, real_labels, fake, fake_labels, loss_scale=1024.0)
    torch.testing.assert_close(scaled_loss, loss)
    for key, parameter in ensemble.stacked.items():
        torch.testing.assert_close(scaled.stacked[key].grad, 1024.0 * parameter.grad, **TOL)


def test_only_the_vmap_form_trains_a_slice_at_a_time() -> None:
    mlp, _, shape = _mlp((7,), None)
    assert not mlp.supports_chunked_training
    mlp.train_chunk = 2
    with pytest.raises(NotImplementedError):
        mlp.backward_in_chunks(torch.randn(K, B, *shape), None, torch.randn(B, *shape), None)
    assert _conv(None)[0].supports_chunked_training


def _edges_into_parameters(loss: Tensor) -> dict[int, int]:
    """For each leaf parameter, how many nodes of ``loss``'s backward graph hand it a gradient."""
    counts: dict[int, int] = {}
    seen, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for child, _ in node.next_functions:
            if child is not None and hasattr(child, "variable"):  # AccumulateGrad of a leaf
                counts[id(child.variable)] = counts.get(id(child.variable), 0) + 1
            elif child is not None:
                stack.append(child)
    return counts


@pytest.mark.parametrize("build", [
    lambda per_pass: _mlp((7,), CLASSES, chunk_floats=per_pass * B * 7)[0],
    lambda per_pass: _conv(CLASSES, chunk=per_pass * B)[0],
], ids=["mlp", "conv-vmap"])
def test_a_chunked_pass_hands_each_stacked_parameter_its_gradient_once_however_many_chunks(build) -> None:
    """Cutting a parameter per chunk (indexing, or vmap's ``chunk_size``) makes every chunk's
    backward fill a gradient of all K teachers: quadratic in K (the update of 1000 preset-size
    G-PATE teachers took 24.7 s instead of 7.1 s on 2 CPU cores). Split once, the gradient of
    all chunks is assembled in one node."""
    counts = []
    for per_pass in (K, 2, 1):  # one pass, two chunks, K chunks
        torch.manual_seed(0)
        ensemble = build(per_pass)
        real, real_labels, _ = _own_batches(ensemble, ensemble_shape(ensemble))
        fake = torch.randn(B, *ensemble_shape(ensemble))
        loss = ensemble.discriminator_loss(real, real_labels, fake, _labels(ensemble, B))
        by_parameter = _edges_into_parameters(loss)
        counts.append([by_parameter[id(p)] for p in ensemble.parameters()])
    assert counts[1] == counts[2], counts  # two chunks and four reach each parameter alike
    assert all(a <= b + 1 for a, b in zip(counts[1], counts[0])), counts  # at most the one split more than one pass


def ensemble_shape(ensemble: TeacherEnsemble) -> tuple[int, ...]:
    return IMAGE if isinstance(ensemble, VmapTeacherEnsemble) else (FEATURES,)


def test_adam_steps_match_and_continue_from_previous_step(case) -> None:
    """Two steps match K independent Adams; step 2 starts from step 1, not from a fresh init."""
    ensemble, teachers, shape = case
    initial = copy.deepcopy(teachers)
    batched_optimizer = ensemble.make_optimizer(lr=0.01, betas=(0.5, 0.999))
    optimizers = [torch.optim.Adam(t.parameters(), lr=0.01, betas=(0.5, 0.999)) for t in teachers]
    first, second = _own_batches(ensemble, shape), _own_batches(ensemble, shape)
    _adam_step(ensemble, batched_optimizer, teachers, optimizers, first)
    _assert_same_params(ensemble, teachers)
    _adam_step(ensemble, batched_optimizer, teachers, optimizers, second)
    _assert_same_params(ensemble, teachers)

    restarted = [copy.deepcopy(t) for t in initial]  # what a re-initialising loop would hold
    for k, teacher in enumerate(restarted):
        x, labels, targets = second
        optimizer = torch.optim.Adam(teacher.parameters(), lr=0.01, betas=(0.5, 0.999))
        _teacher_loss(teacher, x[k], _at(labels, k), targets[k]).backward()
        optimizer.step()
    trained = ensemble.teacher(0).state_dict()
    assert any(not torch.allclose(trained[n], v, atol=1e-4) for n, v in restarted[0].state_dict().items())


def test_forward_shared_equals_forward_on_expanded_batch(case) -> None:
    ensemble, _, shape = case
    x, labels = torch.randn(B, *shape), _labels(ensemble, B)
    expanded_labels = None if labels is None else labels.expand(K, B)
    torch.testing.assert_close(ensemble.forward_shared(x, labels), ensemble(x.expand(K, *x.shape), expanded_labels), **TOL)
    with pytest.raises(ValueError, match="forward_shared"):
        ensemble(x, labels)  # a shared batch given to forward is refused, not misread


def test_input_gradients_equal_loop_over_teachers(case) -> None:
    ensemble, teachers, shape = case
    x, labels = torch.randn(B, *shape), _labels(ensemble, B)
    expected = []
    for teacher in teachers:
        inputs = x.clone().requires_grad_()
        expected.append(torch.autograd.grad(teacher(inputs, labels).sum(), inputs)[0])
    gradients = ensemble.input_gradients(x, labels)
    assert gradients.shape == (K, B, *shape)
    torch.testing.assert_close(gradients, torch.stack(expected), **TOL)


def test_votes_count_teachers_above_threshold() -> None:
    """Teacher k's logit is w_k * x: three say "real" for x = 2, the other two for x = -2."""
    ensemble = MLPTeacherEnsemble(5, in_features=1)
    with torch.no_grad():
        ensemble.layers[0].weight.copy_(torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0]).view(5, 1, 1))
        ensemble.layers[0].bias.zero_()
    x = torch.tensor([[2.0], [-2.0], [0.0]])
    counts, predictions = ensemble.votes(x, return_predictions=True)
    assert counts.tolist() == [3, 2, 0]  # sigmoid(0) = 0.5 is not > 0.5
    assert counts.dtype == torch.int64 and predictions.shape == (5, 3)
    assert predictions[:, 0].tolist() == [True, True, True, False, False]
    assert ensemble.votes(x, threshold=0.9).tolist() == [0, 0, 0]  # sigmoid(2) = 0.88


def test_batched_linear_from_modules_and_init() -> None:
    linears = [nn.Linear(FEATURES, 3) for _ in range(K)]
    batched = BatchedLinear.from_modules(linears)
    x = torch.randn(K, B, FEATURES)
    torch.testing.assert_close(batched(x), torch.stack([layer(x[k]) for k, layer in enumerate(linears)]))
    torch.testing.assert_close(batched.module(2).weight, linears[2].weight)
    fresh = BatchedLinear(1000, 16, 1)
    assert fresh.weight.abs().max() <= 0.25 and fresh.bias.abs().max() <= 0.25  # U(±1/sqrt(16)), like nn.Linear
    assert fresh.weight.std() > 0.1 and not torch.equal(fresh.weight[0], fresh.weight[1])


def test_make_optimizer_is_one_adam_over_all_teachers() -> None:
    ensemble = build_teacher_ensemble(K, (FEATURES,))
    optimizer = ensemble.make_optimizer(lr=1e-3)
    assert [p for group in optimizer.param_groups for p in group["params"]] == list(ensemble.parameters())
    assert optimizer.defaults["fused"] or optimizer.defaults["foreach"]


def test_build_teacher_ensemble_picks_the_form_per_architecture() -> None:
    assert isinstance(build_teacher_ensemble(K, (FEATURES,), hidden=(8,)), MLPTeacherEnsemble)
    conv = build_teacher_ensemble(K, IMAGE, num_classes=CLASSES, channels=2, hidden=4)
    assert isinstance(conv, VmapTeacherEnsemble) and isinstance(conv.teacher(0), ConvTeacher)
    assert isinstance(build_teacher_ensemble(K, IMAGE, arch="mlp"), MLPTeacherEnsemble)
    with pytest.raises(ValueError, match="unknown teacher arch"):
        build_teacher_ensemble(K, IMAGE, arch="resnet")


@pytest.mark.parametrize("kernel, stride, channels", [(5, 2, 1), (3, 1, 3), (4, 2, 2)])
def test_the_label_planes_convolved_once_per_class_give_the_convolution_of_the_concatenated_planes(kernel, stride, channels):
    """ConvTeacher's first layer: the class maps added to the images' convolution equal the
    convolution of the images with their one-hot planes appended, values and gradients (the
    borders included, where the zero padding makes a class map vary)."""
    from lightning_dpgan.nets.conditioning import conv_of_label_planes, label_planes

    torch.manual_seed(0)
    conv = nn.Conv2d(channels + CLASSES, 6, kernel, stride=stride, padding=kernel // 2)
    images, labels = torch.randn(5, channels, 11, 11, requires_grad=True), torch.tensor([0, 2, 1, 2, 0])
    fast = conv_of_label_planes(conv, images, labels, CLASSES)
    plain = conv(label_planes(images, labels, CLASSES))
    torch.testing.assert_close(fast, plain, **TOL)
    weights = torch.randn_like(plain)
    fast_grads = torch.autograd.grad((fast * weights).sum(), [images, conv.weight, conv.bias])
    plain_grads = torch.autograd.grad((plain * weights).sum(), [images, conv.weight, conv.bias])
    for got, expected in zip(fast_grads, plain_grads):
        torch.testing.assert_close(got, expected, **TOL)
    unconditional = nn.Conv2d(channels, 6, kernel, stride=stride, padding=kernel // 2)
    assert torch.equal(conv_of_label_planes(unconditional, images, None, None), unconditional(images))
    with pytest.raises(ValueError, match="labels"):
        conv_of_label_planes(conv, images, labels[:3], CLASSES)


def test_vmap_ensemble_refuses_teachers_with_buffers() -> None:
    with pytest.raises(ValueError, match="stateless"):
        VmapTeacherEnsemble(lambda: nn.Sequential(nn.Linear(3, 1), nn.BatchNorm1d(1)), 2)


@pytest.mark.parametrize(("shape", "kwargs"), [
    ((FEATURES,), {"hidden": (8,)}),
    (IMAGE, {"channels": 2, "hidden": 4}),
], ids=["mlp", "conv"])
@pytest.mark.parametrize("keep", [slice(0, 3), slice(2, 5), slice(5, 7)], ids=["first", "middle", "last"])
def test_a_shard_built_alone_has_the_values_a_build_of_all_teachers_gives_it(shape, kwargs, keep, monkeypatch) -> None:
    """A DDP rank builds only its shard; its teachers must start as a single process's do, and
    the random stream must end where a full build leaves it (later draws agree across ranks)."""
    import lightning_dpgan.nets.ensemble as ensemble_module

    monkeypatch.setattr(ensemble_module, "UNIFORM_BLOCK", 50)  # many blocks, some straddling the shard's edges
    torch.manual_seed(3)
    whole = build_teacher_ensemble(7, shape, num_classes=CLASSES, **kwargs)
    after_whole = torch.rand(3)
    torch.manual_seed(3)
    shard = build_teacher_ensemble(7, shape, num_classes=CLASSES, keep=keep, **kwargs)
    after_shard = torch.rand(3)
    assert shard.num_teachers == len(range(7)[keep])
    whole_params, shard_params = dict(whole.named_parameters()), dict(shard.named_parameters())
    assert whole_params.keys() == shard_params.keys()
    for name, value in whole_params.items():
        assert torch.equal(shard_params[name], value[keep]), name
    assert torch.equal(after_whole, after_shard)
    x = torch.randn(B, *shape)
    labels = torch.randint(0, CLASSES, (B,))
    torch.testing.assert_close(shard.forward_shared(x, labels), whole.forward_shared(x, labels)[keep])


def test_a_shard_must_be_a_contiguous_non_empty_range() -> None:
    for keep in (slice(3, 3), slice(0, 6, 2), slice(9, 12)):
        with pytest.raises(ValueError, match="contiguous range of the 7 teachers"):
            build_teacher_ensemble(7, (FEATURES,), keep=keep)


# --- partitions -------------------------------------------------------------------------------


def test_disjoint_partitions_cover_and_are_balanced() -> None:
    parts = disjoint_partitions(103, 10, seed=1)
    flat = torch.cat(parts)
    assert sorted(flat.tolist()) == list(range(103))
    assert {p.numel() for p in parts} == {10, 11}
    assert all(torch.equal(a, b) for a, b in zip(parts, disjoint_partitions(103, 10, seed=1), strict=True))
    assert not torch.equal(torch.cat(disjoint_partitions(103, 10, seed=2)), flat)
    with pytest.raises(ValueError):
        disjoint_partitions(5, 6, seed=0)


@pytest.mark.parametrize("replacement", [False, True])
def test_each_teacher_draws_only_from_its_own_fixed_partition(replacement: bool) -> None:
    """Rules out all teachers sharing one part and teachers sampling the whole dataset."""
    n, teachers, batch = 400, 40, 8 if not replacement else 25
    data = torch.arange(n, dtype=torch.float32).unsqueeze(1).expand(n, 3)
    parts = disjoint_partitions(n, teachers, seed=0)
    sampler = PartitionedSampler(data, parts, batch, labels=torch.arange(n) % 2, replacement=replacement, seed=3)
    seen: list[set[int]] = [set() for _ in range(teachers)]
    for _ in range(30):
        indices = sampler.draw_indices()
        assert indices.shape == (teachers, batch)
        for k in range(teachers):
            row = set(indices[k].tolist())
            assert row <= set(parts[k].tolist())
            if not replacement:
                assert len(row) == batch  # distinct records within a teacher's batch
            seen[k] |= row
    assert all(torch.equal(a, b) for a, b in zip(sampler.partitions, parts, strict=True))  # fixed across draws
    assert all(seen[k] == set(parts[k].tolist()) for k in range(teachers))  # the whole own part, nothing else
    x, y = sampler.draw()
    assert x.shape == (teachers, batch, 3) and y is not None and y.shape == (teachers, batch)
    for k in range(teachers):
        assert set(x[k, :, 0].long().tolist()) <= set(parts[k].tolist())
        assert torch.equal(y[k], x[k, :, 0].long() % 2)


def test_sampler_state_round_trip_resumes_same_partitions_and_draws() -> None:
    data = torch.randn(60, 2)
    sampler = PartitionedSampler(data, disjoint_partitions(60, 6, seed=4), batch_size=4, seed=5)
    sampler.draw_indices()
    state = sampler.state_dict()
    assert "data" not in state and state["indices"].numel() == 60
    expected = [sampler.draw_indices() for _ in range(3)]

    resumed = PartitionedSampler(data, disjoint_partitions(60, 6, seed=99), batch_size=4, seed=0)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(resumed.partitions, sampler.partitions, strict=True))
    assert all(torch.equal(resumed.draw_indices(), e) for e in expected)
    with pytest.raises(ValueError, match="records"):
        PartitionedSampler(torch.randn(61, 2), disjoint_partitions(61, 6, seed=0), 4).load_state_dict(state)


def test_a_sampler_state_is_refused_for_the_same_count_of_other_or_reordered_records() -> None:
    """The partitions are row positions: on shuffled rows the same positions would hand records
    to teachers other than the ones they trained, one record reaching two teachers."""
    data, labels = torch.randn(60, 2), torch.arange(60) % 2
    state = PartitionedSampler(data, disjoint_partitions(60, 6, seed=4), 4, labels=labels).state_dict()
    shuffled = torch.randperm(60, generator=torch.Generator().manual_seed(0))
    for other_data, other_labels in [(data[shuffled], labels[shuffled]), (data + 1.0, labels), (data, 1 - labels)]:
        with pytest.raises(ValueError, match="other training records"):
            PartitionedSampler(other_data, disjoint_partitions(60, 6, seed=4), 4, labels=other_labels).load_state_dict(state)
    same = PartitionedSampler(data.clone(), disjoint_partitions(60, 6, seed=9), 4, labels=labels.clone())
    same.load_state_dict(state)  # the same rows in the same order: resumed
    assert all(torch.equal(a, b) for a, b in zip(same.partitions, disjoint_partitions(60, 6, seed=4), strict=True))


@pytest.mark.parametrize("replacement", [False, True])
def test_drawing_a_steps_teacher_batches_at_once_gives_the_draws_one_at_a_time_would(replacement: bool) -> None:
    """A PATE step takes its nT teacher minibatches in one draw: the same records and labels, in
    the same order of steps, as nT single draws from the same state (a DDP shard included)."""
    data, labels = torch.randn(90, 3), torch.arange(90) % 3
    parts = disjoint_partitions(90, 6, seed=1)
    batch = 12 if replacement else 5
    batched, single = (PartitionedSampler(data, parts, batch, labels=labels, replacement=replacement, seed=7)
                       for _ in range(2))
    batched.shard = single.shard = slice(2, 5)
    records, drawn_labels = batched.draw_steps(4)
    expected = [single.draw() for _ in range(4)]
    assert len(records) == len(drawn_labels) == 4
    for x_t, y_t, (x, y) in zip(records, drawn_labels, expected, strict=True):
        assert x_t.shape == (3, batch, 3) and y_t.shape == (3, batch)
        order_t, order = x_t[..., 0].argsort(dim=1), x[..., 0].argsort(dim=1)  # within a batch order is free
        assert torch.equal(x_t.gather(1, order_t.unsqueeze(-1).expand_as(x_t)), x.gather(1, order.unsqueeze(-1).expand_as(x)))
        assert torch.equal(y_t.gather(1, order_t), y.gather(1, order))
    assert torch.equal(batched.draw_indices(), single.draw_indices())  # the stream continues in step
    with pytest.raises(ValueError, match="count"):
        batched.draw_steps(0)


def test_sampler_refuses_overlapping_or_too_small_partitions() -> None:
    data = torch.randn(20, 2)
    with pytest.raises(ValueError, match="overlap"):
        PartitionedSampler(data, [torch.arange(0, 10), torch.arange(5, 15)], batch_size=2)
    with pytest.raises(ValueError, match="smallest partition"):
        PartitionedSampler(data, disjoint_partitions(20, 10, seed=0), batch_size=3)
    PartitionedSampler(data, disjoint_partitions(20, 10, seed=0), batch_size=3, replacement=True)


@pytest.mark.parametrize("replacement", [False, True])
def test_unequal_partitions_draw_only_from_their_own_part(replacement):
    """Shorter partitions are padded with index 0, a real record of another teacher's partition:
    the padding must never be drawn, or that record would reach two teachers."""
    n, k, batch = 103, 10, 10  # parts of 11 and 10: the shorter ones are padded
    parts = disjoint_partitions(n, k, seed=0)
    assert {p.numel() for p in parts} == {10, 11}
    sampler = PartitionedSampler(torch.arange(n).unsqueeze(1), parts, batch, replacement=replacement, seed=1)
    for _ in range(50):
        indices = sampler.draw_indices()
        for j in range(k):
            assert set(indices[j].tolist()) <= set(parts[j].tolist())


@pytest.mark.parametrize(("shape", "kwargs"), [
    ((FEATURES,), {"hidden": (7,)}),
    (IMAGE, {"channels": 2, "hidden": 4}),
], ids=["mlp", "conv"])
def test_keeping_a_shard_of_built_teachers_keeps_exactly_those_teachers(shape, kwargs) -> None:
    """``keep_teachers`` (a rank resuming from a checkpoint of all K): the kept teachers, no
    neighbour more, with their values, and they still vote as they did in the whole ensemble."""
    torch.manual_seed(0)
    whole = build_teacher_ensemble(K, shape, num_classes=CLASSES, **kwargs)
    shard = copy.deepcopy(whole)
    shard.keep_teachers(slice(1, 3))
    assert shard.num_teachers == 2
    whole_params = dict(whole.named_parameters())
    for name, value in shard.named_parameters():
        assert torch.equal(value, whole_params[name][1:3]), name
    x, labels = torch.randn(B, *shape), torch.randint(0, CLASSES, (B,))
    torch.testing.assert_close(shard.forward_shared(x, labels), whole.forward_shared(x, labels)[1:3])
    real = torch.randn(2, B, *shape)
    torch.testing.assert_close(shard(real, labels.expand(2, B)), torch.stack(
        [whole.teacher(k)(real[i], labels) for i, k in enumerate((1, 2))]), **TOL)


def test_built_mlp_teachers_are_the_default_standalone_teacher() -> None:
    """The ensemble ``build_teacher_ensemble`` trains is K of :class:`MLPTeacher` as its defaults
    make it (LeakyReLU(0.2) between layers): a default teacher holding teacher k's values gives
    teacher k's logits."""
    torch.manual_seed(0)
    ensemble = build_teacher_ensemble(K, (FEATURES,), num_classes=CLASSES, hidden=(7, 3))
    x, labels = torch.randn(B, FEATURES) * 3, torch.randint(0, CLASSES, (B,))
    logits = ensemble.forward_shared(x, labels)
    for k in range(K):
        standalone = MLPTeacher(FEATURES, (7, 3), CLASSES)
        standalone.load_state_dict(ensemble.teacher(k).state_dict())
        torch.testing.assert_close(standalone(x, labels), logits[k], **TOL)


@pytest.mark.parametrize("num_classes", [None, 3])
def test_a_conv_teacher_is_conv_leaky_relu_fc_leaky_relu_logit(num_classes):
    """G-PATE's teacher: strided conv (label planes joined to the image) -> LeakyReLU(0.2) ->
    FC -> LeakyReLU(0.2) -> one logit. Computed here from the teacher's own layers with plain
    torch ops, so a dropped or different activation in the teacher (which a comparison with the
    ensemble, built from the same teacher class, cannot see) changes the logits."""
    from torch.nn import functional as F

    from lightning_dpgan.nets.conditioning import label_planes

    torch.manual_seed(0)
    teacher = ConvTeacher((1, 8, 8), num_classes, channels=3, kernel_size=3, hidden=4)
    x = torch.randn(6, 1, 8, 8) * 3
    labels = torch.tensor([0, 1, 2, 1, 0, 2]) if num_classes else None
    h = F.leaky_relu(teacher.conv(label_planes(x, labels, num_classes)), 0.2)
    h = F.leaky_relu(teacher.fc(torch.flatten(h, 1)), 0.2)
    expected = teacher.head(h).squeeze(1)
    torch.testing.assert_close(teacher(x, labels), expected)
    # and the batched ensemble of such teachers gives the same logits
    ensemble = VmapTeacherEnsemble.from_teachers([teacher, teacher])
    torch.testing.assert_close(ensemble.forward_shared(x, labels)[1], expected, atol=1e-5, rtol=1e-4)
    # the activations matter here: some pre-activations are negative at both layers
    assert (teacher.conv(label_planes(x, labels, num_classes)) < 0).any()


def test_teachers_with_minibatches_larger_than_a_slice_train_at_least_one_at_a_time():
    from lightning_dpgan.callbacks.teachers import TRAIN_CHUNK_RECORDS, train_chunk

    assert train_chunk(TRAIN_CHUNK_RECORDS * 2) == 1
    assert train_chunk(TRAIN_CHUNK_RECORDS + 1) == 1
    assert train_chunk(64) == TRAIN_CHUNK_RECORDS // 64


def test_ranks_training_on_their_own_gpus_do_not_share_its_memory_but_ranks_on_the_cpu_do(monkeypatch):
    """Each DDP rank trains its shard on its own GPU: the device check is per rank there, and
    multiplied by the machine's ranks only when they all train on the host."""
    import lightning_dpgan.callbacks.teachers as teachers

    per_teacher, k = 1000, 50
    parameter_bytes = k * per_teacher * 4
    monkeypatch.setattr(teachers, "available_memory",
                        lambda device: 10**15 if device.type == "cpu" else 9 * parameter_bytes)
    assert teachers.check_teacher_memory(k, per_teacher, torch.device("cuda"), processes_on_host=4) is False
    monkeypatch.setattr(teachers, "available_memory", lambda device: 11 * parameter_bytes * 2)
    assert teachers.check_teacher_memory(k, per_teacher, torch.device("cpu"), processes_on_host=2) is False
    with pytest.raises(teachers.TeacherMemoryError, match="in each of 3 processes"):
        teachers.check_teacher_memory(k, per_teacher, torch.device("cpu"), processes_on_host=3)


def test_as_many_teachers_as_training_records_is_allowed_and_one_more_is_refused():
    """K = N gives each teacher one record (the sensitivity argument holds); K = N + 1 cannot be partitioned."""
    from pathlib import Path

    import lightning as L

    from lightning_dpgan.callbacks.pate import PATEAggregation
    from lightning_dpgan.callbacks.step_limit import StepLimit
    from lightning_dpgan.datamodules.adult import AdultDataModule
    from lightning_dpgan.modules.pategan import PATEGAN

    adult = Path(__file__).parent / "fixtures" / "adult_tiny"
    probe = AdultDataModule(data_dir=adult, batch_size=8)
    probe.setup("fit")
    records = len(probe.train_dataset)

    def fit(teachers):
        torch.manual_seed(0)
        datamodule = AdultDataModule(data_dir=adult, batch_size=8)
        strategy = PATEAggregation(num_teachers=teachers, lap_inverse_scale=0.05, teacher_batch_size=1, delta=1e-3)
        trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(1), strategy], logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
        module = PATEGAN(datamodule.data_shape)
        trainer.fit(module, datamodule=datamodule)
        return strategy, module

    strategy, module = fit(records)
    assert strategy.num_teachers == module.teachers.num_teachers == records
    assert strategy.partition_report()["partition_sizes"] == [1, 1]
    with pytest.raises(ValueError, match=f"exceeds the {records} training records"):
        fit(records + 1)


def test_an_epoch_of_teacher_batches_covers_the_smallest_partition_with_a_last_partial_step():
    """With --max-epochs 1 the teachers read their smallest partition once: a remainder smaller
    than a step's minibatches is one more step, not dropped."""
    from pathlib import Path

    import lightning as L

    from lightning_dpgan.callbacks.pate import PATEAggregation
    from lightning_dpgan.datamodules.adult import AdultDataModule
    from lightning_dpgan.modules.pategan import PATEGAN

    adult = Path(__file__).parent / "fixtures" / "adult_tiny"
    probe = AdultDataModule(data_dir=adult, batch_size=8)
    probe.setup("fit")
    smallest = min(len(part) for part in probe.partitions(3, 0))
    batch = smallest - 1  # one record left over after a step
    assert batch >= 2
    torch.manual_seed(0)
    datamodule = AdultDataModule(data_dir=adult, batch_size=8)
    strategy = PATEAggregation(num_teachers=3, lap_inverse_scale=0.05, teacher_batch_size=batch, delta=1e-3)
    module = PATEGAN(datamodule.data_shape, teacher_steps=1)
    trainer = L.Trainer(max_epochs=1, callbacks=[strategy], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, datamodule=datamodule)
    assert module.train_steps == 2
