"""SOAP: Adam in Shampoo's eigenbasis, with decoupled weight decay."""

from __future__ import annotations

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import POSITIVE_INTEGER, choice, hyperparameter, static
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import AddDecayedWeights, ScaleByLearningRate
from ..transforms._soap import DATA_FORMATS, ScaleBySoap
from .._core.fields import Scalar
from .._core.masks import MaskOrFn
from jax.typing import DTypeLike


class Soap(AbstractComposite):
    r"""SOAP: Adam run in the eigenbasis of Shampoo's preconditioner, with decoupled weight decay:
    `params -= learning_rate * (soap_update + weight_decay * params)`.

    `soap_update` is `scale_by_soap`'s: for a matrix, `Q_L (m / (sqrt(v) + eps)) Q_R^T` times
    Adam's bias correction `sqrt(1 - b2^t) / (1 - b1^t)`, with `m`, `v` Adam's moments of the
    rotated gradient `Q_L^T G Q_R` and `Q_L`, `Q_R` eigenbases of Shampoo's statistics
    `EMA(G G^T)`, `EMA(G^T G)`, refreshed every `precondition_frequency` steps by one power
    iteration and a QR decomposition. The first step only gathers statistics (its
    `soap_update` is zero). `mask` restricts the decay to some parameters (see
    `add_decayed_weights`).

    The defaults are the paper's and the authors' reference's (which gives `lr=3e-3`).
    Departures from the reference (`pytorch_optimizer.SOAP` and the authors' code, which decay
    the parameters after the step, and not at the first step): the decay here is AdamW's,
    `weight_decay * params` at the start of the step added to the update, also at the first
    step; per step the two differ by `learning_rate * weight_decay` times the step, `O(lr^2)`.

    Layout: without `merge_dims` (the default) every axis of a parameter has its own rotation,
    so the axis order does not matter: Equinox's and Flax's layouts give the same update,
    transposed. `merge_dims` merges neighbouring axes in stored order, as the reference does for
    PyTorch's `(out, in, kh, kw)` convolution kernels (Equinox's layout);
    `data_format="channels_last"` reads a 4-D kernel as `(out, kh, kw, in)`. Flax's `(kh, kw,
    in, out)` kernels are merged in their own order.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of Adam's first moment, in [0, 1).
        b2: the decay rate of Adam's second moment, in [0, 1).
        shampoo_beta: the decay rate of Shampoo's statistics, in [0, 1); `None` uses `b2`.
        eps: added to `sqrt(v)` in the denominator, >= 0.
        weight_decay: the strength of the decoupled weight decay, or a schedule.
        precondition_frequency: refresh the eigenbases every this many steps, an integer >= 1.
        max_precondition_dim: dimensions larger than this stay in the parameter's basis (static).
        merge_dims: merge consecutive small dimensions while their product stays within
            `max_precondition_dim` (static).
        precondition_1d: also precondition vectors (static).
        normalize_grads: divide each parameter's update by its root mean square (static).
        data_format: `"channels_first"` or `"channels_last"`, the layout of 4-D tensors merged by
            `merge_dims` (static).
        correct_bias: apply Adam's bias correction (static).
        mask: where to apply weight decay: a tree of booleans like the params, or a function of
            the params returning one; `None` decays every parameter.
        mu_dtype: the dtype of Adam's first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of Adam's second moment; `None` keeps the parameters' dtype.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.soap(3e-3), model)

    Checked against `pytorch_optimizer.SOAP` 4.1.0 (tests/test_soap.py); see `scale_by_soap`
    for where it follows the authors' reference instead.

    Reference: Vyas et al., 2024, "SOAP: Improving and Stabilizing Shampoo using Adam",
    https://arxiv.org/abs/2409.11321
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.95)
    b2: Scalar = fields.decay_rate(0.95)
    shampoo_beta: Scalar | None = fields.decay_rate(None)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.01)
    precondition_frequency: Scalar = hyperparameter(10, check=POSITIVE_INTEGER)
    max_precondition_dim: int = static(10000)
    merge_dims: bool = static(False)
    precondition_1d: bool = static(False)
    normalize_grads: bool = static(False)
    data_format: str = choice("channels_first", DATA_FORMATS)
    correct_bias: bool = static(True)
    mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        soap = ScaleBySoap(
            self.b1,
            self.b2,
            self.shampoo_beta,
            self.eps,
            self.precondition_frequency,
            self.max_precondition_dim,
            self.merge_dims,
            self.precondition_1d,
            self.normalize_grads,
            self.data_format,
            self.correct_bias,
            mu_dtype=self.mu_dtype,
            nu_dtype=self.nu_dtype,
        )
        return Chain(soap, AddDecayedWeights(self.weight_decay, self.mask), ScaleByLearningRate(self.learning_rate))


soap = Soap
