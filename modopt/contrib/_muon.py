"""Muon: momentum orthogonalized by Newton-Schulz iterations (`muon`, `scale_by_muon`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import fields
from .._base import AbstractComposite, AbstractTransform, init_empty_state
from .._checks import prefix_difference
from .._fields import StaticTree, as_static_tree, choice, hyperparameter, static
from .._moments import update_moment
from .._numerics import safe_increment
from .._specs import REPLICATED
from .._trees import cast, zeros_like
from ..combinators import Chain, Partition
from ..optimizers._adam import AdamW
from ..schedules._base import ScalarOrSchedule
from ..transforms import AddDecayedWeights, ScaleByLearningRate
from ..transforms._adam import debiased_mu

PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")
NS_COEFFS_PRESETS = {
    # Jordan's quintic, chosen for a steep slope at zero; repeated at every step.
    "standard": (3.4445, -4.7750, 2.0315),
    # Dion's coefficients, one row per step (Ahn et al., 2025).
    "dion": (
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ),
}
DEFAULT_NS_COEFFS = NS_COEFFS_PRESETS["standard"]


class MuonDimensionNumbers(NamedTuple):
    """Which axes of a weight form the matrix that Muon orthogonalizes.

    A weight used as `y = x @ W` has its reduction (input) axis first and its output axis
    second, the default. For a weight of higher rank, the reduction axes (flattened together,
    in order) form the rows, the output axes the columns, and every other axis is a batch
    axis: each slice along the batch axes is orthogonalized on its own. Negative axes count
    from the end.

    Args:
        reduction_axis: the axis, or a sequence of axes, contracted with the input.
        output_axis: the axis, or a sequence of axes, of the output.
    """

    reduction_axis: Sequence[int] | int = 0
    output_axis: Sequence[int] | int = 1


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


def _is_dims_leaf(x: Any) -> bool:
    # optax's MuonDimensionNumbers (a NamedTuple with the same fields) is accepted too.
    return (
        x is None
        or isinstance(x, MuonDimensionNumbers)
        or getattr(x, "_fields", None) == MuonDimensionNumbers._fields
    )


def _shape(x: Any) -> tuple[int, ...]:
    """The shape of an array, abstract array (`jax.ShapeDtypeStruct`) or number."""
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def dimension_numbers_per_leaf(spec: Any, tree: Any, owner: str) -> list[tuple[str, Any]]:
    """`(path, dimension numbers or None)` for every leaf of `tree`.

    `spec` is `None` (every leaf a matrix), one `MuonDimensionNumbers` for every leaf, a tree
    of them (and of `None`) whose structure is a prefix of `tree`'s, or a function of `tree`
    returning either. A `ValueError` naming `owner` and the first differing path otherwise.
    """
    if isinstance(spec, StaticTree):
        spec = spec.tree
    elif callable(spec):
        spec = spec(tree)
        spec = spec.tree if isinstance(spec, StaticTree) else spec
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    paths = [jax.tree_util.keystr(path) for path, _ in flat]
    if _is_dims_leaf(spec):
        return [(path, spec) for path in paths]
    spec_def = jax.tree_util.tree_structure(spec, is_leaf=_is_dims_leaf)
    spec_flat = jax.tree_util.tree_flatten_with_path(spec, is_leaf=_is_dims_leaf)[0]
    spec_leaves = [x for _, x in spec_flat]
    for path, x in spec_flat:
        if not _is_dims_leaf(x):
            raise ValueError(
                f"{owner}: the weight dimension numbers hold {x!r} (a {type(x).__name__}) at "
                f"{jax.tree_util.keystr(path) or 'the root'}; each entry is a MuonDimensionNumbers or None."
            )
    try:
        subtrees = spec_def.flatten_up_to(tree)
    except (ValueError, TypeError):
        markers = spec_def.unflatten([0] * spec_def.num_leaves)
        difference = prefix_difference(markers, tree) or "a different structure"
        raise ValueError(
            f"{owner}: the weight dimension numbers and the parameters differ in structure (they must "
            f"have the parameters' structure, or a prefix of it): found {difference}."
        ) from None
    per_leaf = [dims for dims, sub in zip(spec_leaves, subtrees) for _ in jax.tree_util.tree_leaves(sub)]
    return list(zip(paths, per_leaf))


def _axes(value: Any, ndim: int, what: str, where: str, owner: str) -> tuple[int, ...]:
    axes = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    for axis in axes:
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
            raise ValueError(
                f"{owner}: invalid {what} {value!r} for the parameter at {where} of rank {ndim} (each "
                f"axis must be an integer in [{-ndim}, {ndim}))."
            )
    normalized = tuple(int(axis) % ndim for axis in axes)
    if len(set(normalized)) != len(normalized) or not normalized:
        raise ValueError(
            f"{owner}: invalid {what} {value!r} for the parameter at {where}: axes repeat or are missing."
        )
    return normalized


def matrix_axes(shape: tuple[int, ...], dims: Any, where: str, owner: str) -> tuple[tuple[int, ...], ...]:
    """`(batch axes, reduction axes, output axes)` of a weight of `shape`, checked.

    Args:
        shape: the weight's shape.
        dims: its `MuonDimensionNumbers`, or `None` for a matrix (rows: reduction, columns: output).
        where: the weight's path, for errors.
        owner: the transform's name, for errors.
    """
    ndim = len(shape)
    if dims is None:
        if ndim != 2:
            raise ValueError(
                f"{owner}: the parameter at {where} has shape {shape}, not a matrix. Give its "
                "MuonDimensionNumbers (which axes form the matrix) in the weight dimension numbers, or, "
                "with `muon`, leave it to Adam (None at its path)."
            )
        return (), (0,), (1,)
    if ndim < 2:
        raise ValueError(
            f"{owner}: the parameter at {where} has shape {shape}; Muon orthogonalizes weights of rank "
            ">= 2. Give it None in the weight dimension numbers (with `muon`: Adam updates it)."
        )
    reduction = _axes(dims.reduction_axis, ndim, "reduction_axis", where, owner)
    output = _axes(dims.output_axis, ndim, "output_axis", where, owner)
    if set(reduction) & set(output):
        raise ValueError(
            f"{owner}: the parameter at {where} has overlapping reduction axes {reduction} and output "
            f"axes {output} (normalized from {dims}); they must be disjoint."
        )
    batch = tuple(axis for axis in range(ndim) if axis not in reduction and axis not in output)
    return batch, reduction, output


def fans(shape: tuple[int, ...], axes: tuple[tuple[int, ...], ...]) -> tuple[int, int]:
    """`(fan_in, fan_out)`: the sizes of the reduction and the output axes of a weight."""
    _, reduction, output = axes
    return math.prod(shape[a] for a in reduction), math.prod(shape[a] for a in output)


def _newton_schulz_step(
    x: jax.Array, coeffs: jax.Array, precondition: str | None = None, eps: Any = 0.0
) -> jax.Array:
    """`c0 X + (c1 A + c2 A A) X` with `A = X X^H`; with `precondition` ("aol", "schatten"),
    `X` is rescaled first, using `A` (the first step only)."""
    a = x @ x.T.conj()
    if precondition == "aol":  # each row by the inverse square root of its row of |A|'s sum
        s = jax.lax.rsqrt(jnp.clip(jnp.sum(jnp.abs(a), axis=-1), min=eps))[:, None]
        x, a = x * s, a * s * s.T
    elif precondition == "schatten":  # by the Schatten-4 norm of X (the Frobenius norm of A)
        s = jax.lax.rsqrt(jnp.clip(jnp.linalg.norm(a, ord="fro"), min=eps))
        x, a = x * s, a * s**2
    b = coeffs[1] * a + coeffs[2] * a @ a
    return coeffs[0] * x + b @ x


def newton_schulz(
    x: jax.Array, ns_coeffs: jax.Array, ns_steps: int, preconditioning: str, eps: Any
) -> jax.Array:
    """Approximately orthogonalizes the matrix `x` (`U S V^T -> U S' V^T`, `S'` near 1).

    Args:
        x: a matrix.
        ns_coeffs: `(3,)` coefficients used at every step, or `(steps, 3)`, one row per step.
        ns_steps: the number of steps with `(3,)` coefficients.
        preconditioning: how `x` is scaled first: "frobenius", "spectral", "aol" or "schatten".
        eps: keeps the scaling's denominators away from zero.
    """
    transposed = x.shape[0] > x.shape[1]
    if transposed:  # the iteration commutes with transposition; X X^H is the smaller Gram matrix
        x = x.T
    if preconditioning == "frobenius":
        x = x / (jnp.linalg.norm(x, ord="fro") + eps)
    elif preconditioning == "spectral":
        x = x / (jnp.linalg.norm(x, ord=2) + eps)
    coeffs = ns_coeffs.astype(x.dtype)
    rows = [coeffs] * ns_steps if coeffs.ndim == 1 else list(coeffs)
    for i, row in enumerate(rows):
        first = preconditioning if i == 0 and preconditioning in ("aol", "schatten") else None
        x = _newton_schulz_step(x, row, first, eps)
    return x.T if transposed else x


# Compiled as one program also when called eagerly, so its rounding matches jitted code (the
# iteration amplifies rounding differences in the small singular values).
@functools.partial(jax.jit, static_argnames=("axes", "ns_steps", "preconditioning"), inline=True)
def orthogonalize(
    x: jax.Array,
    axes: tuple[tuple[int, ...], ...],
    ns_coeffs: jax.Array,
    ns_steps: int,
    preconditioning: str,
    eps: Any,
) -> jax.Array:
    """`newton_schulz` on each matrix of `x`: its batch axes, then reduction axes (flattened into
    rows), then output axes (flattened into columns); the result laid out as `x`."""
    batch, reduction, output = axes
    order = batch + reduction + output
    sizes = [math.prod(x.shape[a] for a in group) for group in axes]
    matrices = jnp.transpose(x, order).reshape(sizes)
    done = jax.vmap(lambda m: newton_schulz(m, ns_coeffs, ns_steps, preconditioning, eps))(matrices)
    return jnp.transpose(done.reshape([x.shape[a] for a in order]), tuple(int(a) for a in np.argsort(order)))


def as_ns_coeffs(value: Any) -> Any:
    """Newton-Schulz coefficients as a float32 array; a preset's name (`"standard"`, `"dion"`)
    as its coefficients. Anything else passes through, for the check to report."""
    if isinstance(value, str):
        if value not in NS_COEFFS_PRESETS:
            raise ValueError(
                f"Invalid ns_coeffs: {value!r} (the presets are {', '.join(map(repr, NS_COEFFS_PRESETS))})."
            )
        value = NS_COEFFS_PRESETS[value]
    if isinstance(value, jax.core.Tracer):
        return value
    try:
        return jnp.asarray(value, jnp.float32) if not isinstance(value, jax.Array) else value
    except (TypeError, ValueError):
        return value


def check_ns_coeffs(ns_coeffs: Any, ns_steps: Any, owner: str) -> None:
    """Shape `(3,)` or `(rows, 3)` with `rows <= ns_steps`, finite; `ns_steps` an integer >= 0."""
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, (int, np.integer)) or ns_steps < 0:
        raise ValueError(f"Invalid ns_steps: {ns_steps!r} (must be an integer >= 0) in {owner}.")
    shape = getattr(ns_coeffs, "shape", None)
    if shape is None or len(shape) not in (1, 2) or shape[-1] != 3:
        raise ValueError(
            f"Invalid ns_coeffs: {ns_coeffs!r} (must have shape (3,) or (steps, 3): the quintic's "
            f"coefficients, or one row of them per step) in {owner}."
        )
    if len(shape) == 2 and shape[0] > ns_steps:
        raise ValueError(
            f"Invalid ns_coeffs: {shape[0]} rows of coefficients for ns_steps={ns_steps} (as in optax, "
            f"there must be at most ns_steps rows; each row is one step) in {owner}."
        )
    if not isinstance(ns_coeffs, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(ns_coeffs))):
        raise ValueError(f"Invalid ns_coeffs: {np.asarray(ns_coeffs)} (must be finite) in {owner}.")


def _as_dims(value: Any) -> Any:
    """Converter of dimension-number fields: `None`, a function, or a static tree."""
    return None if value is None else as_static_tree(value)


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
            of it, or a function of the updates returning one.

    Example:
        >>> tx = modopt.chain(modopt.contrib.scale_by_muon(), modopt.scale_by_learning_rate(0.02))

    References: Jordan, 2024, "Muon", https://kellerjordan.github.io/posts/muon/ (and
    https://github.com/KellerJordan/modded-nanogpt); Bernstein & Newhouse, 2024, "Old Optimizer,
    New Norm: An Anthology", https://arxiv.org/abs/2409.20325
    """

    ns_coeffs: Any = eqx.field(default=DEFAULT_NS_COEFFS, converter=as_ns_coeffs)
    ns_steps: int = static(default=5)
    beta: Any = fields.decay_rate(0.95)
    eps: Any = fields.eps(1e-8)
    mu_dtype: Any = fields.dtype()
    nesterov: bool = static(default=True, kw_only=True)
    adaptive: bool = static(default=False, kw_only=True)
    preconditioning: str = choice("frobenius", PRECONDITIONINGS, kw_only=True)
    weight_dimension_numbers: Any = static(default=None, converter=_as_dims, kw_only=True)

    def __check_init__(self):
        check_ns_coeffs(self.ns_coeffs, self.ns_steps, type(self).__name__)

    def _axes(self, tree: Any) -> list[Any]:
        """Each leaf's `(batch, reduction, output)` axes, checked (errors name the path)."""
        owner = "scale_by_muon"
        shapes = [_shape(x) for x in jax.tree_util.tree_leaves(tree)]
        return [
            matrix_axes(shape, dims, where or "the root", owner)
            for shape, (where, dims) in zip(
                shapes, dimension_numbers_per_leaf(self.weight_dimension_numbers, tree, owner)
            )
        ]

    def init(self, params):
        self._axes(params)  # bad dimension numbers fail here, before any step
        # A copy of the coefficients: the state is donated to jitted steps, the transform may not be.
        return MuonState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like(params, self.mu_dtype),
            ns_coeffs=jnp.copy(self.ns_coeffs),
        )

    def update(self, updates, state, params=None, **extra_args):
        axes = self._axes(updates)
        mu = update_moment(updates, state.mu, self.beta, 1)
        count = safe_increment(state.count)
        mu_hat = debiased_mu(mu, updates, self.beta, count, self.nesterov)
        flat, treedef = jax.tree_util.tree_flatten(mu_hat)
        ortho = [
            orthogonalize(m, leaf_axes, self.ns_coeffs, self.ns_steps, self.preconditioning, self.eps)
            for m, leaf_axes in zip(flat, axes)
        ]
        if self.adaptive:  # <M, O> O: the dual norm of the momentum along O
            ortho = [jnp.sum(m.conj() * o) * o for m, o in zip(flat, ortho)]
        # The state records the coefficients used (a copy: it must not alias the transform).
        state = MuonState(count=count, mu=cast(mu, self.mu_dtype), ns_coeffs=jnp.copy(self.ns_coeffs))
        return treedef.unflatten(ortho), state

    def state_specs(self, params, param_specs):
        # The momentum is laid out as its parameter; Newton-Schulz reads whole matrices, and
        # XLA gathers what each product needs under jit.
        return MuonState(count=REPLICATED, mu=param_specs, ns_coeffs=REPLICATED)


