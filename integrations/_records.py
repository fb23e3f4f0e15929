"""What a checkpoint holds of each item, independent of Orbax: one record per pytree leaf.

An item (a model, a `modopt.Optimizer`, a Flax TrainState, any pytree) is flattened with its
paths. Each leaf gets a JSON-able record saying how it is stored:

- `array`: a JAX or NumPy array (or NumPy scalar) of numbers or booleans, written by Orbax,
  with shape, dtype and a checksum of its bytes. NumPy data is written and read as NumPy, so
  its dtype is kept exactly (an `np.int64` data-loader position stays 64-bit even where JAX
  has 64-bit types off);
- `key`: a typed PRNG key, written as its `uint32` key data, with the key implementation;
- `empty`: an array with no elements (Orbax rejects those): only its shape and dtype;
- `value`: a Python bool, int (of any size), float or string, kept in the JSON record itself;
- the two arrays of a `modopt.QuantizedArray` (8-bit codes and their scales) also record the
  layout that gives the codes their meaning: `block_size`, `quantization` (the tables) and the
  dtype they dequantize to. Restoring into a `QuantizedArray` laid out otherwise is refused:
  read with other tables or blocks, the same codes are other numbers. (A checkpoint written
  before the layout was recorded restores as the target reads it.)
- `static`: code (a function, a class, any other object) in a field of an object (an Equinox
  module's activation function): not written; restore takes it from the target, as Equinox's
  own serialisation does. `unsavable` finds such objects outside any object's field (in a
  plain dict, list or tuple, or as the item itself), which a save refuses: there they are data
  the caller means to keep.

A Python number and a scalar array of the same kind (bool, integer, floating) stand for each
other: a Flax `TrainState.create(...)` has the Python int `step=0` where a trained one has an
int32 array, and either restores into the other. Values of different kinds do not (a saved
2.5 never restores into an int, nor a string into a number).

`hyperparameter_leaves` tells which leaves of an item are hyperparameters, for the restore
policy (`CheckpointManager.restore(..., hyperparameters=...)`).

The checksum is computed on the device, so sharded arrays are never gathered for it, and it
does not depend on how the array is sharded: a checkpoint verifies on any mesh. NumPy data is
turned into 32-bit words on the host first, the same words the device computes for the same
bytes, so the checksum does not depend on where the data lives either.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from modopt._core.base import AbstractTransform
from modopt._step.hyperparameters import _hyperparameter_index, _state_index
from modopt._core.module import Constant
from modopt._step.optimizer import Optimizer
from modopt._state.quantization import QuantizedArray
from modopt.sharding._shardings import owned_units


def is_constant(x: Any) -> bool:
    """A hyperparameter compiled in as a constant (`modopt.fields.hyperparameter`'s identity): a
    pytree node without leaves, which a checkpoint holds as a leaf, a Python number in the record.
    So a checkpoint pairs it by path with the array the same hyperparameter is at another value,
    and restores either into the other."""
    return type(x) is Constant


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
    quantized: dict | None = None  # for the arrays of a `QuantizedArray`: its layout (see the module)
    units: int | None = None  # for a stack of the owner scheme (`OWNED`): its units, before any padding

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
        if self.quantized is not None:
            record["quantized"] = dict(self.quantized)
        if self.units is not None:
            record["units"] = self.units
        return record

    def describe(self) -> str:
        if self.kind == "static":
            return "code or another object that is not saved"
        if self.kind == "value":
            return f"the value {self.value!r}"
        described = f"{'a PRNG key' if self.kind == 'key' else 'an array'} of shape {tuple(self.shape)} and dtype {self.dtype}"
        if self.quantized is not None:
            q = self.quantized
            described += (
                f" (of 8-bit state: blocks of {q.get('block_size')}, {q.get('quantization')!r} tables, "
                f"dequantized to {q.get('dtype')})"
            )
        return described


def leaves_of(item: Any) -> list[Leaf]:
    """The records of `item`'s leaves, with the arrays to write (in the order of its leaves)."""
    found = []
    units = _stacks_of(item)
    is_quantized = lambda x: isinstance(x, QuantizedArray)  # noqa: E731
    for path, node in jax.tree_util.tree_flatten_with_path(item, is_leaf=lambda x: is_constant(x) or is_quantized(x))[0]:
        if not is_quantized(node):
            found.append(dataclasses.replace(_leaf(jax.tree_util.keystr(path), node), units=units.get(id(node))))
            continue
        layout = {"block_size": node.block_size, "quantization": node.quantization, "dtype": np.dtype(node.dtype).name}
        for inner, leaf in jax.tree_util.tree_flatten_with_path(node)[0]:
            found.append(dataclasses.replace(_leaf(jax.tree_util.keystr(path + inner), leaf), quantized=layout))
    return found


def _stacks_of(item: Any) -> dict[int, int]:
    """The state leaves of the `Optimizer`s in `item` that stack units of the owner scheme
    (`OWNED`), by `id`: how many units each holds. An `Optimizer` made with shardings stores
    them padded to a multiple of its mesh's device count, so the same state has other lengths
    on other meshes; a restore re-pads (`restacked`)."""
    found: dict[int, int] = {}
    for node in jax.tree_util.tree_leaves(item, is_leaf=lambda x: isinstance(x, Optimizer)):
        if not isinstance(node, Optimizer):
            continue
        try:
            units = owned_units(node)
        except Exception:  # noqa: BLE001 - a transform whose rule cannot be read has no stacks to re-pad
            continue
        for leaf, n in zip(jax.tree_util.tree_leaves(node.state), units):
            if n is not None:
                found[id(leaf)] = n
    return found


def restacked(saved: Leaf, target: Leaf) -> bool:
    """Whether `saved` and `target` are the same stack of units of the owner scheme stored with
    other padding (another device count): the saved array restores into the target's shape,
    its units kept and its padding units (zeros) dropped or added."""
    if saved.kind != "array" or target.kind != "array" or saved.dtype != target.dtype:
        return False
    if (saved.units is None and target.units is None) or not saved.shape or not target.shape:
        return False
    if tuple(saved.shape[1:]) != tuple(target.shape[1:]):
        return False
    units = [leaf.units if leaf.units is not None else leaf.shape[0] for leaf in (saved, target)]
    return units[0] == units[1] and units[0] <= min(saved.shape[0], target.shape[0])


def _leaf(path: str, x: Any) -> Leaf:
    if is_constant(x):
        return Leaf(path, "value", value=x.value)
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) or _is_numeric_numpy(x):
        shape = tuple(np.shape(x))
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = None if isinstance(x, jax.ShapeDtypeStruct) else jax.random.key_data(x)
            impl = str(jax.random.key_impl(x)) if not isinstance(x, jax.ShapeDtypeStruct) else ""
            return Leaf(path, "key", shape, "key", impl=impl, data=data)
        kind = "empty" if 0 in shape else "array"
        data = (np.asarray(x) if isinstance(x, np.generic) else x) if kind == "array" else None
        return Leaf(path, kind, shape, np.dtype(x.dtype).name, data=data)
    if value_kind(x) is not None:
        return Leaf(path, "value", value=x)
    return Leaf(path, "static")


