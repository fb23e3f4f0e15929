"""Layer-wise DoG: a parameter-free step size per leaf, from distance travelled over gradients."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform, require_params
from .._core.fields import FINITE, NONNEGATIVE, hyperparameter
from .._core.specs import REPLICATED
from .._util.trees import is_none, map_updates
from .._core.fields import Scalar
from .._state.moments import widen
from jax.typing import DTypeLike


class ScaleByDistanceOverGradientsState(NamedTuple):
    """The state of `scale_by_distance_over_gradients`: per leaf, two running numbers and the
    starting point."""

    max_dist: Any  # per leaf, a scalar: the largest distance from `init_params` (`r_eps` at first)
    grad_sum_of_squares: Any  # per leaf, shape (1,): the sum of the squared gradient elements so far
    init_params: Any  # the parameters at `init`, in `param_dtype`


def _distance(x: jax.Array, y: Any = 0.0) -> jax.Array:
    """The L2 norm of `x - y` over all its elements."""
    return jnp.sqrt(jnp.square(x - y).sum())


class ScaleByDistanceOverGradients(AbstractTransform):
    r"""Scales each leaf's update by its own DoG step size (layer-wise DoG, "LDoG").

    For each leaf (layer) `x` with gradient `g`, starting from `x_0`:

        r_t = max(r_{t-1}, ||x_t - x_0||),   r_0 = reps_rel * (1 + ||x_0||)
        G_t = G_{t-1} + ||g_t||^2
        u_t = global_scale * r_t / sqrt(G_t + eps) * g_t

    The state keeps one copy of the parameters and two numbers per leaf. `update` needs
    `params`. The authors recommend averaging the iterates. Unlike optax 0.2.8, whose update
    of a scalar leaf comes out with shape `(1,)`, every update keeps its leaf's shape.

    Args:
        reps_rel: sets the first distance `r_0` relative to `1 + ||x_0||`, >= 0: 1e-6 is
            recommended, 1e-4 for models with batch normalization.
        eps: added to the sum of squared gradients under the root, >= 0.
        param_dtype: the dtype of the copy of the starting parameters (static).
        global_scale: multiplies every step: 1.0, or -1.0 to descend with it alone.

    Example:
        >>> tx = modopt.chain(modopt.scale_by_distance_over_gradients(), modopt.scale(-1.0))

    Reference: Ivgi, Hinder & Carmon, 2023, "DoG is SGD's Best Friend: A Parameter-Free Dynamic
    Step Size Schedule", https://arxiv.org/abs/2302.12022
    """

    reps_rel: Scalar = hyperparameter(1e-6, check=NONNEGATIVE)
    eps: Scalar = fields.eps(1e-8)
    param_dtype: DTypeLike | None = fields.dtype(jnp.float32)
    global_scale: Scalar = hyperparameter(1.0, check=FINITE)

    def init(self, params):
        return ScaleByDistanceOverGradientsState(
            max_dist=jax.tree_util.tree_map(lambda x: self.reps_rel * (1 + _distance(x)), params),
            grad_sum_of_squares=jax.tree_util.tree_map(lambda x: jnp.zeros(1), params),
            init_params=jax.tree_util.tree_map(lambda x: jnp.array(x, self.param_dtype), params),  # a copy
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        # A leaf without an update (`None`) keeps its numbers.
        max_dist = _each_leaf(
            lambda d, x, x0: jnp.maximum(d, _distance(x, x0)),
            updates,
            state.max_dist,
            params,
            state.init_params,
        )
        # The sum of squares at the state's precision (float32 at least, see `fields.dtype`).
        wide = widen(updates, self.param_dtype)
        sums = _each_leaf(lambda s, g: s + jnp.square(g).sum(), updates, state.grad_sum_of_squares, wide)

        def scaled(g, d, s):
            step = self.global_scale * (d / jnp.sqrt(s + self.eps))
            return jnp.reshape(step * g, jnp.shape(g))

        updates = map_updates(scaled, updates, max_dist, sums)
        return updates, ScaleByDistanceOverGradientsState(max_dist, sums, state.init_params)

    def state_specs(self, params, param_specs):
        # The starting point is split like the parameters; the per-leaf numbers are replicated.
        treedef = jax.tree_util.tree_structure(params)
        specs = treedef.flatten_up_to(param_specs)
        replicated = treedef.unflatten([REPLICATED] * len(specs))
        return ScaleByDistanceOverGradientsState(replicated, replicated, treedef.unflatten(specs))


def _each_leaf(f: Any, updates: Any, numbers: Any, *rest: Any) -> Any:
    """`f(number, *others)` for each leaf of `numbers` whose update is not `None`."""
    return jax.tree_util.tree_map(
        lambda u, n, *r: n if u is None else f(n, *r), updates, numbers, *rest, is_leaf=is_none
    )


scale_by_distance_over_gradients = ScaleByDistanceOverGradients
