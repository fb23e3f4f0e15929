"""Rescaling by root mean squares of past gradients: RMSprop's scalings, Adagrad's and Adadelta's."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import static
from .._state.moments import bias_correction as debias
from .._state.moments import (
    in_update_dtype,
    init_state,
    store,
    widen,
    widened_update_moment,
    widened_update_moment_per_elem_norm,
)
from .._util.numerics import safe_increment
from .._util.trees import abs_sq, map_updates
from .._core.fields import Scalar
from jax.typing import DTypeLike


class ScaleByRssState(NamedTuple):
    """The sum of squared gradients to date."""

    sum_of_squares: Any  # like the params (in `nu_dtype` if set)


class ScaleByRss(AbstractTransform):
    r"""Rescales updates by the root of the sum of all squared gradients to date (Adagrad).

    `s = s + |g|^2` (starting at `initial_accumulator_value`) and `update = g / sqrt(s + eps)`,
    or 0 where `s` is 0.

    Args:
        initial_accumulator_value: the starting value of the sum `s`, >= 0.
        eps: added to `s` inside the square root, >= 0.
        nu_dtype: the dtype of the sum of squares; `None` keeps the parameters' dtype.

    Reference: Duchi et al., 2011, https://jmlr.org/papers/v12/duchi11a.html
    """

    elementwise_updates = True

    initial_accumulator_value: Scalar = fields.eps(0.1)
    eps: Scalar = fields.eps(1e-7)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleByRssState(sum_of_squares=init_state(params, self.nu_dtype, self.initial_accumulator_value))

    def update(self, updates, state, params=None, **extra_args):
        stored = widen(state.sum_of_squares, self.nu_dtype)
        sum_of_squares = map_updates(lambda g, s: abs_sq(g) + s, widen(updates, self.nu_dtype), stored)
        new_updates = map_updates(
            lambda g, s: jnp.where(s > 0, jax.lax.rsqrt(s + self.eps), 0.0) * g, updates, sum_of_squares
        )
        new_updates = in_update_dtype(new_updates, updates, self.nu_dtype)
        return new_updates, ScaleByRssState(sum_of_squares=store(sum_of_squares, self.nu_dtype))


class ScaleByRmsState(NamedTuple):
    """The moving average of squared gradients (without bias correction)."""

    nu: Any  # like the params


class ScaleByRmsWithCountState(NamedTuple):
    """The step count and moving average of squared gradients (with bias correction)."""

    count: jax.Array  # int32 scalar
    nu: Any  # like the params


class ScaleByRStdDevState(NamedTuple):
    """The moving averages of gradients and squared gradients (without bias correction)."""

    mu: Any  # like the params
    nu: Any  # like the params


class ScaleByRStdDevWithCountState(NamedTuple):
    """The step count and moving averages of gradients and squared gradients (with bias correction)."""

    count: jax.Array  # int32 scalar
    mu: Any  # like the params
    nu: Any  # like the params


def _inverse_root(variance: Any, eps: Any, eps_in_sqrt: bool) -> Any:
    """`1 / sqrt(variance + eps)`, or `1 / (sqrt(variance) + eps)` with `eps_in_sqrt=False`."""
    if eps_in_sqrt:
        return jax.lax.rsqrt(variance + eps)
    return 1 / (jnp.sqrt(variance) + eps)


def _count_and_debias(state: Any, enabled: bool, decay: Any, *moments: Any) -> tuple[Any, list[Any]]:
    """The next step count and the moments bias-corrected by it, when `enabled`."""
    if not enabled:
        return None, list(moments)
    count = safe_increment(state.count)
    return count, [debias(m, decay, count) for m in moments]


class ScaleByRms(AbstractTransform):
    r"""Rescales updates by the root of a moving average of squared gradients (RMSprop).

    `v = decay v + (1 - decay) |g|^2`, starting at `initial_scale`, and `update =
    g / sqrt(v + eps)` (`g / (sqrt(v) + eps)` with `eps_in_sqrt=False`). With
    `bias_correction=True`, `v` is divided by `1 - decay^t` first and the state counts steps
    (`ScaleByRmsWithCountState`); `scale_by_rms(b2, eps_in_sqrt=False, bias_correction=True)`
    is then `scale_by_adam(b1=0, b2=b2)` without a first moment.

    Args:
        decay: the decay rate of the moving average `v`, in [0, 1).
        eps: added to `v` inside the square root, or to the root with `eps_in_sqrt=False`, >= 0.
        initial_scale: the starting value of the moving average of squared gradients, >= 0.
        eps_in_sqrt: add `eps` inside the square root rather than outside (static).
        bias_correction: divide `v` by `1 - decay^t`, as Adam does; the state then counts steps
            (static).
        nu_dtype: the dtype of the moving average `v`; `None` keeps the parameters' dtype.

    Reference: Hinton, 2012, http://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf
    """

    elementwise_updates = True

    decay: Scalar = fields.decay_rate(0.9)
    eps: Scalar = fields.eps(1e-8)
    initial_scale: Scalar = fields.eps(0.0)
    eps_in_sqrt: bool = static(default=True)
    bias_correction: bool = static(default=False)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        nu = init_state(params, self.nu_dtype, self.initial_scale)
        if self.bias_correction:
            return ScaleByRmsWithCountState(count=jnp.zeros([], jnp.int32), nu=nu)
        return ScaleByRmsState(nu=nu)

    def update(self, updates, state, params=None, **extra_args):
        nu = widened_update_moment_per_elem_norm(updates, state.nu, self.decay, 2, self.nu_dtype)
        count, (nu_hat,) = _count_and_debias(state, self.bias_correction, self.decay, nu)
        new_updates = map_updates(lambda g, v: _inverse_root(v, self.eps, self.eps_in_sqrt) * g, updates, nu_hat)
        updates, nu = in_update_dtype(new_updates, updates, self.nu_dtype), store(nu, self.nu_dtype)
        if self.bias_correction:
            return updates, ScaleByRmsWithCountState(count=count, nu=nu)
        return updates, ScaleByRmsState(nu=nu)


class ScaleByStddev(AbstractTransform):
    r"""Rescales updates by the root of a centered moving variance of the gradients (centered RMSprop).

    `m = decay m + (1 - decay) g`, `v = decay v + (1 - decay) |g|^2` (starting at
    `initial_scale`) and `update = g / sqrt(v - |m|^2 + eps)` (`g / (sqrt(v - |m|^2) + eps)`
    with `eps_in_sqrt=False`). With `bias_correction=True`, `m` and `v` are divided by
    `1 - decay^t` first and the state counts steps (`ScaleByRStdDevWithCountState`).

    Args:
        decay: the decay rate of both moving averages `m` and `v`, in [0, 1).
        eps: added to the variance inside the square root, or to the root with `eps_in_sqrt=False`,
            >= 0.
        initial_scale: the starting value of the moving average of squared gradients, >= 0.
        eps_in_sqrt: add `eps` inside the square root rather than outside (static).
        bias_correction: divide `m` and `v` by `1 - decay^t`; the state then counts steps (static).
        mu_dtype: the dtype of the moving average `m`; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the moving average `v`; `None` keeps the parameters' dtype.

    Reference: Graves, 2013, https://arxiv.org/abs/1308.0850
    """

    elementwise_updates = True

    decay: Scalar = fields.decay_rate(0.9)
    eps: Scalar = fields.eps(1e-8)
    initial_scale: Scalar = fields.eps(0.0)
    eps_in_sqrt: bool = static(default=True)
    bias_correction: bool = static(default=False)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        mu, nu = init_state(params, self.mu_dtype), init_state(params, self.nu_dtype, self.initial_scale)
        if self.bias_correction:
            return ScaleByRStdDevWithCountState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)
        return ScaleByRStdDevState(mu=mu, nu=nu)

    def update(self, updates, state, params=None, **extra_args):
        mu = widened_update_moment(updates, state.mu, self.decay, 1, self.mu_dtype)
        nu = widened_update_moment_per_elem_norm(updates, state.nu, self.decay, 2, self.nu_dtype)
        count, (mu_hat, nu_hat) = _count_and_debias(state, self.bias_correction, self.decay, mu, nu)
        scale = lambda m, v: _inverse_root(v - abs_sq(m), self.eps, self.eps_in_sqrt)  # noqa: E731
        new_updates = map_updates(lambda g, m, v: scale(m, v) * g, updates, mu_hat, nu_hat)
        updates = in_update_dtype(new_updates, updates, self.mu_dtype, self.nu_dtype)
        mu, nu = store(mu, self.mu_dtype), store(nu, self.nu_dtype)
        if self.bias_correction:
            return updates, ScaleByRStdDevWithCountState(count=count, mu=mu, nu=nu)
        return updates, ScaleByRStdDevState(mu=mu, nu=nu)


class ScaleByAdaDeltaState(NamedTuple):
    """Adadelta's moving averages of squared gradients and of squared updates."""

    e_g: Any  # like the params
    e_x: Any  # like the params


