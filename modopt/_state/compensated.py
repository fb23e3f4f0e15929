"""Low-precision parameters updated without losing small updates: stochastic rounding and Kahan summation.

A bfloat16 parameter keeps 8 significant bits, so an update smaller than half its spacing
(`|u| < 2**-9 |p|`, about 0.2%) is rounded away by `p + u`: late in training, with a decayed
learning rate, most updates are. Two remedies, both for `bfloat16` and `float16` leaves only
(a float32 leaf is updated as `apply_updates` does, and gets no buffer):

- Stochastic rounding (Gupta et al. 2015): `p + u`, computed in float32, is rounded to one of
  its two neighbouring bfloat16 values, up with probability equal to its distance from the
  lower one over their spacing. Rounding is then unbiased, `E[round(x)] = x`, so small updates
  survive on average. It needs a PRNG key per step and no memory.
- Kahan-compensated summation (Zamirai et al. 2020): a buffer of the parameter's dtype keeps
  what rounding lost, and the next update adds it back. Nothing is lost beyond the buffer's
  own rounding, at the cost of one more low-precision array per parameter.

`modopt.Optimizer(tx, model, compensation="kahan" | "stochastic_rounding")` holds the buffer or
the key in its `compensation` field; the pure functions are `apply_updates(..., key=...)` and
`apply_updates_kahan`.

Rounding is written with `jax.lax.reduce_precision` rather than a cast down and back: with
excess precision allowed (XLA's default) a compiler may drop such a pair of casts, and with
it the rounding error these methods keep.
"""

from __future__ import annotations

import abc
import math
from typing import Any

import jax
import jax.numpy as jnp

from .._core.checks import check_update_shapes
from .._util.trees import is_none
from .._core.fields import as_key
from .._core.module import Module

LOW_PRECISION = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
"""The parameter dtypes that stochastic rounding and Kahan summation apply to."""
COMPENSATIONS = ("kahan", "stochastic_rounding")


def is_low_precision(x: Any) -> bool:
    """Whether `x` is an array of one of `LOW_PRECISION`'s dtypes."""
    return x is not None and hasattr(x, "dtype") and jnp.dtype(x.dtype) in LOW_PRECISION


def _wide(x: jax.Array) -> jax.Array:
    """`x` in float32 (or wider, if it is already): the precision sums are formed in."""
    return jnp.asarray(x).astype(jnp.promote_types(jnp.result_type(x), jnp.float32))


def _nearest(x: jax.Array, dtype: Any) -> jax.Array:
    """`x` rounded to the nearest value of `dtype` (ties to even), kept in `x`'s dtype, where it is exact."""
    info = jnp.finfo(dtype)
    near = jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    if info.minexp > jnp.finfo(x.dtype).minexp:
        # float16's subnormals, which `reduce_precision` flushes to zero: a fixed spacing there.
        spacing = float(info.smallest_subnormal)
        near = jnp.where(jnp.abs(x) < float(info.smallest_normal), jnp.round(x / spacing) * spacing, near)
    return near


def _stochastic(x: jax.Array, dtype: Any, key: jax.Array) -> jax.Array:
    """`x` rounded to one of its two neighbours in `dtype`, up with probability
    `(x - lower) / (upper - lower)` (to 2**-16): unbiased, and `x` itself where `dtype` holds it."""
    near = _nearest(x, dtype)
    # The neighbour on x's other side of `near` (above it if `near` is exact).
    toward = jnp.where(near > x, -jnp.inf, jnp.inf).astype(dtype)
    other = jnp.nextafter(near.astype(dtype), toward).astype(x.dtype)
    lower, upper = jnp.minimum(near, other), jnp.maximum(near, other)
    up = _random_16_bits(key, jnp.shape(x)).astype(x.dtype) < (x - lower) / (upper - lower) * 2.0**16
    return jnp.where(up, upper, lower).astype(dtype)


