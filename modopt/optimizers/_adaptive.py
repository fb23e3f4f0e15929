"""Named adaptive optimizers: per-coordinate step sizes from running gradient statistics.

Each is a composite whose fields are its hyperparameters; `build()` chains the scaling
transform of `modopt.transforms`, decoupled weight decay where the optimizer has one, and
the learning rate. Adam, AdamW, NAdam and NAdamW live in `_adam.py`.
"""

from __future__ import annotations

from typing import Any

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform
from .._core.fields import NONNEGATIVE, POSITIVE, UNIT, choice, hyperparameter, static
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import (
    AddDecayedWeights,
    Identity,
    Scale,
    ScaleByAdadelta,
    ScaleByAdamax,
    ScaleByAdan,
    ScaleByAmsgrad,
    ScaleByBelief,
    ScaleByLearningRate,
    ScaleByLion,
    ScaleByNovograd,
    ScaleByRadam,
    ScaleByRms,
    ScaleByRss,
    ScaleByStddev,
    ScaleByYogi,
    Trace,
)
from .._core.fields import Scalar
from jax.typing import DTypeLike
from ..transforms._lion import MODES
from .._core.masks import MaskOrFn


def _descent(scaling: AbstractTransform, learning_rate: Any, weight_decay: Any = None, mask: Any = None):
    """`scaling`, then `weight_decay * params` added (unless `None`), then `-learning_rate` times."""
    decay = () if weight_decay is None else (AddDecayedWeights(weight_decay, mask),)
    return Chain(scaling, *decay, ScaleByLearningRate(learning_rate))


class AdaBelief(AbstractComposite):
    r"""AdaBelief: Adam whose denominator tracks the gradient's deviation from its EMA.

    `params -= learning_rate * m_hat / (sqrt(s_hat) + eps)`, with `m` the EMA of gradients
    and `s` the EMA of `|g - m|^2 + eps_root`, both bias-corrected (see `scale_by_belief`).
    Steps are large where gradients agree with their prediction, small where they don't.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of `s`, the EMA of the squared deviation `|g - m|^2`, in [0, 1).
        eps: added to `sqrt(s_hat)` in the denominator, >= 0.
        eps_root: added to `s` at every step (inside the square root), >= 0.
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of `s`; `None` keeps the parameters' dtype.
        nesterov: use Nesterov's look-ahead first moment (NAdam) instead of the bias-corrected one
            (static).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.adabelief(1e-3), model)

    Reference: Zhuang et al., 2020, https://arxiv.org/abs/2010.07468
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-16)
    eps_root: Scalar = fields.eps(1e-16)
    nesterov: bool = static(default=False, kw_only=True)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        belief = ScaleByBelief(self.b1, self.b2, self.eps, self.eps_root, nesterov=self.nesterov, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype)
        return _descent(belief, self.learning_rate)


class Adadelta(AbstractComposite):
    r"""Adadelta: steps scaled by the ratio of past update RMS to past gradient RMS, no learning rate needed.

    `g' = g + weight_decay * params`, `E[g^2] = rho E[g^2] + (1 - rho) g'^2`,
    `dx = sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps) g'`, `E[dx^2] = rho E[dx^2] + (1 - rho) dx^2`,
    `params -= learning_rate * dx`. `learning_rate=None` (the default) steps by `dx` itself.
    Unlike optax 0.2.8, whose `adadelta(learning_rate=None)` leaves the sign of the update
    unflipped (and so ascends), modopt always descends: `None` acts as a learning rate of 1.

    Args:
        learning_rate: a number >= 0 or a schedule scaling `dx`; `None` (the default) steps by `dx`
            itself.
        rho: the decay rate of both running averages, `E[g^2]` and `E[dx^2]`, in [0, 1).
        eps: added inside both square roots, >= 0; it also sets the size of the first steps.
        weight_decay: the coefficient of the L2 penalty added to the gradient before the averages
            (`g' = g + weight_decay * params`), >= 0.
        weight_decay_mask: which parameters the weight decay applies to: `None` for all, a pytree of
            bools or a function of the params returning one.
        nu_dtype: the dtype of both running averages; `None` keeps the parameters' dtype.

    Reference: Zeiler, 2012, https://arxiv.org/abs/1212.5701
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(None)
    rho: Scalar = fields.decay_rate(0.9)
    eps: Scalar = fields.eps(1e-6)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    weight_decay_mask: MaskOrFn = fields.mask()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        descend = Scale(-1.0) if self.learning_rate is None else ScaleByLearningRate(self.learning_rate)
        decay = AddDecayedWeights(self.weight_decay, self.weight_decay_mask)
        return Chain(decay, ScaleByAdadelta(self.rho, self.eps, nu_dtype=self.nu_dtype), descend)


