"""`jit_step`: compile a training step of an Equinox model, with little work per call.

`eqx.filter_jit` is general: per call it binds the signature, partitions every argument
into arrays and the rest, catches warnings, installs a logging filter and waits for a
marker array (so that `eqx.error_if` errors surface), which costs a few hundred
microseconds and stops the next step from being dispatched while this one runs. A training
step needs less: `jit_step` flattens the arguments once, keys a cache by their structure and
non-array leaves, and hands the arrays to a `jax.jit` function as flat tuples. The model and
optimizer it returned are recognized when they come back as arguments (by identity: Equinox
modules are immutable) and are not flattened again.

Scalars (0-d arrays: hyperparameters, step counts) are never donated: donating four bytes
saves nothing, and one that the step returns unchanged (every hyperparameter, step after
step) is handed back as the same array instead of crossing the jit boundary again; a donated
or copied output costs more per call than the arithmetic of a small model's step.
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
    `_ARRAY` in the arrays' places; `None` when every leaf is an array), and which array leaves
    are scalars (`keep`, kept even where the argument is donated; `None` when none is), hashed
    once. `plain` is the same structure without `keep`, as a part of an argument not donated."""

    __slots__ = ("donate", "hash", "keep", "plain", "statics", "treedef")

    def __init__(self, treedef, statics: tuple | None, keep: tuple | None = None):
        self.treedef, self.statics, self.keep = treedef, statics, keep
        self.donate = None if keep is None else tuple(not k for k in keep)
        self.plain = self if keep is None else _Part(treedef, statics)
        try:
            self.hash = hash((treedef, statics, keep))
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
            and self.keep == other.keep
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


def _split(leaves: list, treedef, mark_scalars: bool = False) -> tuple[list, _Part]:
    """The array leaves, and the structure of the rest (with the scalars marked if asked)."""
    flags = _array_flags(leaves)
    if all(flags):  # a tree of arrays (a dict of parameters): no per-leaf work
        arrays, statics = leaves, None
    else:
        arrays = list(itertools.compress(leaves, flags))
        statics = tuple(_ARRAY if flag else x for flag, x in zip(flags, leaves))
    keep = None
    if mark_scalars:
        scalars = [not shape for shape in map(_shape, arrays)]
        keep = tuple(scalars) if any(scalars) else None
    return arrays, _Part(treedef, statics, keep)


_shape = operator.attrgetter("shape")


class _Pick:
    """Puts an output's array leaves back together: those the step computed, and the scalars
    it returned unchanged, which are arguments it kept (by their indices in `kept + computed`)."""

    __slots__ = ("get",)

    def __init__(self, indices: list[int]):
        getter = operator.itemgetter(*indices)
        self.get = getter if len(indices) > 1 else (lambda seq: (getter(seq),))

    def __call__(self, kept: tuple, computed: list) -> list:
        return list(self.get(kept + tuple(computed)))


def _interleave(keep: tuple, donated: Iterator, kept: Iterator) -> Iterator:
    """The leaves of a donated argument in order: its scalars from `kept`, the rest from `donated`."""
    return iter([next(kept) if k else next(donated) for k in keep])


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
        functools.update_wrapper(self, fn)

    def _prepare(self, args: tuple, kwargs: dict):
        donated, kept = [], []
        parts = []
        outputs = self._outputs
        fed_back = 0
        try:
            for i, arg in enumerate(args):
                donate = i in self.donate_argnums
                record = outputs.get(id(arg))
                if record is not None and record[0]() is arg:
                    arrays, part = record[1], record[2] if donate else record[2].plain
                    fed_back += 1
                else:
                    arrays, part = _split(*jax.tree_util.tree_flatten(arg), donate)
                if not donate:
                    kept.extend(arrays)
                elif part.keep is None:
                    donated.extend(arrays)
                else:  # its scalars are kept
                    donated.extend(itertools.compress(arrays, part.donate))
                    kept.extend(itertools.compress(arrays, part.keep))
                parts.append(part)
            kwargs_part = None
            if kwargs:
                arrays, kwargs_part = _split(*jax.tree_util.tree_flatten(kwargs))
                kept.extend(arrays)
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
        return entry[1], tuple(donated), tuple(kept)

    def _build(self, key) -> Callable[..., Any]:
        parts, kwargs_part = key
        donate = self.donate_argnums
        fn = self.fn

        def step(donated, kept):
            inputs, donated, kept_leaves = kept, iter(donated), iter(kept)
            args = []
            for i, part in enumerate(parts):
                if i not in donate:
                    args.append(part.take(kept_leaves))
                elif part.keep is None:
                    args.append(part.take(donated))
                else:
                    args.append(part.take(_interleave(part.keep, donated, kept_leaves)))
            kwargs = {}
            if kwargs_part is not None:
                kwargs = kwargs_part.take(kept_leaves)
            out = fn(*args, **kwargs)
            # A kept argument returned unchanged (a hyperparameter) is not an output: the caller
            # gets the argument itself back.
            unchanged = {id(x): i for i, x in enumerate(inputs)}
            # Each element of a tuple output separately, so that each can be recognized when fed back.
            elements = out if type(out) is tuple else (out,)
            arrays, structures, picks = [], [], []
            for element in elements:
                leaves, part = _split(*jax.tree_util.tree_flatten(element), mark_scalars=True)
                sources = [unchanged.get(id(x), -1) for x in leaves]
                pick = None
                if max(sources, default=-1) >= 0:
                    computed = itertools.count(len(inputs))
                    pick = _Pick([i if i >= 0 else next(computed) for i in sources])
                    leaves = [x for x, i in zip(leaves, sources) if i < 0]
                arrays.append(leaves)
                structures.append(part)
                picks.append(pick)
            return arrays, _Static((type(out) is tuple, tuple(structures), tuple(picks)))

        step.__name__ = getattr(fn, "__name__", "step")
        step.__qualname__ = getattr(fn, "__qualname__", step.__name__)
        return jax.jit(step, donate_argnums=0)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        compiled, donated, kept = self._prepare(args, kwargs)
        arrays, static = compiled(donated, kept)
        is_tuple, structures, picks = static.value
        outputs, records = [], {}
        for part_arrays, part, pick in zip(arrays, structures, picks):
            if pick is not None:
                part_arrays = pick(kept, part_arrays)
            obj = part.unflatten(part_arrays)
            outputs.append(obj)
            if _array_flags([obj])[0]:  # one array (a loss): nothing to save
                continue
            if part_arrays and isinstance(part_arrays[0], jax.core.Tracer):  # called inside a trace: keep nothing
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
    `optimizer.step` returns `(model, optimizer)`. Their scalars (hyperparameters, step counts)
    are not donated: the old arrays stay valid, and a scalar returned unchanged is the same
    array, not a copy.

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