def _random_16_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Uniform integers in [0, 2**16), two from each random 32-bit word: half the generator's work
    of one word per element (`jax.random.bits(..., jnp.uint16)` draws a word for each). Sixteen
    bits are what rounding a float32 to bfloat16 drops, so they resolve every distance there."""
    size = math.prod(shape)
    words = jax.random.bits(key, ((size + 1) // 2,), jnp.uint32)
    return jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)[:size].reshape(shape)


def _leaf_keys(key: jax.Array, count: int) -> list[jax.Array]:
    return list(jax.random.split(key, count)) if count else []


def apply_updates_stochastic(params: Any, updates: Any, key: jax.Array) -> Any:
    """`apply_updates` rounding each bfloat16 and float16 sum stochastically (see `apply_updates`)."""
    key = as_key(key, "key", "apply_updates", seeds=False)
    leaves, treedef = jax.tree_util.tree_flatten(params, is_leaf=is_none)
    update_leaves = treedef.flatten_up_to(updates)
    keys = iter(_leaf_keys(key, sum(map(is_low_precision, leaves))))
    out = []
    for p, u in zip(leaves, update_leaves):
        if p is None:
            out.append(None)
        elif is_low_precision(p):
            out.append(_stochastic(_wide(p) + _wide(u), p.dtype, next(keys)))
        else:
            out.append(jnp.asarray(p + u).astype(jnp.asarray(p).dtype))
    return treedef.unflatten(out)


def kahan_compensation(params: Any) -> Any:
    """The compensation buffers for Kahan-summed updates of `params`, all zero.

    A zero array of the parameter's shape and dtype for each `bfloat16` or `float16` leaf;
    `None` for every other leaf, which `apply_updates_kahan` updates as `apply_updates` does.

    Args:
        params: the parameters, a pytree of arrays (possibly with `None` leaves).

    Example:
        >>> params = {"w": jnp.ones(3, jnp.bfloat16), "scale": jnp.ones((), jnp.float32)}
        >>> compensation = modopt.kahan_compensation(params)  # {"w": zeros(3, bf16), "scale": None}
    """
    return jax.tree_util.tree_map(
        lambda p: jnp.zeros_like(p) if is_low_precision(p) else None, params, is_leaf=is_none
    )


def apply_updates_kahan(params: Any, updates: Any, compensation: Any) -> tuple[Any, Any]:
    """`params + updates` with Kahan-compensated summation; returns `(params, compensation)`.

    For each `bfloat16` or `float16` parameter `p` with buffer `c`, in float32:

        s = p + (u + c)
        p = round(s)          # to p's dtype, to nearest
        c = s - p             # what rounding lost, kept in p's dtype for the next step

    so an update too small to move `p` accumulates in `c` until it does. Other leaves (those
    whose buffer is `None`) get `p + u` cast back to their dtype, as `apply_updates` gives.

    Args:
        params: the parameters, a pytree of arrays (possibly with `None` leaves).
        updates: the updates, with the structure of `params`.
        compensation: the buffers, from `kahan_compensation(params)` or the previous call.

    Example:
        >>> compensation = modopt.kahan_compensation(params)
        >>> updates, opt_state = tx.update(grads, opt_state, params)
        >>> params, compensation = modopt.apply_updates_kahan(params, updates, compensation)

    Reference:
        Zamirai, Zhang, Aberger, De Sa, [Revisiting BFloat16 Training](https://arxiv.org/abs/2010.06192), 2020.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_none)
    structure = jax.tree_util.tree_structure(params, is_leaf=is_none)
    try:
        buffers = structure.flatten_up_to(compensation)
    except (ValueError, TypeError):
        raise ValueError(
            "apply_updates_kahan: the compensation does not have the structure of the parameters; "
            "create it with `modopt.kahan_compensation(params)`."
        ) from None
    check_update_shapes(params, updates, "apply_updates_kahan")
    new_params, new_buffers = [], []
    for (path, p), u, c in zip(leaves, structure.flatten_up_to(updates), buffers):
        _check_buffer(path, p, c)
        if c is None:
            new_params.append(None if p is None else jnp.asarray(p + u).astype(jnp.asarray(p).dtype))
            new_buffers.append(None)
            continue
        total = _wide(p) + (_wide(u) + _wide(c))
        rounded = _nearest(total, p.dtype)
        new_params.append(rounded.astype(p.dtype))
        new_buffers.append((total - rounded).astype(c.dtype))
    return structure.unflatten(new_params), structure.unflatten(new_buffers)


def _check_buffer(path: Any, p: Any, c: Any) -> None:
    where = f"the parameter at {jax.tree_util.keystr(path) or 'the root'}"
    if c is None:
        if is_low_precision(p):
            raise ValueError(
                f"apply_updates_kahan: {where} is {jnp.dtype(p.dtype)} but has no compensation buffer; "
                "create the buffers with `modopt.kahan_compensation(params)`."
            )
        return
    if p is None or jnp.shape(c) != jnp.shape(p) or jnp.dtype(c.dtype) != jnp.dtype(p.dtype):
        found = "no parameter" if p is None else f"shape {jnp.shape(p)} and dtype {jnp.dtype(p.dtype)}"
        raise ValueError(
            f"apply_updates_kahan: the compensation buffer for {where} has shape {jnp.shape(c)} and dtype "
            f"{jnp.dtype(c.dtype)}, but the parameter has {found}; create the buffers with "
            "`modopt.kahan_compensation(params)`."
        )


class AbstractCompensation(Module):
    """How an `Optimizer` applies updates to low-precision parameters, with the state that needs.

    Held in `Optimizer.compensation` (and so checkpointed and sharded with the optimizer).
    """

    @abc.abstractmethod
    def apply(self, params: Any, updates: Any) -> tuple[Any, AbstractCompensation]:
        """`(new_params, new_compensation)` for `params + updates`."""

    def keep(self, previous: AbstractCompensation, select: Any) -> AbstractCompensation:
        """This state, with `previous`'s parts where the parameter is kept unchanged:
        `select(old_tree, new_tree)` picks per parameter (the old one where its gradient is `None`)."""
        return self

    @abc.abstractmethod
    def shardings(self, param_shardings: Any, replicated: Any) -> AbstractCompensation:
        """This object's structure with a sharding for each array, given the parameters'
        shardings (the params' structure) and a replicated sharding."""


class KahanCompensation(AbstractCompensation):
    """The state of Kahan-compensated updates (`Optimizer(..., compensation="kahan")`).

    Args:
        buffers: what rounding has not yet applied, per `bfloat16` / `float16` parameter (its
            shape and dtype), `None` for other leaves: `apply_updates_kahan`'s `compensation`.
    """

    buffers: Any

    def apply(self, params: Any, updates: Any) -> tuple[Any, KahanCompensation]:
        params, buffers = apply_updates_kahan(params, updates, self.buffers)
        return params, KahanCompensation(buffers)

    def keep(self, previous: KahanCompensation, select: Any) -> KahanCompensation:
        return KahanCompensation(select(previous.buffers, self.buffers))

    def shardings(self, param_shardings: Any, replicated: Any) -> KahanCompensation:
        # A buffer is read and written with its parameter, elementwise: it follows it.
        return KahanCompensation(
            jax.tree_util.tree_map(
                lambda c, s: None if c is None else s, self.buffers, param_shardings, is_leaf=is_none
            )
        )


class StochasticRounding(AbstractCompensation):
    """The state of stochastically rounded updates (`Optimizer(..., compensation="stochastic_rounding")`).

    Args:
        key: the PRNG key of the next step's rounding; each step splits it.
    """

    key: jax.Array

    def apply(self, params: Any, updates: Any) -> tuple[Any, StochasticRounding]:
        key, now = jax.random.split(self.key)
        return apply_updates_stochastic(params, updates, now), StochasticRounding(key)

    def shardings(self, param_shardings: Any, replicated: Any) -> StochasticRounding:
        return StochasticRounding(replicated)


def make_compensation(kind: str | None, params: Any, key: Any, where: str) -> AbstractCompensation | None:
    """The compensation state `Optimizer(..., compensation=kind, key=key)` starts with."""
    if kind is not None and kind not in COMPENSATIONS:
        raise ValueError(
            f"{where}: Invalid compensation: {kind!r} (must be one of {', '.join(map(repr, COMPENSATIONS))} or None)."
        )
    if kind == "stochastic_rounding":
        if key is None:
            raise ValueError(
                f"{where}: compensation='stochastic_rounding' needs a PRNG key for its rounding, e.g. "
                "`key=jax.random.key(0)`."
            )
        return StochasticRounding(jnp.copy(as_key(key, "key", where, seeds=False)))
    if key is not None:
        raise ValueError(
            f"{where}: `key` is the PRNG key of compensation='stochastic_rounding'; it is unused with {kind!r}."
        )
    return None if kind is None else KahanCompensation(kahan_compensation(params))
