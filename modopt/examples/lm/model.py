"""A small decoder-only transformer in Equinox: pre-norm blocks, causal attention with rotary
positions, an untied (or tied) output head.

Weights are `eqx.nn.Linear`s, stored `(out, in)` as Equinox does; the Muon family is told so
(`recipes.muon_dimensions`). The model maps one sequence of token indices `(T,)` to logits
`(T, vocab)`; `loss` averages the next-token cross-entropy of a batch.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

# Model sizes by name: `small` (the default) finishes in minutes on a laptop CPU, `micro` and
# `tiny` are for the tests and the benchmark, `medium` (nanoGPT's character-level Shakespeare
# model) for an accelerator.
SIZES = {
    "micro": {"width": 32, "layers": 1, "heads": 2, "context": 16, "batch": 8},
    "tiny": {"width": 64, "layers": 2, "heads": 4, "context": 64, "batch": 32},
    "small": {"width": 128, "layers": 4, "heads": 4, "context": 64, "batch": 32},
    "medium": {"width": 384, "layers": 6, "heads": 6, "context": 256, "batch": 64},
}


class RMSNorm(eqx.Module):
    weight: jax.Array
    eps: float = eqx.field(static=True, default=1e-6)

    def __init__(self, width: int):
        self.weight = jnp.ones(width)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * self.weight).astype(x.dtype)


def _apply(layer: eqx.nn.Linear, x: jax.Array) -> jax.Array:
    """`layer` on every row of `x` (no bias: the model's linears have none)."""
    return x @ layer.weight.T


def rotary(x: jax.Array) -> jax.Array:
    """Rotary position embedding (Su et al. 2021) of `x`, `(T, heads, head_width)`: each pair of
    features `(i, i + half)` rotated by position times `10000^(-i / half)`."""
    positions = jnp.arange(x.shape[0], dtype=jnp.float32)
    half = x.shape[-1] // 2
    frequencies = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[:, None] * frequencies  # (T, half)
    cos, sin = jnp.cos(angles)[:, None, :].astype(x.dtype), jnp.sin(angles)[:, None, :].astype(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


class Attention(eqx.Module):
    query: eqx.nn.Linear
    key: eqx.nn.Linear
    value: eqx.nn.Linear
    output: eqx.nn.Linear
    heads: int = eqx.field(static=True)

    def __init__(self, width: int, heads: int, *, key: jax.Array):
        keys = jax.random.split(key, 4)
        self.query, self.key, self.value, self.output = (
            eqx.nn.Linear(width, width, use_bias=False, key=k) for k in keys
        )
        self.heads = heads

    def __call__(self, x: jax.Array) -> jax.Array:
        length, width = x.shape
        split = lambda y: y.reshape(length, self.heads, width // self.heads)  # noqa: E731
        q, k, v = rotary(split(_apply(self.query, x))), rotary(split(_apply(self.key, x))), split(_apply(self.value, x))
        scores = jnp.einsum("thd,shd->hts", q, k).astype(jnp.float32) / math.sqrt(width // self.heads)
        causal = jnp.tril(jnp.ones((length, length), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1).astype(x.dtype)
        return _apply(self.output, jnp.einsum("hts,shd->thd", weights, v).reshape(length, width))


class Block(eqx.Module):
    attention_norm: RMSNorm
    attention: Attention
    mlp_norm: RMSNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, width: int, heads: int, *, key: jax.Array):
        keys = jax.random.split(key, 3)
        self.attention_norm, self.mlp_norm = RMSNorm(width), RMSNorm(width)
        self.attention = Attention(width, heads, key=keys[0])
        self.up = eqx.nn.Linear(width, 4 * width, use_bias=False, key=keys[1])
        self.down = eqx.nn.Linear(4 * width, width, use_bias=False, key=keys[2])

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attention(self.attention_norm(x))
        return x + _apply(self.down, jax.nn.gelu(_apply(self.up, self.mlp_norm(x))))


class Transformer(eqx.Module):
    embedding: eqx.nn.Embedding
    blocks: list[Block]
    norm: RMSNorm
    head: eqx.nn.Linear | None  # None: tied to the embedding

    def __init__(self, vocab_size: int, width: int, layers: int, heads: int, *, tied: bool = False, key: jax.Array):
        if width % heads or (width // heads) % 2:
            raise ValueError(f"width {width} must split into {heads} heads of an even width")
        keys = jax.random.split(key, layers + 2)
        self.embedding = eqx.nn.Embedding(weight=0.02 * jax.random.normal(keys[0], (vocab_size, width)))
        self.blocks = [Block(width, heads, key=k) for k in keys[2:]]
        self.norm = RMSNorm(width)
        self.head = None if tied else eqx.nn.Linear(width, vocab_size, use_bias=False, key=keys[1])

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embedding.weight[tokens]
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        head = self.embedding.weight if self.head is None else self.head.weight
        return (x @ head.T).astype(jnp.float32)


def make_model(vocab_size: int, size: str, seed: int, *, tied: bool = False) -> Transformer:
    config = SIZES[size]
    return Transformer(vocab_size, config["width"], config["layers"], config["heads"], tied=tied, key=jax.random.key(seed))


def loss(model: Transformer, batch: jax.Array) -> jax.Array:
    """The mean next-token cross-entropy (nats) of `batch`, `(B, T + 1)` token indices."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = jax.vmap(model)(inputs)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))