def _is_numeric_numpy(x: Any) -> bool:
    """A NumPy array or scalar of booleans or numbers (not strings, objects or dates)."""
    if not isinstance(x, (np.ndarray, np.generic)):
        return False
    return x.dtype == np.bool_ or jnp.issubdtype(x.dtype, jnp.number)


def value_kind(x: Any) -> str | None:
    """"bool", "int", "float" or "str" for a Python value the record keeps, else `None`."""
    for kind, types in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(x, types):
            return kind
    return None


def unsavable(item: Any) -> tuple[str, Any] | None:
    """`(path, leaf)` of the first leaf of `item` that a checkpoint cannot hold and that is not
    in a field of an object (where it is code, taken from the restore target); else `None`."""
    plain = (jax.tree_util.DictKey, jax.tree_util.SequenceKey)
    for path, x in jax.tree_util.tree_flatten_with_path(item, is_leaf=is_constant)[0]:
        if _leaf("", x).kind == "static" and all(isinstance(key, plain) for key in path):
            return jax.tree_util.keystr(path), x
    return None


def described(x: Any) -> str:
    """What an object is, for a message: "a function (builtin_function_or_method)", "a set"."""
    if isinstance(x, (np.ndarray, np.generic)):
        return f"a NumPy {'array' if isinstance(x, np.ndarray) else 'scalar'} of dtype {x.dtype}"
    name = type(x).__name__
    if callable(x):
        return f"{'a class' if isinstance(x, type) else 'a function'} ({name})"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def from_record(record: dict) -> Leaf:
    return Leaf(
        record["path"],
        record["kind"],
        tuple(record.get("shape", ())),
        record.get("dtype", ""),
        record.get("impl", ""),
        record.get("value"),
        record.get("checksum", ""),
        quantized=record.get("quantized"),
        units=record.get("units"),
    )


