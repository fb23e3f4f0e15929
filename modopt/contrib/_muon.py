"""Muon: momentum orthogonalized by Newton-Schulz iterations (`muon`, `scale_by_muon`).

The matrix machinery (dimension numbers, Newton-Schulz, shape scaling, labels) lives in
`modopt.transforms._newton_schulz`, shared with Muon's variants; its names are re-exported here.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform
from .._core.fields import choice, hyperparameter, static
from .._state.moments import in_update_dtype, init_state, store, widen, widened_update_moment
from .._util.numerics import safe_increment
from .._core.specs import REPLICATED
from ..combinators import Chain
from ..optimizers._muon_variants import muon_partition
from ..schedules._base import ScalarOrSchedule
from ..transforms import AddDecayedWeights, ScaleByLearningRate
from ..transforms._adam import debiased_mu
from ..transforms._newton_schulz import DEFAULT_NS_COEFFS as DEFAULT_NS_COEFFS
from ..transforms._newton_schulz import NS_COEFFS_PRESETS as NS_COEFFS_PRESETS
from ..transforms._newton_schulz import PRECONDITIONINGS as PRECONDITIONINGS
from ..transforms._newton_schulz import MuonDimensionNumbers as MuonDimensionNumbers
from ..transforms._newton_schulz import MuonLabels as MuonLabels
from ..transforms._newton_schulz import ScaleByShape as ScaleByShape
from ..transforms._newton_schulz import as_dimension_numbers as as_dimension_numbers
from ..transforms._newton_schulz import as_ns_coeffs as as_ns_coeffs
from ..transforms._newton_schulz import check_ns_coeffs as check_ns_coeffs
from ..transforms._newton_schulz import dimension_numbers_per_leaf as dimension_numbers_per_leaf
from ..transforms._newton_schulz import fans as fans
from ..transforms._newton_schulz import matrix_axes as matrix_axes
from ..transforms._newton_schulz import matrix_axes_per_leaf as matrix_axes_per_leaf
from ..transforms._newton_schulz import newton_schulz as newton_schulz
from ..transforms._newton_schulz import orthogonalize as orthogonalize
from ..transforms._newton_schulz import orthogonalize_leaves
from ..sharding._owners import specs_of
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn


class MuonState(NamedTuple):
    """The state of `scale_by_muon`.

    count: updates made so far (int32 scalar).
    mu: the momentum, like the params (in `mu_dtype` if set).
    ns_coeffs: the Newton-Schulz coefficients (those of the transform, recorded at each step),
        shape `(3,)` or `(steps, 3)`.
    """

    count: jax.Array
    mu: Any
    ns_coeffs: jax.Array


class ScaleByMuon(AbstractTransform):
    r"""Rescales updates to the orthogonalized momentum (Muon's direction).

    With `t` the step (from 1), the momentum `m = beta m + (1 - beta) g` is bias-corrected
    (`m_hat = m / (1 - beta^t)`, or with `nesterov=True` the look-ahead
    `beta m / (1 - beta^(t+1)) + (1 - beta) g / (1 - beta^t)`), and each weight matrix `M` of
    `m_hat` becomes `O = NS(M)`: `M` is scaled (`preconditioning`), then `ns_steps` quintic
    Newton-Schulz steps `X <- c0 X + (c1 A + c2 A^2) X`, `A = X X^H`, push its singular values
    towards 1, so `O ~ U V^T` for `M = U S V^T`. (The default coefficients favour speed: the
    singular values end roughly in [0.7, 1.2], not exactly at 1.) With `adaptive=True` the
    update is `<M, O> O`, scaled by the dual norm of `M`.

    A matrix of huge entries (beyond `2**16` in float32, whose squares in the norms and in
    `X X^H` overflow) is first scaled by a power of two: each scaling divides by a norm, so
    `O` is the same (it was zero: the norm overflowed). Other matrices are scaled by exactly 1.

    Weights of rank other than 2 need `MuonDimensionNumbers` saying which axes form the
    matrix (the others are batch axes, orthogonalized slice by slice).

    Sharding: Newton-Schulz works on whole matrices. The momentum follows the parameter's
    sharding (the rule below); the count and the coefficients are replicated. A sharded matrix
    needs no special handling: under `jax.jit` with sharded inputs, XLA inserts the gathers and
    reductions that the matrix products `X X^H` and `B X` need, and the result equals the
    unsharded computation (up to float rounding); no device ever needs another's momentum.

    Args:
        ns_coeffs: the Newton-Schulz coefficients `(c0, c1, c2)`, used at every step, or one row
            `(c0, c1, c2)` per step (then at most `ns_steps` rows, one step each); or a preset's
            name, "standard" (the default, Jordan's) or "dion". An array leaf.
        ns_steps: the number of Newton-Schulz steps with a single row of coefficients (static).
        beta: the decay rate of the momentum, in [0, 1).
        eps: keeps the denominators of the scaling (and of AOL's and Schatten's rescaling) away
            from zero, >= 0.
        mu_dtype: the dtype of the momentum; `None` keeps the parameters' dtype.
        nesterov: use Nesterov's look-ahead momentum (static; the default, as in optax).
        adaptive: scale each orthogonalized matrix `O` by `<M, O>`, the dual norm of the momentum
            `M` (static).
        preconditioning: how each matrix is scaled before the iteration (static): "frobenius"
            (by its Frobenius norm, the default), "spectral" (by its largest singular value, at
            the cost of one SVD-like norm), "aol" (rows rescaled by AOL in the first step) or
            "schatten" (by the Schatten-4 norm in the first step).
        weight_dimension_numbers: which axes of each weight form the matrix (static): `None`
            (every parameter a matrix, rows the reduction axis), one `MuonDimensionNumbers` for
            all, a tree of them (`None` for a plain matrix) with the params' structure or a prefix
            of it, or a function of the updates returning one. `modopt.Optimizer(tx, model)` replaces a `None` by
            the layout of the model's layers (`modopt.dimension_numbers`).

    Example:
        >>> tx = modopt.chain(modopt.contrib.scale_by_muon(), modopt.scale_by_learning_rate(0.02))

    References: Jordan, 2024, "Muon", https://kellerjordan.github.io/posts/muon/ (and
    https://github.com/KellerJordan/modded-nanogpt); Bernstein & Newhouse, 2024, "Old Optimizer,
    New Norm: An Anthology", https://arxiv.org/abs/2409.20325
    """

    ns_coeffs: Any = eqx.field(default=DEFAULT_NS_COEFFS, converter=as_ns_coeffs)
    ns_steps: int = static(default=5)
    beta: Scalar = fields.decay_rate(0.95)
    eps: Scalar = fields.eps(1e-8)
    mu_dtype: DTypeLike | None = fields.dtype()
    nesterov: bool = static(default=True, kw_only=True)
    adaptive: bool = static(default=False, kw_only=True)
    preconditioning: str = choice("frobenius", PRECONDITIONINGS, kw_only=True)
    weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers, kw_only=True)
    dimension_numbers_field: ClassVar[str] = "weight_dimension_numbers"  # set from the model by `modopt.Optimizer` where None

    def __check_init__(self):
        check_ns_coeffs(self.ns_coeffs, self.ns_steps, type(self).__name__)

    def _axes(self, tree: Any) -> list[Any]:
        """Each leaf's `(batch, reduction, output)` axes, checked (errors name the path)."""
        return matrix_axes_per_leaf(self.weight_dimension_numbers, tree, "scale_by_muon")

    def init(self, params):
        self._axes(params)  # bad dimension numbers fail here, before any step
        # A copy of the coefficients: the state is donated to jitted steps, the transform may not be.
        return MuonState(
            count=jnp.zeros([], jnp.int32),
            mu=init_state(params, self.mu_dtype),
            ns_coeffs=jnp.copy(self.ns_coeffs),
        )

    def update(self, updates, state, params=None, **extra_args):
        axes = self._axes(updates)
        mu = widened_update_moment(updates, state.mu, self.beta, 1, self.mu_dtype)
        count = safe_increment(state.count)
        mu_hat = debiased_mu(mu, widen(updates, self.mu_dtype), self.beta, count, self.nesterov)
        flat, treedef = jax.tree_util.tree_flatten(mu_hat)
        specs = specs_of(state.mu, params)  # where each leaf lies on a mesh (its owner takes it from there)
        ortho = orthogonalize_leaves(flat, axes, self.ns_coeffs, self.ns_steps, self.preconditioning, self.eps, specs)
        if self.adaptive:  # <M, O> O: the dual norm of the momentum along O
            ortho = [jnp.sum(m.conj() * o) * o for m, o in zip(flat, ortho)]
        # The state records the coefficients used (a copy: it must not alias the transform).
        state = MuonState(count=count, mu=store(mu, self.mu_dtype), ns_coeffs=jnp.copy(self.ns_coeffs))
        return in_update_dtype(treedef.unflatten(ortho), updates, self.mu_dtype), state

    def state_specs(self, params, param_specs):
        # The momentum is laid out as its parameter; Newton-Schulz reads whole matrices, and
        # XLA gathers what each product needs under jit.
        return MuonState(count=REPLICATED, mu=param_specs, ns_coeffs=REPLICATED)


class Muon(AbstractComposite):
    r"""Muon: momentum orthogonalized by Newton-Schulz, with Adam for the other parameters.

    For each weight matrix (by default every parameter of rank 2; see
    `muon_weight_dimension_numbers`), the update is

        update = -learning_rate * (s * NS(m_hat) + weight_decay * param)

    with `NS(m_hat)` the Newton-Schulz orthogonalization of the bias-corrected (Nesterov by
    default) momentum of `scale_by_muon`, and `s` a factor of the shape: `sqrt(max(1, fan_out /
    fan_in))`, or `sqrt(max(fan_in, fan_out)) * consistent_rms` where `consistent_rms` is given.
    Every other parameter (vectors, scalars, and weights whose dimension numbers are `None`)
    is updated by AdamW with `adam_learning_rate`, `adam_b1`, `adam_b2`, `eps`, `adam_eps_root`,
    `adam_weight_decay`, `mu_dtype` and `nesterov`. The weight decay of Muon's part is
    multiplied by the learning rate (as in PyTorch).

    Sharding: Muon's momentum follows each parameter's sharding, and the Newton-Schulz products
    run on whole matrices; under `jax.jit` with sharded inputs XLA gathers what they need, and the
    result equals the unsharded one (see `scale_by_muon`).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        ns_coeffs: the Newton-Schulz coefficients: `(c0, c1, c2)` for every step, one row per step,
            or a preset's name ("standard", the default, or "dion").
        ns_steps: the number of Newton-Schulz steps (static; a table of rows makes one step each).
        beta: the decay rate of Muon's momentum, in [0, 1).
        eps: keeps denominators away from zero, >= 0: in Muon's scaling and in Adam's.
        weight_decay: the decoupled weight decay of Muon's parameters (scaled by the learning rate).
        weight_decay_mask: which of Muon's parameters decay: `None` for all, a pytree of bools
            shaped like (a prefix of) the params, or a function of the params returning one.
        mu_dtype: the dtype of both momenta (Muon's and Adam's first moment); `None` keeps the
            parameters' dtype.
        nu_dtype: the dtype of Adam's second moment; `None` keeps the parameters' dtype.
        nesterov: Nesterov momentum, in Muon and in Adam (static).
        adaptive: scale Muon's updates by the dual norm of the momentum (static; see
            `scale_by_muon`).
        preconditioning: how matrices are scaled before Newton-Schulz (static): "frobenius",
            "spectral", "aol" or "schatten" (see `scale_by_muon`).
        adam_b1: the decay rate of Adam's first moment, in [0, 1).
        adam_b2: the decay rate of Adam's second moment, in [0, 1).
        adam_eps_root: added to Adam's second moment inside the square root, >= 0.
        adam_weight_decay: Adam's decoupled weight decay.
        adam_learning_rate: Adam's learning rate (a number or a schedule); `None` uses
            `learning_rate`.
        muon_weight_dimension_numbers: which parameters Muon updates and which of their axes form
            the matrix (static): `None` (every rank-2 parameter, rows the reduction axis; Adam
            for the rest), one `MuonDimensionNumbers` for every parameter, or a tree of them
            with the params' structure or a prefix of it (`None` entries: Adam), or a function of
            the params returning one. A bad entry is an error naming its path. `modopt.Optimizer(tx, model)` replaces a `None` by
            the layout of the model's layers (`modopt.dimension_numbers`).
        consistent_rms: the target RMS of Muon's updates (0.2 matches AdamW's), or `None` for
            width scaling.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.muon(0.02), model)
        >>> conv = modopt.contrib.muon(0.02, muon_weight_dimension_numbers={
        ...     "kernel": modopt.contrib.MuonDimensionNumbers(reduction_axis=(0, 1, 2), output_axis=3),
        ...     "bias": None})

    References: Jordan, 2024, "Muon", https://kellerjordan.github.io/posts/muon/; Liu et al.,
    2025, "Muon is Scalable for LLM Training", https://arxiv.org/abs/2502.16982; Boissin et al.,
    2025 (AOL), https://arxiv.org/abs/2512.04632; Grishina et al., 2025 (Schatten),
    https://arxiv.org/abs/2506.10935; Ahn et al., 2025 (Dion), https://arxiv.org/abs/2504.05295
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    ns_coeffs: Any = eqx.field(default=DEFAULT_NS_COEFFS, converter=as_ns_coeffs)
    ns_steps: int = static(default=5)
    beta: Scalar = fields.decay_rate(0.95)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    weight_decay_mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype()
    nesterov: bool = static(default=True, kw_only=True)
    adaptive: bool = static(default=False, kw_only=True)
    preconditioning: str = choice("frobenius", PRECONDITIONINGS, kw_only=True)
    adam_b1: Scalar = fields.decay_rate(0.9, kw_only=True)
    adam_b2: Scalar = fields.decay_rate(0.999, kw_only=True)
    adam_eps_root: Scalar = fields.eps(0.0, kw_only=True)
    adam_weight_decay: ScalarOrSchedule = fields.weight_decay(0.0, kw_only=True)
    adam_learning_rate: ScalarOrSchedule = fields.learning_rate(None, kw_only=True)
    muon_weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers, kw_only=True)
    dimension_numbers_field: ClassVar[str] = "muon_weight_dimension_numbers"  # set from the model by `modopt.Optimizer` where None
    consistent_rms: Scalar | None = hyperparameter(None, check=fields.NONNEGATIVE, kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        dims = self.muon_weight_dimension_numbers
        muon_part = Chain(
            ScaleByMuon(
                self.ns_coeffs,
                self.ns_steps,
                self.beta,
                self.eps,
                self.mu_dtype,
                nesterov=self.nesterov,
                adaptive=self.adaptive,
                preconditioning=self.preconditioning,
                weight_dimension_numbers=dims,
            ),
            ScaleByShape(dims, self.consistent_rms),
            AddDecayedWeights(self.weight_decay, self.weight_decay_mask),
            ScaleByLearningRate(self.learning_rate),
        )
        # Adam's Nesterov momentum follows `nesterov` here (optax's); the variants have `adam_nesterov`.
        return muon_partition(self, muon_part, self.nesterov, "muon")


scale_by_muon = ScaleByMuon
muon = Muon
