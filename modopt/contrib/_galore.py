"""GaLore: an optimizer run on low-rank projections of matrix gradients (`scale_by_galore`,
`galore`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform, AbstractWrapper, as_transform
from .._core.fields import FINITE, POSITIVE_INTEGER, StaticTree, hyperparameter, static
from .._util.numerics import safe_increment
from .._core.specs import REPLICATED, padded
from .._util.trees import is_none
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..sharding._owners import (
    LeafUnits,
    UnitStacks,
    current_mesh,
    matrix_map,
    owner_spec,
    padded_length,
    per_unit,
    run_per_unit,
    specs_of,
    split_rows,
)
from ..sharding._shardings import split_further
from ..transforms import AddDecayedWeights, ScaleByAdam, ScaleByLearningRate
from .._core.fields import Scalar
from .._core.masks import MaskOrFn
from .._core.fields import dtype_field_names
from .._state.moments import state_dtype_for, store, update_dtype, widen
from jax.typing import DTypeLike


class GaLoreDimensionNumbers(NamedTuple):
    """Which axes of a parameter form the rows and the columns of the matrix GaLore projects.

    The parameter is transposed to `(*reduction axes, *output axes)` and reshaped to the
    matrix `(prod of reduction sizes, prod of output sizes)`; every axis must be in one of
    the two groups. For attention weights stored as `(embed, heads, head_dim)`,
    `GaLoreDimensionNumbers(reduction_axis=0, output_axis=(1, 2))` projects the
    `(embed, heads * head_dim)` matrix.

    reduction_axis: the axis or axes of the rows (the input dimension); negative counts from
        the end.
    output_axis: the axis or axes of the columns (the output dimension).
    """

    reduction_axis: Sequence[int] | int = 0
    output_axis: Sequence[int] | int = 1


class _Layout(NamedTuple):
    """How one parameter is seen as an `(m, n)` matrix, and which side is projected."""

    reduction: tuple[int, ...]  # the parameter's axes forming the rows
    output: tuple[int, ...]  # the parameter's axes forming the columns
    m: int
    n: int
    rank: int  # min(rank, m, n)

    @property
    def tall(self) -> bool:
        """More rows than columns: the owner scheme stacks it transposed, short side first."""
        return self.m > self.n

    @property
    def left(self) -> bool:
        """Project the rows (`P^T G`, `P` of shape `(m, rank)`) when `m >= n`; else the columns."""
        return self.m >= self.n

    def to_matrix(self, x: jax.Array) -> jax.Array:
        return x.transpose(self.reduction + self.output).reshape(self.m, self.n)

    def from_matrix(self, x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        order = self.reduction + self.output
        transposed = x.reshape(tuple(shape[axis] for axis in order))
        return transposed.transpose(sorted(range(len(order)), key=order.__getitem__))

    def projector_shape(self) -> tuple[int, int]:
        return (self.m, self.rank) if self.left else (self.n, self.rank)

    def proxy_shape(self) -> tuple[int, int]:
        return (self.rank, self.n) if self.left else (self.m, self.rank)


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    return tuple(a % ndim for a in ((axis,) if isinstance(axis, int) else axis))


def _layout(shape: tuple[int, ...], numbers: GaLoreDimensionNumbers, rank: int, path: str) -> _Layout:
    if len(shape) < 2:
        raise ValueError(f"GaLore projects parameters of rank >= 2; the one at {path} has shape {shape}.")
    reduction, output = _axes(numbers.reduction_axis, len(shape)), _axes(numbers.output_axis, len(shape))
    if set(reduction) & set(output):
        raise ValueError(
            f"GaLore: the reduction axes {reduction} and output axes {output} overlap for the parameter at "
            f"{path} of shape {shape} ({numbers})."
        )
    if sorted(reduction + output) != list(range(len(shape))):
        raise ValueError(
            f"GaLore: every axis must be a reduction or an output axis; reduction {reduction} and output "
            f"{output} do not cover the parameter at {path} of shape {shape}."
        )
    m, n = math.prod(shape[a] for a in reduction), math.prod(shape[a] for a in output)
    return _Layout(reduction, output, m, n, min(rank, m, n))


def _as_dimension_numbers(value: Any) -> Any:
    """Converter: `None` and functions stay; a `GaLoreDimensionNumbers` or a tree of them
    becomes a hashable `StaticTree` (it decides the shapes of the state)."""
    if value is None or isinstance(value, StaticTree) or (callable(value) and not isinstance(value, tuple)):
        return value
    return StaticTree(value)


def _is_numbers_leaf(x: Any) -> bool:
    return x is None or isinstance(x, GaLoreDimensionNumbers)


def _as_base_optimizer(value: Any) -> AbstractTransform:
    """Converter: `None` is `scale_by_adam()` (optax's default)."""
    return ScaleByAdam() if value is None else as_transform(value, "galore: base_optimizer")


class GaLoreState(NamedTuple):
    """The state of `scale_by_galore`.

    count: updates made so far (int32 scalar).
    base_optimizer_state: the base optimizer's state, built on the projected shapes: `(rank, n)`
        or `(m, rank)` for projected parameters, the parameter's shape for the others.
    projector: per parameter, the projection `(m, rank)` (rows) or `(n, rank)` (columns) of
        its matrix; `(0, 0)` for parameters that are not projected (in `projector_dtype` if set).
    """

    count: jax.Array
    base_optimizer_state: Any
    projector: Any


class ScaleByGalore(AbstractWrapper):
    r"""GaLore: runs a base optimizer on low-rank projections of matrix gradients.

    Each projected parameter is seen as an `(m, n)` matrix `G` (2-D parameters by default;
    see `weight_dimension_numbers`). With `r = min(rank, m, n)`, every `update_proj_gap`
    steps (at steps 0, `update_proj_gap`, ...) the projection `P` is recomputed from the SVD
    of the current gradient, `G = U S V^T` (in float32): `P = U[:, :r]` when `m >= n`, else
    `P = V[:, :r]`. Then

        R = P^T G   (m >= n)    or    R = G P   (m < n)
        N = base_optimizer(R)
        update = scale * P N    or    scale * N P^T

    The base optimizer's state (Adam's moments by default) has the projected shapes, `(r, n)`
    or `(m, r)`: the memory saving. Parameters that are not projected go through the base
    optimizer at full shape (without `scale`, as in optax). `update` ignores `params` and the
    base optimizer gets none: it must not need them (`scale_by_adam`, `scale_by_lion`,
    `sgd(1.0)`, ...; not `adamw`: use `galore`'s `weight_decay`). Extra arguments reach it.

    On a mesh (`modopt.sharding`'s owner scheme), each refresh's SVDs run one per owner device:
    a gradient matrix moves to its owner, and its projection (`(m, r)` or `(n, r)`, not a
    matrix of the parameter's size) moves from there to where the state keeps it, on refresh
    steps only, instead of every device gathering every matrix and computing every SVD.

    Sharding (`state_specs`): a projection `(m, r)` splits its `m` axis as the parameter
    splits its row axes, and `(n, r)` its `n` axis as the parameter's column axes. A group of
    several axes keeps the split of its first axis when the others are unsplit (the merged axis
    is then split in the same blocks), and is unsplit otherwise. The projected moments
    `(r, n)` / `(m, r)` split their `n` / `m` axis the same way. The mesh axes that split the
    dimension a state leaf lacks split it further where a dimension allows
    (`modopt.sharding.split_further`), so that no device holds it whole along them; the base
    optimizer places its state on those specs by its own rule. The
    `(0, 0)` placeholders and the count are replicated; parameters that are not projected
    keep the parameters' specs.

    Args:
        rank: the rank `r` of the projection, an integer >= 1 (static: it sets the shapes).
        update_proj_gap: steps between recomputations of the projections, an integer >= 1.
        scale: the factor of the projected-back updates (a finite number).
        base_optimizer: the transform run on the projected gradients (modopt or optax); `None`
            (the default) is `scale_by_adam()`.
        weight_dimension_numbers: which parameters are projected, and how (static): `None`
            projects the 2-D ones; one `GaLoreDimensionNumbers` applies to every parameter of
            rank >= 2; a pytree shaped like the params with a `GaLoreDimensionNumbers` or `None`
            (not projected) per leaf; or a function of the params returning such a pytree.
        projector_dtype: the dtype the projections are stored in (modopt's, keyword-only);
            `None` keeps the parameters' dtype. Set, the projection and the projection back are
            computed in float32 at least from the unrounded projection, which is rounded only
            when stored (see `fields.dtype`). The base optimizer's state takes its own state
            dtypes.

    Example:
        >>> tx = modopt.chain(modopt.contrib.scale_by_galore(rank=64), modopt.scale(-1e-3))

    Reference: Zhao et al., 2024, "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
    Projection", https://arxiv.org/abs/2403.03507
    """

    rank: int = static(default=128)
    update_proj_gap: Scalar = hyperparameter(200, check=POSITIVE_INTEGER)
    scale: Scalar = hyperparameter(1.0, check=FINITE)
    inner: AbstractTransform = eqx.field(default=None, converter=_as_base_optimizer)
    weight_dimension_numbers: Any = static(default=None, converter=_as_dimension_numbers)
    projector_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    inner_state_field = "base_optimizer_state"

    def __init__(
        self,
        rank: int = 128,
        update_proj_gap: Scalar = 200,
        scale: Scalar = 1.0,
        base_optimizer: Any = None,
        weight_dimension_numbers: Any = None,
        *,
        projector_dtype: DTypeLike | None = None,
    ):
        self.rank = rank
        self.update_proj_gap = update_proj_gap
        self.scale = scale
        self.inner = base_optimizer
        self.weight_dimension_numbers = weight_dimension_numbers
        self.projector_dtype = projector_dtype

    def __check_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int):
            raise TypeError(
                f"Invalid rank: {self.rank!r} of type {type(self.rank).__name__} (must be an int) in ScaleByGalore."
            )
        if self.rank < 1:
            raise ValueError(f"Invalid rank: {self.rank} (must be >= 1) in ScaleByGalore.")

    @property
    def base_optimizer(self) -> AbstractTransform:
        """The transform run on the projected gradients."""
        return self.inner

    def layouts(self, params: Any) -> list[_Layout | None]:
        """Per leaf of `params` (in flattening order), how it is projected, or `None`."""
        spec = self.weight_dimension_numbers
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        if spec is None:
            numbers = [GaLoreDimensionNumbers() if jnp.ndim(p) == 2 else None for _, p in flat]
        elif isinstance(spec, StaticTree) and isinstance(spec.tree, GaLoreDimensionNumbers):
            numbers = [spec.tree if jnp.ndim(p) >= 2 else None for _, p in flat]
        else:
            numbers = _per_leaf(spec(params) if callable(spec) else spec.tree, params)
        return [
            None
            if dims is None
            else _layout(tuple(jnp.shape(p)), dims, self.rank, jax.tree_util.keystr(path))
            for (path, p), dims in zip(flat, numbers)
        ]

    def _proxies_and_projectors(self, params):
        """The shapes the base optimizer sees, and the initial (zero) projections."""
        leaves, treedef = jax.tree_util.tree_flatten(params)
        proxies, projectors = [], []
        for p, layout in zip(leaves, self.layouts(params)):
            stored = state_dtype_for(self.projector_dtype, p.dtype)
            if layout is None:
                proxies.append(jnp.zeros_like(p))
                projectors.append(jnp.zeros((0, 0), stored))
            else:
                proxies.append(jnp.zeros(layout.proxy_shape(), p.dtype))
                projectors.append(jnp.zeros(layout.projector_shape(), stored))
        return treedef.unflatten(proxies), treedef.unflatten(projectors)

    def init(self, params):
        if not jax.tree_util.tree_leaves(params):
            return GaLoreState(jnp.zeros([], jnp.int32), self.inner.init(params), params)
        proxies, projectors = self._proxies_and_projectors(params)
        return GaLoreState(
            count=jnp.zeros([], jnp.int32),
            base_optimizer_state=self.inner.init(proxies),
            projector=projectors,
        )

    def update(self, updates, state, params=None, **extra_args):
        specs = specs_of(updates, params)  # where each gradient lies on a mesh
        del params
        dtype = self.projector_dtype
        refresh = state.count % self.update_proj_gap == 0
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        layouts = self.layouts(updates)
        # With `projector_dtype`, the projections are read (and made) in float32 at least, and
        # so are the gradients they project.
        old_projectors = treedef.flatten_up_to(widen(state.projector, dtype))
        widened = [g if layout is None else widen(g, dtype) for g, layout in zip(leaves, layouts)]
        mesh = current_mesh()

        if mesh is None:
            projectors = jax.lax.cond(
                refresh,
                lambda: [
                    p if layout is None else _svd_projector(layout.to_matrix(g), layout)
                    for g, p, layout in zip(widened, old_projectors, layouts)
                ],
                lambda: old_projectors,
            )
        else:
            # Every SVD on one owner device, its projection kept there in its stack; then each
            # device takes its rows of them, laid out as the state keeps them. Two conditionals:
            # the stacks are made whole between them (XLA fuses nothing across one), not fused
            # into every piece of the exchange.
            stacks, made = _projection_stacks(widened, layouts, specs, old_projectors, mesh)
            new = jax.lax.cond(refresh, lambda: _svd_on_owners(stacks, made, mesh), lambda: made)
            stored = specs_of(state.projector)
            projectors = jax.lax.cond(
                refresh, lambda: _taken_out(stacks, new, old_projectors, stored, mesh), lambda: old_projectors
            )
        projected = [
            g if layout is None else _project(layout.to_matrix(g), p, layout)
            for g, p, layout in zip(widened, projectors, layouts)
        ]
        low_rank, base_state = self.inner.update(
            treedef.unflatten(projected), state.base_optimizer_state, None, **extra_args
        )
        full = []
        for g, n, projector, layout in zip(leaves, treedef.flatten_up_to(low_rank), projectors, layouts):
            if layout is None:
                full.append(n)
                continue
            matrix = projector @ n if layout.left else n @ projector.T
            full.append((self.scale * layout.from_matrix(matrix, g.shape)).astype(update_dtype(g.dtype, dtype)))
        new_state = GaLoreState(
            count=safe_increment(state.count),
            base_optimizer_state=base_state,
            projector=store(treedef.unflatten(projectors), dtype),
        )
        return treedef.unflatten(full), new_state

    def state_specs(self, params, param_specs):
        if not jax.tree_util.tree_leaves(params):
            return GaLoreState(REPLICATED, self.inner.state_specs(params, param_specs), param_specs)
        treedef = jax.tree_util.tree_structure(params)
        leaves, specs = treedef.flatten_up_to(params), treedef.flatten_up_to(param_specs)
        proxy_specs, projector_specs = [], []
        for p, spec, layout in zip(leaves, specs, self.layouts(params)):
            if layout is None:
                proxy_specs.append(spec)
                projector_specs.append(REPLICATED)
                continue
            entries = padded(spec, len(p.shape))
            rows, columns = _group_entry(entries, layout.reduction), _group_entry(entries, layout.output)
            if layout.left:
                projector_spec, proxy_spec = PartitionSpec(rows, None), PartitionSpec(None, columns)
            else:
                projector_spec, proxy_spec = PartitionSpec(columns, None), PartitionSpec(rows, None)
            # The rank axis is no parameter's: the mesh axes that split the dimension projected
            # away split it (or the other dimension) instead, so that no device holds it all.
            projector_specs.append(split_further(projector_spec, layout.projector_shape(), entries))
            proxy_specs.append(split_further(proxy_spec, layout.proxy_shape(), entries))
        proxies = jax.eval_shape(lambda: self._proxies_and_projectors(params)[0])
        return GaLoreState(
            count=REPLICATED,
            base_optimizer_state=self.inner.state_specs(proxies, treedef.unflatten(proxy_specs)),
            projector=treedef.unflatten(projector_specs),
        )