def _signature(leaf: Leaf) -> tuple:
    """What must agree between a saved leaf and its target (not a number's value)."""
    if leaf.kind == "value":
        return ("value", value_kind(leaf.value))
    if leaf.kind == "static":
        return ("static",)
    return ("key" if leaf.kind == "key" else "array", tuple(leaf.shape), leaf.dtype)


def number_kind(leaf: Leaf) -> str | None:
    """"bool", "int", "float" or "complex" for a Python number or a scalar array, else `None`."""
    if leaf.kind == "value":
        kind = value_kind(leaf.value)
        return kind if kind != "str" else None
    if leaf.kind != "array" or tuple(leaf.shape) != ():
        return None
    dtype = jnp.dtype(leaf.dtype)
    for kind, family in (("bool", jnp.bool_), ("int", jnp.integer), ("float", jnp.floating), ("complex", jnp.complexfloating)):
        if jnp.issubdtype(dtype, family):
            return kind
    return None


def _agree(saved: Leaf, target: Leaf) -> bool:
    # 8-bit codes mean nothing with other tables or blocks (a record without a layout is older).
    if saved.quantized is not None and saved.quantized != target.quantized:
        return False
    if _signature(saved) == _signature(target) or restacked(saved, target):
        return True
    # A checkpoint written before strings were saved has them as `static`: the target's stays.
    if saved.kind == "static" and target.kind == "value" and value_kind(target.value) == "str":
        return True
    # A Python number and a scalar array of its kind restore into each other.
    kinds = {saved.kind, target.kind}
    return kinds == {"value", "array"} and number_kind(saved) is not None and number_kind(saved) == number_kind(target)


def _fits(saved: Leaf, target: Leaf) -> bool:
    """Whether a saved Python integer fits the integer dtype of the array it restores into."""
    if saved.kind != "value" or target.kind != "array" or number_kind(saved) != "int":
        return True
    info = np.iinfo(np.dtype(target.dtype))
    return info.min <= saved.value <= info.max


