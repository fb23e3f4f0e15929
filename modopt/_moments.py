"""Moment estimates shared by the adaptive transforms (Adam and its family).

Each works leaf by leaf on pytrees; `None` leaves of `updates` are carried through.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from ._trees import abs_sq, map_updates

if TYPE_CHECKING:
    from ._base import Updates


def update_moment(updates: Updates, moments: Updates, decay: Any, order: int) -> Updates:
    """EMA of the `order`-th power: `(1 - decay) * g**order + decay * m`.

    Args:
        updates: the new updates `g`, a pytree (`None` leaves are skipped).
        moments: the moments `m`, with the structure of `updates`.
        decay: the decay rate, in [0, 1].
        order: the power of `g`, an integer >= 1.
    """
    complement = 1 - decay  # once, not per leaf: the same value, a smaller program
    return map_updates(lambda g, m: complement * (g**order) + decay * m, updates, moments)


def update_moment_per_elem_norm(updates: Updates, moments: Updates, decay: Any, order: int) -> Updates:
    """EMA of `|g|**order`, element-wise; for complex `g` the modulus is used.

    Args:
        updates: the new updates `g`, a pytree (`None` leaves are skipped).
        moments: the moments `m`, with the structure of `updates`.
        decay: the decay rate, in [0, 1].
        order: the power of `|g|`, an integer >= 1.
    """

    def power_of_norm(g):
        if not jnp.iscomplexobj(g):
            return g**order
        half = order / 2
        return abs_sq(g) ** (int(half) if float(half).is_integer() else half)

    complement = 1 - decay
    return map_updates(lambda g, m: complement * power_of_norm(g) + decay * m, updates, moments)


def update_infinity_moment(updates: Updates, moments: Updates, decay: Any, eps: Any) -> Updates:
    """EMA of the infinity norm: `max(|g| + eps, decay * m)`.

    Args:
        updates: the new updates `g`, a pytree.
        moments: the running maximum `m`, with the structure of `updates`.
        decay: the decay rate, in [0, 1].
        eps: added to `|g|`, >= 0.
    """
    return map_updates(lambda g, m: jnp.maximum(jnp.abs(g) + eps, decay * m), updates, moments)


@functools.partial(jax.jit, inline=True)  # compiled `pow` rounds alike in eager and jitted code
def bias_correction(moment: Any, decay: Any, count: Any) -> Any:
    """Divides a moment by `1 - decay**count`, the bias of an EMA started at zero.

    The correction factor is computed in float32 (low precision would round it to 0) and
    applied in each leaf's own dtype, so bf16 moments stay bf16.
    """
    correction = 1 - jnp.asarray(decay) ** count
    return jax.tree_util.tree_map(lambda m: m / correction.astype(m.dtype), moment)
