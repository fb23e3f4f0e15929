"""Block-wise 8-bit quantization of arrays: `quantize_blockwise` and `QuantizedArray`.

An array is cut into blocks of `block_size` consecutive elements; each block is stored as one
byte per element (an index into a fixed table of 256 values in [-1, 1]) and one float32 scale,
the largest magnitude in the block. Dequantizing multiplies the table value by the scale.

Two tables exist for each kind of quantization, as in the 8-bit optimizers of Dettmers et
al.: a signed one for blocks holding negative numbers and an unsigned one, with twice the
resolution, for blocks of numbers >= 0 (a second moment). The table of each block is chosen
from its contents, so no one needs to declare which state is nonnegative.

- "dynamic" (dynamic tree quantization): values `10**-e * f`, an exponent `e` in 0..6 and a
  linear fraction `f` in (0.1, 1) whose resolution grows with the magnitude, plus 0 and 1.
  Small and large numbers of a block both keep about two significant digits; this is the
  table of bitsandbytes' 8-bit optimizers (`create_dynamic_map`).
- "linear": 256 evenly spaced values on [0, 1] (unsigned) or 255 on [-1, 1] (signed, zero
  included).

Reference: Dettmers, Lewis, Shleifer and Zettlemoyer, 2022, "8-bit Optimizers via Block-wise
Quantization", https://arxiv.org/abs/2110.02861
"""

from __future__ import annotations

import functools
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._core.module import Module

QUANTIZATIONS = ("dynamic", "linear")


def dynamic_map(signed: bool) -> np.ndarray:
    """The 256 values of dynamic tree quantization, sorted, as float32.

    For `i = 0..6` the values `10**(i - 6) * c` with `c` the centres of `n` equal bins of
    [0.1, 1], `n = 2**i` (signed: each also negated) or `2**(i + 1)` (unsigned); then 0 and 1.
    Computed in float64 and rounded once.

    Args:
        signed: whether the table covers [-1, 1] (else [0, 1]).
    """
    values = [0.0, 1.0]
    for i in range(7):
        bins = 2**i if signed else 2 ** (i + 1)
        edges = np.linspace(0.1, 1.0, bins + 1)
        centres = 10.0 ** (i - 6) * (edges[:-1] + edges[1:]) / 2
        values += [*centres, *(-centres if signed else [])]
    return np.sort(np.asarray(values, np.float64)).astype(np.float32)


def linear_map(signed: bool) -> np.ndarray:
    """The 256 values of linear quantization, sorted, as float32.

    Unsigned: 256 evenly spaced values on [0, 1]. Signed: 255 evenly spaced values on [-1, 1]
    (zero among them) and zero once more, so that zero is exact and the table still has 256
    entries (as bitsandbytes' `create_linear_map`).

    Args:
        signed: whether the table covers [-1, 1] (else [0, 1]).
    """
    if not signed:
        return np.linspace(0.0, 1.0, 256).astype(np.float32)
    return np.sort(np.append(np.linspace(-1.0, 1.0, 255), 0.0)).astype(np.float32)


def _tables(quantization: str) -> tuple[np.ndarray, np.ndarray]:
    """The values and the decision thresholds of both tables, side by side (512 entries each):
    the signed table at offset 0, the unsigned one at 256. A value is coded by the number of
    thresholds of its table below it: the index of the nearest table value (a tie goes down)."""
    make = dynamic_map if quantization == "dynamic" else linear_map
    values, thresholds = [], []
    for signed in (True, False):
        table = make(signed).astype(np.float64)
        values.append(table)
        thresholds.append(np.append((table[:-1] + table[1:]) / 2, np.inf))
    return np.concatenate(values).astype(np.float32), np.concatenate(thresholds).astype(np.float32)


_TABLES = {name: _tables(name) for name in QUANTIZATIONS}
_UNSIGNED = 256  # the offset of the unsigned table


def block_layout(shape: tuple[int, ...], block_size: int) -> tuple[tuple[int, ...], int]:
    """How an array of `shape` is cut into blocks: `(lead, length)`.

    Blocks run along the flattened trailing axes: the fewest trailing axes whose sizes
    multiply to at least `block_size` (all of them if none do) are merged into one axis of
    `length` elements, cut into `ceil(length / block_size)` blocks (the last one may be
    shorter). The leading axes `lead` are kept, so an array has `(*lead, blocks)` scales.
    For a vector, or a last axis that is a multiple of `block_size`, these are exactly the
    blocks of the array flattened (bitsandbytes' blocks).

    Args:
        shape: the array's shape.
        block_size: the number of elements of a block.
    """
    merged = 0
    length = 1
    while merged < len(shape) and length < block_size:
        merged += 1
        length *= shape[-merged]
    return tuple(shape[: len(shape) - merged]), length