def _svd_projector(matrix: jax.Array, layout: _Layout) -> jax.Array:
    """The top-`rank` left (`m >= n`) or right singular vectors of `matrix`, in its dtype."""
    u, _, vh = jnp.linalg.svd(matrix.astype(jnp.float32), full_matrices=False)
    vectors = u[:, : layout.rank] if layout.left else vh[: layout.rank, :].T
    return vectors.astype(matrix.dtype)


def _project(matrix: jax.Array, projector: jax.Array, layout: _Layout) -> jax.Array:
    return projector.T @ matrix if layout.left else matrix @ projector


class _Stacks(NamedTuple):
    """GaLore's projected leaves as stacks of the owner scheme (`modopt.sharding.run_per_unit`):
    a unit per gradient matrix, stacked by shape (up to a transpose), rank and dtype."""

    stacks: UnitStacks
    leaves: list
    layouts: list


# A stack holds its matrices the short side first, so that (m, n) and (n, m) weights share one
# (both projections are max(m, n) x rank): the stack's units split over the devices as one,
# where the two kinds would each be padded to the device count and the padding units' SVDs
# would double a device's work. Each SVD still runs on its matrix as the parameter lays it out
# (a tall one is transposed back first): one device's numbers, down to the signs of the
# singular vectors, which the moments' basis depends on. What a unit asks of its owner:
_PADDING, _AS_STORED, _TRANSPOSED = 0, 1, 2


