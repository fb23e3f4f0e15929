"""Field declarations for transforms and schedules.

Every transform is an `equinox.Module` whose dataclass fields are its configuration. Two
kinds of field exist:

- `hyperparameter(...)`: a number the math uses (learning rate, betas, eps...). It is stored
  as a JAX array leaf, so changing it inside `jax.jit` never retraces. Python scalars become
  *weakly typed* arrays, so `bf16_array * lr` stays bf16, exactly as with a Python float.
  An optional `check` validates the value at construction. A field may declare an
  `identity`, the value at which it does nothing (a weight decay of 0): given as a Python
  number, that value is compiled into the step as a constant (a `Constant`, see there).
- `static(...)`: structure (flags, dtypes, sizes that shape the computation, code). It is part
  of the treedef: changing it retraces, by design.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .checks import prefix_difference
from .module import Constant, Module, constant_at
from jax.typing import DTypeLike

# Built like `ScalarOrSchedule` (modopt.schedules), of which it is the part without schedules.
Scalar = Union[float, jax.Array]
"""A numeric hyperparameter: a Python or NumPy number, or a 0-d array (stored as a 0-d array leaf)."""

_CHECK = "modopt_check"  # metadata key: the field is a hyperparameter, with this `Check` (or None)
_CHOICES = "modopt_choices"  # metadata key: the values a static field may take
_OPTIONAL = "modopt_optional"  # metadata key: `None` (switching the feature off) is accepted
_KIND = "modopt_kind"  # metadata key: what a hyperparameter accepts (see `_KINDS`)
_NDIM = "modopt_ndim"  # metadata key: the number of dimensions of its value (0: a scalar)
_DTYPE = "modopt_dtype"  # metadata key: a dtype field; the value says what it sets ("state", "hyperparameters")
_PRNG_KEY = "modopt_prng_key"  # metadata key: a PRNG-key field (`prng_key`)
_IDENTITY = "modopt_identity"  # metadata key: the value at which the field does nothing (a `Constant`)
_KINDS = {
    "number": "a number",
    "number_or_schedule": "a number or a schedule (a callable of the step count)",
    "schedule": "a schedule (a callable of the step count)",
    "dict": "a dict of numbers and schedules by name",
}


class Check:
    """A named predicate on a concrete hyperparameter value, e.g. `in [0, 1)`.

    Args:
        description: the condition in words, as error messages show it (`"in [0, 1)"`).
        predicate: a function of the value as a NumPy array returning whether it passes.
    """

    def __init__(self, description: str, predicate: Callable[[np.ndarray], bool]):
        self.description = description
        self.predicate = predicate

    def __repr__(self):
        return f"Check({self.description!r})"


def interval(lo: float, hi: float, *, closed_lo: bool = True, closed_hi: bool = False) -> Check:
    """Values in an interval; `interval(0, 1)` is `[0, 1)`.

    Args:
        lo: the lower end.
        hi: the upper end.
        closed_lo: whether `lo` itself is allowed.
        closed_hi: whether `hi` itself is allowed.
    """
    left = "[" if closed_lo else "("
    right = "]" if closed_hi else ")"

    def ok(v):
        above = v >= lo if closed_lo else v > lo
        below = v <= hi if closed_hi else v < hi
        return bool(np.all(above & below))

    return Check(f"in {left}{lo:g}, {hi:g}{right}", ok)


NONNEGATIVE = Check(">= 0", lambda v: bool(np.all(v >= 0)))
POSITIVE = Check("> 0", lambda v: bool(np.all(v > 0)))
FINITE = Check("finite", lambda v: bool(np.all(np.isfinite(v))))
FINITE_NONNEGATIVE = Check(">= 0 and finite", lambda v: bool(np.all((v >= 0) & np.isfinite(v))))
POSITIVE_INTEGER = Check("an integer >= 1", lambda v: bool(np.all((v >= 1) & (v == np.round(v)))))
NONNEGATIVE_INTEGER = Check("an integer >= 0", lambda v: bool(np.all((v >= 0) & (v == np.round(v)))))
UNIT = interval(0, 1, closed_hi=True)  # [0, 1]
PROBABILITY_EXCLUSIVE = interval(0, 1)  # [0, 1), e.g. Adam's betas


class Rate(Module):
    """A decay rate `b` stored with its complement `1 - b`, both as float32 leaves.

    EMAs weigh new values by `1 - b`. For `b = 0.999` in float32, `1 - b` loses four digits
    (`0.00099998713` instead of `0.001`): a rate given as a Python number keeps its
    complement computed in double precision, so `1 - rate` is exact to float32. Elsewhere a
    rate acts as its value (`rate * x`, `rate ** t`, `jnp.asarray(rate)`, `float(rate)`).
    Gradients with respect to the rate flow through `value` only.

    Args:
        value: the rate `b`, a float32 array.
        complement: `1 - b`, a float32 array computed where it is exact.
    """

    value: Any
    complement: Any

    def __jax_array__(self):
        return jnp.asarray(self.value)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.value, dtype=dtype)

    def __float__(self):
        return float(self.value)

    def __rsub__(self, other):
        if isinstance(other, (int, float)) and other == 1:
            return _one_minus(jnp.asarray(self.value), jnp.asarray(self.complement))
        return other - jnp.asarray(self.value)

    # Everything else is arithmetic on the value.
    def __sub__(self, other):
        return jnp.asarray(self.value) - other

    def __add__(self, other):
        return jnp.asarray(self.value) + other

    def __radd__(self, other):
        return other + jnp.asarray(self.value)

    def __mul__(self, other):
        return jnp.asarray(self.value) * other

    def __rmul__(self, other):
        return other * jnp.asarray(self.value)

    def __truediv__(self, other):
        return jnp.asarray(self.value) / other

    def __rtruediv__(self, other):
        return other / jnp.asarray(self.value)

    def __pow__(self, other):
        return jnp.asarray(self.value) ** other

    def __rpow__(self, other):
        return other ** jnp.asarray(self.value)

    def __neg__(self):
        return -jnp.asarray(self.value)

    def __repr__(self):
        return repr(_Number(np.asarray(self.value)[()])) if is_concrete(self.value) else "Rate(traced)"


@jax.custom_jvp
def _one_minus(value: jax.Array, complement: jax.Array) -> jax.Array:
    """`1 - value`, whose value is the stored `complement` (no arithmetic in the compiled step)
    and whose derivative is that of `1 - value`."""
    return complement


@_one_minus.defjvp
def _one_minus_jvp(primals, tangents):
    (_, complement), (value_tangent, _) = primals, tangents
    return complement, -value_tangent


def as_rate(value: Any) -> Any:
    """Converter of rate fields: a number becomes a `Rate` with an exact complement.

    `None`, rates and values that are not numbers pass through (validation reports them).
    """
    if value is None or isinstance(value, Rate):
        return value
    number = as_hyperparameter(value)
    if not isinstance(number, jax.Array):
        return number
    if complex_violation(number):
        return number  # not a real number: validation reports it
    if isinstance(number, jax.core.Tracer):
        return Rate(number, 1 - number)
    exact = 1.0 - np.asarray(value, np.float64)  # in double precision, then rounded once
    if number.weak_type and number.ndim == 0:
        return Rate(number, jnp.asarray(float(exact)))
    return Rate(number, jnp.asarray(exact, number.dtype))


def as_hyperparameter(value: Any) -> Any:
    """Converts a numeric hyperparameter to an array leaf, keeping Python scalars weakly typed.

    Integers beyond int32 (step counts such as `decay_steps=10**10`) become weak floats.
    Anything that is not a number (`None`, schedules, strings) passes through unchanged:
    `validate_hyperparameters` reports it with the field's name.
    """
    if value is None or callable(value) or isinstance(value, (jax.Array, eqx.Module, Constant)):
        return value
    if isinstance(value, (bool, np.bool_)):
        return value
    if isinstance(value, int) and not -(2**31) <= value < 2**31:
        return jnp.asarray(float(value))
    if isinstance(value, (int, float, complex)):
        return jnp.asarray(value)  # weakly typed
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0 and np.issubdtype(value.dtype, np.number):
        return as_hyperparameter(value.item())  # a NumPy scalar acts like a Python scalar
    try:
        array = jnp.asarray(value)
    except (TypeError, ValueError):
        return value
    return array if jnp.issubdtype(array.dtype, jnp.number) else value


def hyperparameter(
    default: Any = dataclasses.MISSING,
    *,
    check: Check | None = None,
    kind: str = "number",
    optional: bool = False,
    ndim: int = 0,
    identity: int | float | None = None,
    **kwargs: Any,
):
    """A numeric hyperparameter field: an array leaf, validated at construction by `check`.

    `kind` says what it accepts: "number" (the default), "number_or_schedule" (see
    `scalar_or_schedule`) or "schedule". `None` is accepted where it is the default or where
    the field is `optional` (`None` switches the feature off, e.g. Adafactor's clipping).
    A number is a scalar unless `ndim` says otherwise (a schedule's boundaries are a vector).
    A schedule in a field with a `check` must pass it at its `probe_counts()`.

    With an `identity` (the value at which the hyperparameter does nothing: a weight decay of
    0), that value given as a Python or NumPy number is held as a `Constant`, part of the
    structure rather than a leaf, so a jitted step compiles it in (and skips the work it makes
    void); moving the value to or from the identity then compiles the step again. Declare an
    identity only where the default is commonly the identity and rarely changed in training.

    Args:
        default: the field's default value; leave it out for a required field.
        check: a `Check` the value must pass at construction, or `None` for none.
        kind: `"number"`, `"number_or_schedule"` or `"schedule"`: what the field accepts.
        optional: accept `None` (the feature switched off) even where it is not the default.
        ndim: the number of dimensions of a number: 0 (a scalar, the default) or 1 (a vector).
        identity: the value at which the hyperparameter does nothing, held as a `Constant` when
            given as a Python or NumPy number; `None` (the default) for none.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    if kind not in _KINDS:
        raise ValueError(f"Unknown hyperparameter kind {kind!r}; the kinds are {sorted(_KINDS)}.")
    metadata = dict(kwargs.pop("metadata", {}))
    metadata[_CHECK] = check
    metadata[_KIND] = kind
    metadata[_OPTIONAL] = optional or default is None
    metadata[_NDIM] = ndim
    converter = kwargs.pop("converter", as_hyperparameter)
    if identity is not None:
        metadata[_IDENTITY] = identity
        converter = _identity_converter(converter, identity)
    return eqx.field(default=default, converter=converter, metadata=metadata, **kwargs)


def _identity_converter(converter: Callable[[Any], Any], identity: int | float) -> Callable[[Any], Any]:
    """`converter`, except that `identity` given as a number becomes a `Constant`."""

    def convert(value: Any) -> Any:
        constant = constant_at(value, identity)
        return converter(value) if constant is None else constant

    # Equinox gives the field's `__init__` parameter the converter's annotation.
    convert.__annotations__ = dict(getattr(converter, "__annotations__", {}))
    return convert


def field_identity(field: dataclasses.Field) -> int | float | None:
    """The identity a hyperparameter field declares (see `hyperparameter`), else `None`."""
    return field.metadata.get(_IDENTITY)


def rate(default: Any = dataclasses.MISSING, *, check: Check | None = None, **kwargs: Any):
    """A decay-rate hyperparameter (a `Rate`: `1 - rate` stays exact in float32).

    Args:
        default: the field's default rate; leave it out for a required field.
        check: a `Check` the value must pass at construction, or `None` for none.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return hyperparameter(default, check=check, converter=as_rate, **kwargs)


def static(default: Any = dataclasses.MISSING, **kwargs: Any):
    """A structural field: part of the treedef (flags, dtypes, integers that shape the math).

    Args:
        default: the field's default value; leave it out for a required field.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return eqx.field(default=default, static=True, **kwargs)


def choice(default: Any, options: tuple[Any, ...], **kwargs: Any):
    """A static field taking one of `options` (a mode, a variant), validated at construction.

    Args:
        default: the default option.
        options: the allowed values.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    metadata = dict(kwargs.pop("metadata", {}))
    metadata[_CHOICES] = tuple(options)
    return static(default, metadata=metadata, **kwargs)


def as_key(value: Any, name: str = "key", where: str | None = None, *, seeds: bool = True) -> jax.Array:
    """A typed PRNG key from a typed key, its raw `uint32` key data, or (with `seeds`) an integer seed.

    Raises `TypeError` naming the argument (`name`, and `where` it was given) for anything
    else: a float, a bool, `None`, signed or floating key data, key data of another shape than
    the default implementation's, several keys where one is expected.

    Args:
        value: the key, its key data, or a seed.
        name: the argument's name, for the error.
        where: the function or class it was given to, for the error.
        seeds: whether an integer seed is accepted (transforms' `key` fields, as optax's);
            `Optimizer(key=...)` and `apply_updates(key=...)` take a key.
    """
    if (problem := _key_problem(value, seeds)) is not None:
        seed = ", or an integer seed" if seeds else ""
        raise TypeError(
            f"Invalid {name}: {f'keys of shape {tuple(value.shape)}' if _is_key(value) else _shown(value)} ({problem})"
            f"{f' in {where}' if where else ''}. Expected a PRNG key (`jax.random.key(seed)`), its raw key data "
            f"(uint32, shape {_raw_key_shape()}){seed}."
        )
    if _is_key(value):
        return value
    if isinstance(value, (jax.Array, np.ndarray)) and jnp.issubdtype(value.dtype, jnp.unsignedinteger):
        return jax.random.wrap_key_data(jnp.asarray(value, jnp.uint32))
    # A seed, traced too (optax's `inject_hyperparams(noisy_sgd)(key=0)` holds it in the state).
    return jax.random.key(value if isinstance(value, jax.Array) else int(value))


@functools.cache
def _raw_key_shape() -> tuple[int, ...]:
    """The shape of one key's raw data under the default PRNG implementation ((2,) for threefry)."""
    return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape)


def _key_problem(value: Any, seeds: bool) -> str | None:
    """Why `value` is no PRNG key (nor, with `seeds`, an integer seed), in words; `None` if it is one."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        return f"a {type(value).__name__}, not a key"
    if isinstance(value, (int, np.integer)):
        if not seeds:
            return "an integer, not a key: make one with `jax.random.key(seed)`"
        return None if -(2**63) <= int(value) < 2**63 else "a seed beyond 64 bits"
    if not isinstance(value, (jax.Array, np.ndarray)):
        return f"of type {type(value).__name__}"
    shape = tuple(value.shape)
    if _is_key(value):
        return None if shape == () else f"{shape[0] if len(shape) == 1 else shape} keys, not one"
    if jnp.issubdtype(value.dtype, jnp.unsignedinteger):
        if value.dtype != np.uint32:
            return f"key data of dtype {value.dtype}, not uint32"
        return None if shape == _raw_key_shape() else f"key data of shape {shape}, not {_raw_key_shape()}"
    if jnp.issubdtype(value.dtype, jnp.integer) and shape == ():
        return None if seeds else "an integer, not a key: make one with `jax.random.key(seed)`"
    return f"an array of dtype {value.dtype} and shape {shape}"


def _key_or_same(value: Any) -> Any:
    """The converter of a `prng_key` field: the typed key, or `value` as it is when it is none
    (`validate_hyperparameters` then refuses it, naming the field)."""
    try:
        return as_key(value)
    except TypeError:
        return value


def prng_key(default: Any = dataclasses.MISSING, **kwargs: Any):
    """A PRNG-key field: a typed key leaf (from a key, raw key data or an integer seed).

    Anything else (a float, a bool, signed key data or key data of another shape, a batch of
    keys) is refused at construction with a `TypeError` naming the field and the class.

    Typed keys hash (see `tree_hash`), are replicated by the sharding rules and are saved by
    the Orbax integration as their key data.

    Args:
        default: the field's default key or seed; leave it out for a required field.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    metadata = dict(kwargs.pop("metadata", {}))
    metadata[_PRNG_KEY] = True
    return eqx.field(default=default, converter=_key_or_same, metadata=metadata, **kwargs)


def is_concrete(value: Any) -> bool:
    """True when `value` can be inspected in Python (not a tracer inside `jit`)."""
    if isinstance(value, Constant):
        return True
    if isinstance(value, Rate):
        return is_concrete(value.value)
    if isinstance(value, jax.core.Tracer):
        return False
    return isinstance(value, (jax.Array, np.ndarray, np.generic, int, float))


def _is_number(value: Any) -> bool:
    if isinstance(value, (Rate, Constant)):
        return True
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        return jnp.issubdtype(value.dtype, jnp.number)
    return isinstance(value, (int, float, complex))


def complex_violation(value: Any) -> str | None:
    """Why `value` is no real number, if it is a complex one ("(0.001+1j) is complex ..."); else `None`.

    Hyperparameters are real: a complex learning rate or beta would make every update complex
    (or, cast to the field's real dtype, silently lose its imaginary part).
    """
    if isinstance(value, complex) or (
        isinstance(value, (jax.Array, np.ndarray, np.generic)) and jnp.issubdtype(value.dtype, jnp.complexfloating)
    ):
        return f"{_shown(value)} is a complex number (hyperparameters are real numbers)"
    return None


def _is_key(value: Any) -> bool:
    """A typed PRNG key array."""
    return isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if is_concrete(value):
        concrete = np.asarray(value)
        return str(concrete[()] if concrete.ndim == 0 else concrete)  # at its own precision
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validate_hyperparameters(module: eqx.Module) -> None:
    """Raises `ValueError("Invalid b2: 1.0 (must be in [0, 1)) in ScaleByAdam.")` for bad values.

    Checks, for every hyperparameter field, that the value is of an accepted kind (a number,
    a schedule, `None` only where `None` is the default), and a concrete number passes the
    field's `Check`; that every `choice` field holds one of its options, and every `fields.dtype`
    field a floating (or complex) dtype or `None`. Traced values (inside `jit`) cannot be inspected and are
    skipped.
    """
    for f in dataclasses.fields(module):
        if f.metadata.get(_PRNG_KEY):
            as_key(getattr(module, f.name), f.name, type(module).__name__)  # raises naming the field
        if _DTYPE in f.metadata and (violation := _dtype_violation(getattr(module, f.name))):
            raise ValueError(
                f"Invalid {f.name}: {violation} (must be a floating dtype such as jnp.float32 or jnp.bfloat16 "
                f"(or a complex one), or None for the default) in {type(module).__name__}."
            )
        if _CHOICES in f.metadata and getattr(module, f.name) not in f.metadata[_CHOICES]:
            options = ", ".join(map(repr, f.metadata[_CHOICES]))
            raise ValueError(
                f"Invalid {f.name}: {getattr(module, f.name)!r} (must be one of {options}) in {type(module).__name__}."
            )
        if _KIND not in f.metadata:
            continue
        value, kind, check = getattr(module, f.name), f.metadata[_KIND], f.metadata[_CHECK]
        where = f"in {type(module).__name__}"
        if kind == "dict":
            for name, entry in value.items():
                if not (callable(entry) or isinstance(entry, eqx.Module) or _is_number(entry) or _is_key(entry)):
                    raise ValueError(f"Invalid {name}: {_shown(entry)} (expected a number or a schedule) {where}.")
                if problem := complex_violation(entry):
                    raise ValueError(f"Invalid {name}: {problem} {where}.")
            continue
        if value is None:
            if f.metadata.get(_OPTIONAL, False):
                continue
            raise ValueError(f"Invalid {f.name}: None (expected {_KINDS[kind]}) {where}.")
        if callable(value) or isinstance(value, eqx.Module) and not isinstance(value, Rate):
            if kind == "number":
                raise ValueError(
                    f"Invalid {f.name}: {_shown(value)} is a schedule or function, but {f.name} takes a "
                    f"number {where}. Only learning-rate-like hyperparameters accept schedules."
                )
            violation = None if check is None else _schedule_violation(value, check)
            if violation:
                raise ValueError(f"Invalid {f.name}: {_shown(value)} {violation} (must be {check.description}) {where}.")
            continue
        if kind == "schedule":
            raise ValueError(f"Invalid {f.name}: {_shown(value)} (expected {_KINDS[kind]}) {where}.")
        if not _is_number(value):
            raise ValueError(
                f"Invalid {f.name}: {_shown(value)} of type {type(value).__name__} (expected {_KINDS[kind]}) {where}."
            )
        if problem := complex_violation(value):
            raise ValueError(f"Invalid {f.name}: {problem} {where}.")
        ndim, shape = f.metadata.get(_NDIM, 0), jnp.shape(value.value if isinstance(value, Rate) else value)
        if len(shape) != ndim:
            expected = "a scalar" if ndim == 0 else f"an array of {ndim} dimension{'s' if ndim > 1 else ''}"
            raise ValueError(f"Invalid {f.name}: {_shown(value)} of shape {shape} (expected {expected}) {where}.")
        if check is None or not is_concrete(value):
            continue
        concrete = np.asarray(value)
        if np.iscomplexobj(concrete) or not check.predicate(concrete):
            raise ValueError(f"Invalid {f.name}: {_shown(value)} (must be {check.description}) {where}.")


def _schedule_violation(schedule: Any, check: Check) -> str | None:
    """How a schedule fails `check` ("is -0.1 at step 0"), probed at its `probe_counts()`: the
    steps where its pieces start and end, where its extreme values lie. `None` if it passes, or
    if it cannot be probed here (traced numbers; a function that cannot be traced fails again,
    with its own error, when the step runs)."""
    probe_counts = getattr(schedule, "probe_counts", None)
    if probe_counts is None or not all(is_concrete(x) for x in jax.tree_util.tree_leaves(schedule)):
        return None
    counts = np.unique(np.asarray(probe_counts()))
    if counts.dtype.kind in "iu" and not np.all(np.abs(counts) < 2**31):
        counts = counts.astype(np.float32)  # as `as_count` takes steps beyond int32
    try:
        with jax.ensure_compile_time_eval():  # concrete, also while a caller traces
            values = np.asarray(_evaluate(schedule, jnp.asarray(counts)))
    except Exception:  # noqa: BLE001 - user code, probed outside its training step
        return None
    for count, value in zip(counts, values):
        if np.iscomplexobj(value) or not check.predicate(value):
            return f"is {_shown(value)} at step {_shown(count)}"
    return None


@jax.jit
def _evaluate(schedule: Any, counts: jax.Array) -> jax.Array:
    """A schedule's values at several steps, compiled once per kind of schedule (evaluating
    op by op costs ~100x more)."""
    return jax.vmap(schedule)(counts)


def hyperparameter_names(module: eqx.Module) -> tuple[str, ...]:
    """Names of the fields declared with `hyperparameter(...)`."""
    return tuple(f.name for f in dataclasses.fields(module) if _KIND in f.metadata)


def canonical_dtype(dtype: DTypeLike | None) -> Any:
    """A dtype-like turned into a hashable NumPy dtype (respecting x64 mode); `None` stays.

    An array stands for its dtype: optax's `inject_hyperparams` calls a scalar type given as an
    argument (`mu_dtype=jnp.bfloat16`) as if it were a schedule, and passes the factory the
    array it returns, traced under `jit`.
    """
    if dtype is None:
        return None
    if isinstance(dtype, (jax.Array, np.ndarray, np.generic)):
        dtype = dtype.dtype
    try:
        return jax.dtypes.canonicalize_dtype(dtype)
    except TypeError:  # not a dtype: `validate_hyperparameters` names the field and the transform
        return dtype


def dtype_field_names(module: eqx.Module, of: str = "state") -> tuple[str, ...]:
    """Names of the fields declared with `fields.dtype(of=of)` (the dtypes of its state, by default)."""
    return tuple(f.name for f in dataclasses.fields(module) if f.metadata.get(_DTYPE) == of)


def _dtype_violation(value: Any) -> str | None:
    """Why `value` is no floating dtype (complex ones pass too: optax accepts them for state)."""
    if value is None:
        return None
    if not isinstance(value, np.dtype):
        return f"{_shown(value)} is not a dtype"
    if not jnp.issubdtype(value, jnp.inexact):
        return f"{value} is not a floating dtype"
    return None


class StaticTree:
    """A hashable, static holder for a pytree of Python values (masks, labels).

    Masks and labels decide the *structure* of the state, so they must be known at trace
    time: they are stored as (treedef, leaves) and rebuilt on demand. Scalar NumPy and JAX
    booleans and integers count as Python values.
    """

    __slots__ = ("_leaves", "_treedef")

    def __init__(self, tree: Any):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        self._leaves = tuple(_python_value(leaf, path) for path, leaf in zip(_leaf_paths(treedef), leaves))
        self._treedef = treedef

    @property
    def tree(self) -> Any:
        return jax.tree_util.tree_unflatten(self._treedef, self._leaves)

    def __reduce__(self):
        # As the tree itself: the treedef of an Equinox-shaped tree does not survive pickle
        # (see `modopt._util.trees.structure_to_pickle`).
        return StaticTree, (self.tree,)

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


def _leaf_paths(treedef: Any) -> list[str]:
    numbered = treedef.unflatten(range(treedef.num_leaves))
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(numbered)[0]]