class QuantizedArray(Module):
    """An array stored in 8 bits per element, block-wise (made by `quantize_blockwise`).

    Args:
        codes: one `uint8` per element, with the array's shape: the index of the element's
            value in its block's table (sorted, 256 values in [-1, 1]).
        scales: one `float32` per block, shape `(*lead, blocks)` (see `block_layout`): the
            largest magnitude in the block, negated for a block coded with the signed table
            (one holding a negative number).
        dtype: the dtype `dequantize` returns (static).
        block_size: the number of elements of a block (static).
        quantization: the tables' kind, "dynamic" or "linear" (static).
    """

    codes: jax.Array
    scales: jax.Array
    dtype: Any = eqx.field(static=True)
    block_size: int = eqx.field(static=True)
    quantization: str = eqx.field(static=True)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the array stored."""
        return tuple(self.codes.shape)

    def dequantize(self) -> jax.Array:
        """The array stored: each element's table value times its block's scale.

        An array kept in host memory (an optimizer made with `state_memory_kind="pinned_host"`)
        is read on its devices: the result is in their own memory, the `QuantizedArray` stays
        where it is.
        """
        codes, scales = _in_device_memory(self.codes), _in_device_memory(self.scales)
        return _dequantize(codes, scales, self.block_size, self.quantization, self.dtype)


def _in_device_memory(x: jax.Array) -> jax.Array:
    """`x`, or a copy of it in its devices' own memory where it is kept in host memory
    (XLA computes on device memory only)."""
    if isinstance(x, jax.core.Tracer):
        space = getattr(jax.typeof(x), "memory_space", None)
        return x if space != jax.memory.Space.Host else jax.device_put(x, jax.memory.Space.Device)
    sharding = getattr(x, "sharding", None)
    if getattr(sharding, "memory_kind", None) in (None, "device"):
        return x
    return jax.device_put(x, sharding.with_memory_kind("device"))


def quantize_blockwise(x: Any, block_size: int = 256, quantization: str = "dynamic") -> QuantizedArray:
    """Stores a real floating array in 8 bits per element, block by block.

    Each block of `block_size` elements (along the flattened trailing axes, see
    `block_layout`) is divided by its largest magnitude and each element coded as the nearest
    value of a table of 256 (a tie goes to the smaller value): the signed table if the block
    holds a negative number, else the unsigned one (twice the resolution). Dequantized, an
    element is off by at most half a table step times the block's largest magnitude.
    Quantizing works in float32; `dequantize` returns `x`'s dtype.

    Non-finite elements do not enter the scale (the block's largest *finite* magnitude): `inf`
    and `-inf` come back as plus or minus that magnitude, `NaN` as 0, and the other elements
    of the block as they would without them.

    Args:
        x: the array, of a real floating dtype.
        block_size: the number of elements of a block (an integer >= 1).
        quantization: "dynamic" (dynamic tree quantization, bitsandbytes' table) or "linear".

    Example:
        >>> x = jnp.linspace(-1.0, 1.0, 1000)
        >>> q = modopt.quantize_blockwise(x)
        >>> q.codes.dtype, q.scales.shape, float(jnp.max(jnp.abs(q.dequantize() - x))) < 0.01
        (dtype('uint8'), (4,), True)

    Reference: Dettmers et al., 2022, "8-bit Optimizers via Block-wise Quantization",
    https://arxiv.org/abs/2110.02861
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"quantize_blockwise takes a real floating array, got dtype {x.dtype}.")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"Invalid quantization: {quantization!r} (must be one of {QUANTIZATIONS}).")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"Invalid block_size: {block_size!r} (must be an integer >= 1).")
    codes, scales = _quantize(x, block_size, quantization)
    return QuantizedArray(
        codes=codes,
        scales=scales,
        dtype=np.dtype(x.dtype),
        block_size=block_size,
        quantization=quantization,
    )


