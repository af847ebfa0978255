"""DP-SACTGAN's self-attention generator and discriminator (Li & Wang 2023, arXiv:2312.13031).

What the paper fixes (section 4.3, its Figure 6 is not in the text we have): the generator and
discriminator use self-attention ("the self-attention mechanism in providing global information
integration") and "we have opted for layer normalization as the choice for normalization layers",
because "each data point in tabular data is relatively independent, requiring individual
computation and processing". It gives no layer sizes, head counts or depth; the choices below
are ours and kept small.

Tokens. A record is one flat vector, so we make tokens with a learned projection: a Linear maps
the input to ``tokens * token_dim`` features, reshaped to ``(tokens, token_dim)``. Each token has
its own weight rows, so tokens are distinct without a positional embedding, and each can pick up
any mix of columns; attention then lets every token read every other, which is the "global
information integration" across columns the paper credits for its correlation scores. (One
token per column would need the column layout, which the discriminator API -- ``data_dim`` --
does not carry, and would make the sequence length data-dependent.)

Block (pre-norm Transformer encoder): ``x + Attn(LN(x))`` then ``x + FF(LN(x))``, and a final
LayerNorm before the head. Pre-norm trains without learning-rate warm-up (Xiong et al. 2020);
GAN recipes run Adam at a constant rate from the first step. Defaults: 8 tokens of width 32 (256 features, the width of
CTGAN's hidden layers), 4 heads, 2 blocks, feed-forward width 64.

The auxiliary classifier (:class:`~lightning_dpgan.nets.ctgan.AuxiliaryMLP`, shared with
CTAB-GAN+) is re-exported here with the networks it trains beside.

DP. Attention is written from ``nn.Linear`` layers and tensor ops, batch first, so Opacus'
GradSampleModule computes per-sample gradients with its Linear and LayerNorm samplers. (Opacus
1.6's ``DPMultiheadAttention`` mis-orders heads and positions with ``batch_first=True``,
opacus PR #825, and with ``batch_first=False`` its Linears see the sequence, not the batch, in
dimension 0.) Attention mixes tokens *within* a record, never across the batch. Plain matmul
and softmax (not ``scaled_dot_product_attention``, whose fused CUDA kernels have no double
backward) keep WGAN-GP's gradient penalty available on every device.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from lightning_dpgan.nets.ctgan import (
    AuxiliaryMLP,
    Span,
    SpanGenerator,
    check_pac,
    concat_cond_vector,
    pack_records,
    spans_width,
    validate_spans,
)

__all__ = ["AuxiliaryMLP", "LinearSelfAttention", "SACTGANDiscriminator", "SACTGANGenerator", "SelfAttentionBlock", "TokenEncoder"]


class LinearSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention over ``(batch, tokens, dim)``, built from ``nn.Linear``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"token_dim={dim} must be divisible by heads={heads}")
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, tokens, dim = x.shape
        return x.view(batch, tokens, self.heads, dim // self.heads).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (self._split_heads(proj(x)) for proj in (self.query, self.key, self.value))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(x.shape))


class SelfAttentionBlock(nn.Module):
    """Pre-norm Transformer encoder block: ``x + Attn(LN(x))``, then ``x + FF(LN(x))``."""

    def __init__(self, dim: int, heads: int, ff_dim: int, activation: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(dim), LinearSelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(nn.Linear(dim, ff_dim), activation(), nn.Linear(ff_dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.feed_forward(self.norm2(x))


class TokenEncoder(nn.Module):
    """Flat vector -> ``tokens`` learned tokens -> ``depth`` attention blocks -> LayerNorm -> flat vector."""

    def __init__(
        self, in_features: int, tokens: int, token_dim: int, heads: int, depth: int, ff_dim: int, activation: Callable[[], nn.Module]
    ) -> None:
        super().__init__()
        self.tokens, self.token_dim = tokens, token_dim
        self.embed = nn.Linear(in_features, tokens * token_dim)
        self.blocks = nn.Sequential(*(SelfAttentionBlock(token_dim, heads, ff_dim, activation) for _ in range(depth)))
        self.norm = nn.LayerNorm(token_dim)
        self.out_features = tokens * token_dim

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.embed(x).view(x.shape[0], self.tokens, self.token_dim)
        return torch.flatten(self.norm(self.blocks(tokens)), start_dim=1)


class SACTGANGenerator(SpanGenerator):
    """(z, cond) -> token encoder (ReLU feed-forward) -> Linear -> span activations.

    Same interface and output conventions as :class:`~lightning_dpgan.nets.ctgan.CTGANGenerator`
    (``logits``, ``activate``, ``forward``; see :class:`~lightning_dpgan.nets.ctgan.SpanGenerator`):
    tanh / Gumbel-softmax per span, hard one-hot Gumbel-max samples in eval mode.
    """

    def __init__(
        self,
        latent_dim: int,
        cond_dim: int,
        spans: Sequence[Span],
        tokens: int = 8,
        token_dim: int = 32,
        heads: int = 4,
        depth: int = 2,
        ff_dim: int = 64,
        tau: float = 0.2,
    ) -> None:
        super().__init__()
        self.latent_dim, self.cond_dim, self.tau = latent_dim, cond_dim, tau
        self.spans = validate_spans(spans)
        self.data_dim = spans_width(self.spans)
        self.encoder = TokenEncoder(latent_dim + cond_dim, tokens, token_dim, heads, depth, ff_dim, nn.ReLU)
        self.head = nn.Linear(self.encoder.out_features, self.data_dim)

    def logits(self, z: Tensor, cond: Tensor | None = None) -> Tensor:
        """The raw pre-activation record, ``(batch, data_dim)``."""
        return self.head(self.encoder(concat_cond_vector(z, cond, self.cond_dim)))


class SACTGANDiscriminator(nn.Module):
    """Packs of ``pac`` (record + cond) rows -> token encoder (LeakyReLU(0.2) feed-forward) -> Dropout -> Linear -> score.

    Returns ``(batch // pac,)`` scores. LayerNorm only (no BatchNorm), attention inside a
    record: Opacus-compatible, with a record as the sample when ``pac=1``.
    """

    def __init__(
        self,
        data_dim: int,
        cond_dim: int,
        tokens: int = 8,
        token_dim: int = 32,
        heads: int = 4,
        depth: int = 2,
        ff_dim: int = 64,
        pac: int = 1,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        check_pac(pac)
        self.data_dim, self.cond_dim, self.pac = data_dim, cond_dim, pac
        leaky = lambda: nn.LeakyReLU(0.2)  # noqa: E731 - a factory, like the nn classes
        self.encoder = TokenEncoder(pac * (data_dim + cond_dim), tokens, token_dim, heads, depth, ff_dim, leaky)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(self.encoder.out_features, 1)

    def forward(self, x: Tensor, cond: Tensor | None = None) -> Tensor:
        rows = concat_cond_vector(torch.flatten(x, start_dim=1), cond, self.cond_dim)
        return self.head(self.dropout(self.encoder(pack_records(rows, self.pac)))).squeeze(1)
