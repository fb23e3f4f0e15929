"""SM3, Rprop, Polyak SGD, optimistic gradient descent and Adam, and noisy SGD."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import jax

from .. import fields
from .._core.base import AbstractComposite
from .._core.extra_args import ExtraArg
from .._core.fields import FINITE, NONNEGATIVE, choice, hyperparameter, prng_key, static
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import Scale, ScaleByAdam, ScaleByLearningRate
from ..transforms._noise import AddNoise, key_or_seed, noise_decay, noise_variance
from ..transforms._optimistic import ScaleByOptimisticGradient, optimism_coefficient
from ..transforms._polyak import READS_VALUE, VARIANTS, ScaleByPolyak
from ..transforms._rprop import GROWTH_FACTOR, SHRINK_FACTOR, ScaleByRprop
from ..transforms._sm3 import ScaleBySM3
from ._sgd import Sgd
from .._core.fields import Scalar
from jax.typing import DTypeLike


def _negate() -> Scale:
    """The last step of optimizers whose preconditioner already holds the step size."""
    return Scale(-1.0)


class Sm3(AbstractComposite):
    r"""SM3: Adagrad-like adaptive steps with accumulators of sublinear memory.

    `params -= learning_rate * nu`, with `nu` the momentum (decay `momentum`) of
    `g / sqrt(v + 1e-8)`, where `v` bounds the sum of squared gradients of each element by
    the minimum of per-dimension accumulators (see `scale_by_sm3`). A `(m, n)` matrix keeps
    `m + n` accumulators instead of `m * n`.

    `momentum=None` means no momentum (the same as 0).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        momentum: the decay of the momentum, in [0, 1], or `None` for no momentum.
        mu_dtype: the dtype of the momentum; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the accumulators; `None` keeps the parameters' dtype.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.sm3(0.1), model)

    Reference: Anil et al., 2019, "Memory-Efficient Adaptive Optimization",
    https://arxiv.org/abs/1901.11150
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    momentum: Scalar = fields.decay_rate()
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype()

    def __init__(self, learning_rate: Any, momentum: Scalar = 0.9, *, mu_dtype: DTypeLike | None = None, nu_dtype: DTypeLike | None = None):
        self.learning_rate = learning_rate
        self.momentum = 0.0 if momentum is None else momentum
        self.mu_dtype = mu_dtype
        self.nu_dtype = nu_dtype

    def build(self):
        sm3 = ScaleBySM3(b1=self.momentum, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype)
        return Chain(sm3, ScaleByLearningRate(self.learning_rate))


class Rprop(AbstractComposite):
    r"""Rprop: steps of a per-element size that adapts to the sign of successive gradients.

    `params -= step_size * sign(g)`, where each element's `step_size` starts at
    `learning_rate`, is multiplied by `eta_plus` while its gradient keeps its sign and by
    `eta_minus` when the sign changes (that step is skipped), within
    `[min_step_size, max_step_size]` (see `scale_by_rprop`).

    Args:
        learning_rate: the initial step size of every element, > 0.
        eta_minus: the factor applied to a step size when its gradient changes sign, in (0, 1).
        eta_plus: the factor applied to a step size while its gradient keeps its sign, >= 1.
        min_step_size: the smallest step size, >= 0.
        max_step_size: the largest step size, >= `min_step_size`.
        state_dtype: the dtype of the step sizes and of the previous step (modopt's,
            keyword-only; see `scale_by_rprop`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.rprop(1e-3), model)

    References: Riedmiller & Braun, 1993, https://ieeexplore.ieee.org/document/298623;
    Igel & Hüsken, 2003, https://doi.org/10.1016/S0925-2312(01)00700-7
    """

    learning_rate: Scalar = hyperparameter(check=fields.FINITE_NONNEGATIVE)
    eta_minus: Scalar = hyperparameter(0.5, check=SHRINK_FACTOR)
    eta_plus: Scalar = hyperparameter(1.2, check=GROWTH_FACTOR)
    min_step_size: Scalar = hyperparameter(1e-6, check=NONNEGATIVE)
    max_step_size: Scalar = hyperparameter(50.0, check=NONNEGATIVE)
    state_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        rprop = ScaleByRprop(
            self.learning_rate,
            self.eta_minus,
            self.eta_plus,
            self.min_step_size,
            self.max_step_size,
            state_dtype=self.state_dtype,
        )
        return Chain(rprop, _negate())


