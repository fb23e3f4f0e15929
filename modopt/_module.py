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
"""

from __future__ import annotations

import functools
import types
from typing import Any

import equinox as eqx


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

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.__func__
        return _BoundMethod(self.__func__, instance)


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
