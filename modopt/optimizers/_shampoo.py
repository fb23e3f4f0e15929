"""Shampoo with grafting (distributed Shampoo) as a named optimizer."""

from __future__ import annotations

from typing import Any, ClassVar

import jax

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import (
    FINITE,
    NONNEGATIVE,
    NONNEGATIVE_INTEGER,
    POSITIVE,
    POSITIVE_INTEGER,
    UNIT,
    choice,
    hyperparameter,
    static,
)
from .._core.fields import Scalar
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import ScaleByLearningRate
from ..transforms._newton_schulz import as_dimension_numbers
from ..transforms._shampoo import GRAFT_TYPES, ScaleByShampoo, as_graft_type, check_static_ints
from jax.typing import DTypeLike


class Shampoo(AbstractComposite):
    r"""Shampoo with grafting: `params -= learning_rate * scale_by_shampoo(g)`.

    Blocked Kronecker-factored preconditioners `P_j = (L_j + eps I)^(-1/2k)` per block and
    dimension, the update's norm per parameter grafted from a first-order method (`graft_type`),
    momentum (Nesterov by default) and coupled weight decay; see `scale_by_shampoo` for the update
    rule, the sharding rule of the state and the departures from the reference. Arguments and
    defaults are those of `precondition.distributed_shampoo.distributed_shampoo` (the first
    fourteen in its order), except that `block_size` defaults to 128, the reference's advice.

    Layout: a matrix is preconditioned on both sides, so `(in, out)` and `(out, in)` storage give
    the same update, transposed. A kernel of higher rank is merged in its stored axis order by
    default (`best_effort_shape_interpretation`: neighbouring dimensions while their product stays
    within `merge_small_dims_block_size`), the reference's rule, written for Flax's layout: its
    `(*spatial, in, out)` convolution kernel `(3, 3, 16, 32)` becomes the matrix `(144, 32)`.
    In Equinox's `(out, in, *spatial)` order the same rule would make `(32, 16, 3, 3)` the
    matrix `(1536, 3)`; where the model tells the layout, the kernel is its layer's matrix
    instead: `modopt.Optimizer(shampoo(...), model)` (and `NnxOptimizer`) read Equinox's
    convolution kernels off the layers, so `(32, 16, 3, 3)` is `(32, 144)`, then treated as
    any matrix of that shape (blocked; merged into a vector if within
    `merge_small_dims_block_size`). A transform used on its own (`tx.init(params)`) keeps the
    stored-order merge; give it `weight_dimension_numbers=modopt.dimension_numbers(model,
    higher_rank=True)`. Explicit dimension numbers are kept as given (see the docs page
    "Weight layouts").

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        block_size: the largest block along any dimension (static); `<= 0`: no blocks.
        beta1: the momentum, in [0, 1].
        beta2: the decay of the statistics (and of RMSProp grafting's squares), in [0, 1]; 1 sums.
        diagonal_epsilon: added to the square root in Adagrad/RMSProp grafting, >= 0.
        matrix_epsilon: the initial statistics' scale and the damping of the inverse roots, >= 0.
        weight_decay: the coefficient of (coupled) weight decay, added before the momentum.
        start_preconditioning_step: the first step (from 0) that uses Shampoo's update, an
            integer >= 0; the grafting update before.
        preconditioning_compute_steps: recompute the inverse roots at the steps divisible by this,
            an integer >= 1.
        statistics_compute_steps: update the statistics at the steps divisible by this, an
            integer >= 1.
        best_effort_shape_interpretation: merge neighbouring small dimensions before blocking
            (static).
        graft_type: "sgd", "adagrad", "rmsprop", "rmsprop_normalized", "adagrad_normalized",
            "sqrt_n" or "none" (static); the reference's `GraftingType` numbers are accepted.
        nesterov: Nesterov momentum (static).
        exponent_override: the root `p` of every preconditioner (static); 0 for twice the number
            of dimensions.
        inverse_failure_threshold: a new inverse root is used only if its error is below this.
        moving_average_for_momentum: weigh the new update by `1 - beta1` in the momenta (static).
        skip_preconditioning_dim_size_gt: parameters with a larger dimension are not
            preconditioned (static).
        clip_by_scaled_gradient_norm: with RMSProp grafting, the largest RMS of the grafting
            update (> 0); `None`: no clipping.
        precision: the XLA precision of the inverse roots' products (static).
        relative_matrix_epsilon: scale the damping by the statistic's largest eigenvalue (static).
        merge_small_dims_block_size: the largest product of merged dimensions (static).
        skip_preconditioning_rank_lt: parameters of fewer dimensions are not preconditioned
            (static).
        mu_dtype: the dtype of both momenta (Shampoo's and the grafting update's); `None` keeps
            the parameters' dtype.
        nu_dtype: the dtype of the grafting optimizer's sums of squares; `None` keeps the
            parameters' dtype. (The statistics and preconditioners are float32.)
        weight_dimension_numbers: which axes of each kernel of rank above 2 form the two sides
            of its matrix (static), as in `scale_by_shampoo`; `None`: the stored-order merge, or
            the model's layers under `modopt.Optimizer`.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.shampoo(1e-3, block_size=128, graft_type="rmsprop"), model)

    Reference: Anil et al., 2020, Scalable Second Order Optimization for Deep Learning,
    https://arxiv.org/abs/2002.09018
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    block_size: int = static(128)
    beta1: Scalar = fields.decay_rate(0.9, check=UNIT)
    beta2: Scalar = fields.decay_rate(0.999, check=UNIT)
    diagonal_epsilon: Scalar = fields.eps(1e-10)
    matrix_epsilon: Scalar = fields.eps(1e-6)
    weight_decay: Scalar = hyperparameter(0.0, check=FINITE)
    start_preconditioning_step: Scalar = hyperparameter(5, check=NONNEGATIVE_INTEGER)
    preconditioning_compute_steps: Scalar = hyperparameter(1, check=POSITIVE_INTEGER)
    statistics_compute_steps: Scalar = hyperparameter(1, check=POSITIVE_INTEGER)
    best_effort_shape_interpretation: bool = static(True)
    graft_type: str = choice("sgd", GRAFT_TYPES, converter=as_graft_type)
    nesterov: bool = static(True)
    exponent_override: int = static(0)
    inverse_failure_threshold: Scalar = hyperparameter(0.1, check=NONNEGATIVE, kw_only=True)
    moving_average_for_momentum: bool = static(False, kw_only=True)
    skip_preconditioning_dim_size_gt: int = static(4096, kw_only=True)
    clip_by_scaled_gradient_norm: Scalar | None = hyperparameter(None, check=POSITIVE, kw_only=True)
    precision: Any = static(jax.lax.Precision.HIGHEST, kw_only=True)
    relative_matrix_epsilon: bool = static(True, kw_only=True)
    merge_small_dims_block_size: int = static(4096, kw_only=True)
    skip_preconditioning_rank_lt: int = static(1, kw_only=True)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers, kw_only=True)
    # Set from the model by `modopt.Optimizer` where None, with the kernels of rank above 2.
    dimension_numbers_field: ClassVar[str] = "weight_dimension_numbers"
    dimension_numbers_higher_rank: ClassVar[bool] = True

    def __check_init__(self):
        check_static_ints(self)

    def build(self):
        shampoo = ScaleByShampoo(
            self.block_size,
            self.beta1,
            self.beta2,
            self.diagonal_epsilon,
            self.matrix_epsilon,
            self.weight_decay,
            self.start_preconditioning_step,
            self.preconditioning_compute_steps,
            self.statistics_compute_steps,
            self.best_effort_shape_interpretation,
            self.graft_type,
            self.nesterov,
            self.exponent_override,
            inverse_failure_threshold=self.inverse_failure_threshold,
            moving_average_for_momentum=self.moving_average_for_momentum,
            skip_preconditioning_dim_size_gt=self.skip_preconditioning_dim_size_gt,
            clip_by_scaled_gradient_norm=self.clip_by_scaled_gradient_norm,
            precision=self.precision,
            relative_matrix_epsilon=self.relative_matrix_epsilon,
            merge_small_dims_block_size=self.merge_small_dims_block_size,
            skip_preconditioning_rank_lt=self.skip_preconditioning_rank_lt,
            mu_dtype=self.mu_dtype,
            nu_dtype=self.nu_dtype,
            weight_dimension_numbers=self.weight_dimension_numbers,
        )
        return Chain(shampoo, ScaleByLearningRate(self.learning_rate))


shampoo = Shampoo
