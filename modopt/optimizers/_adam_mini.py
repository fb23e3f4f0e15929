"""Adam-mini as a named optimizer."""

from __future__ import annotations

from typing import Any

from .. import fields
from .._core.base import AbstractComposite
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms._adam_mini import ScaleByAdamMini
from ..transforms._scale import ScaleByLearningRate
from ..transforms._weight_decay import AddDecayedWeights
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn


class AdamMini(AbstractComposite):
    r"""Adam-mini: `params -= learning_rate * (u + weight_decay * params)`, with `u` Adam's update
    computed with one second moment per block of parameters (see `scale_by_adam_mini`).

    By default every parameter is one block; give `partition` to follow the paper's partition of a
    Transformer (embeddings and output per token, queries and keys per head, values, projections
    and MLPs per output neuron, norms per leaf; see `scale_by_adam_mini`). The reference code does
    not decay norms and biases: give `mask` for that (e.g. `modopt.weight_decay_mask`).

    Layout: the default (one block per parameter) does not depend on it. An integer rule names
    the axis stored by the model: a per-output-neuron block is axis 0 of an Equinox (and
    PyTorch) `(out, in)` weight and axis -1 of a Flax `(in, out)` kernel;
    `modopt.dimension_numbers(model)` tells each weight's `output_axis`.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the block second moments, in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        weight_decay: the coefficient of decoupled weight decay: `weight_decay * params` is added
            to the update before the learning rate scales it.
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, or a function of the params returning one.
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        partition: each parameter's block rule (static; see `scale_by_adam_mini`): `"leaf"`,
            `"element"`, an integer axis, or `AdamMiniHeads(num_heads, axis)`, as one rule for all,
            a pytree of rules shaped like the params, or a function of the params; `None`: `"leaf"`
            for every parameter.
        nu_dtype: the dtype of the block second moments; `None` keeps the parameters' dtype.

    Example:
        >>> tx = modopt.adam_mini(1e-3, partition={"embed": 0, "mlp": 0, "norm": "leaf"})
        >>> optimizer = modopt.Optimizer(tx, model)

    Reference: Zhang et al., 2024, "Adam-mini: Use Fewer Learning Rates To Gain More",
    https://arxiv.org/abs/2406.16793
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype()
    partition: Any = fields.mask(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return Chain(
            ScaleByAdamMini(self.b1, self.b2, self.eps, self.mu_dtype, self.partition, nu_dtype=self.nu_dtype),
            AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByLearningRate(self.learning_rate),
        )


adam_mini = AdamMini
