"""`jit_step`: compile a training step of an Equinox model, with little work per call.

`eqx.filter_jit` is general: per call it binds the signature, partitions every argument
into arrays and the rest, catches warnings, installs a logging filter and waits for a
marker array (so that `eqx.error_if` errors surface), which costs a few hundred
microseconds and stops the next step from being dispatched while this one runs. A training
step needs less: `jit_step` flattens the arguments once, keys a cache by their structure and
non-array leaves, and hands the arrays to a `jax.jit` function as flat tuples. The model and
optimizer it returned are recognized when they come back as arguments (by identity: Equinox
modules are immutable) and are not flattened again.

Scalars are not donated (donating them saves no memory), and what the step returns unchanged
of them is handed back as the caller's own objects without crossing the jit boundary: an
Equinox module of the arguments whose arrays are all such scalars (the optimizer's transform,
with its hyperparameters) comes back as the same object, neither rebuilt after the call nor
flattened again at the next one.
"""

from __future__ import annotations

import functools
import itertools
import operator
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import equinox as eqx
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
    `_ARRAY` in the arrays' places; `None` when every leaf is an array), and which of its
    arrays are donated where the argument is (`mask`: the arrays that are not scalars; `None`
    when all are), hashed once."""

    __slots__ = ("hash", "mask", "n_donated", "statics", "treedef")

    def __init__(self, treedef, statics: tuple | None, mask: tuple | None):
        self.treedef, self.statics, self.mask = treedef, statics, mask
        self.n_donated = None if mask is None else sum(mask)
        try:
            self.hash = hash((treedef, statics, mask))
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
            and self.mask == other.mask
        )

    def split(self, arrays: list) -> tuple[list, list]:
        """The arrays donated where the argument is donated, and the others (scalars)."""
        mask = self.mask
        if mask is None:
            return arrays, []
        return list(itertools.compress(arrays, mask)), [x for x, m in zip(arrays, mask) if not m]

    def take(self, donated: Iterator, kept: Iterator) -> Any:
        """The tree, its arrays taken in order from `donated` (those `split` gives first) and from `kept`."""
        if self.mask is None:
            count = self.treedef.num_leaves if self.statics is None else self.statics.count(_ARRAY)
            arrays = list(itertools.islice(donated, count))
        else:
            first = iter(list(itertools.islice(donated, self.n_donated)))
            second = iter(list(itertools.islice(kept, len(self.mask) - self.n_donated)))
            arrays = [next(first) if m else next(second) for m in self.mask]
        if self.statics is None:
            return self.treedef.unflatten(arrays)
        arrays = iter(arrays)
        return self.treedef.unflatten([next(arrays) if s is _ARRAY else s for s in self.statics])


def _mask(arrays: list) -> tuple | None:
    """Which arrays are donated where their argument is: all but scalars; `None` for all."""
    mask = tuple(np.ndim(x) > 0 for x in arrays)
    return None if all(mask) else mask


def _split(leaves: list, treedef) -> tuple[list, _Part]:
    """The array leaves, and the structure of the rest."""
    flags = _array_flags(leaves)
    if all(flags):  # a tree of arrays (a dict of parameters): no per-leaf work
        return leaves, _Part(treedef, None, _mask(leaves))
    arrays = list(itertools.compress(leaves, flags))
    statics = tuple(_ARRAY if flag else x for flag, x in zip(flags, leaves))
    return arrays, _Part(treedef, statics, _mask(arrays))


def _getter(keys: tuple) -> Callable[[Any], Any]:
    """A function reading a node of an argument by its keys (see `_getter_keys`): C's
    `operator.attrgetter` where they are all attributes (an optimizer's `tx`)."""
    if keys and all(kind for kind, _ in keys):
        return operator.attrgetter(".".join(name for _, name in keys))
    return _Getter(keys)


class _Getter:
    """Reads a node of an argument by its key path (attributes, dict keys, sequence indices)."""

    __slots__ = ("keys",)

    def __init__(self, keys: tuple):
        self.keys = keys

    def __call__(self, tree: Any) -> Any:
        for kind, key in self.keys:
            tree = getattr(tree, key) if kind else tree[key]
        return tree


def _getter_keys(path: tuple) -> tuple | None:
    """`path`'s keys as `_Getter` reads them, or `None` where one cannot be read back."""
    keys = []
    for key in path:
        if isinstance(key, jax.tree_util.GetAttrKey):
            keys.append((True, key.name))
        elif isinstance(key, jax.tree_util.DictKey):
            keys.append((False, key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            keys.append((False, key.idx))
        else:
            return None
    return tuple(keys)


def _passable(args: list, kept_at: dict) -> dict[int, tuple]:
    """The Equinox modules in `args` that the step may hand back as the caller's own objects:
    those whose arrays are all scalars that are not donated (in `kept_at`), by id, with (module,
    its leaves, argument index, keys to it)."""
    found: dict[int, tuple] = {}

    def visit(node: Any, index: int, keys: tuple) -> None:
        is_module = lambda x: x is not node and isinstance(x, eqx.Module)  # noqa: E731
        for path, child in jax.tree_util.tree_flatten_with_path(node, is_leaf=is_module)[0]:
            if not isinstance(child, eqx.Module) or child is node:
                continue
            child_keys = _getter_keys(path)
            if child_keys is None:
                continue
            record(child, index, keys + child_keys)
            visit(child, index, keys + child_keys)  # a part of it may come back where it does not

    def record(node: Any, index: int, keys: tuple) -> None:
        leaves = jax.tree_util.tree_leaves(node)
        if all(id(x) in kept_at for x in leaves if isinstance(x, _ARRAY_TYPES)):
            found.setdefault(id(node), (node, tuple(leaves), index, keys))

    for index, arg in enumerate(args):
        if isinstance(arg, eqx.Module):
            record(arg, index, ())
        visit(arg, index, ())
    return found


def _picker(indices: tuple) -> Callable[[tuple], tuple]:
    """A function of a sequence returning its items at `indices` as a tuple."""
    if not indices:
        return lambda _: ()
    if len(indices) == 1:
        (i,) = indices
        return lambda items: (items[i],)
    return operator.itemgetter(*indices)


class _Output:
    """How one element of the step's output is rebuilt from the call's arrays, the arrays kept
    (not donated) and the objects handed back, and, fed back as an argument, split again."""

    __slots__ = ("donated", "kept", "leaves", "part", "treedef")

    def __init__(self, treedef, leaves: tuple, part: _Part | None, donated: tuple, kept: tuple):
        self.treedef, self.part = treedef, part
        self.leaves, self.donated, self.kept = _picker(leaves), _picker(donated), _picker(kept)


class JitStep:
    """A function compiled like `eqx.filter_jit`, with donated arguments; see `jit_step`."""

    def __init__(self, fn: Callable[..., Any], donate_argnums: Sequence[int]):
        self.fn = fn
        self.donate_argnums = tuple(sorted(set(donate_argnums)))
        # {key: (key, jitted function)}: the key is kept to re-key an equal one (see `_prepare`).
        self._compiled: dict[Any, Any] = {}
        # The last call's outputs, by id: (weak reference, arrays donated where it is donated,
        # the other arrays, structure). An argument that is one of them (the model and optimizer
        # fed back) is not flattened again: Equinox modules are immutable, so its leaves are still these.
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
                    first, second, part = record[1], record[2], record[3]
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
                    first, second = part.split(arrays)
                if i in self.donate_argnums:
                    donated.extend(first)
                else:
                    kept.extend(first)
                kept.extend(second)
                parts.append(part)
            kwargs_part = None
            if kwargs:
                arrays, kwargs_part = _split(*jax.tree_util.tree_flatten(kwargs))
                first, second = kwargs_part.split(arrays)
                kept.extend(first)
                kept.extend(second)
            last = self._last
            if (
                last is not None
                and kwargs_part is None
                and last[0][1] is None
                and len(parts) == len(last[0][0])
                and all(map(operator.is_, parts, last[0][0]))
            ):  # the structures of the last call, the same objects (its outputs fed back)
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
            donated_in, kept_in = iter(donated), iter(kept)
            args = [
                part.take(donated_in if i in donate else kept_in, kept_in)
                for i, part in enumerate(parts)
            ]
            kwargs = {} if kwargs_part is None else kwargs_part.take(kept_in, kept_in)
            # The scalars that are not donated, which come back as they went in where returned
            # unchanged. (Any other array returned unchanged is a new output: handed back, it
            # would be donated where the output is fed back, under its caller's other reference.)
            kept_at = {id(x): k for k, x in enumerate(kept) if np.ndim(x) == 0}
            passable = _passable(args, kept_at)
            out = fn(*args, **kwargs)
            # Each element of a tuple output separately, so that each can be recognized when fed back.
            elements = out if type(out) is tuple else (out,)
            arrays: list = []  # what the call returns
            new_at: dict[int, int] = {}
            objects: list = []  # modules handed back: (argument index, getter)
            object_at: dict[int, int] = {}
            sources = []  # per element: (treedef, its leaves' sources, its arrays' sources, its structure)

            def handed_back(x) -> bool:
                entry = passable.get(id(x))
                return (
                    entry is not None
                    and entry[0] is x
                    and all(map(operator.is_, jax.tree_util.tree_leaves(x), entry[1]))
                )

            def source(x) -> tuple:
                if id(x) in kept_at:
                    return ("kept", kept_at[id(x)])
                if id(x) not in new_at:
                    new_at[id(x)] = len(arrays)
                    arrays.append(x)
                return ("new", new_at[id(x)])

            for element in elements:
                leaves, treedef = jax.tree_util.tree_flatten(element, is_leaf=handed_back)
                leaf_sources = []
                for leaf in leaves:
                    if isinstance(leaf, eqx.Module) and handed_back(leaf):
                        if id(leaf) not in object_at:
                            object_at[id(leaf)] = len(objects)
                            _, _, index, keys = passable[id(leaf)]
                            objects.append((index, _getter(keys)))
                        leaf_sources.append(("object", object_at[id(leaf)]))
                    elif isinstance(leaf, _ARRAY_TYPES):
                        leaf_sources.append(source(leaf))
                    else:
                        leaf_sources.append(("static", leaf))
                if type(element).__weakrefoffset__ == 0 or isinstance(element, _ARRAY_TYPES):
                    # One array (a loss), a dict, a tuple: flattened again if fed back.
                    sources.append((treedef, leaf_sources, [], None))
                    continue
                # As an argument at the next call: its arrays, split as `_prepare` splits them.
                all_arrays, part = _split(*jax.tree_util.tree_flatten(element))
                sources.append((treedef, leaf_sources, [source(x) for x in all_arrays], part))
            # Indices into `(*arrays, *kept, *objects, *statics)`, the sequence the call builds.
            statics: list = []
            offset = {"new": 0, "kept": len(arrays), "object": len(arrays) + len(kept)}
            base = len(arrays) + len(kept) + len(objects)

            def index(src) -> int:
                kind, value = src
                if kind == "static":
                    statics.append(value)
                    return base + len(statics) - 1
                return offset[kind] + value

            plans = []
            for treedef, leaf_sources, array_sources, part in sources:
                leaf_indices = tuple(index(src) for src in leaf_sources)
                if part is None:
                    plans.append(_Output(treedef, leaf_indices, None, (), ()))
                    continue
                mask = part.mask or (True,) * len(array_sources)
                donated_indices = tuple(index(src) for src, m in zip(array_sources, mask) if m)
                kept_indices = tuple(index(src) for src, m in zip(array_sources, mask) if not m)
                plans.append(_Output(treedef, leaf_indices, part, donated_indices, kept_indices))
            return arrays, _Static((type(out) is tuple, tuple(plans), tuple(objects), tuple(statics)))

        step.__name__ = getattr(fn, "__name__", "step")
        step.__qualname__ = getattr(fn, "__qualname__", step.__name__)
        return jax.jit(step, donate_argnums=0)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        compiled, donated, kept = self._prepare(args, kwargs)
        try:
            arrays, static = compiled(donated, kept)
        except ValueError as error:
            if "deleted or donated" not in str(error):
                raise
            raise ValueError(self._spent_arguments(args, kwargs)) from error
        is_tuple, plans, objects, statics = static.value
        if objects or statics:
            items = (*arrays, *kept, *[get(args[index]) for index, get in objects], *statics)
        else:
            items = (*arrays, *kept)
        outputs, records = [], {}
        traced = isinstance(next(iter(arrays or kept), None), _Tracer)  # called inside a trace: keep nothing
        forget = self._forget
        for plan in plans:
            obj = plan.treedef.unflatten(plan.leaves(items))
            outputs.append(obj)
            if plan.part is not None and not traced:
                ref = weakref.ref(obj, forget)
                records[id(obj)] = (ref, plan.donated(items), plan.kept(items), plan.part)
        self._outputs = records
        return tuple(outputs) if is_tuple else outputs[0]

    def _spent_arguments(self, args: tuple, kwargs: dict) -> str:
        """Which arguments hold arrays already donated (or deleted), and what to pass instead."""
        name = getattr(self.fn, "__name__", repr(self.fn))
        spent = []
        for where, arg in [*((f"argument {i}", a) for i, a in enumerate(args)), *((f"argument {k!r}", a) for k, a in kwargs.items())]:
            for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
                if isinstance(leaf, jax.Array) and leaf.is_deleted():
                    spent.append(f"{where} ({type(arg).__name__}, first at `{jax.tree_util.keystr(path) or 'the root'}`)")
                    break
        donated = " and ".join(map(str, self.donate_argnums)) or "none"
        return (
            f"jit_step({name}): {', '.join(spent) or 'an argument'} holds arrays whose buffers were donated to an "
            f"earlier call (of {name}, which donates its arguments {donated}, or of another function that donates "
            "its inputs) and are deleted. The objects passed to a donating call are spent once it returns: continue "
            f"with the ones it returned (`model, optimizer, loss = {name}(model, optimizer, batch)`), or pass a copy "
            "(`jax.tree.map(jnp.copy, model)`) to keep the original."
        )

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

    The model and optimizer passed to a call are spent once it returns (their buffers now hold
    the outputs): passing one again is an error that names the argument and its first spent
    leaf. Continue with the returned objects, or pass a copy to keep an original.

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
