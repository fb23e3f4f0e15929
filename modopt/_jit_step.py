"""`jit_step`: compile a training step of an Equinox model, with little work per call.

`eqx.filter_jit` is general: per call it binds the signature, partitions every argument
into arrays and the rest, catches warnings, installs a logging filter and waits for a
marker array (so that `eqx.error_if` errors surface), which costs a few hundred
microseconds and stops the next step from being dispatched while this one runs. A training
step needs less: `jit_step` flattens the arguments once, keys a cache by their structure and
non-array leaves, and hands the arrays to a `jax.jit` function as flat tuples. The model and
optimizer it returned are recognized when they come back as arguments (by identity: Equinox
modules are immutable) and are not flattened again.
"""

from __future__ import annotations

import functools
import itertools
import operator
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

# The leaves traced as arrays, as `eqx.is_array` decides (NumPy arrays and scalars included).
_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)


class _ArraySlot:
    """Stands for an array leaf in a cache key and in the static part of the outputs."""

    def __repr__(self):
        return "<array>"


_ARRAY = _ArraySlot()


class _Static:
    """A pytree node without children that carries the output's structure and non-array leaves
    out of the jitted function (as part of its treedef)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


jax.tree_util.register_pytree_node(_Static, lambda s: ((), s.value), lambda value, _: _Static(value))


# Whether leaves of a type are arrays, as `isinstance` finds for the first one seen (tracers
# included): `isinstance` on `jax.Array`, an ABC, is slow per leaf.
_IS_ARRAY: dict[type, bool] = {}


def _array_flags(leaves: list) -> list[bool]:
    flags = list(map(_IS_ARRAY.get, map(type, leaves)))
    if None in flags:
        for x in leaves:
            _IS_ARRAY.setdefault(type(x), isinstance(x, _ARRAY_TYPES))
        flags = list(map(_IS_ARRAY.__getitem__, map(type, leaves)))
    return flags


class _Part:
    """The structure of one argument or output: its treedef and non-array leaves (with
    `_ARRAY` in the arrays' places; `None` when every leaf is an array), hashed once."""

    __slots__ = ("hash", "statics", "treedef")

    def __init__(self, treedef, statics: tuple | None):
        self.treedef, self.statics = treedef, statics
        try:
            self.hash = hash((treedef, statics))
        except TypeError:  # an unhashable leaf: an error where it is used as (part of) a key
            self.hash = None

    def __hash__(self):
        if self.hash is None:
            hash((self.treedef, self.statics))  # raises the TypeError naming the type
        return self.hash

    def __eq__(self, other):
        return self is other or (
            isinstance(other, _Part)
            and self.hash == other.hash
            and self.treedef == other.treedef
            and self.statics == other.statics
        )

    def unflatten(self, arrays: list) -> Any:
        if self.statics is None:
            return self.treedef.unflatten(arrays)
        return self.take(iter(arrays))

    def take(self, arrays: Iterator) -> Any:
        """The tree, its array leaves taken from the iterator `arrays` in order."""
        if self.statics is None:
            return self.treedef.unflatten(list(itertools.islice(arrays, self.treedef.num_leaves)))
        return self.treedef.unflatten([next(arrays) if s is _ARRAY else s for s in self.statics])


def _split(leaves: list, treedef) -> tuple[list, _Part]:
    """The array leaves, and the structure of the rest."""
    flags = _array_flags(leaves)
    if all(flags):  # a tree of arrays (a dict of parameters): no per-leaf work
        return leaves, _Part(treedef, None)
    arrays = list(itertools.compress(leaves, flags))
    return arrays, _Part(treedef, tuple(_ARRAY if flag else x for flag, x in zip(flags, leaves)))


class JitStep:
    """A function compiled like `eqx.filter_jit`, with donated arguments; see `jit_step`."""

    def __init__(self, fn: Callable[..., Any], donate_argnums: Sequence[int]):
        self.fn = fn
        self.donate_argnums = tuple(sorted(set(donate_argnums)))
        # {key: (key, jitted function)}: the key is kept to re-key an equal one (see `_prepare`).
        self._compiled: dict[Any, Any] = {}
        # The last call's outputs, by id: (weak reference, arrays, structure). An argument that
        # is one of them (the model and optimizer fed back) is not flattened again: Equinox
        # modules are immutable, so its leaves are still these.
        self._outputs: dict[int, Any] = {}
        # The structure of the last argument at each position that was not a fed-back output,
        # reused while it recurs (a dict of parameters and a batch are flattened every call).
        self._fresh: dict[int, _Part] = {}
        # The last call's `(key, jitted function)`: taken when the structures are the same objects.
        self._last: tuple | None = None
        functools.update_wrapper(self, fn)

    def _prepare(self, args: tuple, kwargs: dict):
        donated, kept = [], []
        parts = []
        outputs = self._outputs
        fed_back = 0
        try:
            for i, arg in enumerate(args):
                record = outputs.get(id(arg))
                if record is not None and record[0]() is arg:
                    arrays, part = record[1], record[2]
                    fed_back += 1
                else:
                    leaves, treedef = _flatten(arg, None)
                    part = self._fresh.get(i)
                    if (
                        part is not None
                        and part.statics is None
                        and part.treedef == treedef
                        and all(map(_IS_ARRAY.get, map(type, leaves)))
                    ):  # the structure of the last call's argument, still all arrays: the same object
                        arrays = leaves
                    else:
                        arrays, part = _split(leaves, treedef)
                        self._fresh[i] = part
                (donated if i in self.donate_argnums else kept).extend(arrays)
                parts.append(part)
            kwargs_part = None
            if kwargs:
                arrays, kwargs_part = _split(*jax.tree_util.tree_flatten(kwargs))
                kept.extend(arrays)
            last = self._last
            if last is not None and kwargs_part is None and last[0][1] is None and _identical(parts, last[0][0]):
                return last[1], tuple(donated), tuple(kept)
            key = (tuple(parts), kwargs_part)
            entry = self._compiled.get(key)
        except TypeError as error:  # an unhashable non-array leaf
            raise TypeError(
                f"jit_step({getattr(self.fn, '__name__', self.fn)}): every leaf of the arguments that is not an "
                f"array must be hashable, as with `eqx.filter_jit` ({error}). Make it an array, or a static field."
            ) from None
        if entry is None:
            entry = self._compiled[key] = (key, self._build(key))
        elif entry[0] is not key and _same_parts(key, entry[0]) < fed_back:
            # An equal key made of other objects: store this one, whose parts (the structures
            # of fed-back outputs) recur, so that the next lookups compare them by identity.
            del self._compiled[key]
            entry = self._compiled[key] = (key, entry[1])
        self._last = (key, entry[1])  # this call's structures: those of the next one, fed back
        return entry[1], tuple(donated), tuple(kept)

    def _build(self, key) -> Callable[..., Any]:
        parts, kwargs_part = key
        donate = self.donate_argnums
        fn = self.fn

        def step(donated, kept):
            donated, kept = iter(donated), iter(kept)
            args = []
            for i, part in enumerate(parts):
                source = donated if i in donate else kept
                args.append(part.take(source))
            kwargs = {}
            if kwargs_part is not None:
                kwargs = kwargs_part.take(kept)
            out = fn(*args, **kwargs)
            # Each element of a tuple output separately, so that each can be recognized when fed back.
            elements = out if type(out) is tuple else (out,)
            arrays, structures = [], []
            for element in elements:
                element_arrays, part = _split(*jax.tree_util.tree_flatten(element))
                arrays.append(element_arrays)
                structures.append(part)
            return arrays, _Static((type(out) is tuple, tuple(structures)))

        step.__name__ = getattr(fn, "__name__", "step")
        step.__qualname__ = getattr(fn, "__qualname__", step.__name__)
        return jax.jit(step, donate_argnums=0)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        compiled, donated, kept = self._prepare(args, kwargs)
        arrays, static = compiled(donated, kept)
        is_tuple, structures = static.value
        outputs, records = [], {}
        for part_arrays, part in zip(arrays, structures):
            obj = part.treedef.unflatten(part_arrays) if part.statics is None else part.unflatten(part_arrays)
            outputs.append(obj)
            is_array = _IS_ARRAY.get(type(obj))
            if is_array is None:
                is_array = _array_flags([obj])[0]
            if is_array:  # one array (a loss): nothing to save
                continue
            if part_arrays and isinstance(part_arrays[0], _Tracer):  # called inside a trace: keep nothing
                continue
            try:
                records[id(obj)] = (weakref.ref(obj, self._forget), part_arrays, part)
            except TypeError:  # not weakly referenceable (a tuple, a dict): flattened when fed back
                pass
        self._outputs = records
        return tuple(outputs) if is_tuple else outputs[0]

    def _forget(self, ref: weakref.ref) -> None:
        """Drops the record of an output the caller no longer holds (and with it its arrays)."""
        for key, record in list(self._outputs.items()):
            if record[0] is ref:
                del self._outputs[key]

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """The lowered step for these arguments (e.g. `.compile().memory_analysis()`)."""
        compiled, donated, kept = self._prepare(args, kwargs)
        return compiled.lower(donated, kept)

    def __repr__(self):
        return f"jit_step({getattr(self.fn, '__qualname__', self.fn)}, donate_argnums={self.donate_argnums})"


def _identical(parts: list, other: tuple) -> bool:
    """Whether two lists of argument structures are the same objects, one for one."""
    return len(parts) == len(other) and all(map(operator.is_, parts, other))


_Tracer = jax.core.Tracer
_flatten = jax.tree_util.default_registry.flatten  # `tree_flatten` without its Python wrapper


def _same_parts(key, other) -> int:
    """How many argument structures of two equal keys are the same objects."""
    return sum(a is b for a, b in zip(key[0], other[0]))


def jit_step(fn: Callable[..., Any] | None = None, *, donate_argnums: Sequence[int] = (0, 1)) -> Any:
    """Compiles a training step such as `step(model, optimizer, batch)`, donating the model and the optimizer.

    As with `eqx.filter_jit`, every array leaf of every argument (JAX and NumPy arrays) is
    traced and every other leaf (functions, Python numbers, static fields of Equinox modules)
    is static: a new value of one compiles again. The outputs may hold non-array leaves too.
    The arguments at `donate_argnums` (default: the first two) are donated, so XLA updates
    their buffers in place; put them first and return them in the same order, as
    `optimizer.step` returns `(model, optimizer)`.

    It does less per call than `eqx.filter_jit(donate=...)` (see the module docstring): the
    step is dispatched without waiting for the previous one to finish, and a small model's
    step costs about what `jax.jit` on its arrays costs. What it does differently: `eqx.error_if`
    errors surface as JAX's runtime error (when a result is read), not as Equinox's annotated
    one, and JAX's warning about donated buffers that no output can reuse is not silenced.

    A new hyperparameter (`optimizer.set(learning_rate=...)`) or a rebuilt optimizer with the
    same configuration does not compile again: only the arrays changed.

    Args:
        fn: the step function, taking the model and the optimizer first (usable as a decorator
            with or without arguments).
        donate_argnums: the positions of the arguments whose buffers are donated.

    Example:
        >>> @modopt.jit_step
        ... def train_step(model, optimizer, batch):
        ...     x, y = batch
        ...     loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        ...     model, optimizer = optimizer.step(model, grads)
        ...     return model, optimizer, loss
    """
    if fn is None:
        return functools.partial(jit_step, donate_argnums=donate_argnums)
    return JitStep(fn, donate_argnums)