class ScaleByShape(AbstractTransform):
    """Scales each orthogonalized matrix by a factor of its shape (part of `muon`).

    Without `consistent_rms`, by `sqrt(max(1, fan_out / fan_in))` (Jordan's width scaling);
    with it, by `sqrt(max(fan_in, fan_out)) * consistent_rms` (Liu et al., 2025), where `fan_in`
    and `fan_out` are the sizes of the reduction and output axes.

    Args:
        weight_dimension_numbers: as in `scale_by_muon` (static).
        consistent_rms: the target RMS of the updates, or `None` for width scaling.
    """

    weight_dimension_numbers: Any = static(default=None, converter=_as_dims)
    consistent_rms: Any = hyperparameter(None, check=fields.NONNEGATIVE)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        owner = "muon"
        flat, treedef = jax.tree_util.tree_flatten(updates)
        scaled = []
        for u, (where, dims) in zip(
            flat, dimension_numbers_per_leaf(self.weight_dimension_numbers, updates, owner)
        ):
            fan_in, fan_out = fans(u.shape, matrix_axes(u.shape, dims, where or "the root", owner))
            if self.consistent_rms is None:
                scale = jnp.sqrt(jnp.maximum(1, fan_out / fan_in))
            else:
                scale = jnp.sqrt(jnp.maximum(fan_in, fan_out)) * self.consistent_rms
            scaled.append(scale * u)
        return treedef.unflatten(scaled), state


