"""Teacher ensembles for PATE-GAN, G-PATE and PATE-CTGAN: K discriminators as one batched module.

PATE-style models train hundreds to thousands of small teachers, each only on its own disjoint
partition of the private data. A Python loop over K ``nn.Module`` teachers spends its time in
the interpreter and in K tiny kernel launches; here the K teachers' parameters are stacked
along a leading dimension and every forward/backward pass runs once for all of them:

- :class:`MLPTeacherEnsemble` (MLP teachers, PATE-GAN's "depth 1" logistic-regression teachers
  included) is built from :class:`BatchedLinear`, one batched product per layer; a batch shown
  to all teachers (generated records) is never copied K times.
- :class:`VmapTeacherEnsemble` runs any stateless teacher module (e.g. G-PATE's
  :class:`ConvTeacher`) through ``torch.func.vmap(functional_call)`` over parameters stacked by
  ``torch.func.stack_module_state``.

Both register the stacked tensors as ``nn.Parameter``, so one optimizer
(:meth:`TeacherEnsemble.make_optimizer`) updates all teachers at once. Adam is elementwise, so
one Adam over stacked parameters is exactly K independent Adams. A training loss must be the
SUM over teachers of each teacher's own loss (not the mean): teachers share no parameter, so
teacher k then receives exactly the gradient of its own loss.

:func:`build_teacher_ensemble` picks the form per architecture; the measurements behind the
choice are in its docstring (``benchmarks/teacher_ensemble.py`` reproduces them).
"""
from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from itertools import pairwise

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_dpgan.nets.conditioning import concat_condition, conv_of_label_planes


def kept_range(total: int, keep: slice | None) -> range:
    """The teachers ``keep`` selects of ``total`` (all when None): a non-empty contiguous range."""
    kept = range(total)[keep if keep is not None else slice(None)]
    if not kept or kept.step != 1:
        raise ValueError(f"keep must select a non-empty contiguous range of the {total} teachers, got {keep}")
    return kept


#: Random numbers drawn per block by :func:`uniform_rows` (4 MiB of float32).
UNIFORM_BLOCK = 1 << 20