class PolyakSgd(AbstractComposite):
    r"""SGD with Polyak's step size, from the loss `value` passed to each step.

    With `u = scaling * g`: `params -= u * min((value - f_min) / (||u||^2 + eps),
    max_learning_rate)`, the step being 0 where `||u||^2 + eps` vanishes. `variant="sps+"`
    clips the gap `value - f_min` at 0. With `scaling = 1` (the default) this is the SPS_max
    rule `min((f - f*) / ||g||^2, gamma_max)` of Loizou et al.; note that `scaling` enters the
    squared norm too, as in optax.

    Pass the loss: `optimizer.step(model, grads, value=loss)` or
    `update(grads, state, params, value=loss)`.

    Args:
        max_learning_rate: the largest step, >= 0.
        scaling: a number or a schedule, >= 0, multiplying the gradient first.
        f_min: a lower bound of the loss, finite (0 for models that interpolate the data).
        eps: added to the squared norm, >= 0.
        variant: `"sps"` or `"sps+"`.

    Example:
        >>> loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        >>> model, optimizer = optimizer.step(model, grads, value=loss)

    References: Loizou et al., 2021, https://arxiv.org/abs/2002.10542; Berrada et al., 2020,
    https://arxiv.org/abs/1906.05661; Garrigos et al., 2023, https://arxiv.org/abs/2307.14528
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = READS_VALUE

    max_learning_rate: Scalar = hyperparameter(1.0, check=NONNEGATIVE)
    scaling: ScalarOrSchedule = fields.learning_rate(1.0)
    f_min: Scalar = hyperparameter(0.0, check=FINITE)
    eps: Scalar = hyperparameter(0.0, check=NONNEGATIVE)
    variant: str = choice("sps", VARIANTS)

    def build(self):
        polyak = ScaleByPolyak(self.f_min, self.max_learning_rate, self.eps, self.variant)
        return Chain(Sgd(self.scaling), polyak)


class OptimisticGradientDescent(AbstractComposite):
    r"""Optimistic gradient descent: a step along the gradient extrapolated from the last one.

    `params -= learning_rate * ((alpha + beta) g_t - beta g_{t-1})` (with `g_0 = g_1`); the
    default `alpha = beta = 1` gives `2 g_t - g_{t-1}`. An approximation of extra-gradient
    methods with one gradient per step, it converges in the last iterate on min-max games
    where gradient descent cycles.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        alpha: the weight of the current gradient `g_t`, >= 0.
        beta: the weight of the extrapolation `g_t - g_{t-1}`, >= 0.
        mu_dtype: the dtype of the previous gradient kept in the state (modopt's,
            keyword-only; see `scale_by_optimistic_gradient`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.optimistic_gradient_descent(1e-2), model)

    Reference: Mokhtari et al., 2019, https://arxiv.org/abs/1901.08511
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    alpha: Scalar = optimism_coefficient()
    beta: Scalar = optimism_coefficient()
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        optimistic = ScaleByOptimisticGradient(self.alpha, self.beta, mu_dtype=self.mu_dtype)
        return Chain(optimistic, ScaleByLearningRate(self.learning_rate))