def mismatch(saved: list[Leaf], target: list[Leaf], holds: str, is_: str) -> str | None:
    """How the target's leaves depart from the checkpoint's, in words; `None` if they agree.

    Leaves are paired by path, never by position (one leaf more early on would pair every later
    one with an unrelated one). The summary comes first: how many leaves each holds, in which
    top-level parts they differ, and what each is (`holds` and `is_`, e.g. "an Optimizer of Adam"
    and "an Optimizer of Sgd", shown where they differ); then the first paths found only in one of
    them, and the leaves that differ at the same path.
    """
    by_path = {leaf.path: leaf for leaf in target}
    in_saved = {leaf.path for leaf in saved}
    only_saved = [s.path for s in saved if s.path not in by_path]
    only_target = [t.path for t in target if t.path not in in_saved]
    differing = [_difference(s, by_path[s.path]) for s in saved if s.path in by_path]
    differing = [d for d in differing if d]
    if not (only_saved or only_target or differing):
        return None
    kinds = f"; it holds {holds}, the target is {is_}" if holds != is_ else ""
    if not (only_saved or only_target):
        n = len(differing)
        return (
            f"the checkpoint and the target have the same {len(saved)} leaves by path{kinds}, "
            f"{n} of them different: {'; '.join(differing[:3])}{_more(n - 3, 'other')}"
        )
    parts = []
    for part, (n_saved, n_target, same) in _by_part(saved, target, by_path).items():
        if not same:
            parts.append(f"{part or 'the root'} {n_saved} against {n_target}" if n_saved != n_target else f"{part or 'the root'} differs")
    details = []
    if only_saved:
        details.append(f"only in the checkpoint: {', '.join(only_saved[:3])}{_more(len(only_saved) - 3)}")
    if only_target:
        details.append(f"only in the target: {', '.join(only_target[:3])}{_more(len(only_target) - 3)}")
    if differing:
        details.append(f"different at the same path: {'; '.join(differing[:2])}{_more(len(differing) - 2)}")
    return (
        f"the checkpoint holds {len(saved)} leaves, the target {len(target)} "
        f"(by top-level part: {', '.join(parts)}){kinds}. {_capitalized('; '.join(details))}"
    )


def _difference(s: Leaf, t: Leaf) -> str | None:
    """How two leaves at the same path differ, in words; `None` if the saved one restores into the other."""
    where = s.path or "the root"
    if not _agree(s, t):
        return f"at {where} the checkpoint has {s.describe()}, the target {t.describe()}"
    if not _fits(s, t):
        return f"at {where} the checkpoint has {s.describe()}, which does not fit the target's dtype {t.dtype}"
    return None


def _by_part(saved: list[Leaf], target: list[Leaf], by_path: dict[str, Leaf]) -> dict[str, tuple[int, int, bool]]:
    """Per top-level part of the item (`.tx`, `.state`, `['model']`): the leaves the checkpoint
    and the target hold there, and whether those agree."""
    counts: dict[str, list] = {}
    for leaves, side in ((saved, 0), (target, 1)):
        for leaf in leaves:
            counts.setdefault(_top(leaf.path), [0, 0, set(), set()])[side] += 1
            counts[_top(leaf.path)][2 + side].add(leaf.path)
    same_leaves = {s.path for s in saved if s.path in by_path and _difference(s, by_path[s.path]) is None}
    return {
        part: (n_saved, n_target, paths_saved == paths_target and paths_saved <= same_leaves)
        for part, (n_saved, n_target, paths_saved, paths_target) in counts.items()
    }


def _top(path: str) -> str:
    """The first entry of a path: `.tx` of `.tx.b1`, `['model']` of `['model'].layers[0]`."""
    found = re.match(r"\.[^.\[]+|\[[^\]]*\]", path)
    return found.group(0) if found else path


def _more(n: int, what: str = "") -> str:
    return f" and {n} more{' ' + what if what else ''}" if n > 0 else ""


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


# ---- hyperparameters -----------------------------------------------------------------------