@torch.no_grad()
def uniform_rows(total: int, kept: range, row_shape: Sequence[int], bound: float) -> Tensor:
    """Rows ``kept`` of a ``[total, *row_shape]`` U(-bound, bound) draw, without holding the others.

    The CPU generator fills a tensor's elements one after another (``uniform_`` is a serial
    kernel), so drawing the rows block by block consumes the random stream exactly as one draw
    of all ``total`` rows does: a DDP rank gets its teachers' initial values as a single process
    would, in the memory of its own shard. (Pinned by a test against slicing the full draw.)
    """
    row = math.prod(row_shape)
    out = torch.empty(len(kept), *row_shape)
    per_block = max(1, UNIFORM_BLOCK // max(1, row))
    for start in range(0, total, per_block):  # all of them: the next draw starts where a full one ends
        block = torch.empty(min(per_block, total - start), *row_shape).uniform_(-bound, bound)
        first, last = max(start, kept.start), min(start + len(block), kept.stop)
        if first < last:
            out[first - kept.start : last - kept.start] = block[first - start : last - start]
    return out


class BatchedLinear(nn.Module):
    """K independent linear layers: ``x [K, B, in] -> [K, B, out]`` in one batched product.

    ``weight`` is stored ``[K, in, out]`` (already transposed for ``x @ W``) and ``bias``
    ``[K, 1, out]`` so it broadcasts over the batch inside ``torch.baddbmm``. Each model's slice is
    drawn from the same distribution as ``nn.Linear``'s default init, U(-1/sqrt(in), 1/sqrt(in))
    for weight and bias, but from one random stream for all K; to compare with K given
    ``nn.Linear`` layers, build the batched layer from them with :meth:`from_modules`.

    ``keep`` (a contiguous slice of the K, a DDP rank's shard) holds only those models, with the
    values a layer of all K would give them (:func:`uniform_rows`).
    """

    def __init__(self, num_models: int, in_features: int, out_features: int, keep: slice | None = None) -> None:
        super().__init__()
        self.total_models, self.kept = num_models, kept_range(num_models, keep)
        self.num_models, self.in_features, self.out_features = len(self.kept), in_features, out_features
        self.weight = nn.Parameter(torch.empty(self.num_models, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(self.num_models, 1, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's default: kaiming_uniform(a=sqrt(5)) and its bias rule both give U(±1/sqrt(in))."""
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features else 0.0
        with torch.no_grad():
            if self.num_models == self.total_models:
                self.weight.uniform_(-bound, bound)
                self.bias.uniform_(-bound, bound)
            else:
                self.weight.copy_(uniform_rows(self.total_models, self.kept, self.weight.shape[1:], bound))
                self.bias.copy_(uniform_rows(self.total_models, self.kept, self.bias.shape[1:], bound))

    def forward(self, x: Tensor, weights: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``x [K, B, in]`` through the K models, or through ``weights``, the ``(weight, bias)``
        of some of them (a piece of :meth:`pieces`).

        A single output (a teacher's logit layer) is a broadcast multiply and sum: the backward
        of ``baddbmm`` would then multiply ``[B, 1] x [1, in]`` per model, which CPU ``bmm``
        runs as a per-model loop; measured 4-10x faster forward+backward at B = 8-64.
        """
        weight, bias = (self.weight, self.bias) if weights is None else weights
        if self.out_features == 1:
            return (x * weight.transpose(1, 2)).sum(-1, keepdim=True) + bias
        return torch.baddbmm(bias, x, weight)

    def pieces(self, size: int) -> list[tuple[Tensor, Tensor]]:
        """``(weight, bias)`` of consecutive ranges of ``size`` models, cut by one ``split`` each:
        a backward through them joins the ranges' gradients in one ``cat``. (Indexing a range
        per pass would fill a gradient of all K models per range: quadratic in K.)"""
        return list(zip(self.weight.split(size), self.bias.split(size)))

    @classmethod
    def from_modules(cls, linears: Sequence[nn.Linear]) -> BatchedLinear:
        """Stack K ``nn.Linear`` layers (copies of their current values) into one batched layer."""
        first = linears[0]
        if any(layer.bias is None for layer in linears):
            raise ValueError("BatchedLinear.from_modules needs layers with a bias")
        batched = cls(len(linears), first.in_features, first.out_features).to(first.weight)
        with torch.no_grad():
            batched.weight.copy_(torch.stack([layer.weight.detach().T for layer in linears]))
            batched.bias.copy_(torch.stack([layer.bias.detach() for layer in linears]).unsqueeze(1))
        return batched

    def module(self, k: int) -> nn.Linear:
        """Model ``k`` as a standalone ``nn.Linear`` (a copy)."""
        layer = nn.Linear(self.in_features, self.out_features).to(self.weight)
        with torch.no_grad():
            layer.weight.copy_(self.weight[k].T)
            layer.bias.copy_(self.bias[k, 0])
        return layer


class TeacherEnsemble(nn.Module, ABC):
    """K teachers, each a binary discriminator giving one logit per record.

    Shapes: ``forward`` takes each teacher's own batch ``x [K, B, ...]`` (labels ``[K, B]``);
    ``forward_shared``, ``votes`` and ``input_gradients`` take one batch ``x [B, ...]`` (labels
    ``[B]``) shown to every teacher. Logits come back ``[K, B]``.
    """

    num_teachers: int
    num_classes: int | None
    #: Whether :meth:`backward_in_chunks` can train this form a slice of teachers at a time.
    supports_chunked_training: bool = False
    #: Teachers per forward/backward pass of a training update (None: all K in one graph). Set
    #: by the teacher strategy when one graph over all K would not fit in memory.
    train_chunk: int | None = None

    @abstractmethod
    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """Logits ``[K, B]`` of each teacher on its own batch ``x[k]``."""

    @abstractmethod
    def forward_shared(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """Logits ``[K, B]`` of every teacher on the same batch ``x [B, ...]``, without K copies of x."""

    @abstractmethod
    def input_gradients(
        self, x: Tensor, labels: Tensor | None = None, transform: Callable[[Tensor], Tensor] | None = None
    ) -> Tensor:
        """``d f(logit_k(x_b)) / d x_b`` for every teacher k and record b: ``[K, B, *x.shape[1:]]``
        (detached); ``f`` is ``transform`` (elementwise, e.g. a loss of the logit), identity by default."""

    @abstractmethod
    def teacher(self, k: int) -> nn.Module:
        """Teacher ``k`` as a standalone module (a copy), called as ``teacher(x, labels)``."""

    def _check_teacher_dim(self, x: Tensor) -> Tensor:
        """Refuse a batch without the leading teacher dimension (e.g. a shared batch passed to forward)."""
        if x.dim() < 2 or x.shape[0] != self.num_teachers:
            raise ValueError(
                f"forward takes one batch per teacher, [{self.num_teachers}, B, ...], got {tuple(x.shape)}; "
                "use forward_shared for one batch shown to all teachers"
            )
        return x

    @torch.no_grad()
    def votes(
        self, x: Tensor, labels: Tensor | None = None, threshold: float = 0.5, return_predictions: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Per record, how many teachers say "real": ``sigmoid(logit) > threshold``.

        Returns int64 counts ``[B]`` (PATE-GAN's n1; n0 = K - n1), and with
        ``return_predictions`` also the boolean per-teacher predictions ``[K, B]``.
        """
        predictions = torch.sigmoid(self.forward_shared(x, labels)) > threshold
        counts = predictions.sum(dim=0)
        return (counts, predictions) if return_predictions else counts

    def discriminator_loss(
        self, real: Tensor, real_labels: Tensor | None, fake: Tensor, fake_labels: Tensor | None
    ) -> Tensor:
        """Each teacher's binary cross-entropy, its own real batch ``real[k]`` labelled 1 and the
        shared generated batch ``fake`` labelled 0, SUMMED over teachers (see the module docstring)."""
        return summed_teacher_loss(self(real, real_labels), self.forward_shared(fake, fake_labels))

    def backward_in_chunks(
        self, real: Tensor, real_labels: Tensor | None, fake: Tensor, fake_labels: Tensor | None, loss_scale: float = 1.0
    ) -> Tensor:
        """:meth:`discriminator_loss` (detached), the gradients of ``loss_scale`` times it left in
        the parameters' ``.grad``, computed :attr:`train_chunk` teachers at a time (forms with
        :attr:`supports_chunked_training`)."""
        raise NotImplementedError(f"{type(self).__name__} trains all its teachers in one graph")

    @torch.no_grad()
    def keep_teachers(self, teachers: slice) -> None:
        """Keep only ``teachers`` of the K (this process's shard under DDP). Every parameter is
        stacked along the teacher dimension, so a shard is a slice of each."""
        for parameter in self.parameters():
            parameter.data = parameter.data[teachers].clone()
        self.num_teachers = next(self.parameters()).shape[0]
        for layer in self.modules():
            if isinstance(layer, BatchedLinear):
                layer.num_models = layer.total_models = self.num_teachers
                layer.kept = range(self.num_teachers)

    def make_optimizer(self, lr: float, betas: tuple[float, float] = (0.5, 0.999)) -> torch.optim.Adam:
        """One Adam over all teachers' stacked parameters.

        ``fused=True`` where the device supports it, else foreach. For K = 2000 teachers
        30 -> 64 -> 1 (4.1M stacked parameters) one step took 29 ms with CPU's default
        for-loop Adam, 11 ms foreach and 3.4 ms fused (one core); the issue saw 330 vs 28 ms.
        """
        params = list(self.parameters())
        try:
            return torch.optim.Adam(params, lr=lr, betas=betas, fused=True)
        except RuntimeError:
            return torch.optim.Adam(params, lr=lr, betas=betas, foreach=True)


class MLPTeacher(nn.Module):
    """One MLP teacher: flat record (+ one-hot label) -> hidden layers -> one logit.

    ``hidden=()`` is a single linear layer to the logit: logistic regression, PATE-GAN's
    "depth 1" teachers. The standalone form of one member of :class:`MLPTeacherEnsemble`.
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int] = (),
        num_classes: int | None = None,
        activation: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        widths = [in_features + (num_classes or 0), *hidden, 1]
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(widths))
        self.activation = activation if activation is not None else nn.LeakyReLU(0.2)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        h = concat_condition(torch.flatten(x, start_dim=1), labels, self.num_classes)
        for i, layer in enumerate(self.linears):
            h = layer(self.activation(h) if i else h)
        return h.squeeze(1)


#: one range of teachers in a pass over a shared batch: each layer's ``(weight, bias)`` for them
Part = list[tuple[Tensor, Tensor]]


class MLPTeacherEnsemble(TeacherEnsemble):
    """K MLP teachers as a stack of :class:`BatchedLinear` layers (the fast path for MLPs).

    The one-hot label is not concatenated to the input: its product with the first layer is a
    row of that layer's weight, which is gathered directly (same result, no ``[K, B, C]`` one-hot
    tensor). Records are flattened, so image-shaped data works too.

    On CPU, passes over a shared batch run over ranges of teachers whose hidden activations
    (``CPU_CHUNK_FLOATS``, 1 MiB) stay in cache: the elementwise ops between layers are
    memory-bound. With hidden width 64 and B = 64 a shared forward took 20 ms in ranges against
    105 ms in one pass at K = 4000 (about equal at K = 1000). Teachers without hidden layers and
    GPUs get one pass.
    """

    CPU_CHUNK_FLOATS = 1 << 18

    def __init__(
        self,
        num_teachers: int,
        in_features: int,
        hidden: Sequence[int] = (),
        num_classes: int | None = None,
        activation: nn.Module | None = None,
        keep: slice | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.num_classes = in_features, num_classes
        self.hidden = tuple(hidden)
        widths = [in_features + (num_classes or 0), *self.hidden, 1]
        self.layers = nn.ModuleList(BatchedLinear(num_teachers, a, b, keep) for a, b in pairwise(widths))
        self.num_teachers = self.layers[0].num_models
        self.activation = activation if activation is not None else nn.LeakyReLU(0.2)

    @classmethod
    def from_teachers(cls, teachers: Sequence[MLPTeacher]) -> MLPTeacherEnsemble:
        """Stack K :class:`MLPTeacher` (copies of their current parameters)."""
        first = teachers[0]
        widths = [layer.in_features for layer in first.linears]
        in_features = widths[0] - (first.num_classes or 0)
        ensemble = cls(len(teachers), in_features, widths[1:], first.num_classes, copy.deepcopy(first.activation))
        ensemble.layers = nn.ModuleList(
            BatchedLinear.from_modules([t.linears[i] for t in teachers]) for i in range(len(widths))
        )
        return ensemble

    def teacher(self, k: int) -> MLPTeacher:
        single = MLPTeacher(self.in_features, self.hidden, self.num_classes, copy.deepcopy(self.activation))
        single.linears = nn.ModuleList(layer.module(k) for layer in self.layers)
        return single

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        flat = self._check_teacher_dim(x).reshape(self.num_teachers, x.shape[1], -1)
        first = self.layers[0]
        h = torch.baddbmm(first.bias, flat, first.weight[:, : self.in_features])
        if self.num_classes:
            label_rows = self._label_weights()  # [K, C, H]
            index = self._check_labels(labels, x.shape[:2]).unsqueeze(-1).expand(-1, -1, label_rows.shape[-1])
            h = h + torch.gather(label_rows, 1, index)
        return self._rest(h)

    def forward_shared(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        flat, labels = x.reshape(x.shape[0], -1), self._shared_labels(labels, x.shape[0])
        return _cat([self._rest(self._first_layer_shared(flat, labels, part), part) for part in self._parts(x)])

    def input_gradients(
        self, x: Tensor, labels: Tensor | None = None, transform: Callable[[Tensor], Tensor] | None = None
    ) -> Tensor:
        """Back-propagate to the first layer's output, then multiply by its weight.

        Each logit ``[k, b]`` depends only on ``h[k, b]``, so the gradient of the summed logits
        w.r.t. ``h`` holds every per-teacher, per-record gradient, and
        ``d logit / d x = (d logit / d h) W_x^T``. No ``[K, B, in]`` copy of the input is made.
        """
        flat, labels = x.detach().reshape(x.shape[0], -1), self._shared_labels(labels, x.shape[0])
        parts = [self._input_gradients_part(flat, labels, part, transform) for part in self._parts(x)]
        return _cat(parts).reshape(self.num_teachers, *x.shape)

    def _input_gradients_part(
        self, flat: Tensor, labels: Tensor | None, part: Part, transform: Callable[[Tensor], Tensor] | None
    ) -> Tensor:
        with torch.enable_grad():
            h = self._first_layer_shared(flat, labels, part).detach().requires_grad_()
            logits = self._rest(h, part)
            (grad_h,) = torch.autograd.grad((logits if transform is None else transform(logits)).sum(), h)
        weight_x = part[0][0].detach()[:, : self.in_features]  # [k, in, H]
        # einsum rather than bmm: with H = 1 (logistic regression) it becomes a broadcast
        # multiply, 6x faster than bmm's K tiny [B, 1] x [1, in] products.
        return torch.einsum("kbh,kih->kbi", grad_h, weight_x)

    def _parts(self, x: Tensor) -> list[Part]:
        """The layers' ``(weight, bias)`` for each range of teachers of one pass over a shared
        batch (see the class docstring); one range, all K, on GPUs and without hidden layers."""
        if x.device.type != "cpu" or not self.hidden:
            return [[(layer.weight, layer.bias) for layer in self.layers]]
        size = max(1, self.CPU_CHUNK_FLOATS // (x.shape[0] * max(self.hidden)))
        return [list(layers) for layers in zip(*(layer.pieces(size) for layer in self.layers))]

    def _first_layer_shared(self, flat: Tensor, labels: Tensor | None, part: Part) -> Tensor:
        """First layer on one batch ``[B, in]`` for teachers ``part``, never copying the batch k times.

        Width 1 (logistic regression): one ``[B, in] @ [in, k]`` product. Wider: ``baddbmm`` over
        the batch expanded with stride 0, whose contiguous ``[k, B, H]`` output keeps the
        following elementwise ops fast (7x faster than the single product's transposed output
        at k = 128, H = 64; the single product is 6x faster at width 1).
        """
        first_weight, bias = part[0]
        weight = first_weight[:, : self.in_features]
        if self.layers[0].out_features == 1:
            h = torch.einsum("bi,kih->kbh", flat, weight) + bias
        else:
            h = torch.baddbmm(bias, flat.expand(weight.shape[0], *flat.shape), weight)
        if labels is not None:
            h = h + first_weight[:, self.in_features :].index_select(1, labels)
        return h

    def _shared_labels(self, labels: Tensor | None, batch_size: int) -> Tensor | None:
        return self._check_labels(labels, torch.Size([batch_size])) if self.num_classes else None

    def _label_weights(self) -> Tensor:
        """Rows of the first weight that multiply the one-hot label: ``[K, C, H]``."""
        return self.layers[0].weight[:, self.in_features :]

    @staticmethod
    def _check_labels(labels: Tensor | None, shape: torch.Size) -> Tensor:
        if labels is None:
            raise ValueError("these teachers are class-conditional: pass the class labels")
        if labels.shape != shape:
            raise ValueError(f"expected labels of shape {tuple(shape)}, got {tuple(labels.shape)}")
        return labels.long()

    def _rest(self, h: Tensor, part: Part | None = None) -> Tensor:
        """Layers after the first (activation, then batched linear), of all K or of the teachers
        of ``part``, to logits ``[k, B]``."""
        for index, layer in enumerate(self.layers[1:], start=1):
            h = layer(self.activation(h), None if part is None else part[index])
        return h.squeeze(-1)


def _cat(parts: list[Tensor]) -> Tensor:
    """Concatenate per-range results along the teacher dimension (no copy for a single range)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def summed_teacher_loss(real_logits: Tensor, fake_logits: Tensor) -> Tensor:
    """Each teacher's binary cross-entropy (its real batch labelled 1, the generated one 0, each
    averaged over its records), summed over the teachers of ``[K, B]`` logits."""
    bce = nn.functional.binary_cross_entropy_with_logits
    real_loss = bce(real_logits, torch.ones_like(real_logits), reduction="none").mean(1)
    fake_loss = bce(fake_logits, torch.zeros_like(fake_logits), reduction="none").mean(1)
    return (real_loss + fake_loss).sum()


class ConvTeacher(nn.Module):
    """G-PATE's MNIST teacher: strided conv (label as input planes) -> FC -> one logit.

    Defaults follow G-PATE (conv 32 x 5x5 stride 2, FC 256): about 1.6M parameters per 28x28
    teacher, so thousands of them (with Adam's two moments) need tens of GiB; smaller
    ``channels``/``hidden`` fit thousands of teachers on a CPU. No normalization layer, so the
    teacher is stateless (see :class:`VmapTeacherEnsemble`).
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int | None = None,
        channels: int = 32,
        kernel_size: int = 5,
        hidden: int = 256,
    ) -> None:
        super().__init__()
        in_channels, height, width = in_shape
        self.num_classes = num_classes
        padding = kernel_size // 2
        self.conv = nn.Conv2d(in_channels + (num_classes or 0), channels, kernel_size, stride=2, padding=padding)
        side = lambda n: (n + 2 * padding - kernel_size) // 2 + 1  # noqa: E731 - conv output size
        self.fc = nn.Linear(channels * side(height) * side(width), hidden)
        self.head = nn.Linear(hidden, 1)
        self.activation = nn.LeakyReLU(0.2)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        h = self.activation(conv_of_label_planes(self.conv, x, labels, self.num_classes))
        h = self.activation(self.fc(torch.flatten(h, start_dim=1)))
        return self.head(h).squeeze(1)


class VmapTeacherEnsemble(TeacherEnsemble):
    """Any stateless teacher architecture, K of them, via ``vmap(functional_call)``.

    ``make_teacher()`` builds one teacher ``module(x, labels=None) -> logits [B]``; it is called
    K times (K independent inits) and the parameters are stacked with ``stack_module_state``;
    ``keep`` (a DDP rank's contiguous shard) stacks only those teachers, initialised as in a build
    of all K.
    Stacked tensors are registered as parameters named after the teacher's (dots become ``-``).
    Teachers with buffers (BatchNorm running statistics) are refused: vmap cannot update them
    in place, and BatchNorm would mix records within a teacher's batch anyway.

    On CPU, passes over a shared batch (``forward_shared``, ``votes``, ``input_gradients``) run
    ``cpu_chunk_records // B`` teachers per vmap call: conv activations of all K teachers at
    once overflow the caches, and chunks of 8-16 teachers x 64 records were measured 3-4x
    faster than one whole-ensemble call. ``forward`` on the teachers' own (small) batches
    measured fastest unchunked, and GPUs always get the whole ensemble in one call.
    """

    def __init__(
        self,
        make_teacher: Callable[[], nn.Module],
        num_teachers: int,
        cpu_chunk_records: int | None = 1024,
        keep: slice | None = None,
    ) -> None:
        super().__init__()
        kept = kept_range(num_teachers, keep)
        # All K are made, in order, so the kept ones get the initial values they have in a build of
        # all K and the random stream ends where it would (a DDP rank's later draws match one
        # process's); the others are dropped at once, so memory holds only the kept ones.
        teachers = []
        for k in range(num_teachers):
            teacher = make_teacher()
            if k in kept:
                teachers.append(teacher)
        self._init_from(teachers, cpu_chunk_records)

    @classmethod
    def from_teachers(cls, teachers: Sequence[nn.Module], cpu_chunk_records: int | None = 1024) -> VmapTeacherEnsemble:
        """Stack the given teachers (copies of their current parameters)."""
        ensemble = cls.__new__(cls)
        nn.Module.__init__(ensemble)
        ensemble._init_from(teachers, cpu_chunk_records)
        return ensemble

    def _init_from(self, teachers: Sequence[nn.Module], cpu_chunk_records: int | None) -> None:
        if any(True for _ in teachers[0].buffers()):
            raise ValueError("VmapTeacherEnsemble needs stateless teachers (no buffers such as BatchNorm statistics)")
        self.num_teachers = len(teachers)
        self.num_classes = getattr(teachers[0], "num_classes", None)
        self.cpu_chunk_records = cpu_chunk_records
        stacked, _ = stack_module_state(list(teachers))
        self._names = list(stacked)
        self.stacked = nn.ParameterDict({_param_key(name): nn.Parameter(t.detach()) for name, t in stacked.items()})
        # Kept out of the module tree (a tuple), so its meta tensors never reach .parameters().
        self._skeleton = (copy.deepcopy(teachers[0]).to("meta"),)

    supports_chunked_training = True

    def _shared_chunk_size(self, x: Tensor) -> int | None:
        """Teachers per vmap call for a shared batch ``x`` (None: all at once): on CPU by
        ``cpu_chunk_records``; anywhere, at most :attr:`train_chunk` when that is set (the
        memory of one graph over all K is what it spares)."""
        sizes = [self.train_chunk] if self.train_chunk else []
        if x.device.type == "cpu" and self.cpu_chunk_records:
            sizes.append(max(1, self.cpu_chunk_records // max(1, x.shape[0])))
        return min(sizes) if sizes else None

    def _params(self, detach: bool = False) -> dict[str, Tensor]:
        params = {name: self.stacked[_param_key(name)] for name in self._names}
        return {name: p.detach() for name, p in params.items()} if detach else params

    def _call_one(self, params: dict[str, Tensor], x: Tensor, labels: Tensor | None) -> Tensor:
        return functional_call(self._skeleton[0], params, (x, labels))

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        self._check_teacher_dim(x)
        label_dim = None if labels is None else 0
        return vmap(self._call_one, in_dims=(0, 0, label_dim), randomness="different")(self._params(), x, labels)

    def forward_shared(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """Chunked by hand, not with vmap's ``chunk_size``: vmap slices each stacked parameter
        once per chunk, and each slice's backward fills a gradient of all K teachers, which made
        the teachers' update quadratic in K (24.7 s at K = 1000 preset-size conv teachers on 2 CPU
        cores). ``split`` cuts each parameter once, and its backward joins the chunks' gradients
        in one ``cat``."""
        return self._shared_pass(self._params(), x, labels)

    def _shared_pass(self, params: dict[str, Tensor], x: Tensor, labels: Tensor | None) -> Tensor:
        """Logits ``[k, B]`` of the teachers whose stacked parameters are ``params`` on one batch."""
        one_pass = vmap(self._call_one, in_dims=(0, None, None), randomness="different")
        chunk = self._shared_chunk_size(x)
        count = next(iter(params.values())).shape[0]
        if chunk is None or chunk >= count:
            return one_pass(params, x, labels)
        pieces = {name: p.split(chunk) for name, p in params.items()}
        chunks = [dict(zip(pieces, parts)) for parts in zip(*pieces.values())]
        return torch.cat([one_pass(part, x, labels) for part in chunks])

    def backward_in_chunks(
        self, real: Tensor, real_labels: Tensor | None, fake: Tensor, fake_labels: Tensor | None, loss_scale: float = 1.0
    ) -> Tensor:
        """:meth:`discriminator_loss` and its gradients, :attr:`train_chunk` teachers at a time.

        Each teacher's loss depends on its own parameters alone, so the gradient of the sum is,
        row by row, the gradient of each chunk's sum: computed with the chunk's rows of the
        stacked parameters as leaves (``autograd.grad``) and written into those rows of each
        parameter's ``.grad``. Only one chunk's activations are alive at a time: G-PATE's MNIST
        preset (2000 teachers, 821M parameters) needs ~31 GiB in one graph and 19.7 GB (the whole
        process, over a full run) in chunks of 136 teachers (measured on a CPU host). The gradients are those of
        ``loss_scale`` times the loss (a mixed-precision loss scale, as a scaled ``backward``
        would give, for the optimizer step to unscale). Returns the summed loss, detached.
        """
        self._check_teacher_dim(real)
        if not self.train_chunk:
            raise ValueError("backward_in_chunks needs train_chunk, the number of teachers per pass")
        params = self._params(detach=True)
        holders = {name: self.stacked[_param_key(name)] for name in params}
        fresh = {name: holder.grad is None for name, holder in holders.items()}
        for name, holder in holders.items():
            if fresh[name]:
                holder.grad = torch.empty_like(holder)  # every row is written below
        total = real.new_zeros(())
        own_labels = None if real_labels is None else 0
        for start in range(0, self.num_teachers, self.train_chunk):
            rows = slice(start, min(start + self.train_chunk, self.num_teachers))
            leaves = {name: p[rows].detach().requires_grad_() for name, p in params.items()}
            labels = None if real_labels is None else real_labels[rows]
            real_logits = vmap(self._call_one, in_dims=(0, 0, own_labels), randomness="different")(leaves, real[rows], labels)
            loss = summed_teacher_loss(real_logits, self._shared_pass(leaves, fake, fake_labels))
            for name, grad in zip(leaves, torch.autograd.grad(loss * loss_scale, list(leaves.values())), strict=True):
                target = holders[name].grad[rows]
                target.copy_(grad) if fresh[name] else target.add_(grad)
            total = total + loss.detach()
        return total

    def input_gradients(
        self, x: Tensor, labels: Tensor | None = None, transform: Callable[[Tensor], Tensor] | None = None
    ) -> Tensor:
        """``vmap(grad)`` over teachers; the shared input is not copied K times on the way in."""
        f = transform if transform is not None else (lambda logits: logits)

        def grad_one(params: dict[str, Tensor], inputs: Tensor) -> Tensor:
            return torch.func.grad(lambda z: f(self._call_one(params, z, labels)).sum())(inputs)

        chunk = self._shared_chunk_size(x)
        return vmap(grad_one, in_dims=(0, None), randomness="different", chunk_size=chunk)(
            self._params(detach=True), x.detach()
        )

    def teacher(self, k: int) -> nn.Module:
        device = next(iter(self.stacked.values())).device
        single = copy.deepcopy(self._skeleton[0]).to_empty(device=device)
        single.load_state_dict({name: p[k] for name, p in self._params(detach=True).items()})
        return single


def _param_key(name: str) -> str:
    """A teacher's parameter name as a ParameterDict key (which may not contain dots)."""
    return name.replace(".", "-")


def teacher_arch(arch: str, data_shape: Sequence[int]) -> str:
    """``arch`` with ``"auto"`` resolved: ``"mlp"`` for flat records, ``"conv"`` for (C, H, W) images."""
    return ("mlp" if len(data_shape) == 1 else "conv") if arch == "auto" else arch


def build_teacher_ensemble(
    num_teachers: int,
    data_shape: Sequence[int],
    num_classes: int | None = None,
    arch: str = "auto",
    keep: slice | None = None,
    **kwargs: object,
) -> TeacherEnsemble:
    """The teacher ensemble for records of ``data_shape``, in the faster batched form.

    ``keep``: only these of the K teachers (a DDP rank's contiguous shard), with the initial
    values a build of all K gives them, built without ever holding the others.

    ``arch="auto"`` takes ``"mlp"`` for flat records and ``"conv"`` for (C, H, W) images.
    ``kwargs`` go to the teacher: ``hidden``/``activation`` (MLP) or
    ``channels``/``kernel_size``/``hidden`` (:class:`ConvTeacher`).

    Which form, by measurement (``benchmarks/teacher_ensemble.py``, 2 CPU cores, torch 2.13,
    machine otherwise idle; median ms of one step = votes on a shared batch of 64 +
    input-gradients on 64 + the teachers' training step (each on its own 8 records labelled real
    and the shared 64 labelled generated) with one fused Adam; the loop gets the same fused Adam;
    loop at K = 4000 timed on 1000 teachers and scaled; freed memory kept, see
    :mod:`lightning_dpgan.host_memory`):

    ====================================  ======  ==========  ========  =======
    teachers                              K       batched     loop      speedup
    ====================================  ======  ==========  ========  =======
    MLP 30 -> 1 (logistic regression)     100     0.6         13.6      24x
    MLP 30 -> 1                           1000    1.2         140       116x
    MLP 30 -> 1                           4000    3.6         584       161x
    MLP 30 -> 64 -> 1                     100     2.4         26        11x
    MLP 30 -> 64 -> 1                     1000    23          300       13x
    MLP 30 -> 64 -> 1                     4000    102         1198      12x
    conv 1x28x28, 8x5x5/2, FC 32 (vmap)   100     107         200       1.9x
    conv (vmap)                           1000    1037        2076      2.0x
    conv (vmap)                           4000    4142        8806      2.1x
    ====================================  ======  ==========  ========  =======

    - ``"mlp"`` -> :class:`MLPTeacherEnsemble` (``BatchedLinear``). :class:`VmapTeacherEnsemble`
      over the same :class:`MLPTeacher` measured 45 ms a step at K = 1000 (2.5 ms batched) for
      30 -> 1, and 90 ms (27 ms batched) for 30 -> 64 -> 1.
    - ``"conv"`` -> :class:`VmapTeacherEnsemble` over :class:`ConvTeacher`, with shared-batch
      passes chunked on CPU: about 2x a loop. That is the CPU's limit, not the batching's: each conv
      teacher already does enough work per call to keep the loop busy (~25 GFLOP/s on one core),
      and batched updates are bound by memory traffic over K stacked FC weights. Unchunked vmap
      over all teachers was slower than the loop for votes (1210 vs 350-460 ms at K = 1000).
    - On a GPU (H100; the update then on own records only) both forms win far more: MLP 30 -> 1 306x a loop at
      K = 1000, small conv teachers 145x; G-PATE's paper-size conv teachers (32 channels, FC 256)
      20-24x, where a loop of such teachers already keeps the GPU busy (benchmarks/RESULTS.md).
    """
    arch = teacher_arch(arch, data_shape)
    if arch == "mlp":
        return MLPTeacherEnsemble(num_teachers, math.prod(data_shape), num_classes=num_classes, keep=keep, **kwargs)  # type: ignore[arg-type]
    if arch == "conv":
        return VmapTeacherEnsemble(lambda: ConvTeacher(data_shape, num_classes, **kwargs), num_teachers, keep=keep)  # type: ignore[arg-type]
    raise ValueError(f"unknown teacher arch {arch!r}: use 'auto', 'mlp' or 'conv'")


__all__ = [
    "BatchedLinear",
    "ConvTeacher",
    "MLPTeacher",
    "MLPTeacherEnsemble",
    "TeacherEnsemble",
    "VmapTeacherEnsemble",
    "build_teacher_ensemble",
    "teacher_arch",
    "summed_teacher_loss",
]