class OptimisticAdam(AbstractComposite):
    r"""Optimistic Adam: Adam's normalized step, extrapolated from the last one.

    With `r_t` the Adam direction `m_hat / (sqrt(v_hat + eps_root) + eps)` (Nesterov's by
    default): `params -= learning_rate * r_t + optimism * (r_t - r_{t-1})` (`r_0 = r_1`).
    `optimism=None` uses `learning_rate`, as in the paper. The learning rate is a number
    here; `optimistic_adam_v2` takes schedules.

    Deprecated, as in optax 0.2.8: construction emits a `DeprecationWarning` pointing to
    `optimistic_adam_v2`, which computes the same steps with a separate learning rate.

    Args:
        learning_rate: the step size of Adam's direction, a number >= 0 (not a schedule: use
            `optimistic_adam_v2` for one).
        optimism: the weight of the extrapolation `r_t - r_{t-1}`, >= 0; `None` uses
            `learning_rate`.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        mu_dtype: the dtype of the first moment and of the previous Adam direction (for instance
            `jnp.bfloat16` to save memory); `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.
        nesterov: use Nesterov's look-ahead first moment in the Adam direction (static; the default,
            as in optax).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.optimistic_adam(1e-3), generator)

    Reference: Daskalakis et al., 2018, "Training GANs with Optimism",
    https://arxiv.org/abs/1711.00141
    """

    learning_rate: Scalar = hyperparameter(check=fields.FINITE_NONNEGATIVE)
    optimism: Scalar | None = optimism_coefficient(None)
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    mu_dtype: DTypeLike | None = fields.dtype()
    nesterov: bool = static(default=True, kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        if callable(self.learning_rate):
            raise ValueError(
                "optimistic_adam takes a number as learning_rate (it is also the default optimism); "
                "for a schedule use optimistic_adam_v2(learning_rate=schedule, alpha=..., beta=...)."
            )
        warnings.warn(
            "`optimistic_adam` is deprecated (as in optax): use `optimistic_adam_v2` instead, "
            "`optimistic_adam_v2(1.0, alpha=learning_rate, beta=optimism)` takes the same steps.",
            DeprecationWarning,
            stacklevel=3,
        )

    def build(self):
        optimism = self.learning_rate if self.optimism is None else self.optimism
        return Chain(
            ScaleByAdam(
                self.b1, self.b2, self.eps, self.eps_root, self.mu_dtype, nu_dtype=self.nu_dtype, nesterov=self.nesterov
            ),
            ScaleByOptimisticGradient(self.learning_rate, optimism, mu_dtype=self.mu_dtype),
            _negate(),
        )


class OptimisticAdamV2(AbstractComposite):
    r"""Optimistic Adam with a separate learning rate (a number or a schedule).

    With `r_t` the Adam direction `m_hat / (sqrt(v_hat + eps_root) + eps)` (Nesterov's by
    default): `params -= learning_rate * ((alpha + beta) r_t - beta r_{t-1})` (`r_0 = r_1`).
    `optimistic_adam(lr, optimism)` is `optimistic_adam_v2(1.0, alpha=lr, beta=optimism)`.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        alpha: the weight of the current Adam direction `r_t`, >= 0.
        beta: the weight of the extrapolation `r_t - r_{t-1}`, >= 0.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        mu_dtype: the dtype of the first moment and of the previous Adam direction (for instance
            `jnp.bfloat16` to save memory); `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.
        nesterov: use Nesterov's look-ahead first moment in the Adam direction (static; the
            default).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.optimistic_adam_v2(1.0, alpha=1e-2), generator)

    Reference: Daskalakis et al., 2018, "Training GANs with Optimism",
    https://arxiv.org/abs/1711.00141
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    alpha: Scalar = optimism_coefficient(kw_only=True)
    beta: Scalar = optimism_coefficient(kw_only=True)
    b1: Scalar = fields.decay_rate(0.9, kw_only=True)
    b2: Scalar = fields.decay_rate(0.999, kw_only=True)
    eps: Scalar = fields.eps(1e-8, kw_only=True)
    eps_root: Scalar = fields.eps(0.0, kw_only=True)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nesterov: bool = static(default=True, kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return Chain(
            ScaleByAdam(
                self.b1, self.b2, self.eps, self.eps_root, self.mu_dtype, nu_dtype=self.nu_dtype, nesterov=self.nesterov
            ),
            ScaleByOptimisticGradient(self.alpha, self.beta, mu_dtype=self.mu_dtype),
            ScaleByLearningRate(self.learning_rate),
        )


class NoisySgd(AbstractComposite):
    r"""SGD on gradients with added Gaussian noise of decaying variance.

    `params -= learning_rate * (g + sqrt(eta / t^gamma) * n_t)`, with `n_t ~ N(0, I)` and
    `t` the step from 1 (see `add_noise`). `key` is a PRNG key or an integer seed; `seed`
    is the same under the seeds' name (give one; neither means seed 0).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        eta: the variance of the noise at the first step, >= 0.
        gamma: the decay exponent of the noise's variance `eta / t^gamma`, >= 0.
        key: a PRNG key (`jax.random.key(0)`), its raw data, or an integer seed.
        seed: the same as `key`, under the seeds' name; give one of the two (neither: seed 0).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.noisy_sgd(1e-2, key=jax.random.key(0)), model)

    Reference: Neelakantan et al., 2015, "Adding Gradient Noise Improves Learning for Very
    Deep Networks", https://arxiv.org/abs/1511.06807
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    eta: Scalar = noise_variance()
    gamma: Scalar = noise_decay()
    key: jax.Array = prng_key()

    def __init__(
        self, learning_rate: Any, eta: Scalar = 0.01, gamma: Scalar = 0.55, key: Any = None, *, seed: Any = None
    ):
        self.learning_rate = learning_rate
        self.eta = eta
        self.gamma = gamma
        self.key = key_or_seed(key, seed, "noisy_sgd")

    def build(self):
        return Chain(AddNoise(self.eta, self.gamma, self.key), ScaleByLearningRate(self.learning_rate))


sm3 = Sm3
rprop = Rprop
polyak_sgd = PolyakSgd
optimistic_gradient_descent = OptimisticGradientDescent
optimistic_adam = OptimisticAdam
optimistic_adam_v2 = OptimisticAdamV2
noisy_sgd = NoisySgd
