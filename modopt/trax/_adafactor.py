"""trax's `Adafactor`: its factored second moment (over the last two axes), its momentum kept
in a storage dtype, its weight-decay ramp, and the optimizer composed of them."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform, EmptyState
from .._core.fields import FINITE, NONNEGATIVE, POSITIVE, UNIT, hyperparameter, static
from .._util.numerics import safe_increment
from .._core.specs import REPLICATED, drop_axis
from .._util.trees import cast_like, is_none, map_updates, zeros_like
from ..combinators import Chain
from ..schedules import AbstractSchedule
from ..transforms import (
    AddDecayedWeights,
    ClipByBlockRms,
    Scale,
    ScaleByLearningRate,
    ScaleByParamBlockRms,
    WeightDecaySchedule,
)
from ..transforms._real_only import reject_complex
from ._base import Optimizer, learning_rate_field
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._state.moments import in_update_dtype, state_dtype_for, store, widen


class TraxFactoredState(NamedTuple):
    """trax Adafactor's second-moment statistics: the step count and, per parameter, a list."""

    count: jax.Array  # int32 scalar: the step (trax's caller's step)
    v: Any  # per parameter: [v_row, v_col] (float32) if factored, else [v] (the param's dtype); all in `nu_dtype` if set


class ScaleByTraxFactoredRms(AbstractTransform):
    r"""Scales updates by trax Adafactor's (factored) estimate of the second moment.

    With `t = count + 1` (computed in float32), `b = 1 - t^(-decay_rate)` (0 at the first step)
    and `g2 = g^2`, a parameter of rank >= 2 (when `factored`) keeps a row and a column
    statistic over its **last two axes**, whatever their sizes:

        v_row <- b v_row + (1 - b) mean(g2, axis=-1)        # shape[:-1]
        v_col <- b v_col + (1 - b) mean(g2, axis=-2)        # shape[:-2] + shape[-1:]
        y = g * sqrt(mean(v_row, -1) / (v_row + epsilon1))[..., None] * (v_col + epsilon1)^(-1/2)[..., None, :]

    Other parameters keep `v <- b v + (1 - b) g2` and `y = g (v + epsilon1)^(-1/2)`. The
    output is `y`. `epsilon1` is added where the statistics are used, not in the state.

    This differs from `modopt.scale_by_factored_rms` (optax's): that one factors only leaves
    whose second-largest axis reaches `min_dim_size_to_factor`, over the two largest axes, and
    adds its epsilon to `g^2` inside the averages.

    State: `TraxFactoredState`; the factored statistics are float32 whatever the parameter's
    dtype, as in trax (unless `nu_dtype` is set). Under sharding, `v_row` and `v_col` take the
    parameter's spec without the reduced axis.

    Args:
        decay_rate: the exponent of the decay schedule `1 - t^(-decay_rate)`, >= 0.
        epsilon1: added to the statistics where they are used, >= 0.
        factored: factor the statistics of parameters of rank >= 2 (static).
        nu_dtype: the dtype of every statistic (modopt's, keyword-only); `None` keeps trax's
            (float32 for the factored ones, the parameter's for the others). Set, the
            statistics and the gradients are read in float32 at least and the statistics are
            rounded only when stored (see `fields.dtype`).

    Reference: Shazeer & Stern, 2018, https://arxiv.org/abs/1804.04235
    """

    decay_rate: Scalar = hyperparameter(0.8, check=NONNEGATIVE)
    epsilon1: Scalar = fields.eps(1e-16)
    factored: bool = static(default=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def _factors(self, p: Any) -> bool:
        return self.factored and p.ndim >= 2

    def init(self, params):
        reject_complex(params, self)
        dtype = self.nu_dtype

        def one(p):
            if self._factors(p):
                factored = jnp.float32 if dtype is None else dtype
                return [jnp.zeros(p.shape[:-1], factored), jnp.zeros(p.shape[:-2] + p.shape[-1:], factored)]
            return [jnp.zeros_like(p, state_dtype_for(dtype, p.dtype))]

        return TraxFactoredState(count=jnp.zeros([], jnp.int32), v=jax.tree_util.tree_map(one, params))

    def update(self, updates, state, params=None, **extra_args):
        t = jnp.asarray(state.count, jnp.float32) + 1.0
        decay = 1.0 - t ** (-self.decay_rate)
        mixing = 1.0 - decay
        leaves, treedef = jax.tree_util.tree_flatten(updates, is_leaf=is_none)
        stats = treedef.flatten_up_to(state.v)
        results = [(None, v) if g is None else self._one(g, v, decay, mixing) for g, v in zip(leaves, stats)]
        new_updates = in_update_dtype(treedef.unflatten([y for y, _ in results]), updates, self.nu_dtype)
        new_v = treedef.unflatten([v for _, v in results])
        return new_updates, TraxFactoredState(count=safe_increment(state.count), v=new_v)

    def _one(self, g, stats, decay, mixing):
        # With `nu_dtype`, the statistics and the gradient in float32 at least, the statistics
        # rounded to `nu_dtype` when stored; without, each statistic keeps its dtype.
        dtype = self.nu_dtype
        g, widened = widen(g, dtype), widen(stats, dtype)

        def kept(new, old):
            return new.astype(old.dtype) if dtype is None else store(new, dtype)

        g_sq = g * g
        if self._factors(g):
            (v_row, v_col), (row, col) = stats, widened
            new_row = decay * row + mixing * jnp.mean(g_sq, axis=-1)
            new_col = decay * col + mixing * jnp.mean(g_sq, axis=-2)
            row_mean = jnp.mean(new_row, axis=-1, keepdims=True)
            row_factor = (row_mean / (new_row + self.epsilon1)) ** 0.5
            col_factor = (new_col + self.epsilon1) ** -0.5
            y = g * jnp.expand_dims(row_factor, -1) * jnp.expand_dims(col_factor, -2)
            return y, [kept(new_row, v_row), kept(new_col, v_col)]
        (v,), (wide,) = stats, widened
        new_v = decay * wide + mixing * g_sq
        return g * (new_v + self.epsilon1) ** -0.5, [kept(new_v, v)]

    def state_specs(self, params, param_specs):
        def one(p, spec):
            if self._factors(p):
                return [drop_axis(spec, p.ndim, p.ndim - 1), drop_axis(spec, p.ndim, p.ndim - 2)]
            return [spec]

        treedef = jax.tree_util.tree_structure(params)
        specs = [one(p, s) for p, s in zip(treedef.flatten_up_to(params), treedef.flatten_up_to(param_specs))]
        return TraxFactoredState(count=REPLICATED, v=treedef.unflatten(specs))


class StoredEmaState(NamedTuple):
    """The moving average of `StoredEma`."""

    ema: Any  # like the params, in the storage dtype


class StoredEma(AbstractTransform):
    r"""A moving average of updates (no bias correction) computed in the updates' dtype and
    stored in `dtype`: trax Adafactor's momentum.

        m <- decay * m + (1 - decay) * u,   output: m (before rounding to `dtype`)

    With `dtype=jnp.bfloat16` (trax's `momentum_in_bfloat16`) the state is rounded to bf16,
    while the output and the arithmetic use the unrounded value, in float32 at least (as every
    state dtype, see `fields.dtype`; trax's reference computes it in higher precision too).
    `modopt.ema(decay, debias=False, accumulator_dtype=...)` (optax's `ema`) computes
    `decay * m` in the stored dtype instead, which rounds it to bf16.

    Args:
        decay: the decay of the average, in [0, 1].
        dtype: the dtype the average is stored in (`None`: that of the params).
    """

    decay: Scalar = hyperparameter(check=UNIT)
    dtype: DTypeLike | None = fields.dtype()

    def init(self, params):
        return StoredEmaState(ema=zeros_like(params, self.dtype))

    def update(self, updates, state, params=None, **extra_args):
        dtype = self.dtype
        ema = map_updates(
            lambda u, m: self.decay * m.astype(u.dtype) + (1.0 - self.decay) * u, widen(updates, dtype), widen(state.ema, dtype)
        )
        new_state = StoredEmaState(ema=cast_like(ema, state.ema) if dtype is None else store(ema, dtype))
        return in_update_dtype(ema, updates, dtype), new_state


class WeightDecayRamp(AbstractSchedule):
    r"""trax Adafactor's weight-decay schedule: constant, or a linear ramp down to zero.

    `weight_decay_rate` while `weight_decay_n_steps < 1`; otherwise
    `weight_decay_rate * max(weight_decay_n_steps - count, 0) / weight_decay_n_steps`, which
    falls from `weight_decay_rate` at step 0 to 0 at step `weight_decay_n_steps`. Both values
    are leaves, so switching the ramp on or off does not retrace.

    Args:
        weight_decay_rate: the weight decay at step 0 (any finite number).
        weight_decay_n_steps: the length of the ramp, >= 0; below 1 the decay stays constant.
    """

    weight_decay_rate: Scalar = hyperparameter(check=FINITE)
    weight_decay_n_steps: Scalar = hyperparameter(0, check=NONNEGATIVE)

    def __call__(self, count):
        n = jnp.asarray(self.weight_decay_n_steps)
        ramp = self.weight_decay_rate * jnp.maximum(n - count, 0.0) / jnp.maximum(n, 0.0)
        return jnp.where(n < 1, self.weight_decay_rate, ramp)


class Adafactor(Optimizer):
    r"""trax's Adafactor.

    Per weight `w` with gradient `g`, at the caller's step (`t = step + 1`):

    1. `y` from the second-moment statistics (`ScaleByTraxFactoredRms`): factored over the
       last two axes for rank >= 2 when `factored`, with `b = 1 - t^(-decay_rate)`.
    2. `do_clipping`: `y <- y / max(1, rms(y) / clipping_threshold)`.
    3. `sub = learning_rate * y`, times `max(rms(w), epsilon2)` when
       `multiply_by_parameter_scale`.
    4. `do_momentum`: `m <- beta1 m + (1 - beta1) sub` (no bias correction) and `sub = m`; with
       `momentum_in_bfloat16`, the slot is stored in bf16. (`beta1` defaults to 0: momentum
       must be given a `beta1` to do anything.)
    5. `w <- (1 - wd) w - sub`, with `wd = weight_decay_rate`, or when
       `weight_decay_n_steps >= 1`, `weight_decay_rate * max(n_steps - step, 0) / n_steps`.
       The weight decay is on by default (1e-5) and is not multiplied by the learning rate.

    Slots per weight (a list): `[v_row, v_col]` (float32) or `[v]`, then `m` if `do_momentum`.
    The flags are static (fixed at construction, as in trax); the numbers are opt_params.
    `clipping_threshold` and `weight_decay_n_steps` take numbers only (trax fails on `None`
    too): switch clipping off with `do_clipping=False` and the ramp with `0`.

    Compared with `modopt.adafactor` (optax's): trax factors every weight of rank >= 2 over
    its last two axes (optax: the two largest, and only from 128 elements on), adds
    `epsilon1` (1e-16) where the statistics are used (optax: 1e-30 into them), defaults to a
    learning rate of 0.05 with weight decay on, and ramps the decay with
    `weight_decay_n_steps`.

    Built from transforms: `ScaleByTraxFactoredRms`, modopt's `clip_by_block_rms`,
    `scale_by_learning_rate(lr, flip_sign=False)`, `scale_by_param_block_rms(epsilon2)`,
    `StoredEma`, `add_decayed_weights(WeightDecayRamp(...))` and `scale(-1)` (the chain
    builds trax's positive `sub + wd * w`, so the momentum slot holds trax's value, and
    negates it last).

    Args:
        learning_rate: the step size, >= 0.
        factored: factor the statistics of weights of rank >= 2 over their last two axes.
        multiply_by_parameter_scale: scale the step by the weight's RMS (at least `epsilon2`).
        do_clipping: clip `y` to an RMS of `clipping_threshold`.
        do_momentum: keep a momentum slot (an EMA of the steps, decay `beta1`).
        momentum_in_bfloat16: store the momentum slot in bfloat16.
        beta1: the momentum's decay, in [0, 1].
        decay_rate: the exponent of the second moment's decay `1 - t^(-decay_rate)`, >= 0.
        clipping_threshold: the RMS `y` is clipped to, > 0.
        weight_decay_rate: the fraction of each weight removed per step (any finite number).
        weight_decay_n_steps: the steps over which the decay ramps down to 0; 0 (default): a
            constant decay.
        epsilon1: added to the second-moment statistics where they are used, >= 0.
        epsilon2: the smallest weight RMS the step is scaled by, >= 0.
        mu_dtype: the dtype of the momentum slot (modopt's, keyword-only); `None` keeps the
            weights' (bfloat16 with `momentum_in_bfloat16`, which is the same as
            `mu_dtype=jnp.bfloat16`; another `mu_dtype` with it is an error).
        nu_dtype: the dtype of the second-moment statistics (modopt's, keyword-only); `None`
            keeps trax's (float32 when factored, else the weight's). Set, they are accumulated
            in float32 and rounded when stored (see `fields.dtype`).

    Reference: Shazeer & Stern, 2018, https://arxiv.org/abs/1804.04235
    """

    learning_rate: Scalar = learning_rate_field(0.05)
    factored: bool = static(default=True)
    multiply_by_parameter_scale: bool = static(default=True)
    do_clipping: bool = static(default=True)
    do_momentum: bool = static(default=False)
    momentum_in_bfloat16: bool = static(default=False)
    beta1: Scalar = hyperparameter(0.0, check=UNIT)
    decay_rate: Scalar = hyperparameter(0.8, check=NONNEGATIVE)
    clipping_threshold: Scalar = hyperparameter(1.0, check=POSITIVE)
    weight_decay_rate: Scalar = hyperparameter(1e-5, check=FINITE)
    weight_decay_n_steps: Scalar = hyperparameter(0, check=NONNEGATIVE)
    epsilon1: Scalar = fields.eps(1e-16)
    epsilon2: Scalar = fields.eps(1e-3)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        if self.momentum_in_bfloat16 and self.mu_dtype not in (None, jnp.dtype(jnp.bfloat16)):
            raise ValueError(
                f"Invalid mu_dtype: {self.mu_dtype} with momentum_in_bfloat16=True (which stores the momentum in "
                "bfloat16): give one of the two, in Adafactor."
            )

    @property
    def opt_param_names(self):
        return (
            "beta1", "decay_rate", "clipping_threshold", "weight_decay_rate", "weight_decay_n_steps",
            "epsilon1", "epsilon2", "learning_rate",
        )  # fmt: skip

    def step_transform(self):
        parts: list[AbstractTransform] = [
            ScaleByTraxFactoredRms(self.decay_rate, self.epsilon1, factored=self.factored, nu_dtype=self.nu_dtype)
        ]
        if self.do_clipping:
            parts.append(ClipByBlockRms(self.clipping_threshold))
        parts.append(ScaleByLearningRate(self.learning_rate, flip_sign=False))
        if self.multiply_by_parameter_scale:
            parts.append(ScaleByParamBlockRms(self.epsilon2))
        if self.do_momentum:
            momentum_dtype = jnp.bfloat16 if self.momentum_in_bfloat16 else None
            parts.append(StoredEma(self.beta1, momentum_dtype if self.mu_dtype is None else self.mu_dtype))
        parts.append(AddDecayedWeights(WeightDecayRamp(self.weight_decay_rate, self.weight_decay_n_steps)))
        parts.append(Scale(-1.0))
        return Chain(*parts)

    def slot_to_state(self, step, slot):
        slot = list(slot)
        stats = slot[:-1] if self.do_momentum else slot
        states: list[Any] = [TraxFactoredState(count=step, v=stats)]
        states += [EmptyState()] * (1 + self.do_clipping + self.multiply_by_parameter_scale)
        if self.do_momentum:
            states.append(StoredEmaState(ema=slot[-1]))
        return (*states, WeightDecaySchedule(count=step), EmptyState())

    def state_to_slot(self, state):
        slot = list(state[0].v)
        if self.do_momentum:
            slot.append(state[-3].ema)
        return slot