class Adagrad(AbstractComposite):
    r"""Adagrad: steps scaled by the root of the sum of all past squared gradients.

    `s = s + g^2` (from `initial_accumulator_value`), `params -= learning_rate * g / sqrt(s + eps)`.
    Rarely updated coordinates keep large steps; the step size only ever decreases.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        initial_accumulator_value: the starting value of the sum of squared gradients `s`, >= 0.
        eps: added to `s` inside the square root, >= 0.
        nu_dtype: the dtype of the sum of squared gradients `s`; `None` keeps the parameters' dtype.

    Reference: Duchi et al., 2011, https://jmlr.org/papers/v12/duchi11a.html
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    initial_accumulator_value: Scalar = fields.eps(0.1)
    eps: Scalar = fields.eps(1e-7)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return _descent(ScaleByRss(self.initial_accumulator_value, self.eps, nu_dtype=self.nu_dtype), self.learning_rate)


class Adamax(AbstractComposite):
    r"""Adamax: Adam with the infinity norm in place of the second moment.

    `m = b1 m + (1 - b1) g`, `u = max(|g| + eps, b2 u)`, `params -= learning_rate * m / ((1 - b1^t) u)`.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the infinity norm `u = max(|g| + eps, b2 u)`, in [0, 1).
        eps: added to `|g|` in the running maximum, >= 0, so that `u` is never zero.
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the infinity norm `u`; `None` keeps the parameters' dtype.

    Reference: Kingma & Ba, 2014 (Section 7.1), https://arxiv.org/abs/1412.6980
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return _descent(ScaleByAdamax(self.b1, self.b2, self.eps, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype), self.learning_rate)


