"""MARS (MARS-AdamW) as a named optimizer: MARS on the matrices, AdamW on the other parameters."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import POSITIVE, hyperparameter, static
from ..combinators import Chain, Partition
from ..schedules._base import ScalarOrSchedule
from ..transforms._mars import ScaleByMars
from ..transforms._scale import ScaleByLearningRate
from ..transforms._weight_decay import AddDecayedWeights
from ._adam import AdamW
from .._core.fields import Scalar
from jax.typing import DTypeLike


@dataclasses.dataclass(frozen=True)
class MarsLabels:
    """`mars`'s labels of the parameters: "mars" for the matrices (rank 2), "adam" for the others."""

    def __call__(self, params: Any) -> Any:
        flat, treedef = jax.tree_util.tree_flatten(params)
        return treedef.unflatten(["mars" if len(x.shape) == 2 else "adam" for x in flat])


class Mars(AbstractComposite):
    r"""MARS-AdamW: AdamW on variance-reduced gradients for the matrices, AdamW for the rest.

    For each matrix (rank 2; every parameter with `optimize_1d=True`):
    `params -= learning_rate * (u + weight_decay * params)` with `u` the update of
    `scale_by_mars` (Adam's moments of `c = g_t + gamma * b1 / (1 - b1) * (g_t - g_{t-1})`, `c`
    clipped to norm `max_norm` per parameter). The other parameters (vectors, scalars, and
    tensors of rank 3 or more) get AdamW with `adam_learning_rate`, `adam_b1`, `adam_b2`, `eps`
    and `adam_weight_decay`, as the paper's code does. The defaults are the paper's code's
    (`lr=3e-3` there, for GPT-2 small).

    Checked against `pytorch_optimizer.MARS(mars_type="adamw")` (4.1.0) in
    `tests/test_beyond_adam.py`. pytorch_optimizer's names: `lr_1d` is `adam_learning_rate`,
    `betas_1d` is `(adam_b1, adam_b2)`, `weight_decay_1d` is `adam_weight_decay`. Departure:
    pytorch_optimizer gives MARS every parameter of rank >= 2; the paper's code (followed here)
    only those of rank 2.

    Args:
        learning_rate: the step size of the MARS part: a number >= 0 or a schedule of the step
            count.
        b1: the decay rate of MARS's first moment, in [0, 1); it also sets the correction's
            weight `gamma * b1 / (1 - b1)`.
        b2: the decay rate of MARS's second moment, in [0, 1).
        gamma: the strength of the variance-reduction correction, >= 0.
        eps: added to the denominator's square root (MARS's and AdamW's), >= 0.
        weight_decay: the decoupled weight decay of the MARS part (multiplied by the learning
            rate).
        max_norm: the largest norm of each matrix's corrected gradient, > 0; `None` for no
            clipping.
        mu_dtype: the dtype of the first moments and of the previous gradient (for instance
            `jnp.bfloat16` to save memory); `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moments (MARS's and AdamW's); `None` keeps the
            parameters' dtype.
        optimize_1d: apply MARS to every parameter, not only the matrices (static).
        adam_learning_rate: AdamW's learning rate (a number or a schedule); `None` uses
            `learning_rate`.
        adam_b1: the decay rate of AdamW's first moment, in [0, 1).
        adam_b2: the decay rate of AdamW's second moment, in [0, 1).
        adam_weight_decay: AdamW's decoupled weight decay (multiplied by its learning rate).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.mars(3e-3), model)

    Reference: Yuan et al., 2024, "MARS: Unleashing the Power of Variance Reduction for Training
    Large Models", https://arxiv.org/abs/2411.10438
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.95)
    b2: Scalar = fields.decay_rate(0.99)
    gamma: Scalar = hyperparameter(0.025, check=fields.NONNEGATIVE)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    max_norm: Scalar | None = hyperparameter(1.0, check=POSITIVE, optional=True)
    mu_dtype: DTypeLike | None = fields.dtype()
    optimize_1d: bool = static(default=False, kw_only=True)
    adam_learning_rate: ScalarOrSchedule = fields.learning_rate(None, kw_only=True)
    adam_b1: Scalar = fields.decay_rate(0.9, kw_only=True)
    adam_b2: Scalar = fields.decay_rate(0.95, kw_only=True)
    adam_weight_decay: ScalarOrSchedule = fields.weight_decay(0.1, kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        mars_part = Chain(
            ScaleByMars(self.b1, self.b2, self.gamma, self.eps, self.max_norm, self.mu_dtype, nu_dtype=self.nu_dtype),
            AddDecayedWeights(self.weight_decay),
            ScaleByLearningRate(self.learning_rate),
        )
        if self.optimize_1d:
            return mars_part
        adam_learning_rate = self.learning_rate if self.adam_learning_rate is None else self.adam_learning_rate
        adam_part = AdamW(
            adam_learning_rate,
            self.adam_b1,
            self.adam_b2,
            self.eps,
            0.0,
            self.mu_dtype,
            self.adam_weight_decay,
            nu_dtype=self.nu_dtype,
        )
        return Partition({"mars": mars_part, "adam": adam_part}, MarsLabels())


mars = Mars
