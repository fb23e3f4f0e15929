"""Muon's matrix machinery, shared by Muon and its variants (NorMuon, AdaMuon).

Which axes of a weight form the matrix (`MuonDimensionNumbers`), Newton-Schulz orthogonalization
of each matrix, the scaling of orthogonalized matrices by their shape (`ScaleByShape`), and the
labels that send matrices to Muon and everything else to Adam (`MuonLabels`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import fields
from .._core.base import AbstractTransform, init_empty_state
from .._core.checks import prefix_difference
from .._core.fields import StaticTree, as_static_tree, hyperparameter, static
from .._core.fields import Scalar
from .._util.numerics import overflow_scale
from ..sharding._owners import LeafUnits, UnitMap, UnitStacks, current_mesh, matrix_map, run_per_unit

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

    Attributes:
        reduction_axis: the axis, or a sequence of axes, contracted with the input.
        output_axis: the axis, or a sequence of axes, of the output.
    """

    reduction_axis: Sequence[int] | int = 0
    output_axis: Sequence[int] | int = 1


def _is_dims_leaf(x: Any) -> bool:
    # optax's MuonDimensionNumbers (a NamedTuple with the same fields) is accepted too.
    return (
        x is None
        or isinstance(x, MuonDimensionNumbers)
        or getattr(x, "_fields", None) == MuonDimensionNumbers._fields
    )


def shape_of(x: Any) -> tuple[int, ...]:
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