def _projection_stacks(grads: list, layouts: list, specs: list, old: list, mesh: Any) -> tuple[_Stacks, list]:
    """The stacks of the projected leaves, and per stack a zero state of its projections (a
    `max(m, n) x rank` matrix per unit, padded as the owners split it)."""
    kinds, leaves = [], []
    for g, layout, spec in zip(grads, layouts, specs):
        if layout is None:
            kinds.append(None)
            leaves.append(None)
            continue
        kinds.append(((min(layout.m, layout.n), max(layout.m, layout.n)), layout.rank, jnp.result_type(g)))
        leaves.append(LeafUnits((g,), matrix_map(g.shape, (), layout.reduction, layout.output, swap=layout.tall), spec))
    stacks = UnitStacks(kinds, [1] * len(kinds))
    made = []
    for s, members in enumerate(stacks.members):
        leaf = members[0]
        zeros = jnp.zeros((padded_length(stacks.size(s), mesh), *layouts[leaf].projector_shape()), old[leaf].dtype)
        made.append(jax.lax.with_sharding_constraint(zeros, NamedSharding(mesh, owner_spec(len(zeros), mesh))))
    return _Stacks(stacks, leaves, layouts), made


def _svd_on_owners(stacks: _Stacks, made: list, mesh: Any) -> list:
    """New projections, each SVD run on one owner device: the gradient matrix moves to its
    owner, and its projection stays there as its stack's state (where a matrix-shaped output
    would bring back `m x n`). A padding unit (code 0: the owner scheme pads with zeros) runs no
    SVD, and its projection stays zero."""
    layouts = stacks.layouts
    codes = [None if layout is None else jnp.full((1,), _TRANSPOSED if layout.tall else _AS_STORED, jnp.int32) for layout in layouts]
    orientations = [{layouts[leaf].tall for leaf in members} for members in stacks.stacks.members]

    def work(kinds, pieces, states):
        new = []
        for ((short, long), rank, _), (x, code), state, found in zip(kinds, pieces, states, orientations):
            like = jax.ShapeDtypeStruct(state.shape[1:], state.dtype)
            unit = functools.partial(_unit_projection, short=short, long=long, rank=rank, found=found, like=like)
            # Batched (`vmap`), the switch would run every branch: a stack of both orientations runs its units one by one.
            new.append(per_unit(unit, len(x), x, code, sequential=len(found) > 1))
        return [() for _ in kinds], new

    return run_per_unit(work, stacks.stacks, stacks.leaves, made, mesh, extras=codes)[1]