class _Mark:
    """Stands in for the leaf of index `index`, to see where a getter leads."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def hyperparameter_leaves(item: Any) -> dict[int, str]:
    """Which leaves of `item` (by index in its flattening) are hyperparameters, with their names.

    The hyperparameters are those of every modopt transform in `item`, wherever it sits, as
    `Optimizer.hyperparameters` lists them: the fields declared hyperparameters (learning rates,
    betas, schedules with their numbers), and the numbers that live in the optimizer state
    (`inject_hyperparams`; a scheduled value there is recomputed from the step count, so it is
    state). Anything else, a transform's PRNG key included, is state. A transform is found as
    itself, as the `tx` of a `modopt.Optimizer`, of a TrainState (modopt's or Flax's) or of an
    `NnxOptimizer`, and as the `Hyperparameter` variables of an NNX state. Each is named by its
    path in the item's transform, as `Optimizer.set` accepts it (`transforms[1].b1`), after the
    path of the optimizer in the item (`['opt'].learning_rate`); one in the state is marked so
    (`learning_rate (in the state)`).
    """
    found: dict[int, str] = {}
    offset = 0
    for path, node in jax.tree_util.tree_flatten_with_path(item, is_leaf=_holds_or_constant)[0]:
        leaves, treedef = jax.tree_util.tree_flatten(node, is_leaf=is_constant)
        if _holds_hyperparameters(node):
            marked = treedef.unflatten([_Mark(offset + i) for i in range(len(leaves))])
            prefix = jax.tree_util.keystr(path)
            for index, name in _marked_names(node, marked).items():
                found[index] = prefix + (f".{name}" if name and not name.startswith("[") else name)
        offset += len(leaves)
    return found


def _holds_or_constant(x: Any) -> bool:
    return is_constant(x) or _holds_hyperparameters(x)


def _nnx_hyperparameter() -> Any:
    """`modopt.integrations.flax.Hyperparameter` where that module is loaded (never imports Flax)."""
    adapter = sys.modules.get("modopt.integrations.flax")
    return getattr(adapter, "Hyperparameter", None)


def _transform_and_state(node: Any) -> tuple[Any, Any] | None:
    """`(transform, optimizer state)` of an optimizer-like node, else `None`."""
    if isinstance(node, AbstractTransform):
        return node, None
    if isinstance(node, Optimizer):
        return node.tx, node.state
    if hasattr(node, "opt_state"):
        tx = getattr(node, "tx", None)
        if isinstance(tx, AbstractTransform):
            return tx, _pure(node.opt_state)
    return None


def _holds_hyperparameters(node: Any) -> bool:
    variable = _nnx_hyperparameter()
    if variable is not None and isinstance(node, variable):
        return True
    return not isinstance(node, (jax.Array, np.ndarray, np.generic)) and _transform_and_state(node) is not None


def _pure(state: Any) -> Any:
    """An NNX optimizer's state as plain values (its variables unwrapped)."""
    nnx = sys.modules.get("flax.nnx")
    return state if nnx is None else nnx.as_pure(state)


def _marks(tree: Any) -> list[_Mark]:
    return [x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, _Mark)]


def _marked_names(node: Any, marked: Any) -> dict[int, str]:
    """The hyperparameters among the marks of `marked` (a copy of `node` with marks for leaves)."""
    variable = _nnx_hyperparameter()
    if variable is not None and isinstance(node, variable):
        if isinstance(node.get_value(), AbstractTransform):  # an NnxOptimizer's transform
            return _marked_names(node.get_value(), marked.get_value())
        return {mark.index: "" for mark in _marks(marked)}
    tx, state = _transform_and_state(node)
    marked_tx, marked_state = _transform_and_state(marked)
    names = {}
    # The fields declared hyperparameters, by the paths `set` knows (deeper last, so a schedule's
    # numbers are named as such). Other leaves of a transform (the PRNG key that seeds a noise
    # state) are where its state comes from: state.
    for name, (get, _) in _hyperparameter_index(marked_tx, all_paths=True).items():
        for mark in _marks(get(marked_tx)):
            names[mark.index] = name
    # Those that live in the state are found through the transform's parts, which may need its
    # concrete values (an abstract transform is restored from the checkpoint anyway).
    if state is not None and _is_concrete(tx):
        for name, get in _state_index(tx, all_paths=True).items():
            for mark in _marks(get(marked_state)):
                names[mark.index] = f"{name} (in the state)"
    return names


