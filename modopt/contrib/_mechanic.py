"""Mechanic: learning the scale of a base optimizer's updates online (`mechanize`)."""

from __future__ import annotations

import functools
import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._core.base import AbstractTransform, AbstractWrapper, inner_transform, require_params
from .._core.fields import NONNEGATIVE, POSITIVE, hyperparameter, static
from .._util.numerics import safe_increment
from .._core.specs import REPLICATED
from .._util.trees import global_norm, select
from .._core.fields import Scalar
from .. import fields
from .._state.moments import copy_state, in_update_dtype, scalar_dtype, store, widen
from jax.typing import DTypeLike


class MechanicState(NamedTuple):
    """The state of `mechanize`.

    base_optimizer_state: the wrapped optimizer's state.
    count: updates made so far (int32 scalar).
    r: per-beta discounted reward (shape `(num_betas,)`, like every field below but `x0`).
    m: per-beta running maximum of `|h|`, the size of the scalar gradients seen.
    v: per-beta discounted sum of `h**2`.
    s: per-beta scale; the step applied is `sum(s)` times the accumulated base updates.
    x0: the reference point, the parameters of the first update (a copy of the parameters at
        `init` until then), in `param_dtype` if set.
    """

    base_optimizer_state: Any
    count: jax.Array
    r: jax.Array
    m: jax.Array
    v: jax.Array
    s: jax.Array
    x0: Any