def _python_value(leaf: Any, path: str) -> Any:
    """A mask or label leaf as a hashable Python value; arrays of several elements are an error."""
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
        if isinstance(leaf, jax.core.Tracer) or np.ndim(leaf) != 0:
            raise TypeError(
                f"Masks and labels hold one Python value (a bool, a string) per parameter leaf or "
                f"subtree, or are a function of the params; at {path or 'the root'} there is an array "
                f"of shape {np.shape(leaf)}."
            )
        return np.asarray(leaf).item()
    return leaf


def _is_function(value: Any) -> bool:
    """A callable to be called on the params, as opposed to a tree of values.

    As optax decides it: a function when every leaf of the value is callable (a function is
    its own leaf). An Equinox module or any other callable pytree shaped like the model (its
    leaves bools, strings, arrays) is a tree, not a function to call.
    """
    leaves = jax.tree_util.tree_leaves(value)
    return bool(leaves) and all(callable(leaf) for leaf in leaves)


def as_static_tree(value: Any) -> Any:
    """Converter for mask/label fields: functions stay, pytrees become `StaticTree`."""
    if value is None or isinstance(value, StaticTree) or _is_function(value):
        return value
    return StaticTree(value)


def resolve_tree(value: Any, params: Any, what: str | None = None) -> Any:
    """The concrete mask/labels tree: call it on `params` if it is a function.

    With `what` (e.g. "masked: the mask"), the tree must have the structure of `params` or
    a prefix of it; a `ValueError` names the first path where it does not.
    """
    tree = value.tree if isinstance(value, StaticTree) else as_static_tree(value(params)).tree
    if what is not None and params is not None:
        difference = prefix_difference(tree, params)
        if difference:
            raise ValueError(
                f"{what} and the parameters differ in structure (it must be theirs, or a prefix of "
                f"it): found {difference}."
            )
    return tree


