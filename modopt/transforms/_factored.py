"""Adafactor's factored second-moment estimate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import fields
from .._core.base import AbstractTransform, require_params
from .._core.fields import NONNEGATIVE, UNIT, hyperparameter, static
from .._state.moments import in_update_dtype, state_dtype_for, widen
from .._util.numerics import abs_sq, safe_increment
from .._core.specs import REPLICATED, drop_axis
from .._core.fields import Scalar
from jax.typing import DTypeLike


def decay_rate_pow(step: jax.Array, exponent: Any = 0.8) -> jax.Array:
    """Adafactor's increasing decay, `1 - (step + 1) ** -exponent`."""
    t = jnp.asarray(step + 1, jnp.float32)
    return 1.0 - t ** (-exponent)


def factored_dims(shape: tuple[int, ...], factored: bool, min_dim_size_to_factor: int):
    """The two axes `(d1, d0)` a leaf's statistics are factored over, or `None`.

    `d0` is the largest axis and `d1` the second largest; a leaf is factored only if it has
    at least two axes and the second largest has `min_dim_size_to_factor` elements or more.
    The row statistic reduces over `d0` and the column statistic over `d1`.
    """
    if not factored or len(shape) < 2:
        return None
    order = np.argsort(shape)
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return int(order[-2]), int(order[-1])


class FactoredState(NamedTuple):
    """Adafactor's statistics: row/column factors for factored leaves, `v` for the others.

    Leaves that are not factored hold a `(1,)` placeholder in `v_row`/`v_col`; factored
    leaves hold one in `v`.
    """

    count: jax.Array  # int32 scalar
    v_row: Any  # per leaf: the param's shape without axis d0, or (1,)
    v_col: Any  # per leaf: the param's shape without axis d1, or (1,)
    v: Any  # per leaf: the param's shape, or (1,)


class ScaleByFactoredRms(AbstractTransform):
    r"""Scales updates by a factored estimate of the root mean square of past gradients.

    For a factored leaf with row statistic `R` (mean of `g^2 + epsilon` over axis `d0`) and
    column statistic `C` (mean over `d1`), both decayed with `decay_rate_fn(t - step_offset,
    decay_rate)`, the update is `g * (R / mean(R))^{-1/2} * C^{-1/2}`. Other leaves use the
    unfactored `g * v^{-1/2}`.

    Args:
        factored: factor the statistics of matrices into row and column statistics (static); `False`
            keeps a full second moment for every leaf.
        decay_rate: the parameter of `decay_rate_fn`: with the default, the exponent `c` of the
            decay rate `1 - (t - step_offset + 1)^(-c)`, in [0, 1].
        step_offset: subtracted from the step count before `decay_rate_fn`, >= 0.
        min_dim_size_to_factor: factor a leaf only if its second largest dimension has at least this
            many elements (static).
        epsilon: added to the squared gradients before they are averaged, >= 0.
        decay_rate_fn: the function `(step, decay_rate) -> rate` giving each step's decay rate of
            the statistics (static: code).
        nu_dtype: the dtype of the statistics (rows, columns, full); `None` keeps the parameters'
            dtype, and then, as in optax, each step rounds them to it before using them.

    Reference: Shazeer & Stern, 2018, https://arxiv.org/abs/1804.04235
    """

    factored: bool = static(default=True)
    decay_rate: Scalar = hyperparameter(default=0.8, check=UNIT)
    step_offset: Scalar = hyperparameter(default=0, check=NONNEGATIVE)
    min_dim_size_to_factor: int = static(default=128)
    epsilon: Scalar = hyperparameter(default=1e-30, check=NONNEGATIVE)
    decay_rate_fn: Callable[[Any, Any], Any] = static(default=decay_rate_pow)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def _dims(self, leaf):
        return factored_dims(leaf.shape, self.factored, self.min_dim_size_to_factor)

    def init(self, params):
        def one(p):
            dtype = state_dtype_for(self.nu_dtype, p.dtype)
            placeholder = lambda: jnp.zeros((1,), dtype)  # noqa: E731  (one array per field: each is donated)
            dims = self._dims(p)
            if dims is None:
                return placeholder(), placeholder(), jnp.zeros_like(p, dtype)
            d1, d0 = dims
            row = jnp.zeros(np.delete(p.shape, d0), dtype)
            col = jnp.zeros(np.delete(p.shape, d1), dtype)
            return row, col, placeholder()

        leaves, treedef = jax.tree_util.tree_flatten(params)
        return _factored_state(jnp.zeros([], jnp.int32), treedef, [one(p) for p in leaves])

    def state_specs(self, params, param_specs):
        # Row and column statistics drop the reduced axis from the parameter's spec; the
        # `(1,)` placeholders are replicated.
        def one(p, spec):
            dims = self._dims(p)
            if dims is None:
                return REPLICATED, REPLICATED, spec
            d1, d0 = dims
            return drop_axis(spec, p.ndim, d0), drop_axis(spec, p.ndim, d1), REPLICATED

        treedef = jax.tree_util.tree_structure(params)
        stats = [one(p, spec) for p, spec in zip(treedef.flatten_up_to(params), treedef.flatten_up_to(param_specs))]
        return _factored_state(REPLICATED, treedef, stats)

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        decay = self.decay_rate_fn(state.count - self.step_offset, self.decay_rate)

        def one(g, v_row, v_col, v, p):
            stored = state_dtype_for(self.nu_dtype, p.dtype)
            # Without a state dtype the statistics are rounded to the params' dtype before use
            # (optax); with one they are used as computed (in float32 at least) and then stored.
            used = p.dtype if self.nu_dtype is None else None
            rounded = lambda x: x if used is None else x.astype(used)  # noqa: E731
            g, v_row, v_col, v = widen((g, v_row, v_col, v), self.nu_dtype)
            placeholder = jnp.zeros((1,), stored)
            g_sq = abs_sq(g) + self.epsilon
            dims = self._dims(p)
            if dims is None:
                new_v = rounded(decay * v + (1.0 - decay) * g_sq)
                return g * new_v**-0.5, (placeholder, placeholder, new_v.astype(stored))
            d1, d0 = dims
            new_row = rounded(decay * v_row + (1.0 - decay) * jnp.mean(g_sq, axis=d0))
            new_col = rounded(decay * v_col + (1.0 - decay) * jnp.mean(g_sq, axis=d1))
            row_axis_of_d1 = d1 - 1 if d1 > d0 else d1  # where d1 sits once d0 is gone
            row_factor = (new_row / jnp.mean(new_row, axis=row_axis_of_d1, keepdims=True)) ** -0.5
            col_factor = new_col**-0.5
            update = g * jnp.expand_dims(row_factor, d0) * jnp.expand_dims(col_factor, d1)
            return update, (new_row.astype(stored), new_col.astype(stored), placeholder)

        treedef = jax.tree_util.tree_structure(params)
        columns = (treedef.flatten_up_to(t) for t in (updates, state.v_row, state.v_col, state.v, params))
        results = [one(*leaves) for leaves in zip(*columns)]
        new_updates = treedef.unflatten([update for update, _ in results])
        new_updates = in_update_dtype(new_updates, updates, self.nu_dtype)
        return new_updates, _factored_state(safe_increment(state.count), treedef, [s for _, s in results])


def _factored_state(count, treedef, stats) -> FactoredState:
    """Builds the state from one `(row, col, v)` triple per parameter leaf."""
    row, col, v = (treedef.unflatten([triple[i] for triple in stats]) for i in range(3))
    return FactoredState(count=count, v_row=row, v_col=col, v=v)


scale_by_factored_rms = ScaleByFactoredRms