def _unit_projection(matrix, code, *, short: int, long: int, rank: int, found: set, like: jax.ShapeDtypeStruct) -> jax.Array:
    """The projection of one unit of a `(short, long)` stack (shaped and typed `like`), by its
    code: zero for padding, else its SVD's, the matrix as stored or transposed back (the
    branches of the orientations the stack does not hold are zero too)."""
    zeros = lambda: jnp.zeros(like.shape, like.dtype)  # noqa: E731
    as_stored = lambda: _svd_projector(matrix, _Layout((0,), (1,), short, long, rank)).astype(like.dtype)  # noqa: E731
    transposed = lambda: _svd_projector(matrix.T, _Layout((0,), (1,), long, short, rank)).astype(like.dtype)  # noqa: E731
    # By code: _PADDING, _AS_STORED, _TRANSPOSED.
    return jax.lax.switch(code, [zeros, as_stored if False in found else zeros, transposed if True in found else zeros])


def _taken_out(stacks: _Stacks, new: list, old: list, stored: list, mesh: Any) -> list:
    """Each leaf's projection out of its stack, laid out as the state keeps it (`stored`): each
    device first takes its rows of every projection (`split_rows`; a unit taken out of a stack
    split along its units is gathered whole to every device)."""
    rows = stacks.stacks.unstack([x if (split := split_rows(x, mesh)) is None else split for x in new])
    projectors = []
    for p, layout, spec, row in zip(old, stacks.layouts, stored, rows):
        if layout is not None:
            p = row[0] if spec is None else jax.lax.with_sharding_constraint(row[0], NamedSharding(mesh, spec))
        projectors.append(p)
    return projectors


