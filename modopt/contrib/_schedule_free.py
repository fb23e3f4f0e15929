"""Schedule-Free learning: interpolation and averaging in place of momentum and a decaying schedule."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.checks import prefix_difference
from .._core.base import AbstractComposite, AbstractTransform, AbstractWrapper, inner_transform, require_params
from .._core.fields import FINITE_NONNEGATIVE, POSITIVE_INTEGER, hyperparameter, interval
from .._util.numerics import safe_increment
from .._state.moments import store
from .._util.trees import is_none
from ..combinators import Chain
from ..optimizers._sgd import Sgd
from ..schedules._base import ScalarOrSchedule, is_schedule, value_at
from ..schedules._schedules import linear_schedule
from ..transforms import AddDecayedWeights, ScaleByLearningRate, ScaleByRms
from ._mechanic import _lowest_dtype
from .._core.fields import Scalar
from jax.typing import DTypeLike

# The interpolation weight b1 divides in `x = (y - (1 - b1) z) / b1`: it must be positive.
INTERPOLATION = interval(0, 1, closed_lo=False, closed_hi=True)


class ScheduleFreeState(NamedTuple):
    """The state of `schedule_free`.

    b1: the interpolation weight that produced the current parameters `y` (a scalar in the
        parameters' lowest dtype, or `state_dtype` where that is wider; so are `weight_sum` and
        `max_lr`); `schedule_free_eval_params` reads it.
    weight_sum: the sum of the averaging weights `max_lr**weight_lr_power` so far.
    step_count: the step about to be taken, starting at 1 (int32 scalar); the schedule of
        `learning_rate` is evaluated at it.
    max_lr: the largest learning rate seen so far.
    base_optimizer_state: the wrapped optimizer's state.
    z: the base optimizer's own iterates `z`, like the params (in `state_dtype` if set).
    """

    b1: jax.Array
    weight_sum: jax.Array
    step_count: jax.Array
    max_lr: jax.Array
    base_optimizer_state: Any
    z: Any


class ScheduleFree(AbstractWrapper):
    r"""Schedule-Free: makes a base optimizer schedule-free (no momentum, no decaying schedule).

    The base optimizer (without momentum) moves its own sequence `z`; the parameters the
    gradients are taken at, `y`, interpolate between `z` and a weighted running average `x`
    of the `z`'s, which is the sequence to evaluate the model at. For SGD:

        y_t     = (1 - b1) z_t + b1 x_t
        z_{t+1} = z_t - lr * grad f(y_t)                 (the base optimizer's step)
        x_{t+1} = (1 - c_{t+1}) x_t + c_{t+1} z_{t+1}
        c_{t+1} = w_t / (w_1 + ... + w_t),   w_t = max(lr_1, ..., lr_t) ** weight_lr_power

    The state keeps `z` and the base optimizer's state; `x` is recomputed from `y` and `z`
    (`x = (y - (1 - b1) z) / b1`), so the memory is that of the base optimizer plus one copy
    of the parameters. Evaluate the model at `x`, given by `schedule_free_eval_params`.

    Switch off the base optimizer's momentum (`adam(lr, b1=0.0)`, `sgd(lr)`): the averaging
    replaces it. Give the base optimizer and this wrapper the same `learning_rate` (a
    constant, or a warmup then constant schedule); the wrapper's schedule is evaluated at
    `step_count`, which starts at 1. `update` needs `params`; extra arguments reach the base
    optimizer.

    `b1` is read at each step and the state records the `b1` of the last step (what
    `schedule_free_eval_params` uses); after changing it with `Optimizer.set`, the first step
    recovers `x` with the new value.

    `Optimizer` steps this wrapper leaf by leaf (it does not group small leaves into flat
    buffers, see `Optimizer`), so `optimizer.state.z` is shaped like the model's trained leaves
    and `schedule_free_eval_params(optimizer.state, model)` gives the evaluation model.

    Args:
        base_optimizer: the optimizer that moves `z` (a modopt or optax transform), without
            momentum.
        learning_rate: the learning rate of the base optimizer, a number >= 0 or a schedule of
            the step count; it sets the averaging weights.
        b1: the interpolation weight `b1` between `x` and `z` in `y`, in (0, 1].
        weight_lr_power: the power of the largest learning rate so far in the averaging weight,
            >= 0 (the default 2 gives the steps of a warmup less weight).
        state_dtype: the dtype of `z` (`None`: the parameters' dtype; static). The scalars of the
            state (`b1`, `weight_sum`, `max_lr`) take it where it is wider than the parameters'
            lowest dtype (optax keeps them in the parameters' dtype).

    Example:
        >>> schedule = modopt.linear_schedule(0.0, 1e-3, 1000)  # warmup, then constant
        >>> tx = modopt.contrib.schedule_free(modopt.adam(schedule, b1=0.0), schedule, b1=0.9)
        >>> optimizer = modopt.Optimizer(tx, model)
        >>> model, optimizer = optimizer.step(model, grads)
        >>> eval_model = modopt.contrib.schedule_free_eval_params(optimizer.state, model)

    References: Defazio et al., 2024, "The Road Less Scheduled",
    https://arxiv.org/abs/2405.15682; https://github.com/facebookresearch/schedule_free
    """

    inner: AbstractTransform = inner_transform()
    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9, check=INTERPOLATION)
    weight_lr_power: Scalar = hyperparameter(2.0, check=FINITE_NONNEGATIVE)
    state_dtype: DTypeLike | None = fields.dtype()
    inner_state_field = "base_optimizer_state"

    def __init__(
        self,
        base_optimizer: Any,
        learning_rate: ScalarOrSchedule,
        b1: Scalar = 0.9,
        weight_lr_power: Scalar = 2.0,
        state_dtype: DTypeLike | None = None,
    ):
        self.inner = base_optimizer
        self.learning_rate = learning_rate
        self.b1 = b1
        self.weight_lr_power = weight_lr_power
        self.state_dtype = state_dtype

    @property
    def base_optimizer(self) -> AbstractTransform:
        """The optimizer that moves `z`."""
        return self.inner

    def init(self, params):
        dtype = _lowest_dtype(jax.tree_util.tree_leaves(params))
        if self.state_dtype is not None:  # a sum of weights in bfloat16 would stall
            dtype = jnp.promote_types(dtype, self.state_dtype)
        return ScheduleFreeState(
            b1=jnp.asarray(self.b1, dtype),
            weight_sum=jnp.zeros([], dtype),
            step_count=jnp.ones([], jnp.int32),
            max_lr=jnp.zeros([], dtype),
            base_optimizer_state=self.inner.init(params),
            # A copy: the state is donated to jitted steps alongside the parameters.
            z=jax.tree_util.tree_map(jnp.copy, store(params, self.state_dtype)),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        lr = jnp.asarray(value_at(self.learning_rate, state.step_count), state.max_lr.dtype)
        max_lr = jnp.maximum(state.max_lr, lr)
        weight = max_lr**self.weight_lr_power
        weight_sum = state.weight_sum + weight
        # The averaging weight of the new z: 0 (not NaN) while every learning rate is 0.
        ck = jnp.where(
            jnp.isnan(weight) | jnp.isnan(weight_sum),
            jnp.full(weight.shape, jnp.nan),
            jnp.nan_to_num(weight / weight_sum, nan=0.0, posinf=jnp.inf),
        )
        base_updates, base_state = self.inner.update(updates, state.base_optimizer_state, params, **extra_args)
        z = jax.tree_util.tree_map(lambda zi, u: jnp.asarray(zi + u).astype(zi.dtype), state.z, base_updates)

        b1 = self.b1
        # x from y and the previous z: recomputed rather than stored (one buffer less, and exact
        # for whatever moved y since the last step).
        new_params = jax.tree_util.tree_map(
            lambda y, z_old, z_new: _interpolate(_average(_eval_point(y, z_old, b1), z_new, ck), z_new, b1),
            params,
            state.z,
            z,
        )
        new_updates = jax.tree_util.tree_map(lambda new, y: new - y, new_params, params)
        return new_updates, ScheduleFreeState(
            b1=jnp.asarray(b1, state.b1.dtype),
            weight_sum=weight_sum,
            step_count=safe_increment(state.step_count),
            max_lr=max_lr,
            base_optimizer_state=base_state,
            z=z,
        )


def _eval_point(y: Any, z: Any, b1: Any) -> Any:
    """`x = (y - (1 - b1) z) / b1`: the averaged iterate, from the gradient point `y` and `z`."""
    return (y - (1.0 - b1) * z) / b1


def _average(x: Any, z: Any, ck: Any) -> Any:
    return (1.0 - ck) * x + ck * z


def _interpolate(x: Any, z: Any, b1: Any) -> Any:
    """`y = b1 x + (1 - b1) z`: the next gradient point."""
    return b1 * x + (1.0 - b1) * z


def _find_state(state: Any) -> ScheduleFreeState:
    """`state` if it is a `ScheduleFreeState`, else the only one inside it (a chain's state)."""
    if isinstance(state, ScheduleFreeState):
        return state
    is_state = lambda x: isinstance(x, ScheduleFreeState)  # noqa: E731
    found = [x for x in jax.tree_util.tree_leaves(state, is_leaf=is_state) if is_state(x)]
    if len(found) == 1:
        return found[0]
    what = "no ScheduleFreeState" if not found else f"{len(found)} ScheduleFreeStates"
    raise ValueError(
        f"schedule_free_eval_params needs the state of a schedule_free optimizer; got a "
        f"{type(state).__name__} holding {what}. Pass `opt_state` (pure API) or `optimizer.state` "
        "(a `modopt.Optimizer`)."
    )


def schedule_free_eval_params(state: Any, params: Any) -> Any:
    """The parameters to evaluate a Schedule-Free model at: `x = (y - (1 - b1) z) / b1`.

    Training moves the parameters `y`, where gradients are taken; the averaged iterate `x`
    is the one to evaluate (validation loss, checkpoints for inference).

    `state` is the state of `schedule_free` (or of one of its aliases), or a state holding
    exactly one (a chain around it). With a `modopt.Optimizer`, pass `optimizer.state` and the
    model: the leaves the optimizer does not train (integers, frozen leaves, static fields) come
    back unchanged.

    Args:
        state: the `ScheduleFreeState` (`opt_state`, `optimizer.state`), or a state holding one.
        params: the current parameters `y` (or the whole model, with `optimizer.state`).

    Example:
        >>> model, optimizer = train_step(model, optimizer, batch)
        >>> eval_model = modopt.contrib.schedule_free_eval_params(optimizer.state, model)
        >>> # pure API: eval_params = schedule_free_eval_params(opt_state, params)
    """
    state = _find_state(state)
    b1 = state.b1
    marked = jax.tree_util.tree_map(lambda z: 0 if z is None else z, state.z, is_leaf=is_none)
    difference = prefix_difference(marked, params)
    if difference:
        raise ValueError(
            f"schedule_free_eval_params: the parameters and the state's `z` differ in structure: found "
            f"{difference}. Pass the parameters (or the model) the state was made for."
        )

    def leaf(z, y):
        return y if z is None else _eval_point(y, z, b1)

    # `z` is None where the optimizer trains nothing: there the model's leaf (or subtree) stays.
    return jax.tree_util.tree_map(leaf, state.z, params, is_leaf=is_none)


def _warmup(learning_rate: Any, warmup_steps: Any, owner: str) -> Any:
    """The learning rate, or a linear warmup from 0 to it over `warmup_steps` then constant."""
    if warmup_steps is None:
        return learning_rate
    if is_schedule(learning_rate):
        raise ValueError(
            f"{owner}: with warmup_steps, learning_rate is the peak value and must be a number, got a "
            "schedule. Pass warmup_steps=None and a schedule of your own (warmup included) instead."
        )
    return linear_schedule(0.0, learning_rate, warmup_steps)


class ScheduleFreeSgd(AbstractComposite):
    r"""Schedule-Free SGD: `schedule_free(sgd(lr), lr)`, with an optional warmup and weight decay.

    The base step is `z -= lr * (g + weight_decay * y)` (the decay taken at the gradient
    point `y` and multiplied by the learning rate, as PyTorch does), and the parameters follow
    the Schedule-Free interpolation and averaging (see `schedule_free`). With `warmup_steps`,
    `lr` rises linearly from 0 to `learning_rate` over that many steps and stays there.
    Evaluate the model at `schedule_free_eval_params(state, params)`.

    Args:
        learning_rate: the SGD learning rate (the peak after warmup), a number >= 0 (or a
            schedule, without `warmup_steps`).
        warmup_steps: the length of the linear warmup, an integer >= 1, or `None` for none.
        b1: the interpolation weight between the average `x` and `z`, in (0, 1].
        weight_decay: the strength of the weight decay, or `None` for none.
        weight_lr_power: the power of the largest learning rate so far in the averaging weight, >= 0.
        state_dtype: the dtype of `z` (`None`: the parameters' dtype; static; see
            `schedule_free`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.schedule_free_sgd(1.0, warmup_steps=100), model)
        >>> model, optimizer = optimizer.step(model, grads)
        >>> eval_model = modopt.contrib.schedule_free_eval_params(optimizer.state, model)

    Reference: Defazio et al., 2024, "The Road Less Scheduled", https://arxiv.org/abs/2405.15682
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(1.0)
    warmup_steps: Scalar | None = hyperparameter(None, check=POSITIVE_INTEGER)
    b1: Scalar = fields.decay_rate(0.9, check=INTERPOLATION)
    weight_decay: ScalarOrSchedule | None = fields.weight_decay(None)
    weight_lr_power: Scalar = hyperparameter(2.0, check=FINITE_NONNEGATIVE)
    state_dtype: DTypeLike | None = fields.dtype()

    def build(self):
        lr = _warmup(self.learning_rate, self.warmup_steps, "schedule_free_sgd")
        base: AbstractTransform = Sgd(lr)
        if self.weight_decay is not None:
            base = Chain(AddDecayedWeights(self.weight_decay), base)
        return ScheduleFree(base, lr, self.b1, self.weight_lr_power, self.state_dtype)


class ScheduleFreeAdamW(AbstractComposite):
    r"""Schedule-Free AdamW: AdamW without momentum, made schedule-free.

    The base step is `z -= lr * (g / (sqrt(v_hat) + eps) + weight_decay * y)`, with `v_hat`
    the bias-corrected moving average (decay `b2`) of the squared gradients, and the
    parameters follow the Schedule-Free interpolation and averaging with weight `b1` (see
    `schedule_free`). With `warmup_steps`, `lr` rises linearly from 0 to `learning_rate` over
    that many steps and stays there. Evaluate the model at
    `schedule_free_eval_params(state, params)`.

    The base optimizer is `scale_by_rms(b2, eps, eps_in_sqrt=False, bias_correction=True)`,
    `add_decayed_weights(weight_decay)` and `scale_by_learning_rate(lr)` (Adam with `b1=0`,
    without a first moment kept at zero), as in optax.

    Args:
        learning_rate: the AdamW learning rate (the peak after warmup), a number >= 0 (or a
            schedule, without `warmup_steps`).
        warmup_steps: the length of the linear warmup, an integer >= 1, or `None` for none.
        b1: the interpolation weight between the average `x` and `z`, in (0, 1].
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the square root of the second moment, >= 0.
        weight_decay: the strength of the decoupled weight decay (multiplied by the learning rate).
        weight_lr_power: the power of the largest learning rate so far in the averaging weight, >= 0.
        state_dtype: the dtype of `z` (`None`: the parameters' dtype; static; see `schedule_free`).
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.

    Example:
        >>> tx = modopt.contrib.schedule_free_adamw(1e-3, warmup_steps=1000, weight_decay=1e-4)
        >>> optimizer = modopt.Optimizer(tx, model)
        >>> model, optimizer = optimizer.step(model, grads)
        >>> eval_model = modopt.contrib.schedule_free_eval_params(optimizer.state, model)

    Reference: Defazio et al., 2024, "The Road Less Scheduled", https://arxiv.org/abs/2405.15682
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(0.0025)
    warmup_steps: Scalar | None = hyperparameter(None, check=POSITIVE_INTEGER)
    b1: Scalar = fields.decay_rate(0.9, check=INTERPOLATION)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    weight_lr_power: Scalar = hyperparameter(2.0, check=FINITE_NONNEGATIVE)
    state_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        lr = _warmup(self.learning_rate, self.warmup_steps, "schedule_free_adamw")
        base = Chain(
            ScaleByRms(decay=self.b2, eps=self.eps, eps_in_sqrt=False, bias_correction=True, nu_dtype=self.nu_dtype),
            AddDecayedWeights(self.weight_decay),
            ScaleByLearningRate(lr),
        )
        return ScheduleFree(base, lr, self.b1, self.weight_lr_power, self.state_dtype)


schedule_free = ScheduleFree
schedule_free_sgd = ScheduleFreeSgd
schedule_free_adamw = ScheduleFreeAdamW
