"""L-BFGS: updates preconditioned by a limited-memory quasi-Newton inverse Hessian."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, require_params
from .._core.fields import static
from .._util.numerics import safe_increment
from .._core.specs import REPLICATED, follow_params
from .._util.trees import cast_like, global_norm, sum_of_squares
from ._linesearch import check_count, inner
from .. import fields
from .._state.moments import in_update_dtype, state_dtype_for, widen
from jax.typing import DTypeLike


class ScaleByLBFGSState(NamedTuple):
    """L-BFGS's step count, last point, and memory of the last `memory_size` secant pairs.

    The memories stack one pair per row: leaf by leaf, shape `(memory_size, *param.shape)`.
    Row `k % memory_size` holds the pair of step `k`, overwritten in a ring.
    """

    count: jax.Array  # int32 scalar: updates made
    params: Any  # the parameters at the last update
    updates: Any  # the updates (gradients) received at the last update
    diff_params_memory: Any  # past parameter differences s_k = w_{k+1} - w_k (in `memory_dtype` if set)
    diff_updates_memory: Any  # past gradient differences y_k = g_{k+1} - g_k (in `memory_dtype` if set)
    weights_memory: jax.Array  # shape (memory_size,): rho_k = 1 / <y_k, s_k> (0 where undefined)


class ScaleByLBFGS(AbstractTransform):
    r"""Multiplies updates by L-BFGS's approximation of the inverse Hessian.

    With `w_k` the parameters and `g_k` the updates (gradients) at step `k`, it keeps the last
    `m = memory_size` pairs `s_j = w_{j+1} - w_j`, `y_j = g_{j+1} - g_j` with weights
    `rho_j = 1 / <y_j, s_j>`, and returns `P_k g_k` where

        P = gamma I, then for each stored pair, oldest first:
        P <- (I - rho_j s_j y_j^T) P (I - rho_j y_j s_j^T) + rho_j s_j s_j^T

    computed without forming `P` by the two-loop recursion. The initial scale is
    `gamma = <s, y> / <y, y>` of the newest pair (`scale_init_precond=True`) or 1; at the first
    step, which has no pair, it is `min(1, 1 / ||g_0||)`, so the first step has length at most
    1. Pairs enter the memory at the next update, once the step is known, so a line search
    chained after this transform may pick the step size.

    The output points along the gradient: negate it to descend (`lbfgs` chains `scale(-1)`
    and a line search).

    Args:
        memory_size: the number of pairs kept (static), >= 1.
        scale_init_precond: scale the initial approximation by `gamma` (static).
        memory_dtype: the dtype of the memories of `s` and `y` (modopt's, keyword-only;
            `jnp.bfloat16` halves the `2 * memory_size` copies of float32 parameters); `None`
            keeps the parameters' dtype. Set, the pairs are computed in float32 at least, the
            newest one is used unrounded, the stored rows are read widened, and a pair is rounded
            only when stored (see `fields.dtype`). The last parameters and gradients keep the
            parameters' dtype: the pairs are their differences.

    References: Nocedal & Wright, Numerical Optimization, 1999 (Algorithms 7.4 and 7.5),
    https://doi.org/10.1007/978-0-387-40065-5; Liu & Nocedal, 1989, On the limited memory
    BFGS method for large scale optimization, https://doi.org/10.1007/BF01589116
    """

    memory_size: int = static(default=10)
    scale_init_precond: bool = static(default=True)
    memory_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        check_count(self, "memory_size", self.memory_size, 1)

    def init(self, params):
        def history(p):
            return jnp.zeros((self.memory_size, *jnp.shape(p)), state_dtype_for(self.memory_dtype, jnp.result_type(p)))

        return ScaleByLBFGSState(
            count=jnp.zeros([], jnp.int32),
            params=jax.tree_util.tree_map(jnp.zeros_like, params),
            updates=jax.tree_util.tree_map(jnp.zeros_like, params),
            diff_params_memory=jax.tree_util.tree_map(history, params),
            diff_updates_memory=jax.tree_util.tree_map(history, params),
            weights_memory=jnp.zeros(self.memory_size),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        first = state.count == 0
        slot = state.count % self.memory_size  # the row the current step's pair will take
        previous = (state.count - 1) % self.memory_size  # the row of the pair completed now

        # The pair of the last step; there is none at the first update (zeros, weight 0). With
        # `memory_dtype`, in float32 at least.
        dtype = self.memory_dtype
        grads, updates = updates, widen(updates, dtype)
        s = jax.tree_util.tree_map(lambda a, b: a - b, widen(params, dtype), widen(state.params, dtype))
        y = jax.tree_util.tree_map(lambda a, b: a - b, updates, widen(state.updates, dtype))
        curvature = inner(y, s, conjugate=True)
        rho = jnp.where(curvature == 0.0, 0.0, 1.0 / curvature)
        s, y, rho = jax.tree_util.tree_map(lambda x: jnp.where(first, jnp.zeros_like(x), x), (s, y, rho))
        diff_params_memory, diff_updates_memory, weights_memory = jax.tree_util.tree_map(
            lambda memory, new: memory.at[previous].set(new.astype(memory.dtype)),
            (state.diff_params_memory, state.diff_updates_memory, state.weights_memory),
            (s, y, rho),
        )

        if self.scale_init_precond:
            squared = sum_of_squares(y)
            gamma = jnp.where(squared > 0.0, inner(y, s, conjugate=True) / squared, 1.0)
            # No pair yet: a step of length at most 1 (a heuristic; the papers leave gamma_0 open).
            gamma = jnp.where(
                first, jnp.minimum(1.0, 1.0 / global_norm(jax.lax.stop_gradient(updates))), gamma
            )
        else:
            gamma = 1.0
        newest = None if dtype is None else (previous, s, y)  # the newest pair, unrounded
        direction = _two_loop(updates, diff_params_memory, diff_updates_memory, weights_memory, gamma, slot, newest)
        direction = in_update_dtype(direction, grads, dtype)
        return direction, ScaleByLBFGSState(
            count=safe_increment(state.count),
            params=params,
            updates=grads,
            diff_params_memory=diff_params_memory,
            diff_updates_memory=diff_updates_memory,
            weights_memory=weights_memory,
        )

    def state_specs(self, params, param_specs):
        # The memories (memory_size, *shape) follow their parameters with the memory axis
        # unsplit (the generic rule); the weights are one number per pair, so replicated
        # whatever their length.
        specs = follow_params(jax.eval_shape(self.init, params), params, param_specs, type(self).__name__)
        return specs._replace(weights_memory=REPLICATED)


def _two_loop(
    g: Any, s_memory: Any, y_memory: Any, rho: jax.Array, gamma: Any, slot: jax.Array, newest: Any = None
) -> Any:
    """`P g` by the two-loop recursion (N&W Algorithm 7.4) over the ring buffer's rows.

    `slot` is the oldest row: rows are visited newest to oldest, then oldest to newest.
    Empty rows (weight 0) leave the vector unchanged. `newest`, if given, is `(row, s, y)`: the
    newest pair unrounded, used in place of that row (whose stored copy is rounded), and every
    other row is read in the dtype of `g` (widened from the memory's).
    """
    memory_size = rho.shape[0]
    order = (slot + jnp.arange(memory_size)) % memory_size  # oldest first

    def read(memory, i, which):
        if newest is None:
            return jax.tree_util.tree_map(lambda x: x[i], memory)
        index, pair = newest[0], newest[which]
        return jax.tree_util.tree_map(lambda x, new: jnp.where(i == index, new, x[i].astype(new.dtype)), memory, pair)

    def backward(q, i):
        alpha = rho[i] * inner(read(s_memory, i, 1), q, conjugate=True)
        new = jax.tree_util.tree_map(lambda v, y: v + jnp.asarray(-alpha) * y, q, read(y_memory, i, 2))
        return cast_like(new, q), alpha

    q, alphas = jax.lax.scan(backward, g, order, reverse=True)
    r = jax.tree_util.tree_map(lambda v: gamma * v, q)

    def forward(r, i_alpha):
        i, alpha = i_alpha
        beta = rho[i] * inner(read(y_memory, i, 2), r, conjugate=True)
        new = jax.tree_util.tree_map(lambda v, s: v + jnp.asarray(alpha - beta) * s, r, read(s_memory, i, 1))
        return cast_like(new, r), beta

    r, _ = jax.lax.scan(forward, r, (order, alphas))
    return r


scale_by_lbfgs = ScaleByLBFGS