def pretty(module: eqx.Module) -> str:
    """The module's repr with concrete scalar hyperparameters shown as numbers, and short
    vectors (a schedule's boundaries) as lists of numbers."""

    def number(leaf):
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return leaf
        if isinstance(leaf, (jax.Array, Rate)) and is_concrete(leaf) and np.ndim(leaf) == 0:
            return _Number(np.asarray(leaf)[()])
        if isinstance(leaf, jax.Array) and is_concrete(leaf) and np.ndim(leaf) == 1 and leaf.size <= 8:
            return _Number("[" + ", ".join(str(x) for x in np.asarray(leaf)) + "]")
        return leaf

    is_rate = lambda x: isinstance(x, Rate)  # noqa: E731
    return eqx.tree_pformat(jax.tree_util.tree_map(number, module, is_leaf=is_rate), short_arrays=True)


def tree_hash(module: eqx.Module) -> int:
    """A hash of a module by its structure and the bytes of its concrete leaves.

    Transforms and schedules hash this way, so they can be static (Flax's linen `TrainState`
    keeps `tx` static) and be `jax.jit`'s function. Traced modules cannot be hashed.
    """
    leaves, treedef = jax.tree_util.tree_flatten(module)
    return hash((treedef, tuple(_hashable(leaf) for leaf in leaves)))


def _hashable(leaf: Any) -> Any:
    if isinstance(leaf, jax.core.Tracer):
        raise TypeError("A transform or schedule holding traced values cannot be hashed.")
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return (str(leaf.dtype), _hashable(jax.random.key_data(leaf)))
    if isinstance(leaf, (jax.Array, np.ndarray)):
        array = np.asarray(leaf)
        return (array.shape, array.dtype.str, array.tobytes())
    return leaf


class _Number:
    """Prints a NumPy scalar at its own precision (`0.001`, not `0.0010000000474974513`), or a list."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return str(self.value)
