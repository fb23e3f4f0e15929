"""Reading and replacing a transform's hyperparameters by name."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, _shown
from .._core.checks import warn_user
from .._core.fields import Rate, as_hyperparameter, as_rate, complex_violation, field_identity, hyperparameter_names
from .._core.fields import validate_hyperparameters
from .._core.module import Constant, constant_at
from ..schedules._base import AbstractSchedule, as_schedule, is_schedule
from ..schedules._exact import is_traced
from ..schedules._schedules import ConstantSchedule


def hyperparameters(tx: AbstractTransform) -> dict[str, Any]:
    """Every hyperparameter of `tx` by name (a dotted path where names clash), schedules included.

    Args:
        tx: a transform; its parts (a chain's transforms, a wrapper's inner one) and the numbers
            of its schedules are included.

    Example:
        >>> modopt.hyperparameters(modopt.adam(1e-3))["learning_rate"]
        Array(0.001, dtype=float32, weak_type=True)
    """
    return {name: _readable(get(tx)) for name, (get, _) in _hyperparameter_index(tx).items()}


def hyperparameters_with_state(tx: AbstractTransform, state: Any) -> dict[str, Any]:
    """`hyperparameters(tx)`, with the live values of those that live in `state` (`inject_hyperparams`)."""
    return {**hyperparameters(tx), **{name: get(state) for name, get in _state_index(tx).items()}}


def set_hyperparameters_with_state(
    tx: AbstractTransform, state: Any, *, init: Callable[[AbstractTransform], Any] | None = None, **values: Any
) -> tuple[AbstractTransform, Any]:
    """`set_hyperparameters(tx, **values)`, also writing each value that lives in `state`.

    A name that lives in the state (`inject_hyperparams`' numbers) is written there, keeping
    its array type, and in `tx` too where `tx` names it (its initial value). Returns the new
    `(tx, state)`.

    With `init` (`init(tx)` returns the state `tx` makes for the parameters, traceable: it
    builds them from their shapes), a schedule may replace a number: the parts of the state the
    new `tx` needs and the old one had not (the schedule's step count) are made by `init`, so
    the schedule counts from 0 at the next step; the rest of the state is kept.
    """
    in_state = _state_index(tx, all_paths=True)
    in_tx = _hyperparameter_index(tx, all_paths=True)
    unknown = sorted(set(values) - set(in_state) - set(in_tx))
    if unknown:
        raise KeyError(_unknown(unknown[0], sorted(set(_state_index(tx)) | set(_hyperparameter_index(tx)))))
    new_tx = _set_hyperparameters(tx, {name: value for name, value in values.items() if name in in_tx}, init is not None)
    for name, value in values.items():
        if name in in_state:
            get = in_state[name]
            state = eqx.tree_at(get, state, _like(value, get(state), name))
    if init is not None and jax.tree_util.tree_structure(new_tx) != jax.tree_util.tree_structure(tx):
        state = _rebuilt_state(new_tx, state, init, values)  # a schedule where a number was
    return new_tx, state


def _rebuilt_state(tx: AbstractTransform, state: Any, init: Callable[[AbstractTransform], Any], values: dict) -> Any:
    """`state`, with the parts that `tx` needs and `state` lacks made by `init(tx)`.

    Only step counts (integer scalars) are made so: any other new part would start from
    nothing in the middle of training, which is an error.
    """
    fresh = jax.eval_shape(lambda: init(tx))
    made: list[Any] = []
    merged = _merge(state, fresh, made)
    if not made:
        return state
    new_leaves = [leaf for part in made for leaf in jax.tree_util.tree_leaves(part)]
    if not all(leaf.shape == () and jnp.issubdtype(leaf.dtype, jnp.integer) for leaf in new_leaves):
        names = ", ".join(sorted(values))
        raise ValueError(
            f"set({names}=...) changes the optimizer's state beyond a step count (it would need new state "
            f"{[f'{leaf.dtype.name}{list(leaf.shape)}' for leaf in new_leaves]}, which cannot start from nothing "
            "mid-training). Build a new optimizer with the new values instead."
        )
    parts = iter(jax.jit(lambda: _new_parts(state, init(tx)))())
    return jax.tree_util.tree_map(lambda x: next(parts) if x is _MADE else x, merged, is_leaf=lambda x: x is _MADE)


_MADE = object()  # where `_merge` takes a part of the new state


def _merge(old: Any, new: Any, made: list[Any]) -> Any:
    """`new`'s structure, holding `old`'s subtrees where they have the same structure (leaves of
    the same shape and dtype), and `_MADE` in place of each leaf of a new part (appended to `made`)."""
    if _same_structure(old, new):
        return old
    old_children, old_node = _one_level(old)
    new_children, new_node = _one_level(new)
    if old_node == new_node and old_node.num_nodes > 1:
        return new_node.unflatten([_merge(o, n, made) for o, n in zip(old_children, new_children)])
    made.append(new)
    return jax.tree_util.tree_map(lambda _: _MADE, new)


def _new_parts(old: Any, new: Any) -> list[Any]:
    """The leaves of the parts of `new` that `_merge(old, new)` takes, in its order."""
    made: list[Any] = []
    _merge(old, new, made)
    return [leaf for part in made for leaf in jax.tree_util.tree_leaves(part)]


def _same_structure(old: Any, new: Any) -> bool:
    if jax.tree_util.tree_structure(old) != jax.tree_util.tree_structure(new):
        return False
    return all(
        jnp.shape(o) == jnp.shape(n) and jnp.result_type(o) == jnp.result_type(n)
        for o, n in zip(jax.tree_util.tree_leaves(old), jax.tree_util.tree_leaves(new))
    )


def _one_level(tree: Any) -> tuple[list[Any], Any]:
    """`tree`'s children and its top node (a treedef whose children are leaves)."""
    return jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is not tree)


def _by_structure(index: Callable[..., dict]) -> Callable[..., dict]:
    """`index(tx, *flags)`, kept per pytree structure of `tx` (its classes, static fields and
    the places of its arrays), of which an index of names and getters is a function alone: a
    `set` or a read of the hyperparameters does not rebuild a composite's parts each time. A
    transform with traced leaves, or whose structure cannot be hashed, is indexed anew. The
    index returned is shared: read it, do not change it."""
    cache: dict[Any, dict] = {}

    @functools.wraps(index)
    def cached(tx: Any, *flags: Any, **named_flags: Any) -> dict:
        leaves, structure = jax.tree_util.tree_flatten(tx)
        key = (structure, flags, tuple(named_flags.items()))
        try:
            found = cache.get(key)
        except TypeError:  # a static field that cannot be hashed
            return index(tx, *flags, **named_flags)
        if found is None:
            found = index(tx, *flags, **named_flags)
            if not is_traced(*leaves):  # `_state_index`'s getters hold the parts built from these leaves
                if len(cache) >= 512:
                    cache.clear()
                cache[key] = found
        return found

    return cached


@_by_structure
def _state_index(tx: AbstractTransform, all_paths: bool = False) -> dict[str, Callable[[Any], Any]]:
    """The hyperparameters that live in the state, found through every part, with getters from
    the whole state. Short names where unique, qualified by the parts' names otherwise."""
    found: list[tuple[str, str, Callable[[Any], Any]]] = []

    def visit(node: AbstractTransform, path: str, get: Callable[[Any], Any]) -> None:
        for name, inner_get in node.hyperparameters_in_state().items():
            found.append((name, f"{path}.{name}".lstrip("."), lambda s, get=get, inner_get=inner_get: inner_get(get(s))))
        for part in node.parts():
            visit(part.transform, path + part.name, lambda s, get=get, part=part: part.state(get(s)))

    visit(tx, "", lambda s: s)
    return _named(found, all_paths)


def _unknown(name: str, names: list[str]) -> str:
    """The message for a name `set` cannot find: an ambiguous short name lists its paths."""
    paths = [n for n in names if n.endswith(f".{name}") or n.endswith(f"[{name!r}]")]
    if paths:
        return f"The hyperparameter name {name!r} is not unique here: name one of {paths}."
    return f"No hyperparameter named {name!r}; the names are {names} (full paths such as 'transforms[0].b1' work too)."


def _readable(value: Any) -> Any:
    """A rate is read as its value (its exact complement is bookkeeping), a `Constant` as its array."""
    if isinstance(value, Constant):
        return value.array()
    return value.value if isinstance(value, Rate) else value


def _is_none_or_constant(x: Any) -> bool:
    """The nodes without leaves that `set` replaces (`eqx.tree_at` finds them as leaves)."""
    return x is None or type(x) is Constant


def set_hyperparameters(tx: AbstractTransform, **values: Any) -> AbstractTransform:
    """A copy of `tx` with hyperparameters replaced by name, validated.

    Numbers keep the array type of the value they replace, so a jitted step taking the
    transform as an argument does not retrace, unless the value moves to or from the identity
    its field declares (a weight decay to or from 0, given as a number: that value is compiled
    into the step, see `modopt.fields.hyperparameter`). A hyperparameter is named by its field name
    where that is unique in `tx` (`learning_rate`) and by its path otherwise
    (`transforms[0].b1`); its full path is always accepted, so a name written as a path
    keeps working when a chain grows another transform with the same field.

    Each new value is validated by the module that holds it and by every module around it (a
    schedule's new `init_value` must still make a valid learning rate).

    Args:
        tx: the transform to copy.
        **values: the new values by name (see `hyperparameters(tx)` for the names).
    """
    return _set_hyperparameters(tx, values, schedules_for_numbers=False)


def _set_hyperparameters(tx: AbstractTransform, values: dict[str, Any], schedules_for_numbers: bool) -> AbstractTransform:
    """`set_hyperparameters(tx, **values)`; a schedule may replace a number if `schedules_for_numbers`
    (the caller makes the state it then needs)."""
    index = _hyperparameter_index(tx, all_paths=True, with_fields=True)
    for name, value in values.items():
        if name not in index:
            raise KeyError(_unknown(name, sorted(_hyperparameter_index(tx))))
        get, owners, field = index[name]
        identity = None if field is None else field_identity(field)
        new = _like(value, get(tx), name, schedules_for_numbers, identity)
        tx = eqx.tree_at(get, tx, new, is_leaf=_is_none_or_constant)
        for owner in reversed(owners):  # the field's module, then each module holding it (a schedule's
            validate_hyperparameters(owner(tx))  # new value must also suit its optimizer's learning rate)
    return tx


def _like(value: Any, old: Any, name: str, schedules_for_numbers: bool = False, identity: Any = None) -> Any:
    """`value` converted the way the field it replaces was (weak arrays, rates, schedules), a
    `Constant` where it is the field's `identity` given as a number (see `Constant`).

    A number replacing a schedule becomes a constant schedule, so the state (which counts
    steps for the schedule) keeps its structure. A schedule replacing a number needs a step
    count the state does not have: an error unless `schedules_for_numbers` (the caller makes
    it). A number replacing `None` or the reverse (momentum switched on or off) is an error,
    and so is a complex number where the old value is real (hyperparameters are real numbers).
    """
    if (old is None) != (value is None):
        was, now = ("None", "a value") if old is None else ("a value", "None")
        raise ValueError(
            f"Cannot set {name} from {was} to {now}: that changes the structure of the optimizer's "
            f"state (e.g. momentum buffers). Build a new optimizer with {name}={value!r} instead."
        )
    complex_problem = complex_violation(value)
    if complex_problem and not (isinstance(old, jax.Array) and jnp.iscomplexobj(old)):
        raise ValueError(f"Invalid {name}: {complex_problem}.")
    if isinstance(old, Constant):
        old = old.array()  # what it stands for, whose type a new array takes
    constant = None if identity is None or is_schedule(old) else constant_at(value, identity)
    if constant is not None:  # of the kind of number the old value was, as an array keeps its type
        inexact = isinstance(old, jax.Array) and jnp.issubdtype(old.dtype, jnp.inexact)
        return Constant(float(constant.value)) if inexact else constant
    if isinstance(old, Rate):
        new = as_rate(value)  # its complement computed from the number as given
        if not isinstance(new, Rate):
            return new  # not a number: validation reports it
        return Rate(_like(new.value, old.value, name), _like(new.complement, old.complement, name))
    value = as_schedule(as_hyperparameter(value))
    if is_schedule(old) and not is_schedule(value):
        warn_user(
            f"set({name}={_shown(value)}) replaces the schedule {type(old).__name__} by the constant "
            f"{_shown(value)} for every later step. Pass a schedule to keep one."
        )
        return ConstantSchedule(value)
    if is_schedule(value) and not is_schedule(old) and not schedules_for_numbers:
        raise ValueError(
            f"Cannot set {name} to a schedule here: it was a number when the optimizer was made, so the "
            "optimizer's state has no step count for a schedule, and this call cannot add one. "
            "`modopt.Optimizer.set` and the Flax adapter's `TrainState.set` add it (the schedule then counts "
            "from 0 at the next step); for a bare transform, `init` a new state for the transform "
            "`set_hyperparameters` returns; else build a new optimizer with the schedule."
        )
    if isinstance(value, jax.Array) and isinstance(old, jax.Array) and not isinstance(value, jax.core.Tracer):
        if value.shape != old.shape:
            raise ValueError(f"Cannot set {name} to an array of shape {value.shape}: it has shape {old.shape}.")
        if value.dtype != old.dtype or value.weak_type != old.weak_type:
            value = _same_type(value, old)
    return value


def _same_type(value: jax.Array, old: jax.Array) -> jax.Array:
    """`value` with the dtype and weak type of `old`, so a jitted step sees the same types."""
    if old.weak_type and old.ndim == 0:
        kind = float if jnp.issubdtype(old.dtype, jnp.floating) else complex if jnp.iscomplexobj(old) else int
        return jnp.asarray(kind(value.item()))
    return value.astype(old.dtype)


Getter = Callable[[Any], Any]


@_by_structure
def _hyperparameter_index(tx: Any, all_paths: bool = False, with_fields: bool = False) -> dict[str, tuple]:
    """Maps each hyperparameter's name to (getter of its value, getters of the modules holding
    it, from the root to its own module), and with `with_fields` its dataclass field (`None`
    for an entry of a dict of hyperparameters).

    Short field names are used where unique; clashing names are qualified by their path.
    """
    found: list[tuple] = []
    fields_of: dict[str, dataclasses.Field] = {}

    def visit(node: Any, path: str, get: Getter, owners: tuple[Getter, ...]) -> None:
        if isinstance(node, (AbstractTransform, AbstractSchedule)):
            owners = (*owners, get)
            names = hyperparameter_names(node)
            for name in names:
                getter = lambda t, get=get, name=name: getattr(get(t), name)
                value = getattr(node, name)
                if isinstance(value, dict):  # a dict of hyperparameters (`inject_hyperparams`)
                    for key, entry in value.items():
                        entry_getter = lambda t, getter=getter, key=key: getter(t)[key]
                        found.append((key, f"{path}.{name}[{key!r}]".lstrip("."), entry_getter, owners))
                        visit(entry, f"{path}.{name}[{key!r}]", entry_getter, owners)
                    continue
                found.append((name, f"{path}.{name}".lstrip("."), getter, owners))
                fields_of[f"{path}.{name}".lstrip(".")] = _field(node, name)
                visit(value, f"{path}.{name}", getter, owners)  # a schedule's own numbers
            for f in dataclasses.fields(node):
                if f.name not in names and not f.metadata.get("static", False):
                    child = getattr(node, f.name)
                    visit(child, f"{path}.{f.name}", lambda t, get=get, n=f.name: getattr(get(t), n), owners)
        elif isinstance(node, (tuple, list)):
            for i, child in enumerate(node):
                visit(child, f"{path}[{i}]", lambda t, get=get, i=i: get(t)[i], owners)
        elif isinstance(node, dict):
            for key, child in node.items():
                visit(child, f"{path}[{key!r}]", lambda t, get=get, key=key: get(t)[key], owners)

    visit(tx, "", lambda t: t, ())
    if with_fields:
        found = [(name, path, get, owners, fields_of.get(path)) for name, path, get, owners in found]
    return _named(found, all_paths)


def _field(module: Any, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(module) if f.name == name)


def _named(found: list[tuple], all_paths: bool) -> dict[str, Any]:
    """`(name, path, *values)` rows by name where the name is unique, else by path; with
    `all_paths`, by path as well for every row (the names `set` accepts)."""
    counts: dict[str, int] = {}
    for name, *_ in found:
        counts[name] = counts.get(name, 0) + 1
    named = {}
    for name, path, *values in found:
        value = values[0] if len(values) == 1 else tuple(values)
        if counts[name] == 1:
            named[name] = value
        if counts[name] > 1 or all_paths:
            named[path] = value
    return named
