"""DoG and DoWG: parameter-free step sizes from the distance travelled over the gradients seen."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform, require_params
from .._core.fields import Check, choice, hyperparameter
from .._util.trees import global_norm, map_updates, sum_of_squares
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import AddDecayedWeights, Identity, ScaleByLearningRate
from ._mechanic import _lowest_dtype
from .._core.fields import Scalar
from .._state.moments import copy_state, scalar_dtype, widen
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn

INIT_STEP_TYPES = ("distance", "learning_rate", "heuristic")
POSITIVE_FINITE = Check("> 0 and finite", lambda v: bool(np.all((v > 0) & np.isfinite(v))))


class DoGState(NamedTuple):
    """DoG's state: the starting point and two running scalars (in the parameters' lowest dtype)."""

    is_init_step: jax.Array  # bool scalar: no update made yet
    init_params: Any  # the parameters at `init`, like the params (in `param_dtype` if set)
    max_dist: jax.Array  # the largest distance from `init_params` so far (`r_eps` at first)
    sum_sq_norm_grads: jax.Array  # the sum of the squared global norms of the gradients


class DoWGState(NamedTuple):
    """DoWG's state: the starting point and two running scalars (in the parameters' lowest dtype)."""

    init_params: Any  # the parameters at `init`, like the params (in `param_dtype` if set)
    weighted_sq_norm_grads: jax.Array  # the sum of the squared gradient norms, each weighted by `estim_sq_dist`
    estim_sq_dist: jax.Array  # the largest squared distance from `init_params` so far


def _distance_sq(params: Any, init_params: Any, param_dtype: Any) -> jax.Array:
    """`||init_params - params||^2` over the whole tree (in float32 at least where
    `param_dtype` is set)."""
    return sum_of_squares(jax.tree_util.tree_map(jnp.subtract, widen(init_params, param_dtype), params))



def _scaled(step_size: jax.Array, updates: Any) -> Any:
    return map_updates(lambda u: step_size * u, updates)


class ScaleByDoG(AbstractTransform):
    r"""Scales updates by the DoG step size `max_k ||x_k - x_0|| / sqrt(sum_k ||g_k||^2 + eps)`.

    The distance from the starting point `x_0` and the squared norms are taken over the whole
    parameter tree. Before the first step the distance is `r_eps`, set by `init_step_type`:
    "distance" takes `r_eps = init_step_value`, "heuristic" takes
    `r_eps = init_step_value * (1 + ||x_0||)` (so `init` needs the real parameters), and
    "learning_rate" takes `r_eps = 0` and makes the first step size `init_step_value` instead.

    `update` needs `params`. `optax.contrib.dog` builds this transform (optax does not export it).

    Args:
        init_step_type: how the first step is specified (static): `"distance"`,
            `"learning_rate"` or `"heuristic"`, as above.
        init_step_value: the number the first step is specified by, > 0.
        eps: added to the sum of squared gradient norms under the root, >= 0.
        param_dtype: the dtype of the copy of the initial parameters (modopt's, keyword-only;
            `None` keeps the parameters' dtype). With it set, the distance from it and the
            gradients' norms are taken in float32 at least; the running scalars take the
            parameters' lowest dtype, or `param_dtype` where it is wider.

    Reference: Ivgi, Hinder & Carmon, 2023, "DoG is SGD's Best Friend: A Parameter-Free Dynamic
    Step Size Schedule", https://arxiv.org/abs/2302.12022
    """

    init_step_type: str = choice("heuristic", INIT_STEP_TYPES)
    init_step_value: Scalar = hyperparameter(1e-6, check=POSITIVE_FINITE)
    eps: Scalar = fields.eps(1e-8)
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        dtype = scalar_dtype(_lowest_dtype(jax.tree_util.tree_leaves(params)), self.param_dtype)
        if self.init_step_type == "distance":
            r_eps = self.init_step_value
        elif self.init_step_type == "heuristic":
            r_eps = self.init_step_value * (1 + global_norm(params))
        else:
            r_eps = 0.0
        return DoGState(
            is_init_step=jnp.asarray(True),
            init_params=copy_state(params, self.param_dtype),
            max_dist=jnp.asarray(r_eps, dtype),
            sum_sq_norm_grads=jnp.asarray(0.0, dtype),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        max_dist = jnp.maximum(state.max_dist, jnp.sqrt(_distance_sq(params, state.init_params, self.param_dtype)))
        sum_sq_norm_grads = state.sum_sq_norm_grads + sum_of_squares(widen(updates, self.param_dtype))
        step_size = max_dist / jnp.sqrt(sum_sq_norm_grads + self.eps)
        if self.init_step_type == "learning_rate":
            step_size = jnp.where(state.is_init_step, self.init_step_value, step_size)
        return _scaled(step_size, updates), DoGState(
            is_init_step=jnp.asarray(False),
            init_params=state.init_params,
            max_dist=max_dist.astype(state.max_dist.dtype),
            sum_sq_norm_grads=sum_sq_norm_grads.astype(state.sum_sq_norm_grads.dtype),
        )


class ScaleByDoWG(AbstractTransform):
    r"""Scales updates by the DoWG step size `r^2 / (sqrt(v) + eps)`.

    `r^2 = max_k ||x_k - x_0||^2` is the largest squared distance from the starting point so
    far (at least its initial estimate), and `v = sum_k r_k^2 ||g_k||^2` sums the squared
    gradient norms, each weighted by the estimate at its step; norms are over the whole tree.

    `update` needs `params`. `optax.contrib.dowg` builds this transform (optax does not export it).

    Args:
        init_estim_sq_dist: the initial estimate of the squared distance to the solution, > 0;
            `None` uses `eps`.
        eps: added to the denominator, >= 0; also the initial estimate when
            `init_estim_sq_dist` is `None`.
        param_dtype: the dtype of the copy of the initial parameters (modopt's, keyword-only;
            `None` keeps the parameters' dtype). With it set, the distance from it and the
            gradients' norms are taken in float32 at least; the running scalars take the
            parameters' lowest dtype, or `param_dtype` where it is wider.

    Reference: Khaled, Mishchenko & Jin, 2023, "DoWG Unleashed: An Efficient Universal
    Parameter-Free Gradient Descent Method", https://arxiv.org/abs/2305.16284
    """

    init_estim_sq_dist: Scalar | None = hyperparameter(None, check=POSITIVE_FINITE)
    eps: Scalar = fields.eps(1e-4)
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        dtype = scalar_dtype(_lowest_dtype(jax.tree_util.tree_leaves(params)), self.param_dtype)
        initial = self.eps if self.init_estim_sq_dist is None else self.init_estim_sq_dist
        return DoWGState(
            init_params=copy_state(params, self.param_dtype),
            weighted_sq_norm_grads=jnp.asarray(0.0, dtype),
            estim_sq_dist=jnp.asarray(initial, dtype),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        estim_sq_dist = jnp.maximum(state.estim_sq_dist, _distance_sq(params, state.init_params, self.param_dtype))
        weighted = estim_sq_dist * sum_of_squares(widen(updates, self.param_dtype)) + state.weighted_sq_norm_grads
        step_size = estim_sq_dist / (jnp.sqrt(weighted) + self.eps)
        return _scaled(step_size, updates), DoWGState(
            init_params=state.init_params,
            weighted_sq_norm_grads=weighted.astype(state.weighted_sq_norm_grads.dtype),
            estim_sq_dist=estim_sq_dist.astype(state.estim_sq_dist.dtype),
        )


def _init_step_pair(init_step: Any) -> tuple[str, Any]:
    """`init_step` checked to be a pair `(type, value)` with a known type."""
    if not (isinstance(init_step, (tuple, list)) and len(init_step) == 2 and isinstance(init_step[0], str)):
        raise ValueError(
            f"Invalid init_step: {init_step!r} (must be a pair (type, value) with type one of "
            f"{', '.join(map(repr, INIT_STEP_TYPES))}, e.g. ('heuristic', 1e-6)) in Dog."
        )
    if init_step[0] not in INIT_STEP_TYPES:
        raise ValueError(
            f"Invalid init_step: {init_step!r} (its type must be one of {', '.join(map(repr, INIT_STEP_TYPES))}) in Dog."
        )
    return init_step[0], init_step[1]


class Dog(AbstractComposite):
    r"""DoG (Distance over Gradients): SGD with a parameter-free step size.

    `x_{t+1} = x_t - learning_rate * eta_t g_t` with
    `eta_t = max_{k <= t} ||x_k - x_0|| / sqrt(sum_{k <= t} ||g_k||^2 + eps)` (norms over the
    whole parameter tree). The first step is set by `init_step = (type, value)`:
    `("distance", r)` starts the running maximum at `r`; `("heuristic", a)` at
    `a (1 + ||x_0||)` (a = 1e-6 is suggested, 1e-4 with batch normalization; `init` then needs
    the real parameters); `("learning_rate", eta)` makes the first step size `eta`. The value
    should keep the first step small. `weight_decay` (if not `None`) adds `weight_decay * params`
    to the gradients first; `learning_rate` (a number or schedule) multiplies the DoG step.

    The type of `init_step` is static; its value is the hyperparameter `init_step_value`
    (`dog.init_step` gives the pair back). The authors recommend averaging the iterates.

    Args:
        learning_rate: multiplies DoG's step size: a number >= 0 or a schedule of the step count.
        init_step: the pair `(type, value)` setting the first step, as above; the value > 0.
        eps: added to the sum of squared gradient norms under the root, >= 0.
        weight_decay: the coefficient of the L2 penalty added to the gradients before DoG, or
            `None` for none (a number or a schedule).
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, or a function of the params returning one.
        param_dtype: the dtype of the copy of the initial parameters kept in the state
            (modopt's, keyword-only; `None` keeps the parameters' dtype; see `scale_by_dog`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.dog(), model)

    Reference: Ivgi, Hinder & Carmon, 2023, "DoG is SGD's Best Friend: A Parameter-Free Dynamic
    Step Size Schedule", https://arxiv.org/abs/2302.12022
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(1.0)
    init_step_type: str = choice("heuristic", INIT_STEP_TYPES)
    init_step_value: Scalar = hyperparameter(1e-6, check=POSITIVE_FINITE)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(None)
    mask: MaskOrFn = fields.mask()
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __init__(
        self,
        learning_rate: Any = 1.0,
        init_step: tuple[str, Any] = ("heuristic", 1e-6),
        eps: Scalar = 1e-8,
        weight_decay: Any = None,
        mask: MaskOrFn = None,
        *,
        param_dtype: DTypeLike | None = None,
    ):
        self.learning_rate = learning_rate
        self.init_step_type, self.init_step_value = _init_step_pair(init_step)
        self.eps = eps
        self.weight_decay = weight_decay
        self.mask = mask
        self.param_dtype = param_dtype

    @property
    def init_step(self) -> tuple[str, Any]:
        """The pair `(init_step_type, init_step_value)` given as `init_step`."""
        return self.init_step_type, self.init_step_value

    def build(self):
        return Chain(
            Identity() if self.weight_decay is None else AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByDoG(self.init_step_type, self.init_step_value, self.eps, param_dtype=self.param_dtype),
            ScaleByLearningRate(self.learning_rate),
        )


class Dowg(AbstractComposite):
    r"""DoWG (Distance over Weighted Gradients): SGD with a parameter-free step size.

    `x_{t+1} = x_t - learning_rate * eta_t g_t` with `eta_t = r_t^2 / (sqrt(v_t) + eps)`, where
    `r_t^2 = max(r_{t-1}^2, ||x_t - x_0||^2)` (starting at `init_estim_sq_dist`, or `eps` if
    `None`) and `v_t = v_{t-1} + r_t^2 ||g_t||^2` (norms over the whole parameter tree).
    `weight_decay` (if not `None`) adds `weight_decay * params` to the gradients first;
    `learning_rate` (a number or schedule) multiplies the DoWG step.

    Args:
        learning_rate: multiplies DoWG's step size: a number >= 0 or a schedule of the step count.
        init_estim_sq_dist: the initial estimate of the squared distance to the solution, > 0;
            `None` uses `eps`.
        eps: added to the denominator, >= 0; also the initial estimate when
            `init_estim_sq_dist` is `None`.
        weight_decay: the coefficient of the L2 penalty added to the gradients before DoWG, or
            `None` for none (a number or a schedule).
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, or a function of the params returning one.
        param_dtype: the dtype of the copy of the initial parameters kept in the state
            (modopt's, keyword-only; `None` keeps the parameters' dtype; see `scale_by_dowg`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.dowg(), model)

    Reference: Khaled, Mishchenko & Jin, 2023, "DoWG Unleashed: An Efficient Universal
    Parameter-Free Gradient Descent Method", https://arxiv.org/abs/2305.16284
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(1.0)
    init_estim_sq_dist: Scalar | None = hyperparameter(None, check=POSITIVE_FINITE)
    eps: Scalar = fields.eps(1e-4)
    weight_decay: ScalarOrSchedule = fields.weight_decay(None)
    mask: MaskOrFn = fields.mask()
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return Chain(
            Identity() if self.weight_decay is None else AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByDoWG(self.init_estim_sq_dist, self.eps, param_dtype=self.param_dtype),
            ScaleByLearningRate(self.learning_rate),
        )


dog = Dog
dowg = Dowg