def _is_concrete(tree: Any) -> bool:
    return not any(isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct)) for x in jax.tree_util.tree_leaves(tree))


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


@functools.partial(jax.jit, static_argnames="rows")
def _checksums(arrays: list[jax.Array], rows: tuple[int | None, ...] | None = None) -> list[jax.Array]:
    rows = (None,) * len(arrays) if rows is None else rows
    return [_checksum(_resized(x, n, jnp)) for x, n in zip(arrays, rows)]


def _resized(x: Any, rows: int | None, xp: Any) -> Any:
    """`x` with `rows` rows along axis 0: cut, or extended with zeros (`xp`: jnp or np)."""
    if rows is None or rows == x.shape[0]:
        return x
    if rows < x.shape[0]:
        return x[:rows]
    return xp.concatenate([x, xp.zeros((rows - x.shape[0], *x.shape[1:]), x.dtype)])


def _host_words(x: np.ndarray) -> np.ndarray:
    """`_words` of a NumPy array, on the host: its dtype may be one JAX does not hold (64-bit
    types where `jax_enable_x64` is off), and `uint32` words it always holds."""
    if np.iscomplexobj(x):
        x = np.stack([x.real, x.imag], axis=-1)
    if x.dtype == np.bool_:
        return x.astype(np.uint32)
    size = x.dtype.itemsize
    flat = np.ascontiguousarray(x).reshape(-1)
    if size == 8:
        return flat.view(np.uint32).reshape(x.shape + (2,))
    return flat.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[size]).astype(np.uint32).reshape(x.shape)


def _host_checksum(words: np.ndarray) -> tuple[int, int]:
    """`_checksum` of `uint32` words on the host: NumPy's `uint32` arithmetic wraps modulo 2**32
    as XLA's does, term for term, so the two sums are the same numbers."""
    index = (np.arange(words.size, dtype=np.uint64) % 2**32).astype(np.uint32).reshape(words.shape)
    with np.errstate(over="ignore"):
        a = (words ^ (index * np.uint32(0x9E3779B9))) * np.uint32(0x85EBCA6B)
        a = a ^ (a >> np.uint32(13))
        b = (words + index * np.uint32(0xC2B2AE35)) * np.uint32(0x27D4EB2F)
        b = b ^ (b >> np.uint32(15))
    return int(np.sum(a, dtype=np.uint32)), int(np.sum(b, dtype=np.uint32))


# Below this many elements a checksum is computed on the host: no compilation for the arrays
# of each new tree, and the bytes are read for writing anyway. Larger or multi-host arrays are
# summed where they live.
_HOST_ELEMENTS = 2**20


def checksums(arrays: list[Any], rows: list[int | None] | None = None) -> list[str]:
    """One hex checksum per array. NumPy arrays and small arrays of this process are summed on
    the host; the others on their devices, one compiled call per set of devices they live on
    (usually one). Both give the same numbers for the same bytes (`_words` of words is the
    words themselves), whatever the sharding. `rows` (per array, or `None`) gives an array's
    checksum as it was saved with that many rows along axis 0: a stack of units read with
    other padding (`restacked`), its padding rows zero."""
    rows = [None] * len(arrays) if rows is None else rows
    found: list[str] = [""] * len(arrays)
    groups: dict[frozenset, list[int]] = {}
    for i, x in enumerate(arrays):
        if not isinstance(x, jax.Array) or (x.is_fully_addressable and x.size <= _HOST_ELEMENTS):
            found[i] = "{:08x}{:08x}".format(*_host_checksum(_host_words(_resized(np.asarray(x), rows[i], np))))
        else:
            groups.setdefault(frozenset(x.sharding.device_set), []).append(i)
    for indices in groups.values():
        values = jax.device_get(_checksums([arrays[i] for i in indices], rows=tuple(rows[i] for i in indices)))
        for i, v in zip(indices, values):
            found[i] = f"{int(v[0]):08x}{int(v[1]):08x}"
    return found