# Compiled once per shape: eager callers (an optimizer's init) would otherwise compile each of
# its operations on its own. Inside a traced step the call is inlined.
@functools.partial(jax.jit, static_argnums=(1, 2))
def _quantize(x: jax.Array, block_size: int, quantization: str) -> tuple[jax.Array, jax.Array]:
    """The codes and scales of `quantize_blockwise`."""
    _, thresholds = _TABLES[quantization]
    lead, length = block_layout(x.shape, block_size)
    blocks = math.ceil(length / block_size)
    values = _in_blocks(x.astype(jnp.float32).reshape(*lead, length), blocks, block_size)
    # The scale is the largest finite magnitude: an `inf` or `NaN` element is coded alone (as
    # +-1, the scale, or as 0) and leaves the rest of its block as it would be without it.
    finite = jnp.isfinite(values)
    absmax = jnp.max(jnp.where(finite, jnp.abs(values), 0), axis=-1)
    signed = jnp.any(values < 0, axis=-1)
    # Scaled by the reciprocal, as bitsandbytes does; an all-zero block stays zero.
    normalized = jnp.clip(values * (1 / jnp.where(absmax > 0, absmax, 1))[..., None], -1, 1)
    normalized = jnp.where(jnp.isnan(values), 0, normalized)
    codes = _nearest(jnp.asarray(thresholds), signed[..., None], normalized, quantization)
    codes = codes.reshape(*lead, blocks * block_size)[..., :length].reshape(x.shape)
    return codes.astype(jnp.uint8), jnp.where(signed, -absmax, absmax)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _dequantize(codes: jax.Array, scales: jax.Array, block_size: int, quantization: str, dtype: Any) -> jax.Array:
    """The array a `QuantizedArray` stores."""
    values, _ = _TABLES[quantization]
    lead, length = block_layout(codes.shape, block_size)
    blocks = scales.shape[-1]
    in_blocks = _in_blocks(codes.reshape(*lead, length), blocks, block_size)
    offset = jnp.where(scales < 0, 0, _UNSIGNED)[..., None]
    found = jnp.asarray(values)[offset + in_blocks.astype(jnp.int32)] * jnp.abs(scales)[..., None]
    found = found.reshape(*lead, blocks * block_size)[..., :length]
    return found.reshape(codes.shape).astype(dtype)


def _in_blocks(flat: jax.Array, blocks: int, block_size: int) -> jax.Array:
    """`(*lead, length)` as `(*lead, blocks, block_size)`, the last block padded with zeros."""
    pad = blocks * block_size - flat.shape[-1]
    if pad:
        flat = jnp.pad(flat, [(0, 0)] * (flat.ndim - 1) + [(0, pad)])
    return flat.reshape(*flat.shape[:-1], blocks, block_size)


def _nearest(thresholds: jax.Array, signed: jax.Array, x: jax.Array, quantization: str) -> jax.Array:
    """The index of the table entry nearest each `x` in [-1, 1] (the number of the table's
    thresholds below it), signed table where `signed`.

    The entries just below and above `x` are found by arithmetic from the tables' structure
    (`_below_dynamic`, `_below_linear`), and one threshold decides between them: one table
    lookup per element instead of a binary search's eight.
    """
    below = (_below_dynamic if quantization == "dynamic" else _below_linear)(x, signed)
    return below + (thresholds[jnp.where(signed, 0, _UNSIGNED) + below] < x)


def _below_dynamic(x: jax.Array, signed: jax.Array) -> jax.Array:
    """The index `k` in the dynamic table such that the nearest entry to `x` is `k` or `k + 1`.

    An entry of magnitude `10**(i - 6) * (0.1 + 0.9 * (j + 0.5) / n_i)` (`n_i = n_0 * 2**i` bins
    in decade `i`, `n_0 = 1` signed, 2 unsigned) has rank `n_0 * (2**i - 1) + j` among the
    magnitudes; the decade of `|x|` is found by comparisons, the bin by a floor. A decade off by
    one at its edge still brackets `x` (the bin is clipped to the decade's ends).
    """
    magnitude = jnp.abs(x)
    first = jnp.where(signed, 1, 2)
    decade = jnp.zeros(x.shape, jnp.int32)
    scale = jnp.full(x.shape, 1e6, jnp.float32)  # 10**(6 - decade): the decade's magnitudes in [0.1, 1]
    for i in range(1, 7):
        above = magnitude >= np.float32(10.0 ** (i - 7))
        decade = decade + above
        scale = jnp.where(above, np.float32(10.0 ** (6 - i)), scale)
    bins = first << decade
    position = (magnitude * scale - 0.1) * (bins.astype(jnp.float32) / 0.9) - 0.5
    rank = first * ((1 << decade) - 1) + jnp.clip(jnp.floor(position), -1, bins - 1).astype(jnp.int32)
    # Signed: 127 negative entries (the largest magnitude first), zero at 127, positive ones and
    # 1 above it. Unsigned: zero at 0, then the entries by rank (rank -1: zero itself).
    positive = jnp.where(signed, 128, 1) + rank
    return jnp.where(x < 0, 125 - jnp.minimum(rank, 125), positive)


def _below_linear(x: jax.Array, signed: jax.Array) -> jax.Array:
    """The index `k` in the linear table such that the nearest entry to `x` is `k` or `k + 1`.

    Unsigned: `k / 255` at `k`. Signed: `-1 + 2 * k / 254` at `k` up to 127 (zero), zero again at
    128 and `(k - 128) * 2 / 254` above.
    """
    unsigned = jnp.clip(jnp.floor(x * 255), 0, 254)
    negative = jnp.clip(jnp.floor((x + 1) * 127), 0, 126)
    positive = jnp.clip(jnp.floor(x * 127), 0, 126) + 128
    return jnp.where(signed, jnp.where(x <= 0, negative, positive), unsigned).astype(jnp.int32)
