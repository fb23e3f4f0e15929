"""PSGD Kron as a named optimizer: `scale_by_kron`, weight decay on matrices, the learning rate."""

from __future__ import annotations

from typing import Any, ClassVar

import jax

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import POSITIVE, UNIT, choice, hyperparameter, prng_key, static
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import AddDecayedWeights, ScaleByLearningRate
from ..transforms._kron import MEMORY_SAVE_MODES, ScaleByKron, _probability
from ..transforms._newton_schulz import as_dimension_numbers
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn


def at_least_2d(params: Any) -> Any:
    """The weight-decay mask of PSGD Kron's reference: `True` for parameters of two or more axes."""
    return jax.tree_util.tree_map(lambda p: jax.numpy.ndim(p) >= 2, params)


class Kron(AbstractComposite):
    r"""PSGD Kron: momentum preconditioned by a Kronecker-factored `P = ⊗ Q_i^T Q_i` fitted to
    random probes, then decoupled weight decay and the learning rate.

    `params -= learning_rate * (clip_rms(P m_hat) + weight_decay * params)`; see `scale_by_kron`
    for the preconditioner, its update (with probability `preconditioner_update_probability`,
    a coin flipped with the state's PRNG key) and where it departs from the reference. As
    kron_torch, weight decay applies only to parameters of two or more axes by default.
    PSGD's updates have an RMS of about 1 (capped at 1.1), so its learning rates are Adam's
    order of magnitude or below (the reference's default is 3e-4).

    Layout: a matrix's two factors are alike, so `(in, out)` and `(out, in)` storage give the same
    update, transposed. `merge_dims` sees a parameter of higher rank as a matrix: by default
    `(prod(shape[:-1]), shape[-1])`, as the JAX reference does, right for Flax's `(*spatial, in,
    out)` convolution kernels (`(3, 3, 64, 128)` is `(576, 128)`). Where the model tells the
    layout, the kernel is its layer's matrix: `modopt.Optimizer(kron(...), model)` (and
    `NnxOptimizer`) read Equinox's `(out, in, *spatial)` convolution kernels off the layers,
    so `(128, 64, 3, 3)` is `(128, 576)` (the default rule would make it `(24576, 3)`, its long
    side diagonal). A transform used on its own (`tx.init(params)`) keeps the default rule;
    give it `weight_dimension_numbers=modopt.dimension_numbers(model, higher_rank=True)`.
    Explicit dimension numbers, and `merge_dims=False` (a factor per axis), are kept as given.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the momentum, in [0, 1).
        weight_decay: the coefficient of decoupled weight decay, a number or a schedule.
        preconditioner_update_probability: the probability of a preconditioner update at a step,
            in [0, 1], a number or a schedule; `None` is `precond_update_prob_schedule()`.
        max_size_triangular: axes longer than this get a diagonal factor (static).
        min_ndim_triangular: parameters (after merging) of fewer axes get diagonal factors only
            (static).
        memory_save_mode: `None`, `"smart_one_diag"`, `"one_diag"` or `"all_diag"`: which axes
            get diagonal factors (see `kron_layout`; static).
        momentum_into_precond_update: fit the preconditioner to the debiased momentum (`True`)
            or to the raw gradient (static).
        precond_lr: the normalized step size of the factors' updates, in [0, 1].
        precond_init_scale: the initial preconditioner is this times the identity, > 0.
        merge_dims: see parameters of three or more axes as matrices (static).
        mu_dtype: the dtype of the momentum; `None` keeps the parameters'.
        precond_dtype: the dtype of the factors and of their arithmetic; `None` is float32.
        weight_decay_mask: which parameters decay: by default those of two or more axes (the
            reference's rule); `None` for all, a pytree of bools or a function of the params.
        balance_prob: the probability that an update first balances the factors, in [0, 1].
        key: the PRNG key of the first step, its raw data, or an integer seed.
        weight_dimension_numbers: which axes of each kernel of rank above 2 form the two sides
            of its matrix (static), as in `scale_by_kron`; `None`: the default rule, or the
            model's layers under `modopt.Optimizer`.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.kron(3e-4, weight_decay=0.1), model)

    Reference: Li, 2015, https://arxiv.org/abs/1512.04202; Li, 2018,
    https://arxiv.org/abs/1809.10232; https://github.com/evanatyourservice/kron_torch
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(0.0003)
    b1: Scalar = fields.decay_rate(0.9)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    preconditioner_update_probability: ScalarOrSchedule = hyperparameter(
        None, check=UNIT, kind="number_or_schedule", converter=_probability
    )
    max_size_triangular: int = static(default=8192)
    min_ndim_triangular: int = static(default=2)
    memory_save_mode: str | None = choice(None, MEMORY_SAVE_MODES)
    momentum_into_precond_update: bool = static(default=True)
    precond_lr: Scalar = hyperparameter(0.1, check=UNIT)
    precond_init_scale: Scalar = hyperparameter(1.0, check=POSITIVE)
    merge_dims: bool = static(default=True)
    mu_dtype: DTypeLike | None = fields.dtype()
    precond_dtype: DTypeLike | None = fields.dtype(of="compute")
    weight_decay_mask: MaskOrFn = fields.mask(at_least_2d, kw_only=True)
    balance_prob: Scalar = hyperparameter(0.01, check=UNIT, kw_only=True)
    key: jax.Array = prng_key(0, kw_only=True)
    weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers, kw_only=True)
    # Set from the model by `modopt.Optimizer` where None, with the kernels of rank above 2.
    dimension_numbers_field: ClassVar[str] = "weight_dimension_numbers"
    dimension_numbers_higher_rank: ClassVar[bool] = True

    def build(self):
        return Chain(
            ScaleByKron(
                self.b1,
                self.preconditioner_update_probability,
                self.max_size_triangular,
                self.min_ndim_triangular,
                self.memory_save_mode,
                self.momentum_into_precond_update,
                self.precond_lr,
                self.precond_init_scale,
                self.merge_dims,
                self.mu_dtype,
                self.precond_dtype,
                balance_prob=self.balance_prob,
                key=self.key,
                weight_dimension_numbers=self.weight_dimension_numbers,
            ),
            AddDecayedWeights(self.weight_decay, self.weight_decay_mask),
            ScaleByLearningRate(self.learning_rate),
        )


kron = Kron