def _group_entry(entries: tuple, axes: tuple[int, ...]) -> Any:
    """The split of the axis merging `axes`: the first axis's, if the others are unsplit."""
    if all(entries[axis] is None for axis in axes[1:]):
        return entries[axes[0]]
    return None


def _per_leaf(numbers: Any, params: Any) -> list[GaLoreDimensionNumbers | None]:
    """A tree of dimension numbers (shaped like the params, `None` for leaves not projected)
    as one entry per leaf of `params`, with a clear error when the structures differ."""
    treedef = jax.tree_util.tree_structure(params)
    try:
        aligned = jax.tree_util.tree_map(
            lambda p, d: None if p is None else d, params, numbers, is_leaf=is_none
        )
        per_leaf = treedef.flatten_up_to(aligned)
    except (ValueError, TypeError) as error:
        raise ValueError(
            "GaLore: weight_dimension_numbers must be shaped like the parameters, with a GaLoreDimensionNumbers "
            f"or None per leaf ({error})."
        ) from None
    for (path, _), entry in zip(jax.tree_util.tree_flatten_with_path(params)[0], per_leaf):
        if not _is_numbers_leaf(entry):
            raise ValueError(
                f"GaLore: weight_dimension_numbers has {entry!r} for the parameter at "
                f"{jax.tree_util.keystr(path)} (expected a GaLoreDimensionNumbers or None)."
            )
    return per_leaf


