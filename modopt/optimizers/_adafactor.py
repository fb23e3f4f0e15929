"""Adafactor: factored second moments for memory-efficient adaptive training."""

from __future__ import annotations

import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import NONNEGATIVE, POSITIVE, UNIT, hyperparameter, static
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import (
    AddDecayedWeights,
    ClipByBlockRms,
    Ema,
    Scale,
    ScaleByFactoredRms,
    ScaleByLearningRate,
    ScaleByParamBlockRms,
)
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn


class Adafactor(AbstractComposite):
    r"""Adafactor: updates scaled by a factored RMS estimate of past gradients.

    The chain is `scale_by_factored_rms`, then (each optional) `clip_by_block_rms
    (clipping_threshold)`, scaling by `learning_rate`, `scale_by_param_block_rms`
    (`multiply_by_parameter_scale`), an EMA with `momentum`, `add_decayed_weights
    (weight_decay_rate, weight_decay_mask)`, and finally a sign flip for descent.
    Its natural learning rate differs from Adam's.

    Args:
        learning_rate: a number >= 0, a schedule, or `None` to leave the updates unscaled (for a
            schedule applied elsewhere in a chain).
        min_dim_size_to_factor: factor the second moment of a parameter only if its two largest
            dimensions are at least this size; smaller parameters keep a full second moment
            (static).
        decay_rate: the exponent `c` of the second moment's decay rate `1 - (t - decay_offset +
            1)^(-c)`, in [0, 1]; the rate grows towards 1 with the step `t`.
        decay_offset: subtracted from the step count in that decay rate, >= 0 (for fine-tuning, the
            number of steps the model was pre-trained for).
        multiply_by_parameter_scale: scale each update by the root mean square of its parameter
            block, so that steps are relative to the parameters' size (static).
        clipping_threshold: clip each update block to this root mean square (`clip_by_block_rms`), >
            0, or `None` for no clipping.
        momentum: the decay of an EMA of the updates, in [0, 1], or `None` for none (Adafactor's
            memory saving relies on having none).
        dtype_momentum: the dtype of the momentum accumulator (optax's name for a `mu_dtype`).
        weight_decay_rate: the coefficient of decoupled weight decay, >= 0, or `None` for none.
        eps: added to the squared gradients before they are averaged, >= 0 (the paper's `epsilon1`).
        factored: factor the second moment of matrices into row and column statistics (static);
            `False` keeps a full second moment, like Adam's.
        weight_decay_mask: which parameters the weight decay applies to: `None` for all, a pytree of
            bools or a function of the params returning one.
        nu_dtype: the dtype of the second-moment statistics; `None` keeps the parameters' dtype
            (see `scale_by_factored_rms`).

    Reference: Shazeer & Stern, 2018, https://arxiv.org/abs/1804.04235
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(None)
    min_dim_size_to_factor: int = static(default=128)
    decay_rate: Scalar = hyperparameter(default=0.8, check=UNIT)
    decay_offset: Scalar = hyperparameter(default=0, check=NONNEGATIVE)
    multiply_by_parameter_scale: bool = static(default=True)
    clipping_threshold: Scalar | None = hyperparameter(default=1.0, check=POSITIVE, optional=True)
    momentum: Scalar | None = fields.decay_rate(None, check=UNIT)
    dtype_momentum: DTypeLike | None = fields.dtype(jnp.float32)
    weight_decay_rate: ScalarOrSchedule = fields.weight_decay(None)
    eps: Scalar = fields.eps(1e-30)
    factored: bool = static(default=True)
    weight_decay_mask: MaskOrFn = fields.mask()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        factored = (self.factored, self.decay_rate, self.decay_offset, self.min_dim_size_to_factor, self.eps)
        chain = [ScaleByFactoredRms(*factored, nu_dtype=self.nu_dtype)]
        if self.clipping_threshold is not None:
            chain.append(ClipByBlockRms(self.clipping_threshold))
        if self.learning_rate is not None:
            chain.append(ScaleByLearningRate(self.learning_rate, flip_sign=False))
        if self.multiply_by_parameter_scale:
            chain.append(ScaleByParamBlockRms())
        if self.momentum is not None:
            chain.append(Ema(self.momentum, debias=False, accumulator_dtype=self.dtype_momentum))
        if self.weight_decay_rate is not None:
            chain.append(AddDecayedWeights(self.weight_decay_rate, self.weight_decay_mask))
        chain.append(Scale(-1))
        return Chain(*chain)


adafactor = Adafactor