@dataclasses.dataclass(frozen=True)
class MuonLabels:
    """`muon`'s labels of the parameters: "muon" where Muon applies, else "adam".

    By default the matrices (rank 2) are Muon's; with dimension numbers, every parameter with
    `MuonDimensionNumbers` is, and every one with `None` is Adam's.
    """

    dims: Any

    def __call__(self, params: Any) -> Any:
        flat, treedef = jax.tree_util.tree_flatten(params)
        if self.dims is None:
            return treedef.unflatten(["muon" if len(_shape(x)) == 2 else "adam" for x in flat])
        per_leaf = dimension_numbers_per_leaf(self.dims, params, "muon")
        return treedef.unflatten(["adam" if dims is None else "muon" for _, dims in per_leaf])


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
            the params returning one. A bad entry is an error naming its path.
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
    beta: Any = fields.decay_rate(0.95)
    eps: Any = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    weight_decay_mask: Any = fields.mask()
    mu_dtype: Any = fields.dtype()
    nesterov: bool = static(default=True, kw_only=True)
    adaptive: bool = static(default=False, kw_only=True)
    preconditioning: str = choice("frobenius", PRECONDITIONINGS, kw_only=True)
    adam_b1: Any = fields.decay_rate(0.9, kw_only=True)
    adam_b2: Any = fields.decay_rate(0.999, kw_only=True)
    adam_eps_root: Any = fields.eps(0.0, kw_only=True)
    adam_weight_decay: ScalarOrSchedule = fields.weight_decay(0.0, kw_only=True)
    adam_learning_rate: ScalarOrSchedule = fields.learning_rate(None, kw_only=True)
    muon_weight_dimension_numbers: Any = static(default=None, converter=_as_dims, kw_only=True)
    consistent_rms: Any = hyperparameter(None, check=fields.NONNEGATIVE, kw_only=True)

    def build(self):
        dims = self.muon_weight_dimension_numbers
        adam_learning_rate = (
            self.learning_rate if self.adam_learning_rate is None else self.adam_learning_rate
        )
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
        adam_part = AdamW(
            adam_learning_rate,
            self.adam_b1,
            self.adam_b2,
            self.eps,
            self.adam_eps_root,
            self.mu_dtype,
            self.adam_weight_decay,
            nesterov=self.nesterov,
        )
        return Partition({"muon": muon_part, "adam": adam_part}, MuonLabels(dims))


scale_by_muon = ScaleByMuon
muon = Muon
