"""How microbatched results combine: `Accumulator` programs and the `AccumulationType` presets."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Accumulator:
    """How the results of the microbatches of one function combine into one result.

    For the results `r_0, ..., r_{n-1}` of `n` microbatches, the combined result is what this
    program returns:

    ```python
    carry = init(jax.eval_shape(lambda: r_0))  # from the shape and dtype of one result
    for i in range(n):
        carry = update(carry, r_i, i)
    result = finalize(carry)
    ```

    `aggregate` does the same reduction in one go over a stacked axis 0 (for `micro_vmap`, within
    a microbatch). A plain frozen dataclass, so that a pytree of accumulators keeps them as
    leaves (a prefix of the function's output tree).

    Args:
        init: `init(shape_dtype) -> carry`, from the shape and dtype of one microbatch's result.
        update: `update(carry, value, index) -> carry`, folding in microbatch `index`'s result.
        finalize: `finalize(carry) -> result`.
        aggregate: `aggregate(stacked) -> result` for results stacked along axis 0.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.microbatching import Accumulator, microbatch
        >>> largest = Accumulator(
        ...     init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
        ...     update=lambda carry, value, index: jnp.maximum(carry, value),
        ...     finalize=lambda carry: carry,
        ...     aggregate=lambda stacked: stacked.max(axis=0),
        ... )
        >>> f = microbatch(lambda x: x.max(), argnums=0, microbatch_size=2, accumulator=largest)
        >>> f(jnp.array([3.0, 1.0, 4.0, 1.5]))
        Array(4., dtype=float32)
    """

    init: Callable[[Any], Any]
    update: Callable[[Any, Any, Any], Any]
    finalize: Callable[[Any], Any]
    aggregate: Callable[[Any], Any]


class AccumulationType(enum.Enum):
    """The preset ways microbatched results combine (see `microbatch`)."""

    MEAN = enum.auto()
    """The mean over the microbatches (over all of them, also with `num_real_microbatches`)."""
    SUM = enum.auto()
    """The sum over the microbatches."""
    RUNNING_MEAN = enum.auto()
    """The mean over the microbatches that ran (`num_real_microbatches` of them)."""
    CONCAT = enum.auto()
    """The results concatenated along axis 0, in the order of the original batch."""


def _over_leaves(accumulator: Accumulator) -> Accumulator:
    """An accumulator of arrays applied leaf by leaf to trees of results."""
    tree_map = jax.tree_util.tree_map
    return Accumulator(
        init=lambda value: tree_map(accumulator.init, value),
        update=lambda carry, value, index: tree_map(
            lambda c, v: accumulator.update(c, v, index), carry, value
        ),
        finalize=lambda carry: tree_map(accumulator.finalize, carry),
        aggregate=lambda stacked: tree_map(accumulator.aggregate, stacked),
    )


def _floating_zeros(kind: str) -> Callable[[Any], jax.Array]:
    def init(value):
        if not jnp.issubdtype(value.dtype, jnp.inexact):
            raise ValueError(
                f"AccumulationType.{kind} averages, so it needs floating-point results; got one of dtype "
                f"{value.dtype}. Use AccumulationType.SUM or return floats from the function."
            )
        return jnp.zeros_like(value)

    return init


def _positive(num_microbatches: int) -> None:
    if num_microbatches <= 0:
        raise ValueError(f"Invalid number of microbatches: {num_microbatches} (must be > 0).")


def _sum() -> Accumulator:
    return _over_leaves(
        Accumulator(
            init=jnp.zeros_like,
            update=lambda carry, value, _: carry + value,
            finalize=lambda carry: carry,
            aggregate=lambda stacked: jnp.sum(stacked, axis=0),
        )
    )


def _mean(num_microbatches: int) -> Accumulator:
    _positive(num_microbatches)
    return _over_leaves(
        Accumulator(
            init=_floating_zeros("MEAN"),
            update=lambda carry, value, _: carry + value,
            finalize=lambda carry: carry / num_microbatches,
            aggregate=lambda stacked: jnp.mean(stacked, axis=0),
        )
    )


def _running_mean() -> Accumulator:
    def update(carry, value, index):
        # mean_{i+1} = mean_i * i / (i + 1) + value / (i + 1)
        kept = index / (index + 1)
        return carry * kept + value * (1 - kept)

    return _over_leaves(
        Accumulator(
            init=_floating_zeros("RUNNING_MEAN"),
            update=update,
            finalize=lambda carry: carry,
            aggregate=lambda stacked: jnp.mean(stacked, axis=0),
        )
    )


def explicit_sharding(x: Any) -> Any:
    """`x`'s NamedSharding when its mesh's axes are all explicit (sharding in types), else None."""
    typeof = getattr(jax, "typeof", None)
    if typeof is None:
        return None
    sharding = getattr(typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not getattr(mesh, "are_all_axes_explicit", False):
        return None
    return sharding


def _concat(num_microbatches: int) -> Accumulator:
    _positive(num_microbatches)

    def init(value):
        return jnp.broadcast_to(jnp.zeros_like(value), (num_microbatches, *value.shape))

    def finalize(carry):
        # Row k of microbatch i came from example i + num_microbatches * k (see
        # reshape_batch_axis): the column-major reshape puts every example back in its place.
        shape = (-1, *carry.shape[2:])
        sharding = explicit_sharding(carry)
        if sharding is None:
            return carry.reshape(shape, order="F")
        spec = jax.sharding.PartitionSpec(*sharding.spec[1:])
        out = jax.sharding.NamedSharding(sharding.mesh, spec)
        return jnp.reshape(carry, shape, order="F", out_sharding=out)

    return _over_leaves(
        Accumulator(
            init=init,
            update=lambda carry, value, index: carry.at[index].set(value),
            finalize=finalize,
            aggregate=lambda stacked: stacked,
        )
    )


def _as_accumulation_type(entry: Any) -> Any:
    """Ours for a member of another library's `AccumulationType` enum (optax's, ported code),
    matched by member name; anything else unchanged (and rejected by `resolve`)."""
    if (
        isinstance(entry, enum.Enum)
        and not isinstance(entry, AccumulationType)
        and type(entry).__name__ == AccumulationType.__name__
        and entry.name in AccumulationType.__members__
    ):
        return AccumulationType[entry.name]
    return entry


def resolve(accumulator: Any, num_microbatches: int) -> Accumulator:
    """One Accumulator for a tree of `Accumulator`s and `AccumulationType`s (a prefix of the
    function's output tree), for `num_microbatches` microbatches."""

    def one(path, entry):
        if isinstance(entry, Accumulator):
            return entry
        entry = _as_accumulation_type(entry)
        if entry is AccumulationType.MEAN:
            return _mean(num_microbatches)
        if entry is AccumulationType.SUM:
            return _sum()
        if entry is AccumulationType.RUNNING_MEAN:
            return _running_mean()
        if entry is AccumulationType.CONCAT:
            return _concat(num_microbatches)
        where = f" at accumulator{jax.tree_util.keystr(path)}" if path else ""
        raise ValueError(
            f"Unknown accumulator{where}: {entry!r} (expected an Accumulator or an AccumulationType: "
            f"{', '.join(t.name for t in AccumulationType)}; optax's AccumulationType members work too)."
        )

    tree = jax.tree_util.tree_map_with_path(one, accumulator)
    tree_map = jax.tree_util.tree_map
    return Accumulator(
        init=lambda values: tree_map(lambda acc, value: acc.init(value), tree, values),
        update=lambda carry, values, index: tree_map(
            lambda acc, c, value: acc.update(c, value, index), tree, carry, values
        ),
        finalize=lambda carry: tree_map(lambda acc, c: acc.finalize(c), tree, carry),
        aggregate=lambda stacked: tree_map(lambda acc, s: acc.aggregate(s), tree, stacked),
    )
