"""Field declarations for transforms and schedules.

Every transform is an `equinox.Module` whose dataclass fields are its configuration. Two
kinds of field exist:

- `hyperparameter(...)`: a number the math uses (learning rate, betas, eps...). It is stored
  as a JAX array leaf, so changing it inside `jax.jit` never retraces. Python scalars become
  *weakly typed* arrays, so `bf16_array * lr` stays bf16, exactly as with a Python float.
  An optional `check` validates the value at construction.
- `static(...)`: structure (flags, dtypes, sizes that shape the computation, code). It is part
  of the treedef: changing it retraces, by design.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

_CHECK = "modopt_check"


class Check:
    """A named predicate on a concrete hyperparameter value, e.g. `in [0, 1)`."""

    def __init__(self, description: str, predicate: Callable[[np.ndarray], bool]):
        self.description = description
        self.predicate = predicate

    def __repr__(self):
        return f"Check({self.description!r})"


def interval(lo: float, hi: float, *, closed_lo: bool = True, closed_hi: bool = False) -> Check:
    """Values in an interval; `interval(0, 1)` is `[0, 1)`."""
    left = "[" if closed_lo else "("
    right = "]" if closed_hi else ")"

    def ok(v):
        above = v >= lo if closed_lo else v > lo
        below = v <= hi if closed_hi else v < hi
        return bool(np.all(above & below))

    return Check(f"in {left}{lo:g}, {hi:g}{right}", ok)


NONNEGATIVE = Check(">= 0", lambda v: bool(np.all(v >= 0)))
POSITIVE = Check("> 0", lambda v: bool(np.all(v > 0)))
UNIT = interval(0, 1, closed_hi=True)  # [0, 1]
PROBABILITY_EXCLUSIVE = interval(0, 1)  # [0, 1), e.g. Adam's betas


def as_hyperparameter(value: Any) -> Any:
    """Converts a numeric hyperparameter to an array leaf, keeping Python scalars weakly typed.

    `None`, callables and modules (schedules) pass through: they are handled by their owner.
    """
    if value is None or callable(value) or isinstance(value, (jax.Array, eqx.Module)):
        return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"Expected a number, got the boolean {value!r}.")
    if isinstance(value, (int, float, complex)):
        return jnp.asarray(value)  # weakly typed
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
        return jnp.asarray(value.item())  # a NumPy scalar acts like a Python scalar
    return jnp.asarray(value)


def hyperparameter(default: Any = dataclasses.MISSING, *, check: Check | None = None, **kwargs):
    """A numeric hyperparameter field: an array leaf, validated at construction by `check`."""
    metadata = dict(kwargs.pop("metadata", {}))
    metadata[_CHECK] = check
    converter = kwargs.pop("converter", as_hyperparameter)
    return eqx.field(default=default, converter=converter, metadata=metadata, **kwargs)


def static(default: Any = dataclasses.MISSING, **kwargs):
    """A structural field: part of the treedef (flags, dtypes, integers that shape the math)."""
    return eqx.field(default=default, static=True, **kwargs)


def is_concrete(value: Any) -> bool:
    """True when `value` can be inspected in Python (not a tracer inside `jit`)."""
    if isinstance(value, jax.core.Tracer):
        return False
    return isinstance(value, (jax.Array, np.ndarray, np.generic, int, float))


def validate_hyperparameters(module: eqx.Module) -> None:
    """Raises `ValueError("Invalid b2: 1.0 (must be in [0, 1))")` for out-of-range values.

    Values that are not concrete (traced inside `jit`) cannot be checked and are skipped.
    """
    for f in dataclasses.fields(module):
        check = f.metadata.get(_CHECK)
        if check is None:
            continue
        value = getattr(module, f.name)
        if not is_concrete(value):
            continue
        concrete = np.asarray(value)
        if np.iscomplexobj(concrete) or not check.predicate(concrete):
            shown = concrete[()] if concrete.ndim == 0 else concrete  # at its own precision
            raise ValueError(
                f"Invalid {f.name}: {shown!s} (must be {check.description}) "
                f"in {type(module).__name__}."
            )


def hyperparameter_names(module: eqx.Module) -> tuple[str, ...]:
    """Names of the fields declared with `hyperparameter(...)`."""
    return tuple(f.name for f in dataclasses.fields(module) if _CHECK in f.metadata)


def canonical_dtype(dtype: Any) -> Any:
    """A dtype-like turned into a hashable NumPy dtype (respecting x64 mode); `None` stays."""
    if dtype is None:
        return None
    return jax.dtypes.canonicalize_dtype(dtype)


class StaticTree:
    """A hashable, static holder for a pytree of Python values (masks, labels).

    Masks and labels decide the *structure* of the state, so they must be known at trace
    time: they are stored as (treedef, leaves) and rebuilt on demand.
    """

    __slots__ = ("_leaves", "_treedef")

    def __init__(self, tree: Any):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        for leaf in leaves:
            if isinstance(leaf, (jax.Array, np.ndarray)):
                raise TypeError(
                    "Masks and labels must hold Python values (bools, strings) or be a "
                    f"callable, not arrays: got {type(leaf).__name__}. Use Python bools."
                )
        self._leaves = tuple(leaves)
        self._treedef = treedef

    @property
    def tree(self) -> Any:
        return jax.tree_util.tree_unflatten(self._treedef, self._leaves)

    def __hash__(self):
        return hash((self._treedef, self._leaves))

    def __eq__(self, other):
        return (
            isinstance(other, StaticTree)
            and self._treedef == other._treedef
            and self._leaves == other._leaves
        )

    def __repr__(self):
        return repr(self.tree)


def as_static_tree(value: Any) -> Any:
    """Converter for mask/label fields: callables stay, pytrees become `StaticTree`."""
    if value is None or callable(value) or isinstance(value, StaticTree):
        return value
    return StaticTree(value)


def resolve_tree(value: Any, params: Any) -> Any:
    """The concrete mask/labels tree: call it on `params` if it is a function."""
    if isinstance(value, StaticTree):
        return value.tree
    return value(params)


def pretty(module: eqx.Module) -> str:
    """The module's repr with concrete scalar hyperparameters shown as numbers."""

    def number(leaf):
        if isinstance(leaf, jax.Array) and is_concrete(leaf) and leaf.ndim == 0:
            return _Number(np.asarray(leaf)[()])
        return leaf

    return eqx.tree_pformat(jax.tree_util.tree_map(number, module), short_arrays=True)


class _Number:
    """Prints a NumPy scalar at its own precision (`0.001`, not `0.0010000000474974513`)."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return str(self.value)