class ScaleByAdadelta(AbstractTransform):
    r"""Rescales updates by the ratio of the RMS of past updates to the RMS of past gradients.

    `E[g^2] = rho E[g^2] + (1 - rho) g^2`, `update = sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps) g`
    (with the previous `E[dx^2]`), then `E[dx^2] = rho E[dx^2] + (1 - rho) update^2`. The
    units of the update match those of the parameters, so no learning rate is needed.

    Args:
        rho: the decay rate of both running averages, `E[g^2]` and `E[dx^2]`, in [0, 1).
        eps: added inside both square roots, >= 0; it also sets the size of the first steps.
        nu_dtype: the dtype of both running averages; `None` keeps the parameters' dtype.

    Reference: Zeiler, 2012, https://arxiv.org/abs/1212.5701
    """

    elementwise_updates = True

    rho: Scalar = fields.decay_rate(0.9)
    eps: Scalar = fields.eps(1e-6)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleByAdaDeltaState(e_g=init_state(params, self.nu_dtype), e_x=init_state(params, self.nu_dtype))

    def update(self, updates, state, params=None, **extra_args):
        e_g = widened_update_moment(updates, state.e_g, self.rho, 2, self.nu_dtype)
        e_x = widen(state.e_x, self.nu_dtype)
        ratio = lambda g, eg, ex: (jnp.sqrt(ex + self.eps) / jnp.sqrt(eg + self.eps)) * g  # noqa: E731
        new_updates = map_updates(ratio, updates, e_g, e_x)
        e_x = widened_update_moment(new_updates, e_x, self.rho, 2, self.nu_dtype)
        return in_update_dtype(new_updates, updates, self.nu_dtype), ScaleByAdaDeltaState(e_g=store(e_g, self.nu_dtype), e_x=store(e_x, self.nu_dtype))


scale_by_rss = ScaleByRss
scale_by_rms = ScaleByRms
scale_by_stddev = ScaleByStddev
scale_by_adadelta = ScaleByAdadelta
