"""`Module`: an Equinox module whose attribute reads cost what a plain object's cost.

`equinox.Module` turns every method read from an instance (`tx.update`) into a bound method
that is itself a pytree, holding the module. It does so in a Python `__getattribute__`, so
every attribute read pays a Python call, `__dict__` included, which the generated flatten
function of each module reads twice. A `jax.jit` call flattens its arguments every time:
each module of a transform passed to a jitted step (the transform, each decay rate) cost
about 2.4 microseconds of dispatch this way on this project's 2-core machine, 0.5 with
plain attribute reads (a few percent of a small model's 0.2 ms step for Adam's three).

Here methods are read through a descriptor that builds the same bound method, and every
other attribute read is Python's own: the same objects, the same pytrees, the cost of a
plain class's flatten.

`Constant` is a hyperparameter held at its identity value (a weight decay of 0): a pytree
node without leaves whose number is part of the structure. A method read from a module
holding one is bound to a copy whose constants are plain numbers (see `Constant`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import types
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


class _Probe(eqx.Module):
    def method(self) -> None:
        pass


# Equinox's bound method (a pytree whose child is the module), as Equinox builds it.
_BoundMethod = type(_Probe().method)


def _is_magic(name: str) -> bool:
    """Names Equinox never binds as pytrees (as Equinox decides)."""
    return (name.startswith("__") and name.endswith("__")) or name == "_abc_impl"


class _PytreeMethod:
    """A method that, read from an instance, is Equinox's bound method (a pytree holding the
    instance), and read from the class, the function itself."""

    def __init__(self, function: types.FunctionType):
        functools.update_wrapper(self, function)  # name, docstring, `__isabstractmethod__`
        self.__func__ = function
        self._bound_fields: dict[str, Any] | None = None

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.__func__
        # Equinox builds a bound method through its module machinery (about half a millisecond,
        # paid by every eager `tx.update(...)` and by every transform built, which validates its
        # parts); the same object is assembled here from the fields Equinox gives it.
        if self._bound_fields is None:
            self._bound_fields = dict(_BoundMethod(self.__func__, _Probe()).__dict__)
        bound = object.__new__(_BoundMethod)
        bound.__dict__.update(self._bound_fields)
        bound.__dict__["__self__"] = with_constants_as_numbers(instance)
        return bound


class Constant:
    """A hyperparameter at its identity value, compiled into the step as a constant.

    A field declared with an identity (`fields.weight_decay`, `fields.eps`: 0) holds a
    `Constant` instead of an array leaf when it is given that value as a Python or NumPy
    number. It is a pytree node without leaves whose number is part of the structure
    (the treedef), so a jitted step sees the number itself: XLA drops `x + 0` and `x * 1`, and
    a transform skips work that a concrete zero makes void (`g + 0 * p`). Methods (`update`,
    `init`, ...) see the field as the Python number itself, as a number written in the code
    (weakly typed, as the array it would otherwise be), so no transform reads a `Constant`.

    Moving the value to or from the identity (`set(weight_decay=1e-4)` on a decay of 0)
    changes the structure, so a jitted step compiles again; any other change of a value does
    not. A JAX array, even one equal to the identity, stays an array leaf.

    Args:
        value: the number (a Python `int` or `float`).
    """

    __slots__ = ("_flat", "value")

    def __init__(self, value: int | float):
        self.value = value
        self._flat = ((), _key(value))  # what it flattens to, made once (flattened at every jitted call)

    def array(self) -> jax.Array:
        """The value as the array a Python number becomes in a hyperparameter field (weakly
        typed); concrete, also while a step is traced (so `is_concrete_zero` knows it)."""
        with jax.ensure_compile_time_eval():
            return jnp.asarray(self.value)

    def __float__(self) -> float:
        return float(self.value)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.value, dtype=dtype)

    @property
    def shape(self) -> tuple[()]:
        return ()

    @property
    def ndim(self) -> int:
        return 0

    def __eq__(self, other: Any) -> bool:
        return type(other) is Constant and _key(self.value) == _key(other.value)

    def __hash__(self) -> int:
        return hash(_key(self.value))

    def __reduce__(self):
        return Constant, (self.value,)

    def __repr__(self) -> str:
        return repr(self.value)


def _key(value: int | float) -> tuple:
    """What tells two constants apart: the type (an int and a float make arrays of other
    dtypes) and the number, with its sign (`-0.0` is not `0.0`)."""
    return (type(value), value, math.copysign(1, value) if isinstance(value, float) else 1)


jax.tree_util.register_pytree_node(Constant, operator.attrgetter("_flat"), lambda key, _: Constant(key[1]))


def constant_at(value: Any, identity: int | float) -> Constant | None:
    """`Constant(value)` where `value` is a Python or NumPy number (not a bool, not a JAX array)
    equal to `identity`, sign included; else `None`."""
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
        value = value.item() if np.issubdtype(value.dtype, np.number) else value
    if type(value) not in (int, float):
        return None
    if value != identity or _key(float(value))[2] != _key(float(identity))[2]:
        return None
    return Constant(value)


# The dynamic fields of each module class, as `with_constants_as_numbers` looks for constants in them.
_DYNAMIC_FIELDS: dict[type, tuple[str, ...]] = {}


def with_constants_as_numbers(module: Any) -> Any:
    """`module`, or a copy whose `Constant` fields hold their numbers (what its methods compute with).

    Numbers rather than arrays: a number is concrete while a step is traced, and compares and
    hashes as itself (JAX caches on bound methods, `jax.eval_shape(self.init, ...)`, comparing
    their modules; concrete arrays would be compared by traced operations there)."""
    cls = type(module)
    names = _DYNAMIC_FIELDS.get(cls)
    if names is None:
        dynamic = (f.name for f in dataclasses.fields(cls) if not f.metadata.get("static", False))
        names = _DYNAMIC_FIELDS[cls] = tuple(dynamic)
    values = module.__dict__
    constants = [name for name in names if type(values.get(name)) is Constant]
    if not constants:
        return module
    copy = object.__new__(cls)
    copy.__dict__.update(values)
    for name in constants:
        copy.__dict__[name] = values[name].value
    return copy


class Module(eqx.Module):
    """An `equinox.Module` whose attribute reads skip Equinox's per-read hook.

    Its subclasses behave as Equinox modules (fields, pytrees, `tx.update` a pytree bound
    method that `eqx.filter_jit` traces through); only reading an attribute is faster, and
    with it flattening (see the module docstring).
    """

    __getattribute__ = object.__getattribute__

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields = cls.__dict__.get("__annotations__", {})
        for name, value in list(cls.__dict__.items()):
            if isinstance(value, types.FunctionType) and not _is_magic(name) and name not in fields:
                setattr(cls, name, _PytreeMethod(value))
