"""What a checkpoint holds of each item, independent of Orbax: one record per pytree leaf.

An item (a model, a `modopt.Optimizer`, a Flax TrainState, any pytree) is flattened with its
paths. Each leaf gets a JSON-able record saying how it is stored:

- `array`: written by Orbax, with shape, dtype and a checksum of its bytes;
- `key`: a typed PRNG key, written as its `uint32` key data, with the key implementation;
- `empty`: an array with no elements (Orbax rejects those): only its shape and dtype;
- `value`: a Python number or bool, kept in the JSON record itself;
- `static`: anything else (functions, strings): not written; restore takes it from the target.

The checksum is computed on the device, so sharded arrays are never gathered for it, and it
does not depend on how the array is sharded: a checkpoint verifies on any mesh.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored as asked: corrupted, garbled, or for another target."""


@dataclasses.dataclass
class Leaf:
    """How one leaf is stored, and (at save time) the array written for it."""

    path: str
    kind: str  # "array", "key", "empty", "value" or "static"
    shape: tuple[int, ...] = ()
    dtype: str = ""
    impl: str = ""  # for keys
    value: Any = None  # for values
    checksum: str = ""  # for arrays and keys, once computed
    data: Any = None  # the array to write (not in the record)

    def record(self) -> dict:
        record = {"path": self.path, "kind": self.kind}
        if self.kind in ("array", "key", "empty"):
            record.update(shape=list(self.shape), dtype=self.dtype)
        if self.kind == "key":
            record["impl"] = self.impl
        if self.kind == "value":
            record["value"] = self.value
        if self.checksum:
            record["checksum"] = self.checksum
        return record

    def describe(self) -> str:
        if self.kind == "static":
            return "a non-array leaf"
        if self.kind == "value":
            return f"the value {self.value!r}"
        return f"{'a PRNG key' if self.kind == 'key' else 'an array'} of shape {tuple(self.shape)} and dtype {self.dtype}"


def leaves_of(item: Any) -> list[Leaf]:
    """The records of `item`'s leaves, with the arrays to write."""
    return [_leaf(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(item)[0]]


def _leaf(path: str, x: Any) -> Leaf:
    if isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        shape = tuple(x.shape)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = None if isinstance(x, jax.ShapeDtypeStruct) else jax.random.key_data(x)
            impl = str(jax.random.key_impl(x)) if not isinstance(x, jax.ShapeDtypeStruct) else ""
            return Leaf(path, "key", shape, "key", impl=impl, data=data)
        kind = "empty" if 0 in shape else "array"
        return Leaf(path, kind, shape, np.dtype(x.dtype).name, data=x if kind == "array" else None)
    if isinstance(x, (bool, int, float)):
        return Leaf(path, "value", value=x)
    return Leaf(path, "static")


def from_record(record: dict) -> Leaf:
    return Leaf(
        record["path"],
        record["kind"],
        tuple(record.get("shape", ())),
        record.get("dtype", ""),
        record.get("impl", ""),
        record.get("value"),
        record.get("checksum", ""),
    )


def _signature(leaf: Leaf) -> tuple:
    """What must agree between a saved leaf and its target (not a number's value)."""
    if leaf.kind in ("value", "static"):
        return (leaf.kind,)
    return ("key" if leaf.kind == "key" else "array", tuple(leaf.shape), leaf.dtype)


def first_mismatch(saved: list[Leaf], target: list[Leaf]) -> str | None:
    """Where the target's leaves depart from the checkpoint's, in words; `None` if they agree."""
    for s, t in zip(saved, target):
        if s.path != t.path:
            return f"the checkpoint has a leaf at {s.path} where the target has one at {t.path}"
        if _signature(s) != _signature(t):
            return f"at {s.path} the checkpoint has {s.describe()}, the target {t.describe()}"
    if len(saved) != len(target):
        n = min(len(saved), len(target))
        which, longer = ("checkpoint", saved) if len(saved) > n else ("target", target)
        return f"the {which} has {len(longer) - n} more leaves, the first at {longer[n].path}"
    return None


# ---- checksums -----------------------------------------------------------------------------


def _words(x: jax.Array) -> jax.Array:
    """The bytes of `x` as `uint32` words (one per element, or two for 8-byte elements)."""
    if jnp.iscomplexobj(x):
        x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    size = np.dtype(x.dtype).itemsize
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[size]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _checksum(x: jax.Array) -> jax.Array:
    """Two position-dependent sums of the words of `x`, modulo 2**32.

    Each term is a bijection of its word for a given position, so any change of a single
    word changes both sums; the position makes swapped elements count. Integer sums are exact
    and order-free: the result does not depend on the sharding.
    """
    words = _words(x)
    index = jnp.zeros(words.shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(words.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(stride % 2**32)
        stride *= words.shape[axis]
    a = (words ^ (index * jnp.uint32(0x9E3779B9))) * jnp.uint32(0x85EBCA6B)
    a = a ^ (a >> 13)
    b = (words + index * jnp.uint32(0xC2B2AE35)) * jnp.uint32(0x27D4EB2F)
    b = b ^ (b >> 15)
    return jnp.stack([jnp.sum(a, dtype=jnp.uint32), jnp.sum(b, dtype=jnp.uint32)])


@jax.jit
def _checksums(arrays: list[jax.Array]) -> list[jax.Array]:
    return [_checksum(x) for x in arrays]


def checksums(arrays: list[Any]) -> list[str]:
    """One hex checksum per array, computed on the arrays' devices in one compiled call."""
    if not arrays:
        return []
    values = jax.device_get(_checksums([jnp.asarray(x) for x in arrays]))
    return [f"{int(v[0]):08x}{int(v[1]):08x}" for v in values]
