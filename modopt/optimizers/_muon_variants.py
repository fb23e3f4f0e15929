"""NorMuon and AdaMuon: Muon's adaptive variants, with Adam for the non-matrix parameters.

The scale-by transforms (`scale_by_normuon`, `scale_by_adamuon`) are in
`modopt/transforms/_muon_variants.py`; the parameters are split between them and AdamW as in
`modopt.contrib.muon` (its `MuonLabels`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import choice, hyperparameter, static
from ..combinators import Chain, Partition
from ..schedules._base import ScalarOrSchedule
from ..transforms import AddDecayedWeights, ScaleByLearningRate
from ..transforms._muon_variants import ScaleByAdaMuon, ScaleByNorMuon
from ..transforms._newton_schulz import (
    DEFAULT_NS_COEFFS,
    PRECONDITIONINGS,
    MuonLabels,
    ScaleByShape,
    as_dimension_numbers,
    as_ns_coeffs,
)
from .._core.fields import Scalar
from jax.typing import DTypeLike
from ._adam import AdamW
from .._core.masks import MaskOrFn


def muon_partition(tx: Any, matrices: Any, nesterov: bool, owner: str) -> Partition:
    """Muon's split (also `modopt.contrib.muon`'s): `matrices` for the weights that the
    dimension numbers of `tx` select, AdamW for the others, built from the `adam_*` fields of
    `tx` with its `eps`, `mu_dtype` and `nu_dtype` (its learning rate `learning_rate` unless given)."""
    learning_rate = tx.learning_rate if tx.adam_learning_rate is None else tx.adam_learning_rate
    adam = AdamW(
        learning_rate,
        tx.adam_b1,
        tx.adam_b2,
        tx.eps,
        tx.adam_eps_root,
        tx.mu_dtype,
        tx.adam_weight_decay,
        nu_dtype=tx.nu_dtype,
        nesterov=nesterov,
    )
    dims = tx.muon_weight_dimension_numbers
    return Partition({"muon": matrices, "adam": adam}, MuonLabels(dims, owner))


class NorMuon(AbstractComposite):
    r"""NorMuon: Muon with a per-neuron second moment, with Adam for the other parameters.

    For each weight matrix (every parameter of rank 2 by default; see
    `muon_weight_dimension_numbers`), the update is

        update = -learning_rate * (s * N + weight_decay * param)

    with `N` the neuron-normalized orthogonalized momentum of `scale_by_normuon`, rescaled to the
    RMS `consistent_rms` (0.2, the paper's Algorithm 1; `s = 1`), or with `consistent_rms=None`
    kept at the Frobenius norm of the orthogonalized momentum and scaled by Muon's width factor
    `s = sqrt(max(1, fan_out / fan_in))` (the authors' code). Every other parameter is updated by
    AdamW with `adam_learning_rate`, `adam_b1`, `adam_b2`, `eps`, `adam_eps_root`,
    `adam_weight_decay`, `mu_dtype` and `adam_nesterov`. The weight decay
    of the matrices is multiplied by the learning rate (as in PyTorch).

    Checked against `pytorch_optimizer.NorMuon` (4.1.0) in `tests/test_muon_variants.py`: its
    `update_scale="match_rms"` is `consistent_rms=0.2`, its default `"preserve_norm"` (with
    `use_adjusted_lr=False`) is `consistent_rms=None`; the weight decay, `lr * weight_decay *
    param`, is the same. pytorch_optimizer's default AdamW part has `b2 = 0.95` and its own
    learning rate 3e-4; here Adam's rate is `learning_rate` unless `adam_learning_rate` is given.
    Weights in PyTorch's `(out, in)` layout take `MuonDimensionNumbers(reduction_axis=1,
    output_axis=0)`; `modopt.Optimizer` gives them to Equinox's layers on its own.

    Sharding: the momentum follows each parameter, the neurons' second moment follows the
    parameter's output axes (see `scale_by_normuon`), and Adam's moments follow theirs.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        ns_coeffs: the Newton-Schulz coefficients: `(c0, c1, c2)` for every step, one row per step,
            or a preset's name ("standard", the default, or "dion").
        ns_steps: the number of Newton-Schulz steps (static).
        beta: the decay rate of the momentum, in [0, 1).
        b2: the decay rate of the neurons' second moment, in [0, 1).
        eps: keeps denominators away from zero, >= 0: in NorMuon's normalization and in Adam's.
        weight_decay: the decoupled weight decay of the matrices (scaled by the learning rate).
        weight_decay_mask: which of the matrices decay: `None` for all, a pytree of bools shaped
            like (a prefix of) the params, or a function of the params returning one.
        mu_dtype: the dtype of both momenta (NorMuon's and Adam's first moment); `None` keeps the
            parameters' dtype.
        nu_dtype: the dtype of both second moments (NorMuon's and Adam's); `None` keeps the
            parameters' dtype.
        consistent_rms: the RMS the matrices' updates are rescaled to, or `None` to keep the
            orthogonalized norm and apply Muon's width scaling.
        nesterov: orthogonalize Nesterov's look-ahead of the momentum (static).
        preconditioning: how matrices are scaled before Newton-Schulz (static): "frobenius",
            "spectral", "aol" or "schatten" (see `modopt.contrib.scale_by_muon`).
        adam_b1: the decay rate of Adam's first moment, in [0, 1).
        adam_b2: the decay rate of Adam's second moment, in [0, 1).
        adam_eps_root: added to Adam's second moment inside the square root, >= 0.
        adam_weight_decay: Adam's decoupled weight decay.
        adam_learning_rate: Adam's learning rate (a number or a schedule); `None` uses
            `learning_rate`.
        adam_nesterov: Nesterov momentum in Adam (static; off, as in the references, whatever
            `nesterov` is).
        muon_weight_dimension_numbers: which parameters the orthogonalized update takes and which
            of their axes form the matrix (static), as in `modopt.contrib.muon`: `None` (every
            rank-2 parameter, rows the reduction axis; Adam for the rest), one
            `MuonDimensionNumbers` for every parameter, a tree of them with the params'
            structure or a prefix of it (`None` entries: Adam), or a function of the params. `modopt.Optimizer(tx, model)` replaces a `None` by
            the layout of the model's layers (`modopt.dimension_numbers`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.normuon(1e-3, weight_decay=0.1), model)

    References: Li et al., 2025, "NorMuon: Making Muon more efficient and scalable",
    https://arxiv.org/abs/2510.05491
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    ns_coeffs: Any = eqx.field(default=DEFAULT_NS_COEFFS, converter=as_ns_coeffs)
    ns_steps: int = static(default=5)
    beta: Scalar = fields.decay_rate(0.95)
    b2: Scalar = fields.decay_rate(0.95)
    eps: Scalar = fields.eps(1e-10)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    weight_decay_mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype()
    consistent_rms: Scalar | None = hyperparameter(0.2, check=fields.NONNEGATIVE, optional=True, kw_only=True)
    nesterov: bool = static(default=True, kw_only=True)
    preconditioning: str = choice("frobenius", PRECONDITIONINGS, kw_only=True)
    adam_b1: Scalar = fields.decay_rate(0.9, kw_only=True)
    adam_b2: Scalar = fields.decay_rate(0.999, kw_only=True)
    adam_eps_root: Scalar = fields.eps(0.0, kw_only=True)
    adam_weight_decay: ScalarOrSchedule = fields.weight_decay(0.0, kw_only=True)
    adam_learning_rate: ScalarOrSchedule = fields.learning_rate(None, kw_only=True)
    adam_nesterov: bool = static(default=False, kw_only=True)
    muon_weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers, kw_only=True)
    dimension_numbers_field: ClassVar[str] = "muon_weight_dimension_numbers"  # set from the model by `modopt.Optimizer` where None
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        dims = self.muon_weight_dimension_numbers
        direction = ScaleByNorMuon(
            self.ns_coeffs,
            self.ns_steps,
            self.beta,
            self.b2,
            self.eps,
            self.mu_dtype,
            self.consistent_rms,
            nesterov=self.nesterov,
            preconditioning=self.preconditioning,
            weight_dimension_numbers=dims,
            nu_dtype=self.nu_dtype,
        )
        width = () if self.consistent_rms is not None else (ScaleByShape(dims, None, owner="normuon"),)
        matrices = Chain(
            direction,
            *width,
            AddDecayedWeights(self.weight_decay, self.weight_decay_mask),
            ScaleByLearningRate(self.learning_rate),
        )
        return muon_partition(self, matrices, self.adam_nesterov, "normuon")


class AdaMuon(AbstractComposite):
    r"""AdaMuon: Muon with an element-wise second moment and RMS alignment, with Adam for the
    other parameters.

    For each weight matrix (every parameter of rank 2 by default; see
    `muon_weight_dimension_numbers`), the update is

        update = -learning_rate * (A + weight_decay * param)

    with `A` the update of `scale_by_adamuon`: the Newton-Schulz orthogonalization of the sign
    of the momentum, divided element-wise by the root of its bias-corrected second moment, with
    its RMS set to `consistent_rms` (0.2, so that Adam's learning rates carry over). Every other
    parameter is updated by AdamW with `adam_learning_rate`, `adam_b1`, `adam_b2`, `eps`,
    `adam_eps_root`, `adam_weight_decay`, `mu_dtype` and `adam_nesterov`.
    The weight decay of the matrices is multiplied by the learning rate (as in PyTorch).

    Checked against `pytorch_optimizer.AdaMuon` (4.1.0) in `tests/test_muon_variants.py`, with
    `sign_stabilization=False, nesterov=False` (it omits the paper's sign and uses a plain
    momentum) and its default `use_adjusted_lr=True`, whose learning-rate factor `0.2 sqrt(max(m,
    n))` times its `sqrt(min(m, n)) / ||O_hat||` is this RMS alignment; its
    `use_adjusted_lr=False` (Jordan's factor on that) has no counterpart here. The weight decay,
    `lr * weight_decay * param`, is the same. Weights in PyTorch's `(out, in)` layout take
    `MuonDimensionNumbers(reduction_axis=1, output_axis=0)` (the RMS does not depend on it).

    Sharding: every moment follows its parameter.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        ns_coeffs: the Newton-Schulz coefficients: `(c0, c1, c2)` for every step, one row per step,
            or a preset's name ("standard", the default, or "dion").
        ns_steps: the number of Newton-Schulz steps (static).
        beta: the decay rate of the momentum, in [0, 1).
        b2: the decay rate of the element-wise second moment, in [0, 1).
        eps: keeps denominators away from zero, >= 0: in AdaMuon's normalization and in Adam's.
        weight_decay: the decoupled weight decay of the matrices (scaled by the learning rate).
        weight_decay_mask: which of the matrices decay: `None` for all, a pytree of bools shaped
            like (a prefix of) the params, or a function of the params returning one.
        mu_dtype: the dtype of both momenta (AdaMuon's and Adam's first moment); `None` keeps the
            parameters' dtype.
        nu_dtype: the dtype of both second moments (AdaMuon's and Adam's); `None` keeps the
            parameters' dtype.
        consistent_rms: the RMS of each matrix's update, >= 0.
        nesterov: orthogonalize Nesterov's look-ahead of the momentum (static).
        sign_stabilization: orthogonalize the sign of the momentum (the paper's) rather than the
            momentum (static).
        preconditioning: how matrices are scaled before Newton-Schulz (static): "frobenius",
            "spectral", "aol" or "schatten" (see `modopt.contrib.scale_by_muon`).
        adam_b1: the decay rate of Adam's first moment, in [0, 1).
        adam_b2: the decay rate of Adam's second moment, in [0, 1).
        adam_eps_root: added to Adam's second moment inside the square root, >= 0.
        adam_weight_decay: Adam's decoupled weight decay.
        adam_learning_rate: Adam's learning rate (a number or a schedule); `None` uses
            `learning_rate`.
        adam_nesterov: Nesterov momentum in Adam (static; off, as in the references, whatever
            `nesterov` is).
        muon_weight_dimension_numbers: which parameters the orthogonalized update takes and which
            of their axes form the matrix (static), as in `modopt.contrib.muon`: `None` (every
            rank-2 parameter, rows the reduction axis; Adam for the rest), one
            `MuonDimensionNumbers` for every parameter, a tree of them with the params'
            structure or a prefix of it (`None` entries: Adam), or a function of the params. `modopt.Optimizer(tx, model)` replaces a `None` by
            the layout of the model's layers (`modopt.dimension_numbers`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.adamuon(1e-3, weight_decay=0.1), model)

    References: Si, Zhang and Shen, 2025, "AdaMuon: Adaptive Muon Optimizer",
    https://arxiv.org/abs/2507.11005
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    ns_coeffs: Any = eqx.field(default=DEFAULT_NS_COEFFS, converter=as_ns_coeffs)
    ns_steps: int = static(default=5)
    beta: Scalar = fields.decay_rate(0.95)
    b2: Scalar = fields.decay_rate(0.95)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    weight_decay_mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype()
    consistent_rms: Scalar = hyperparameter(0.2, check=fields.NONNEGATIVE, kw_only=True)
    nesterov: bool = static(default=True, kw_only=True)
    sign_stabilization: bool = static(default=True, kw_only=True)
    preconditioning: str = choice("frobenius", PRECONDITIONINGS, kw_only=True)
    adam_b1: Scalar = fields.decay_rate(0.9, kw_only=True)
    adam_b2: Scalar = fields.decay_rate(0.999, kw_only=True)
    adam_eps_root: Scalar = fields.eps(0.0, kw_only=True)
    adam_weight_decay: ScalarOrSchedule = fields.weight_decay(0.0, kw_only=True)
    adam_learning_rate: ScalarOrSchedule = fields.learning_rate(None, kw_only=True)
    adam_nesterov: bool = static(default=False, kw_only=True)
    muon_weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers, kw_only=True)
    dimension_numbers_field: ClassVar[str] = "muon_weight_dimension_numbers"  # set from the model by `modopt.Optimizer` where None
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        dims = self.muon_weight_dimension_numbers
        matrices = Chain(
            ScaleByAdaMuon(
                self.ns_coeffs,
                self.ns_steps,
                self.beta,
                self.b2,
                self.eps,
                self.mu_dtype,
                self.consistent_rms,
                nesterov=self.nesterov,
                sign_stabilization=self.sign_stabilization,
                preconditioning=self.preconditioning,
                weight_dimension_numbers=dims,
                nu_dtype=self.nu_dtype,
            ),
            AddDecayedWeights(self.weight_decay, self.weight_decay_mask),
            ScaleByLearningRate(self.learning_rate),
        )
        return muon_partition(self, matrices, self.adam_nesterov, "adamuon")


normuon = NorMuon
adamuon = AdaMuon