def matrix_axes_per_leaf(spec: Any, tree: Any, owner: str) -> list[tuple[tuple[int, ...], ...]]:
    """Each leaf's `(batch axes, reduction axes, output axes)`, checked (errors name the path).

    Args:
        spec: the weight dimension numbers, as `dimension_numbers_per_leaf` takes them.
        tree: the parameters or updates (arrays, abstract arrays or numbers).
        owner: the transform's name, for errors.
    """
    shapes = [shape_of(x) for x in jax.tree_util.tree_leaves(tree)]
    return [
        matrix_axes(shape, dims, where or "the root", owner)
        for shape, (where, dims) in zip(shapes, dimension_numbers_per_leaf(spec, tree, owner))
    ]


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
    # Every preconditioning divides by a norm, so a power of two scales nothing but huge
    # entries (beyond 2**16 in float32), whose squares would overflow: by exactly 1 otherwise.
    # Where the scale is 1, `x / norm` is computed as it stands: the same program as optax's,
    # so that the products round alike (multiplying by 1 changes no number, but XLA's program).
    scale = overflow_scale(x, bound=jnp.finfo(x.dtype).maxexp // 8)
    if preconditioning in ("frobenius", "spectral"):
        norm = jnp.linalg.norm(x * scale, ord="fro" if preconditioning == "frobenius" else 2)
        x = jnp.where(scale == 1, x / (norm / scale + eps), x * scale / (norm + eps))
    else:
        x = x * scale
    coeffs = ns_coeffs.astype(x.dtype)
    steps = ns_steps if coeffs.ndim == 1 else coeffs.shape[0]
    if steps and preconditioning in ("aol", "schatten"):  # the first step rescales X
        x = _newton_schulz_step(x, coeffs if coeffs.ndim == 1 else coeffs[0], preconditioning, eps)
        steps, coeffs = steps - 1, coeffs if coeffs.ndim == 1 else coeffs[1:]
    # The plain steps as an unrolled loop (optax's program: the same rounding).
    if steps and coeffs.ndim == 1:
        x = jax.lax.fori_loop(0, steps, lambda _, x: _newton_schulz_step(x, coeffs), x, unroll=True)
    elif steps:
        x, _ = jax.lax.scan(lambda x, row: (_newton_schulz_step(x, row), None), x, coeffs)
    return x.T if transposed else x


def matrix_units(shape: tuple[int, ...], axes: tuple[tuple[int, ...], ...], *, swap: bool = False) -> UnitMap:
    """The matrices of a weight of `shape` as units `(batch, rows, cols)`: its batch axes
    flattened, its reduction axes flattened into rows, its output axes into columns (`swap`:
    each matrix transposed)."""
    return matrix_map(tuple(shape), *axes, swap=swap)


# Compiled as one program also when called eagerly, so its rounding matches jitted code (the
# iteration amplifies rounding differences in the small singular values).
@functools.partial(jax.jit, static_argnames=("ns_steps", "preconditioning"), inline=True)
def _newton_schulz_stack(units: jax.Array, ns_coeffs: jax.Array, ns_steps: int, preconditioning: str, eps: Any) -> jax.Array:
    return jax.vmap(lambda m: newton_schulz(m, ns_coeffs, ns_steps, preconditioning, eps))(units)


def orthogonalize(
    x: jax.Array,
    axes: tuple[tuple[int, ...], ...],
    ns_coeffs: jax.Array,
    ns_steps: int,
    preconditioning: str,
    eps: Any,
) -> jax.Array:
    """`newton_schulz` on each matrix of `x` (see `matrix_units`); the result laid out as `x`."""
    units = matrix_units(x.shape, _as_stored(x.ndim, axes, preconditioning))
    return units.from_units(_newton_schulz_stack(units.to_units(x), ns_coeffs, ns_steps, preconditioning, eps))


def _as_stored(ndim: int, axes: tuple[tuple[int, ...], ...], preconditioning: str) -> tuple[tuple[int, ...], ...]:
    """A matrix's axes as it is stored, whichever axis reduces: Newton-Schulz commutes with
    transposition, and so do these preconditionings (optax's order of operations, so that the
    rounding is the same; AOL scales rows, so there the orientation changes the result)."""
    return ((), (0,), (1,)) if ndim == 2 and preconditioning != "aol" else axes


def orthogonalize_leaves(
    leaves: list[jax.Array],
    axes: list[tuple[tuple[int, ...], ...]],
    ns_coeffs: jax.Array,
    ns_steps: int,
    preconditioning: str,
    eps: Any,
    specs: list[Any] | None = None,
) -> list[jax.Array]:
    """`orthogonalize` on every leaf; on a mesh, each matrix on one owner device.

    On a mesh (`modopt.sharding`'s owner scheme), the matrices of all leaves are stacked by
    shape, a matrix taller than wide as its transpose (Newton-Schulz transposes it anyway:
    the numbers are the same), and each stack is split over the devices: each matrix moves to
    its owner and its orthogonalization back, and no device repeats another's iterations.
    Without a mesh, the matrices of one shape are stacked too and orthogonalized in one batched
    program (`orthogonalize`'s numbers; on an accelerator, a few large kernels instead of a
    chain of small ones per leaf).

    Args:
        leaves: the arrays to orthogonalize.
        axes: each leaf's `(batch, reduction, output)` axes.
        ns_coeffs, ns_steps, preconditioning, eps: as in `newton_schulz`.
        specs: each leaf's `PartitionSpec` on the mesh, where known (`modopt.sharding.spec_of`).
    """
    mesh = current_mesh()
    specs = [None] * len(leaves) if specs is None else specs
    work, kinds = [], []
    for x, a, spec in zip(leaves, axes, specs):
        if mesh is None:
            # The matrices as `orthogonalize` takes them, so that the numbers are the same.
            units = matrix_units(x.shape, _as_stored(x.ndim, a, preconditioning))
        else:
            units = matrix_units(x.shape, a)
            rows, cols = units.unit_shape
            units = units._replace(swap=rows > cols)
        work.append(LeafUnits((x,), units, spec))
        kinds.append(None if x.size == 0 else (units.unit_shape, jnp.result_type(x)))

    def newton_schulz_stacks(kinds, pieces, states):
        return [(_newton_schulz_stack(x, ns_coeffs, ns_steps, preconditioning, eps),) for (x,) in pieces], states

    stacks = UnitStacks(kinds, [leaf.units.count for leaf in work])
    work = [w if k is not None else None for w, k in zip(work, kinds)]
    done, _ = run_per_unit(newton_schulz_stacks, stacks, work, None, mesh, stacked=True)
    # A leaf without elements has nothing to orthogonalize.
    return [x if result is None else result[0] for x, result in zip(leaves, done)]


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


def as_dimension_numbers(value: Any) -> Any:
    """Converter of dimension-number fields: `None`, a function, or a static tree."""
    return None if value is None else as_static_tree(value)


class ScaleByShape(AbstractTransform):
    """Scales each orthogonalized matrix by a factor of its shape (part of `muon`).

    Without `consistent_rms`, by `sqrt(max(1, fan_out / fan_in))` (Jordan's width scaling);
    with it, by `sqrt(max(fan_in, fan_out)) * consistent_rms` (Liu et al., 2025), where `fan_in`
    and `fan_out` are the sizes of the reduction and output axes.

    Args:
        weight_dimension_numbers: as in `scale_by_muon` (static).
        consistent_rms: the target RMS of the updates, or `None` for width scaling.
        owner: the optimizer's name, for errors (static).
    """

    weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers)
    consistent_rms: Scalar | None = hyperparameter(None, check=fields.NONNEGATIVE)
    owner: str = static(default="muon", kw_only=True)
    dimension_numbers_field: ClassVar[str] = "weight_dimension_numbers"  # set from the model by `modopt.Optimizer` where None

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        flat, treedef = jax.tree_util.tree_flatten(updates)
        scaled = []
        for u, axes in zip(flat, matrix_axes_per_leaf(self.weight_dimension_numbers, updates, self.owner)):
            fan_in, fan_out = fans(u.shape, axes)
            if self.consistent_rms is None:
                # A matrix without columns has an empty update: any factor serves.
                scale = jnp.sqrt(jnp.maximum(1, fan_out / fan_in if fan_in else 1))
            else:
                scale = jnp.sqrt(jnp.maximum(fan_in, fan_out)) * self.consistent_rms
            scaled.append(scale * u)
        return treedef.unflatten(scaled), state


@dataclasses.dataclass(frozen=True)
class MuonLabels:
    """`muon`'s (and its variants') labels of the parameters: "muon" where Muon applies, else "adam".

    By default the matrices (rank 2) are Muon's; with dimension numbers, every parameter with
    `MuonDimensionNumbers` is, and every one with `None` is Adam's.
    """

    dims: Any
    owner: str = "muon"  # the optimizer's name, for errors

    def __call__(self, params: Any) -> Any:
        flat, treedef = jax.tree_util.tree_flatten(params)
        if self.dims is None:
            return treedef.unflatten(["muon" if len(shape_of(x)) == 2 else "adam" for x in flat])
        per_leaf = dimension_numbers_per_leaf(self.dims, params, self.owner)
        return treedef.unflatten(["adam" if dims is None else "muon" for _, dims in per_leaf])