class Mechanize(AbstractWrapper):
    """Mechanic: learns online the scale of the updates of a base optimizer.

    The base optimizer's updates `u_t` (its learning rate included) are summed into a
    direction `D_t = u_1 + ... + u_t`, and the parameters are placed at `x0 + S_t * D_t`,
    where `x0` are the parameters of the first update and the scale `S_t = sum_i s_i` is
    learned by `num_betas` one-dimensional online learners, one per discount
    `beta_i = 1 - 10**-i`. Each step, with `g` the gradient at `x_t` and `S = S_{t-1}`:

        g'  = g + weight_decay * S * |g| / (|x_t| + eps) * x_t
        h   = <g', D_{t-1}>                      (the gradient with respect to the scale)
        m_i = max(beta_i * m_i, |h| + eps)
        v_i = beta_i**2 * v_i + h**2
        r_i = beta_i * r_i - s_i * clip(h, -m_i_old, m_i_old)
        s_i = (s_init / num_betas * m_i + max(r_i, 0)) / (sqrt(v_i) + eps)
        x_{t+1} = x0 + (sum_i s_i) * D_t

    and the update returned is `x_{t+1} - x_t`. `D_{t-1}` is kept as `(x_t - x0) / (S + eps)`,
    so the state holds one copy of the parameters (`x0`) beyond the base optimizer's.

    Mechanic replaces tuning the base learning rate: give the base optimizer a learning rate
    (or a schedule's peak) of 1 and let Mechanic find the scale. A schedule's shape still
    matters and is kept. It works with SGD, momentum, Adam, Lion and most first-order
    optimizers, but not with optimizers that normalize each update (LARS, LAMB).

    The learning rate an `Optimizer` reports (`optimizer.learning_rate`) is the base
    optimizer's; Mechanic's scale on top of it is `sum(state.s)`.

    `update` needs `params`. Extra arguments reach the base optimizer. Complex parameters are
    not supported: wrap as `modopt.experimental.split_real_and_imaginary(mechanize(...))`.

    Args:
        base_optimizer: the optimizer whose updates are scaled (a modopt or optax transform).
        weight_decay: strength of Mechanic's own weight decay (>= 0), distinct from any decay
            of the base optimizer. It also makes runs with different seeds agree more; the
            default rarely needs tuning.
        eps: small constant in the denominators (>= 0).
        s_init: initial value of each scale `s_i` (> 0); it also sets each learner's base
            wealth `s_init / num_betas * m_i`. The default almost never needs changing.
        num_betas: number of discounts `beta_i = 1 - 10**-i`, `i = 1..num_betas` (an integer
            >= 1; static: it sets the shape of the state).
        param_dtype: the dtype of the reference point `x0`, a copy of the parameters
            (modopt's, keyword-only); `None` keeps the parameters' dtype. It is read in float32
            at least (see `fields.dtype`), and with it set the gradients are too (the base
            optimizer gets them widened). The per-beta vectors take the parameters' lowest
            dtype, or `param_dtype` where it is wider. The base optimizer's state takes its own
            state dtypes.

    The three numbers are hyperparameters: changing them does not retrace.

    Example:
        >>> schedule = modopt.warmup_cosine_decay_schedule(0.0, 1.0, 100, 10_000)
        >>> tx = modopt.contrib.mechanize(modopt.adam(schedule))
        >>> optimizer = modopt.Optimizer(tx, model)
        >>> model, optimizer = optimizer.step(model, grads)

    Reference: Cutkosky, Defazio and Mehta, 2023, "Mechanic: A Learning Rate Tuner",
    https://arxiv.org/abs/2306.00144
    """

    inner: AbstractTransform = inner_transform()
    weight_decay: Scalar = hyperparameter(1e-2, check=NONNEGATIVE)
    eps: Scalar = hyperparameter(1e-8, check=NONNEGATIVE)
    s_init: Scalar = hyperparameter(1e-6, check=POSITIVE)
    num_betas: int = static(default=6)
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    inner_state_field = "base_optimizer_state"

    def __init__(
        self,
        base_optimizer: Any,
        weight_decay: Scalar = 1e-2,
        eps: Scalar = 1e-8,
        s_init: Scalar = 1e-6,
        num_betas: int = 6,
        *,
        param_dtype: DTypeLike | None = None,
    ):
        self.inner = base_optimizer
        self.weight_decay = weight_decay
        self.eps = eps
        self.s_init = s_init
        self.num_betas = _as_int(num_betas)
        self.param_dtype = param_dtype

    def __check_init__(self):
        value = self.num_betas
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"Invalid num_betas: {value!r} (must be an integer >= 1) in Mechanize. It is the number "
                "of discounts 1 - 10**-i tried at once; the default is 6."
            )

    @property
    def base_optimizer(self) -> AbstractTransform:
        """The optimizer whose updates are scaled."""
        return self.inner

    def betas(self, dtype: Any) -> jax.Array:
        """The discounts `1 - 10**-i` for `i = 1..num_betas`, in `dtype`."""
        return jnp.asarray([1.0 - 10.0 ** -(i + 1) for i in range(self.num_betas)], dtype)

    def init(self, params):
        leaves = jax.tree_util.tree_leaves(params)
        if any(jnp.iscomplexobj(leaf) for leaf in leaves):
            raise TypeError(
                "mechanize does not support complex parameters (its scale is learned from real inner "
                "products): wrap it as `modopt.experimental.split_real_and_imaginary(mechanize(...))`."
            )
        dtype = scalar_dtype(_lowest_dtype(leaves), self.param_dtype)
        zeros = jnp.zeros([self.num_betas], dtype)
        return MechanicState(
            base_optimizer_state=self.inner.init(params),
            count=jnp.zeros([], jnp.int32),
            r=zeros,
            m=jnp.zeros_like(zeros),
            v=jnp.zeros_like(zeros),
            s=jnp.full([self.num_betas], self.s_init, dtype),
            x0=copy_state(params, self.param_dtype),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        grads = updates
        updates = widen(updates, self.param_dtype)  # with `param_dtype`, all in float32 at least
        base_updates, base_state = self.inner.update(
            updates, state.base_optimizer_state, params, **extra_args
        )
        # The reference point is the parameters of the first update (those of `init` may differ,
        # e.g. a state built before the parameters were loaded).
        x0 = select(state.count == 0, params, widen(state.x0, self.param_dtype))
        scale = jnp.sum(state.s)
        eps = self.eps

        # Mechanic's weight decay, relative to the gradient's size.
        decay = self.weight_decay * scale * global_norm(updates) / (global_norm(params) + eps)
        decayed = jax.tree_util.tree_map(lambda g, x: g + decay * x, updates, params)
        # The direction so far, negated: (x0 - x) / S = -(u_1 + ... + u_{t-1}).
        back = jax.tree_util.tree_map(lambda x, start: (start - x) / (scale + eps), params, x0)
        h = _vdot(decayed, back)  # -<g', D_{t-1}>: the sign of the docstring's h flipped

        betas = self.betas(state.s.dtype)
        clipped = jnp.clip(h, -state.m, state.m)
        m = jnp.maximum(betas * state.m, jnp.abs(h) + eps)
        v = betas**2 * state.v + h**2
        r = betas * state.r + clipped * state.s
        wealth = self.s_init / self.num_betas * m + jnp.maximum(r, 0.0)
        s = wealth / (jnp.sqrt(v) + eps)

        total = jnp.sum(s)
        new_params = jax.tree_util.tree_map(
            lambda start, b, u: start - total * (b - u), x0, back, base_updates
        )
        new_updates = jax.tree_util.tree_map(lambda new, x: new - x, new_params, params)
        new_updates = in_update_dtype(new_updates, grads, self.param_dtype)
        return new_updates, MechanicState(
            base_optimizer_state=base_state,
            count=safe_increment(state.count),
            r=r,
            m=m,
            v=v,
            s=s,
            x0=store(x0, self.param_dtype, state.x0),
        )

    def state_specs(self, params, param_specs):
        # The reference point is laid out as the parameters; the per-beta vectors and the
        # count are replicated (they are small, and shared by every parameter).
        return MechanicState(
            base_optimizer_state=self.inner.state_specs(params, param_specs),
            count=REPLICATED,
            r=REPLICATED,
            m=REPLICATED,
            v=REPLICATED,
            s=REPLICATED,
            x0=param_specs,
        )


def _as_int(value: Any) -> Any:
    """An integer (a NumPy one too) as a Python int; anything else as it is, for the check."""
    if isinstance(value, (bool, np.bool_)):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def _lowest_dtype(leaves: list[Any]) -> Any:
    """The dtype of the leaves that every other leaf's dtype promotes from (bf16 among f32),
    or JAX's default float dtype for no leaves."""
    if not leaves:
        return jnp.asarray([]).dtype

    def lower(a, b):
        return b if jnp.promote_types(a, b) == a else a

    return functools.reduce(lower, [jnp.result_type(leaf) for leaf in leaves])


def _vdot(a: Any, b: Any) -> jax.Array:
    """`sum a * b` over the leaves of two trees of real arrays, as one scalar."""
    products = [
        jnp.tensordot(x, y, jnp.ndim(x))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    ]
    return sum(products, jnp.zeros([], jnp.int32))


mechanize = Mechanize