class AdamaxW(AbstractComposite):
    r"""AdamaxW: Adamax with decoupled weight decay.

    `params -= learning_rate * (m / ((1 - b1^t) u) + weight_decay * params)`, with `m`, `u`
    as in `adamax`; `mask` restricts the decay to some parameters.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the infinity norm `u = max(|g| + eps, b2 u)`, in [0, 1).
        eps: added to `|g|` in the running maximum, >= 0, so that `u` is never zero.
        weight_decay: the coefficient of decoupled weight decay: `weight_decay * params` is added to
            the update before the learning rate scales it, >= 0.
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, a function of the params returning one (such as `modopt.weight_decay_mask`).
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the infinity norm `u`; `None` keeps the parameters' dtype.

    References: Kingma & Ba, 2014, https://arxiv.org/abs/1412.6980;
    Loshchilov & Hutter, 2019, https://arxiv.org/abs/1711.05101
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(1e-4)
    mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        adamax = ScaleByAdamax(self.b1, self.b2, self.eps, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype)
        return _descent(adamax, self.learning_rate, self.weight_decay, self.mask)


class Amsgrad(AbstractComposite):
    r"""AMSGrad: Adam dividing by the running maximum of the second moment.

    `v_max = max(v_max, v_hat)`, `params -= learning_rate * m_hat / (sqrt(v_max + eps_root) + eps)`
    with Adam's moments (see `scale_by_amsgrad` for the bias-correction switches).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment and of its running maximum; `None` keeps the
            parameters' dtype.
        bias_correction_mu: bias-correct the first moment as Adam does (static); `False` uses `m` as
            in the paper.
        bias_correction_nu: bias-correct the second moment before its running maximum (static);
            `False` uses `v` as in the paper.

    Reference: Reddi et al., 2018, https://openreview.net/forum?id=ryQu7f-RZ
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    mu_dtype: DTypeLike | None = fields.dtype()
    bias_correction_mu: bool = static(default=True)
    bias_correction_nu: bool = static(default=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        amsgrad = ScaleByAmsgrad(
            self.b1,
            self.b2,
            self.eps,
            self.eps_root,
            self.mu_dtype,
            self.bias_correction_mu,
            self.bias_correction_nu,
            nu_dtype=self.nu_dtype,
        )
        return _descent(amsgrad, self.learning_rate)


class Adan(AbstractComposite):
    r"""Adan: adaptive Nesterov momentum estimated from gradients and their differences.

    `params -= learning_rate * ((m_hat + (1 - b2) v_hat) / (sqrt(n_hat + eps_root) + eps)
    + weight_decay * params)`, with `m`, `v`, `n` the EMAs of gradients, gradient differences
    and `|g + (1 - b2)(g - g_prev)|^2` (see `scale_by_adan`).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of `m`, the EMA of gradients, in [0, 1).
        b2: the decay rate of `v`, the EMA of gradient differences `g - g_prev`, in [0, 1).
        b3: the decay rate of `n`, the EMA of `|g + (1 - b2)(g - g_prev)|^2`, in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to `n` inside the square root, >= 0.
        weight_decay: the coefficient of decoupled weight decay: `weight_decay * params` is added to
            the update before the learning rate scales it, >= 0.
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, a function of the params returning one (such as `modopt.weight_decay_mask`).
        mu_dtype: the dtype of the first-order state (`m`, `v` and the previous gradient); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of `n`; `None` keeps the parameters' dtype.

    Reference: Xie et al., 2022, https://arxiv.org/abs/2208.06677
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.98)
    b2: Scalar = fields.decay_rate(0.92)
    b3: Scalar = fields.decay_rate(0.99)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        adan = ScaleByAdan(self.b1, self.b2, self.b3, self.eps, self.eps_root, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype)
        return _descent(adan, self.learning_rate, self.weight_decay, self.mask)


class Lion(AbstractComposite):
    r"""Lion: steps of equal size per coordinate, the sign of an interpolated momentum.

    `params -= learning_rate * (sign((1 - b1) g + b1 m) + weight_decay * params)`, then
    `m = b2 m + (1 - b2) g`. `mode` and `smooth_beta` choose the sign function (see
    `scale_by_lion`); optax's `lion` has only the hard sign.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the interpolation between momentum and gradient inside the sign, `(1 - b1) g + b1 m`, in
            [0, 1].
        b2: the decay rate of the momentum `m`, in [0, 1).
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        weight_decay: the coefficient of decoupled weight decay, >= 0 (Lion's steps have unit size
            per coordinate, so it is usually larger than AdamW's).
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, a function of the params returning one (such as `modopt.weight_decay_mask`).
        mode: the sign function (static): `"hard"` is `sign(c)` (the paper's and optax's),
            `"smooth"` is `tanh(smooth_beta c)`, `"refined"` is `c` where `|c| < 1` and `sign(c)`
            elsewhere.
        smooth_beta: the sharpness of the smooth sign function, > 0 (used only with
            `mode="smooth"`).

    Reference: Chen et al., 2023, https://arxiv.org/abs/2302.06675
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9, check=UNIT)
    b2: Scalar = fields.decay_rate(0.99)
    mu_dtype: DTypeLike | None = fields.dtype()
    weight_decay: ScalarOrSchedule = fields.weight_decay(1e-3)
    mask: MaskOrFn = fields.mask()
    mode: str = choice("hard", MODES, kw_only=True)
    smooth_beta: Scalar = hyperparameter(1.0, check=POSITIVE, kw_only=True)

    def build(self):
        lion = ScaleByLion(self.b1, self.b2, self.mu_dtype, mode=self.mode, smooth_beta=self.smooth_beta)
        return _descent(lion, self.learning_rate, self.weight_decay, self.mask)


class Novograd(AbstractComposite):
    r"""NovoGrad: momentum over gradients normalized by a per-layer second moment.

    Per parameter leaf: `v = b2 v + (1 - b2) ||g||^2` (`||g||^2` at the first step),
    `m = b1 m + g / (sqrt(v + eps_root) + eps) + weight_decay * params`, `params -= learning_rate * m`.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the momentum `m`, in [0, 1).
        b2: the decay rate of the per-layer second moment `v` of gradient norms, in [0, 1).
        eps: added to `sqrt(v)` in the normalization, >= 0.
        eps_root: added to `v` inside the square root, >= 0.
        weight_decay: the coefficient of weight decay added to the normalized gradient inside the
            momentum, >= 0.
        mu_dtype: the dtype of the momentum; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the per-layer second moments; `None` keeps the parameters' dtype.

    Reference: Ginsburg et al., 2019, https://arxiv.org/abs/1905.11286
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.25)
    eps: Scalar = fields.eps(1e-6)
    eps_root: Scalar = fields.eps(0.0)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        novograd = ScaleByNovograd(self.b1, self.b2, self.eps, self.eps_root, self.weight_decay, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype)
        return _descent(novograd, self.learning_rate)


class Radam(AbstractComposite):
    r"""RAdam: Adam whose adaptive step is switched on, and rectified, once its variance is tractable.

    `params -= learning_rate * r_t m_hat / (sqrt(v_hat + eps_root) + eps)` once the SMA length
    `rho_t` reaches `threshold`, and `params -= learning_rate * m_hat` before (see
    `scale_by_radam` for `rho_t` and `r_t`).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        threshold: the length `rho_t` of the approximated simple moving average from which the
            adaptive, rectified step is used, >= 0 (the paper uses 4 or 5).
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.
        nesterov: use Nesterov's look-ahead first moment (NAdam) instead of the bias-corrected one
            (static).

    Reference: Liu et al., 2020, https://arxiv.org/abs/1908.03265
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    threshold: Scalar = hyperparameter(5.0, check=NONNEGATIVE)
    nesterov: bool = static(default=False, kw_only=True)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        radam = ScaleByRadam(
            self.b1, self.b2, self.eps, self.eps_root, self.threshold, nesterov=self.nesterov, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype
        )
        return _descent(radam, self.learning_rate)


class Rmsprop(AbstractComposite):
    r"""RMSprop: steps scaled by the root of a moving average of squared gradients.

    `v = decay v + (1 - decay) g^2`, `params -= learning_rate * g / sqrt(v + eps)`. With
    `centered=True` the moving variance `v - m^2` replaces `v` (`m` the moving average of
    gradients); with `momentum` the scaled step goes through a momentum trace (Nesterov's
    with `nesterov=True`). See `scale_by_rms` for `initial_scale`, `eps_in_sqrt` and
    `bias_correction`.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        decay: the decay rate of the moving average of squared gradients, in [0, 1).
        eps: added to the moving average inside the square root (`eps_in_sqrt=True`) or to the root,
            >= 0.
        initial_scale: the starting value of the moving average of squared gradients, >= 0 (PyTorch
            and Keras start at 0, TensorFlow 1 at 1).
        eps_in_sqrt: add `eps` inside the square root, `sqrt(v + eps)`, rather than outside,
            `sqrt(v) + eps` (static).
        centered: divide by the root of the moving variance `v - m^2` instead of `v` (static).
        momentum: the decay of the momentum trace `t = g + momentum * t`, in [0, 1], or `None` for
            no momentum. It follows the scaling.
        nesterov: use Nesterov's momentum `g + momentum * t` in place of `t` (static).
        bias_correction: bias-correct the moving averages, as Adam does (static).
        mu_dtype: the dtype of the first-order state: the moving average of gradients
            (`centered=True`) and the momentum trace; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the moving average of squared gradients; `None` keeps the
            parameters' dtype.

    Reference: Hinton, 2012, http://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    decay: Scalar = fields.decay_rate(0.9)
    eps: Scalar = fields.eps(1e-8)
    initial_scale: Scalar = fields.eps(0.0)
    eps_in_sqrt: bool = static(default=True)
    centered: bool = static(default=False)
    momentum: Scalar | None = fields.momentum(None)
    nesterov: bool = static(default=False)
    bias_correction: bool = static(default=False)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        momentum = Identity() if self.momentum is None else Trace(self.momentum, self.nesterov, self.mu_dtype)
        arguments = (self.decay, self.eps, self.initial_scale, self.eps_in_sqrt, self.bias_correction)
        if self.centered:
            rescale = ScaleByStddev(*arguments, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype)
        else:
            rescale = ScaleByRms(*arguments, nu_dtype=self.nu_dtype)
        return Chain(
            rescale,
            ScaleByLearningRate(self.learning_rate),
            momentum,
        )


class Yogi(AbstractComposite):
    r"""Yogi: Adam with an additive second moment that cannot grow the step size abruptly.

    `v = v - (1 - b2) sign(v - g^2) g^2`, `params -= learning_rate * m_hat / (sqrt(v_hat) + eps)`
    with Adam's first moment (see `scale_by_yogi`).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the rate of Yogi's additive second-moment update `v - (1 - b2) sign(v - g^2) g^2`, in
            [0, 1).
        eps: added to `sqrt(v_hat)` in the denominator, >= 0 (larger than Adam's by default).
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.

    Reference: Zaheer et al., 2018,
    https://papers.nips.cc/paper/2018/hash/90365351ccc7437a1309dc64e4db32a3-Abstract.html
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-3)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return _descent(ScaleByYogi(self.b1, self.b2, self.eps, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype), self.learning_rate)


adabelief = AdaBelief
adadelta = Adadelta
adagrad = Adagrad
adamax = Adamax
adamaxw = AdamaxW
amsgrad = Amsgrad
adan = Adan
lion = Lion
novograd = Novograd
radam = Radam
rmsprop = Rmsprop
yogi = Yogi
