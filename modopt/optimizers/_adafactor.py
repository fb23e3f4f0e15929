"""Adafactor: factored second moments for memory-efficient adaptive training."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .. import fields
from .._base import AbstractComposite
from .._fields import NONNEGATIVE, POSITIVE, UNIT, hyperparameter, static
from ..combinators import Chain
from ..transforms import (
    AddDecayedWeights,
    ClipByBlockRms,
    Ema,
    Scale,
    ScaleByFactoredRms,
    ScaleByLearningRate,
    ScaleByParamBlockRms,
)


class Adafactor(AbstractComposite):
    r"""Adafactor: updates scaled by a factored RMS estimate of past gradients.

    The chain is `scale_by_factored_rms`, then (each optional) `clip_by_block_rms
    (clipping_threshold)`, scaling by `learning_rate`, `scale_by_param_block_rms`
    (`multiply_by_parameter_scale`), an EMA with `momentum`, `add_decayed_weights
    (weight_decay_rate, weight_decay_mask)`, and finally a sign flip for descent.
    Its natural learning rate differs from Adam's.

    Reference: Shazeer & Stern, 2018, https://arxiv.org/abs/1804.04235
    """

    learning_rate: Any = fields.learning_rate(None)
    min_dim_size_to_factor: int = static(default=128)
    decay_rate: Any = hyperparameter(default=0.8, check=UNIT)
    decay_offset: Any = hyperparameter(default=0, check=NONNEGATIVE)
    multiply_by_parameter_scale: bool = static(default=True)
    clipping_threshold: Any = hyperparameter(default=1.0, check=POSITIVE, optional=True)
    momentum: Any = fields.decay_rate(None, check=UNIT)
    dtype_momentum: Any = fields.dtype(jnp.float32)
    weight_decay_rate: Any = fields.weight_decay(None)
    eps: Any = fields.eps(1e-30)
    factored: bool = static(default=True)
    weight_decay_mask: Any = fields.mask()

    def build(self):
        chain = [ScaleByFactoredRms(self.factored, self.decay_rate, self.decay_offset, self.min_dim_size_to_factor, self.eps)]
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
