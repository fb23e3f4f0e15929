"""Muon's adaptive variants: NorMuon (`scale_by_normuon`) and AdaMuon (`scale_by_adamuon`).

Both orthogonalize the momentum of each weight matrix with Newton-Schulz, as Muon does (the
machinery of `modopt.transforms._newton_schulz`), then apply a second moment to the
orthogonalized matrix: one per neuron (NorMuon) or one per element (AdaMuon), and rescale it.
The named optimizers (`modopt.normuon`, `modopt.adamuon`) are in `modopt/optimizers`.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import choice, hyperparameter, static
from .._state.moments import (
    bias_correction,
    init_state,
    state_dtype_for,
    store,
    update_dtype,
    update_moment,
    widen,
    widened_update_moment,
    widened_update_moment_per_elem_norm,
)
from .._util.numerics import safe_increment
from .._core.specs import REPLICATED, padded
from .._util.trees import abs_sq
from ..sharding._owners import specs_of
from ._newton_schulz import (
    DEFAULT_NS_COEFFS,
    PRECONDITIONINGS,
    as_dimension_numbers,
    as_ns_coeffs,
    check_ns_coeffs,
    fans,
    matrix_axes_per_leaf,
    orthogonalize_leaves,
    shape_of,
)
from .._core.fields import Scalar
from jax.typing import DTypeLike


class ScaleByNorMuonState(NamedTuple):
    """The state of `scale_by_normuon`.

    count: updates made so far (int32 scalar).
    mu: the momentum, like the params (in `mu_dtype` if set).
    nu: the second moment of each neuron of the orthogonalized update: shaped like the
        parameter with its reduction axes of size 1 (a `(fan_in, fan_out)` matrix gives
        `(1, fan_out)`), in `nu_dtype` if set.
    """

    count: jax.Array
    mu: Any
    nu: Any


class ScaleByAdaMuonState(NamedTuple):
    """The state of `scale_by_adamuon`.

    count: updates made so far (int32 scalar).
    mu: the momentum, like the params (in `mu_dtype` if set).
    nu: the second moment of each element of the orthogonalized update, like the params (in
        `nu_dtype` if set).
    """

    count: jax.Array
    mu: Any
    nu: Any


def _look_ahead(updates: Any, mu: Any, beta: Any, nesterov: bool) -> Any:
    """What is orthogonalized: the momentum, or with `nesterov` its look-ahead `beta m + (1 - beta) g`."""
    return update_moment(updates, mu, beta, 1) if nesterov else mu


def _frobenius(x: jax.Array, axes: tuple[tuple[int, ...], ...]) -> jax.Array:
    """The Frobenius norm of each matrix of `x` (over its reduction and output axes), kept as
    axes of size 1 so that it broadcasts against `x`."""
    _, reduction, output = axes
    return jnp.sqrt(jnp.sum(abs_sq(x), axis=reduction + output, keepdims=True))


def rms_aligned(x: jax.Array, axes: tuple[tuple[int, ...], ...], rms: Any, eps: Any) -> jax.Array:
    """Each matrix of `x` rescaled to the root mean square `rms`: `rms sqrt(m n) x / (||x||_F + eps)`
    for an `m x n` matrix (NorMuon's and AdaMuon's RMS alignment).

    Args:
        x: the orthogonalized and normalized update of one weight.
        axes: its `(batch, reduction, output)` axes.
        rms: the target root mean square.
        eps: keeps the denominator away from zero.
    """
    fan_in, fan_out = fans(x.shape, axes)
    return x * (rms * (fan_in * fan_out) ** 0.5 / (_frobenius(x, axes) + eps)).astype(x.dtype)


class _AbstractMuonVariant(AbstractTransform):
    """The momentum step and the orthogonalization NorMuon and AdaMuon share (their fields
    `beta`, `nesterov`, `ns_coeffs`, `ns_steps`, `preconditioning`, `eps`, `mu_dtype`, `nu_dtype`
    and `weight_dimension_numbers` are declared by each)."""

    _owner: ClassVar[str]
    dimension_numbers_field: ClassVar[str] = "weight_dimension_numbers"  # set from the model by `modopt.Optimizer` where None

    def _axes(self, tree: Any) -> list[Any]:
        return matrix_axes_per_leaf(self.weight_dimension_numbers, tree, self._owner)

    def _orthogonalized(self, updates: Any, state: Any, params: Any, signed: bool = False):
        """`(axes, new momentum, [O per leaf], treedef, count)`: the momentum step and
        Newton-Schulz on each matrix (of the sign of the momentum where `signed`), each `O` in
        the dtype of the update (the gradient's, promoted with the state dtypes that are set)."""
        axes = self._axes(updates)
        mu = widened_update_moment(updates, state.mu, self.beta, 1, self.mu_dtype)
        look = _look_ahead(widen(updates, self.mu_dtype), mu, self.beta, self.nesterov)
        flat, treedef = jax.tree_util.tree_flatten(look)
        signs = [jnp.sign(m) for m in flat] if signed else flat
        ortho = [
            o.astype(update_dtype(g.dtype, self.mu_dtype, self.nu_dtype))
            for o, g in zip(
                orthogonalize_leaves(
                    signs, axes, self.ns_coeffs, self.ns_steps, self.preconditioning, self.eps, specs_of(state.mu, params)
                ),
                jax.tree_util.tree_leaves(updates),
            )
        ]
        return axes, store(mu, self.mu_dtype), ortho, treedef, safe_increment(state.count)


class ScaleByNorMuon(_AbstractMuonVariant):
    r"""Rescales updates to NorMuon's direction: Muon's orthogonalized momentum, normalized per neuron.

    For each weight matrix, with the momentum `m = beta m + (1 - beta) g` (with `nesterov`, its
    look-ahead `beta m + (1 - beta) g` is used), `O = NS(m)` is its Newton-Schulz
    orthogonalization (as in `scale_by_muon`). Each output neuron (each entry of the output axes:
    a column of a `(fan_in, fan_out)` weight used as `x @ W`) keeps a second moment of the mean
    square of its entries of `O`,

        nu = b2 nu + (1 - b2) mean_over_reduction_axes(O^2),    O_hat = O / (sqrt(nu) + eps),

    and the update is `O_hat` rescaled: to the RMS `consistent_rms`, `consistent_rms sqrt(m n)
    O_hat / (||O_hat||_F + eps)` (the paper's Algorithm 1, the default), or, with
    `consistent_rms=None`, to the Frobenius norm of `O`, `||O||_F O_hat / (||O_hat||_F + eps)`
    (the authors' code; `normuon` then applies Muon's width scaling). Neither moment is
    bias-corrected (the rescaling removes a uniform bias).

    Checked against `pytorch_optimizer.NorMuon` (4.1.0) in `tests/test_muon_variants.py`,
    configured alike (its Newton-Schulz in float32, not bfloat16). Its "neurons" are the rows of
    a PyTorch `(out, in)` weight; here they are the output axes of the dimension numbers, so a
    weight in PyTorch's layout takes `MuonDimensionNumbers(reduction_axis=1, output_axis=0)`.
    Its Newton-Schulz divides by `max(||X||_F, 1e-7)`, this one by `||X||_F + eps`.

    Sharding: the momentum follows its parameter; the second moment follows the parameter's
    output (and batch) axes and is whole along its reduction axes, where it has size 1.

    Args:
        ns_coeffs: the Newton-Schulz coefficients `(c0, c1, c2)` for every step, one row per step,
            or a preset's name ("standard", the default, or "dion"). An array leaf.
        ns_steps: the number of Newton-Schulz steps (static).
        beta: the decay rate of the momentum, in [0, 1).
        b2: the decay rate of the neurons' second moment, in [0, 1).
        eps: added to the denominators (the normalization, the rescaling and Newton-Schulz's
            scaling), >= 0.
        mu_dtype: the dtype of the momentum; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the neurons' second moment; `None` keeps the parameters' dtype.
        consistent_rms: the RMS the update is rescaled to (0.2, the paper's, matches Adam's), or
            `None` to keep the Frobenius norm of the orthogonalized momentum.
        nesterov: orthogonalize Nesterov's look-ahead rather than the momentum (static).
        preconditioning: how each matrix is scaled before Newton-Schulz (static): "frobenius",
            "spectral", "aol" or "schatten" (see `scale_by_muon`).
        weight_dimension_numbers: which axes of each weight form the matrix (static), as in
            `scale_by_muon`: `None` (every parameter a `(fan_in, fan_out)` matrix), one
            `MuonDimensionNumbers`, a tree of them, or a function of the params returning one.

    Example:
        >>> tx = modopt.chain(modopt.scale_by_normuon(), modopt.scale_by_learning_rate(1e-3))

    References: Li et al., 2025, "NorMuon: Making Muon more efficient and scalable",
    https://arxiv.org/abs/2510.05491 (code: https://github.com/zichongli5/NorMuon)
    """

    ns_coeffs: Any = eqx.field(default=DEFAULT_NS_COEFFS, converter=as_ns_coeffs)
    ns_steps: int = static(default=5)
    beta: Scalar = fields.decay_rate(0.95)
    b2: Scalar = fields.decay_rate(0.95)
    eps: Scalar = fields.eps(1e-10)
    mu_dtype: DTypeLike | None = fields.dtype()
    consistent_rms: Scalar | None = hyperparameter(0.2, check=fields.NONNEGATIVE, optional=True)
    nesterov: bool = static(default=True, kw_only=True)
    preconditioning: str = choice("frobenius", PRECONDITIONINGS, kw_only=True)
    weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers, kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    _owner: ClassVar[str] = "scale_by_normuon"

    def __check_init__(self):
        check_ns_coeffs(self.ns_coeffs, self.ns_steps, type(self).__name__)

    def init(self, params):
        axes = self._axes(params)  # bad dimension numbers fail here, before any step
        flat, treedef = jax.tree_util.tree_flatten(params)
        nu = [
            jnp.zeros(_neuron_shape(shape_of(p), a), state_dtype_for(self.nu_dtype, p.dtype))
            for p, a in zip(flat, axes)
        ]
        return ScaleByNorMuonState(
            count=jnp.zeros([], jnp.int32), mu=init_state(params, self.mu_dtype), nu=treedef.unflatten(nu)
        )

    def update(self, updates, state, params=None, **extra_args):
        axes, mu, ortho, treedef, count = self._orthogonalized(updates, state, params)
        new_nu, out = [], []
        for o, old_nu, leaf_axes in zip(ortho, jax.tree_util.tree_leaves(state.nu), axes):
            row = jnp.mean(abs_sq(o), axis=leaf_axes[1], keepdims=True)
            nu = widened_update_moment(row, old_nu, self.b2, 1, self.nu_dtype)
            normalized = o / (jnp.sqrt(nu) + self.eps).astype(o.dtype)
            if self.consistent_rms is None:
                ratio = _frobenius(o, leaf_axes) / (_frobenius(normalized, leaf_axes) + self.eps)
                out.append(normalized * ratio.astype(o.dtype))
            else:
                out.append(rms_aligned(normalized, leaf_axes, self.consistent_rms, self.eps))
            new_nu.append(store(nu, self.nu_dtype, old_nu))
        return treedef.unflatten(out), ScaleByNorMuonState(count=count, mu=mu, nu=treedef.unflatten(new_nu))

    def state_specs(self, params, param_specs):
        # The second moment is the parameter with its reduction axes reduced to size 1: it keeps
        # the parameter's split of the other axes and is whole along the reduced ones.
        axes = self._axes(params)
        treedef = jax.tree_util.tree_structure(params)
        specs = treedef.flatten_up_to(param_specs)
        nu = [
            PartitionSpec(*(None if i in a[1] else e for i, e in enumerate(padded(spec, len(shape_of(p))))))
            if isinstance(spec, PartitionSpec)
            else spec
            for p, spec, a in zip(treedef.flatten_up_to(params), specs, axes)
        ]
        return ScaleByNorMuonState(count=REPLICATED, mu=param_specs, nu=treedef.unflatten(nu))


def _neuron_shape(shape: tuple[int, ...], axes: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """The shape of a weight's per-neuron statistic: its reduction axes of size 1."""
    return tuple(1 if i in axes[1] else d for i, d in enumerate(shape))


class ScaleByAdaMuon(_AbstractMuonVariant):
    r"""Rescales updates to AdaMuon's direction: Muon's orthogonalized (sign of the) momentum,
    normalized by an element-wise second moment and aligned to a fixed RMS.

    For each weight matrix, with the momentum `m = beta m + (1 - beta) g` (with `nesterov`, its
    look-ahead `beta m + (1 - beta) g`), and `t` the step (from 1):

        O = NS(sign(m))        (NS(m) with sign_stabilization=False)
        nu = b2 nu + (1 - b2) O^2,    O_hat = O / (sqrt(nu / (1 - b2^t)) + eps)
        update = consistent_rms sqrt(m n) O_hat / (||O_hat||_F + eps)

    for an `m x n` matrix: the update's RMS is `consistent_rms` (0.2, Adam's typical RMS, so
    Adam's learning rates carry over).

    The sign stabilization and `beta = b2 = 0.95` are the paper's; `pytorch_optimizer.AdaMuon`
    (4.1.0), the reference of `tests/test_muon_variants.py`, omits the sign and uses a plain
    momentum (`sign_stabilization=False, nesterov=False` here; its default `b1` is 0.9). The
    bias correction of `nu` is the authors' code's and pytorch_optimizer's (the paper has none;
    the rescaling removes it up to `eps`). pytorch_optimizer reaches the RMS through its
    learning-rate adjustment `0.2 sqrt(max(m, n))` times `sqrt(min(m, n)) / ||O_hat||`; the
    product is the same. Its Newton-Schulz runs in bfloat16 (float32 in the test) and divides by
    `max(||X||_F, 1e-7)`, this one by `||X||_F + eps`.

    Sharding: the momentum and the second moment follow the parameter (the default rule).

    Args:
        ns_coeffs: the Newton-Schulz coefficients `(c0, c1, c2)` for every step, one row per step,
            or a preset's name ("standard", the default, or "dion"). An array leaf.
        ns_steps: the number of Newton-Schulz steps (static).
        beta: the decay rate of the momentum, in [0, 1).
        b2: the decay rate of the element-wise second moment, in [0, 1).
        eps: added to the denominators (the normalization, the rescaling and Newton-Schulz's
            scaling), >= 0.
        mu_dtype: the dtype of the momentum; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the element-wise second moment; `None` keeps the parameters' dtype.
        consistent_rms: the RMS of each matrix's update, >= 0.
        nesterov: orthogonalize Nesterov's look-ahead rather than the momentum (static).
        sign_stabilization: orthogonalize the sign of the momentum (the paper's), not the
            momentum itself (static).
        preconditioning: how each matrix is scaled before Newton-Schulz (static): "frobenius",
            "spectral", "aol" or "schatten" (see `scale_by_muon`).
        weight_dimension_numbers: which axes of each weight form the matrix (static), as in
            `scale_by_muon`.

    Example:
        >>> tx = modopt.chain(modopt.scale_by_adamuon(), modopt.scale_by_learning_rate(1e-3))

    References: Si, Zhang and Shen, 2025, "AdaMuon: Adaptive Muon Optimizer",
    https://arxiv.org/abs/2507.11005 (code: https://github.com/Chongjie-Si/AdaMuon)
    """

    ns_coeffs: Any = eqx.field(default=DEFAULT_NS_COEFFS, converter=as_ns_coeffs)
    ns_steps: int = static(default=5)
    beta: Scalar = fields.decay_rate(0.95)
    b2: Scalar = fields.decay_rate(0.95)
    eps: Scalar = fields.eps(1e-8)
    mu_dtype: DTypeLike | None = fields.dtype()
    consistent_rms: Scalar = hyperparameter(0.2, check=fields.NONNEGATIVE)
    nesterov: bool = static(default=True, kw_only=True)
    sign_stabilization: bool = static(default=True, kw_only=True)
    preconditioning: str = choice("frobenius", PRECONDITIONINGS, kw_only=True)
    weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers, kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    _owner: ClassVar[str] = "scale_by_adamuon"

    def __check_init__(self):
        check_ns_coeffs(self.ns_coeffs, self.ns_steps, type(self).__name__)

    def init(self, params):
        self._axes(params)  # bad dimension numbers fail here, before any step
        return ScaleByAdaMuonState(
            count=jnp.zeros([], jnp.int32), mu=init_state(params, self.mu_dtype), nu=init_state(params, self.nu_dtype)
        )

    def update(self, updates, state, params=None, **extra_args):
        axes, mu, ortho, treedef, count = self._orthogonalized(updates, state, params, self.sign_stabilization)
        nu = widened_update_moment_per_elem_norm(treedef.unflatten(ortho), state.nu, self.b2, 2, self.nu_dtype)
        nu_hat = jax.tree_util.tree_leaves(bias_correction(nu, self.b2, count))
        out = [
            rms_aligned(
                o / (jnp.sqrt(v) + self.eps).astype(o.dtype), leaf_axes, self.consistent_rms, self.eps
            )
            for o, v, leaf_axes in zip(ortho, nu_hat, axes)
        ]
        return treedef.unflatten(out), ScaleByAdaMuonState(count=count, mu=mu, nu=store(nu, self.nu_dtype, state.nu))


scale_by_normuon = ScaleByNorMuon
scale_by_adamuon = ScaleByAdaMuon