class Galore(AbstractComposite):
    r"""GaLore: memory-efficient training of full parameters through low-rank gradients.

    The gradients of matrices are projected onto the top-`rank` singular subspace of a recent
    gradient (recomputed every `update_proj_gap` steps), the base optimizer (Adam by default)
    runs there with states of the projected size, and its updates are projected back (see
    `scale_by_galore`). Then, as AdamW:

        params -= learning_rate * (scale * P N + weight_decay * params)

    For an `(m, n)` matrix with `m >= n` and rank `r`, Adam keeps `2 r n` numbers instead of
    `2 m n`, plus the projection `m r`.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        rank: the rank of the projections, an integer >= 1 (static).
        update_proj_gap: steps between recomputations of the projections, an integer >= 1.
        scale: the factor of the projected-back updates (a finite number).
        base_optimizer: the gradient transform run in the projected space, which must not need
            the parameters (`scale_by_adam`, not `adamw`); `None` is `scale_by_adam()`. If it
            has its own learning rate, set `learning_rate=1.0` here.
        weight_decay: the coefficient of decoupled weight decay, applied at full shape (a number
            or a schedule).
        mask: which parameters the decay applies to: `None` for all, a pytree of bools shaped
            like a prefix of the params, or a function of the params returning one.
        weight_dimension_numbers: which parameters are projected and how (see
            `scale_by_galore`); `None` projects the 2-D ones (static).
        mu_dtype: the dtype of the base optimizer's first moment (modopt's, keyword-only):
            passed on to the base optimizer (Adam by default), which must take it; `None`
            leaves the base optimizer's own.
        nu_dtype: the dtype of the base optimizer's second moment (keyword-only), likewise.
        projector_dtype: the dtype of the projections (keyword-only; see `scale_by_galore`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.galore(1e-2, rank=16), model)

    Reference: Zhao et al., 2024, "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
    Projection", https://arxiv.org/abs/2403.03507
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    rank: int = static(default=128)
    update_proj_gap: Scalar = hyperparameter(200, check=POSITIVE_INTEGER)
    scale: Scalar = hyperparameter(1.0, check=FINITE)
    base_optimizer: AbstractTransform = eqx.field(default=None, converter=_as_base_optimizer)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()
    weight_dimension_numbers: Any = static(default=None, converter=_as_dimension_numbers)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    projector_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        self._base_with_dtypes()  # a base optimizer without the dtypes given is an error now

    def _base_with_dtypes(self) -> AbstractTransform:
        """The base optimizer, with the `mu_dtype` and `nu_dtype` given (those not `None`)."""
        base = self.base_optimizer
        changes = {name: value for name, value in (("mu_dtype", self.mu_dtype), ("nu_dtype", self.nu_dtype)) if value is not None}
        if not changes:
            return base
        for name, value in changes.items():
            if name not in dtype_field_names(base):
                raise ValueError(
                    f"Invalid {name}: {value} (the base_optimizer {type(base).__name__} takes no {name}; give it "
                    f"to the base optimizer, or leave it None) in Galore."
                )
        try:
            return dataclasses.replace(base, **changes)
        except TypeError:
            raise ValueError(
                f"Invalid {', '.join(changes)}: the base_optimizer {type(base).__name__} cannot be rebuilt with "
                "them; give them to the base optimizer instead, in Galore."
            ) from None

    def build(self):
        return Chain(
            ScaleByGalore(
                self.rank,
                self.update_proj_gap,
                self.scale,
                self._base_with_dtypes(),
                self.weight_dimension_numbers,
                projector_dtype=self.projector_dtype,
            ),
            AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByLearningRate(self.learning_rate),
        )


scale_by_galore = ScaleByGalore
galore = Galore
