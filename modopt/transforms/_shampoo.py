"""Shampoo with grafting: blocked Kronecker-factored preconditioners (distributed Shampoo)."""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import fields
from .._core.base import AbstractTransform, require_params
from .._core.fields import (
    FINITE,
    NONNEGATIVE,
    NONNEGATIVE_INTEGER,
    POSITIVE,
    POSITIVE_INTEGER,
    UNIT,
    choice,
    hyperparameter,
    is_concrete,
    static,
)
from .._core.fields import Scalar
from .._state.moments import init_state, update_dtype, widen
from .._util.numerics import overflow_exponent, power_of_two, safe_increment, scaled_norm
from ._kernel_views import kernel_views
from .._core.specs import OWNED, REPLICATED
from .._core.specs import padded as spec_entries
from ..linalg import matrix_inverse_pth_root
from ..sharding._owners import LeafUnits, UnitMap, UnitStacks, current_mesh, run_per_unit, specs_of
from ._newton_schulz import as_dimension_numbers
from jax.sharding import NamedSharding, PartitionSpec
from jax.typing import DTypeLike

GRAFT_TYPES = ("sgd", "adagrad", "rmsprop", "rmsprop_normalized", "adagrad_normalized", "sqrt_n", "none")
# The reference's `GraftingType` numbers, so `graft_type=GraftingType.ADAGRAD` ports unchanged.
_GRAFT_NUMBERS = {
    0: "none",
    1: "sgd",
    2: "adagrad",
    3: "rmsprop",
    4: "rmsprop_normalized",
    5: "sqrt_n",
    6: "adagrad_normalized",
}
_DIAGONAL_GRAFTS = ("adagrad", "rmsprop", "rmsprop_normalized", "adagrad_normalized")
_TINY = 1e-25  # keeps norms' quotients finite (the reference's constant)
_RETRIES = 5  # restarts of an inverse root with 10x the damping while its error exceeds 0.05
_RETRY_ERROR = 0.05
# Gradients' entries are brought within 2**16 before their products are summed into statistics
# (which the roots square again): see `ScaleByShampoo._statistics`.
_BOUND = 16
# Without a mesh, the statistics of at most this size (above 1) are padded to the largest of
# them and share one batched inverse root (whatever their roots): each distinct batch is a program of its
# own, which takes seconds to compile, and a model's biases and small blocks come in many sizes.
_SMALL = 64


def as_graft_type(value: Any) -> Any:
    """Converter: a graft type's name (any case), or the reference's `GraftingType` number."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return _GRAFT_NUMBERS.get(int(value), value)
    return value.lower() if isinstance(value, str) else value


def merge_small_dims(shape: tuple[int, ...], max_dim: int) -> tuple[int, ...]:
    """`shape` with runs of neighbouring dimensions merged while their product is at most
    `max_dim`: `(1, 2, 512, 1, 2048, 1, 3, 4)` becomes `(1024, 2048, 12)` for `max_dim=1024`.
    Unit dimensions vanish (all-unit shapes become `(1,)`)."""
    if shape and all(d == 1 for d in shape):
        return (1,)
    merged, product = [], 1
    for d in shape:
        if product * d <= max_dim:
            product *= d
            continue
        if product > 1:
            merged.append(product)
        product = d
    if product > 1:
        merged.append(product)
    return tuple(merged)


class _Layout(NamedTuple):
    """How one parameter is cut into blocks (static: from its shape and the configuration).

    The parameter is reshaped to `shape`, each dimension `j` zero-padded to `counts[j] *
    sizes[j]` and cut into `counts[j]` pieces of `sizes[j]`; the `prod(counts)` blocks, in
    row-major order of the block grid, stack along a leading axis. `valid[j][n]` is the true
    extent along `j` of block `n` (smaller than `sizes[j]` only for the last, padded pieces).
    """

    shape: tuple[int, ...]
    counts: tuple[int, ...]
    sizes: tuple[int, ...]
    valid: tuple[np.ndarray, ...]

    @property
    def blocks(self) -> int:
        return math.prod(self.counts)

    @property
    def padded(self) -> tuple[bool, ...]:
        """Per dimension, whether some block is padded along it."""
        return tuple(bool(np.any(v < s)) for v, s in zip(self.valid, self.sizes))

    def units(self, shape: tuple[int, ...], boxed: bool = False) -> UnitMap:
        """The blocks of a parameter of `shape` as units of the owner scheme (`modopt.sharding`):
        `(blocks, *sizes)`; with `boxed`, each dimension whose blocks are boxes of the parameter's
        own axes (a run of whole slices of one axis by the axes after it; not padded) is kept as
        those axes, so a unit is `(blocks, *box)` (a reshape of the block), whose dimensions
        follow the parameter's sharding."""
        groups, pieces, sizes, counted, start = [], [], [], [], 0
        for k, (d, n, s) in enumerate(zip(self.shape, self.counts, self.sizes)):
            end, product = start + 1, shape[start]  # the parameter's axes merged into dimension k
            while end < len(shape) and (product < d or k == len(self.shape) - 1):
                product, end = product * shape[end], end + 1
            cut = _box(shape[start:end], n, s) if boxed else None
            if cut is None:
                groups.append(end - start)
                pieces.append(n)
                sizes.append(s)
            else:  # the axes before the first one of the box are cut into single slices
                first = next(i for i, (p, size) in enumerate(cut) if size > 1 or i == len(cut) - 1)
                counted += [len(groups) + i for i in range(first)]
                groups += [1] * len(cut)
                pieces += [p for p, _ in cut]
                sizes += [size for _, size in cut]
            start = end
        return UnitMap(
            tuple(shape), tuple(range(len(shape))), tuple(groups), tuple(pieces), tuple(sizes), tuple(counted)
        )

    def box(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of a unit of `units(shape, boxed=True)`."""
        return self.units(shape, boxed=True).unit_shape

    def split(self, x: jax.Array) -> jax.Array:
        """A parameter-shaped array as its stack of blocks, `(blocks, *sizes)`."""
        return self.units(x.shape).to_units(x)

    def merge(self, blocks: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """The inverse of `split`: a stack of blocks back as an array of `shape`."""
        return self.units(tuple(shape)).from_units(blocks)


class _Kind(NamedTuple):
    """What the blocks of one stack share (see `ScaleByShampoo`'s sharding rule): the block's
    shape, the root, per dimension whether some block is padded (its roots are masked), and the
    shape the block moves in (`_Layout.units`). A block taller than wide is stacked as its
    transpose, with its masks reversed. Blocks of parameters with other block grids (a model's
    attention, MLP, embedding and head matrices) stack together: one stack of many blocks splits
    over the devices more evenly than several short ones."""

    sizes: tuple[int, ...]
    exponent: int
    padded: tuple[bool, ...]
    box: tuple[int, ...]


class ScaleByShampooState(NamedTuple):
    """The state of `scale_by_shampoo`.

    count: updates made so far (int32 scalar).
    statistics: the blocks' statistics, stacked: one entry per kind of block (the same shape,
        root and padding, from any parameters; see `ScaleByShampoo`'s sharding rule), in the order of the first parameter of each kind; an entry is a tuple
        with one float32 array `(n, size_j, size_j)` per dimension `j` of the block, stacking
        the decayed sums of the Gram matrices along `j` of the kind's `n` blocks (parameter by
        parameter, in the order of the parameters, each parameter's blocks in row-major order
        of its block grid). A block taller than wide is stacked as its transpose: its two
        statistics in reverse order. `ScaleByShampoo.unstacked` gives them per parameter.
    preconditioners: the inverse roots of `statistics` (same layout).
    diagonal_statistics: the grafting optimizer's sums of squared gradients (Adagrad, RMSProp
        and their normalized variants), like the params (in `nu_dtype` if set); `None` for the
        other graft types.
    diagonal_momentum: the momentum of the grafting updates, like the params (in `mu_dtype` if set).
    momentum: the momentum of the Shampoo updates, like the params (in `mu_dtype` if set).
    log2_scales: per stack of `statistics`, an int32 array `(n,)`: each block's statistics
        are stored divided by `2**log2_scale` (an even number, 0 unless a gradient's entries
        exceeded `2**16`: squared, they would overflow float32; see `ScaleByShampoo`).
    diagonal_log2_scales: with `diagonal_statistics`, an int32 scalar per parameter: they are
        stored divided by `2**log2_scale` (even, 0 unless the grafted gradient's entries
        exceeded `2**32`); `None` for the other graft types.
    """

    count: jax.Array
    statistics: Any
    preconditioners: Any
    diagonal_statistics: Any
    diagonal_momentum: Any
    momentum: Any
    log2_scales: Any
    diagonal_log2_scales: Any


class ScaleByShampoo(AbstractTransform):
    r"""Scales updates by Shampoo's blocked Kronecker-factored preconditioner, grafted onto the
    layer-wise step size of a first-order method (distributed Shampoo).

    Each parameter is reshaped (small neighbouring dimensions merged, see
    `best_effort_shape_interpretation`, or a kernel's matrix, see Layout below) to `k`
    dimensions and cut into blocks of at most `block_size` along each. Per block `G` and
    dimension `j`, the statistic is

        L_j <- beta2 L_j + (1 - beta2) G_(j) G_(j)^T       (beta2 = 1: plain sums)

    (`G_(j)`: `G` unfolded along `j`), started at `matrix_epsilon * I`, updated every
    `statistics_compute_steps` steps. Every `preconditioning_compute_steps` steps the
    preconditioners are recomputed, `P_j = (L_j + matrix_epsilon * lambda_max(L_j) I)^(-1/p)`
    with `p = 2k` (or `exponent_override`) by `modopt.linalg.matrix_inverse_pth_root`; a root
    whose error is NaN or at least `inverse_failure_threshold` is discarded (the old one kept).
    The Shampoo direction is `S = G x_1 P_1 ... x_k P_k`, block by block, rescaled per parameter
    to the norm of the grafting update `D` (`sgd`: `g`; `adagrad`: `g / (sqrt(sum g^2) +
    diagonal_epsilon)`; `rmsprop`: the same with `beta2`-decayed sums; `*_normalized`: of
    `g / ||g||`; `sqrt_n`: `sign(g)`; `none`: no rescaling): `S <- S ||D|| / ||S||`. With
    (coupled) weight decay `wd`, `S += wd * params` and `D += wd * params`. Both get a momentum,

        m_S <- beta1 m_S + w S,    m_D <- beta1 m_D + w D    (w = 1, or 1 - beta1 with
                                                               `moving_average_for_momentum`),

    and the update is `m_S` from step `start_preconditioning_step` on and `m_D` before
    (with `nesterov`: `w S + beta1 m_S`, resp. `w D + beta1 m_D`). Scalars and parameters with a
    dimension above `skip_preconditioning_dim_size_gt` take the grafting update.

    Huge gradients: a statistic sums products of the gradient's entries, which overflow
    float32 beyond about `1e19`. Each block's statistics are kept with a power-of-two scale
    (the state's `log2_scales`, 0 for ordinary gradients): where a gradient block's entries
    exceed `2**16`, the block and its stored statistics are scaled down by a power of two
    before the products are summed, and the inverse roots (of the statistics the scale stands
    for) scaled back. The statistics stay finite, the numbers of ordinary gradients are
    unchanged (a scale of 1 changes no bit), and the update for gradients `c * g` is that for
    `g` times `c` with SGD grafting (`||D||` scales, `S`'s direction does not), or the same with
    Adagrad, normalized and `sqrt_n` grafting, up to the damping `matrix_epsilon` and rounding. The
    norms of the grafting use a scaled copy too, and Adagrad and RMSProp grafting's sums of
    squares a power-of-two scale per parameter (`diagonal_log2_scales`).

    Layout: a matrix is preconditioned on both sides, so `(in, out)` and `(out, in)` storage
    give the same update, transposed. A kernel of higher rank is merged in its stored axis
    order by default (the reference's rule, written for Flax's `(*spatial, in, out)`: `(3, 3,
    16, 32)` becomes `(144, 32)`); that would make Equinox's `(out, in, *spatial)` kernel
    `(32, 16, 3, 3)` the matrix `(1536, 3)`. With `weight_dimension_numbers`, a kernel is its
    layer's matrix instead, the reduction axes merged into one side and the output axes into
    the other (`(32, 144)`), which then goes through the rules of a matrix of that shape
    (merged into a vector if within `merge_small_dims_block_size`, blocked);
    `modopt.Optimizer(tx, model)` (and `NnxOptimizer`) fill them from the model's layers
    where they are `None`. Unused without `best_effort_shape_interpretation`.

    Statistics and preconditioners are float32; the grafting state and momenta have the
    params' dtype. Sharding rule (`state_specs`), the owner scheme of `modopt.sharding`: every
    block has one owner device. Blocks of one kind (the same block shape, root and padded
    dimensions, from any parameters, so that a network's layers, embedding and head stack
    together; a matrix's block taller than wide as its transpose, so that an `(m, n)` and an
    `(n, m)` weight share a stack) are stacked, and their statistics and preconditioners are
    stored stacked per kind (`OWNED`): each stack split along its block axis over the mesh
    axes dividing its length (an `Optimizer` made with shardings pads it to a multiple of the
    device count, so it splits over all of them), never split further by ZeRO-1;
    `ScaleByShampoo.unstacked` gives them per parameter. At each step the gradient's blocks
    move to their owners (one all-to-all per stack; a parameter split along its blocks is
    first split inside them), the statistics, inverse roots and preconditioned blocks are
    computed there on whole blocks, and the preconditioned blocks come back. The grafting
    state and momenta follow the parameters, and the grafting and the norm rescaling run where
    the parameters live. Without a mesh, each parameter's blocks are computed in its own
    layout (the roots of all blocks of one size in one batch, whatever their roots, each
    computed with its own; blocks of at most 64 rows, of all sizes, padded to the largest of
    them, in one batch: each batch is a program of its own, seconds to compile).

    Checked against `precondition.distributed_shampoo.distributed_shampoo` (precondition-opt
    0.3.0, the JAX reference of the paper's authors) step by step: updates and states, every
    graft type, blocking with padded edge blocks, merged and unmerged shapes. Departures: no
    quantization, sharded/pjit modes, low-rank or frequent-directions preconditioners, LOBPCG,
    `eigh` roots, one-sided preconditioner types or `decoupled_learning_rate=False`; the step
    size is applied by a separate `scale_by_learning_rate` (the reference's default decoupled
    learning rate gives the same numbers); decoupled weight decay is
    `chain(scale_by_shampoo(), add_decayed_weights(wd), scale_by_learning_rate(lr))` (the
    reference's `decoupled_weight_decay=True` multiplies it by the learning rate twice);
    the switch at `start_preconditioning_step` selects rather than blends the two updates, so
    a non-finite value in the unused one does not leak in; an inverse root's error is that of
    the root returned (the reference reports the error of the iterate after it, when the
    iteration stops on a growing error).

    Args:
        block_size: the largest block along any dimension (static); dimensions of at most this
            size (or all, if `block_size <= 0`) are not cut.
        beta1: the momentum, in [0, 1].
        beta2: the decay of the statistics (and of RMSProp grafting's squares), in [0, 1]; 1 sums.
        diagonal_epsilon: added to the square root in Adagrad/RMSProp grafting, >= 0.
        matrix_epsilon: the initial statistics' scale and the damping of the inverse roots
            (relative to the largest eigenvalue with `relative_matrix_epsilon`), >= 0.
        weight_decay: the coefficient of weight decay added before the momentum, finite.
        start_preconditioning_step: the first step (counted from 0) that uses Shampoo's update,
            an integer >= 0; the grafting update before.
        preconditioning_compute_steps: recompute the inverse roots at the steps divisible by this,
            an integer >= 1.
        statistics_compute_steps: update the statistics at the steps divisible by this, an
            integer >= 1.
        best_effort_shape_interpretation: merge neighbouring small dimensions whose product is at
            most `merge_small_dims_block_size` before blocking (static).
        graft_type: the first-order method whose per-parameter update norm Shampoo's update takes
            (static): "sgd", "adagrad", "rmsprop", "rmsprop_normalized", "adagrad_normalized",
            "sqrt_n" or "none"; the reference's `GraftingType` numbers are accepted.
        nesterov: Nesterov momentum (static).
        exponent_override: the root `p` of every preconditioner (static); 0 for `2k`, twice the
            number of dimensions of the merged shape.
        inverse_failure_threshold: a new inverse root is used only if its error is below this
            (>= 0).
        moving_average_for_momentum: weigh the new update by `1 - beta1` in the momenta (static).
        skip_preconditioning_dim_size_gt: parameters with a larger dimension are not
            preconditioned (static).
        clip_by_scaled_gradient_norm: with RMSProp grafting, scale the grafting update down so
            that its RMS is at most this (> 0); `None`: no clipping.
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
            of the matrix it is read as (static): `None` (the stored-order merge), one
            `MuonDimensionNumbers` for all, a tree of them (`None` entries: the stored-order
            merge) with the params' structure or a prefix of it, or a function of the params
            returning one. Leaves of rank 2 or less are not reshaped; dimension numbers with
            batch axes or axes that are not runs are an error naming the path. The skip rule
            (`skip_preconditioning_dim_size_gt`) reads the stored shape, and with `block_size
            <= 0` the matrix's too.

    Example:
        >>> tx = modopt.chain(modopt.scale_by_shampoo(block_size=128), modopt.scale_by_learning_rate(1e-3))

    Reference: Anil et al., 2020, Scalable Second Order Optimization for Deep Learning,
    https://arxiv.org/abs/2002.09018; Gupta, Koren & Singer, 2018, Shampoo,
    https://arxiv.org/abs/1802.09568
    """

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

    # -- layout ---------------------------------------------------------------------------------

    def layout(self, shape: tuple[int, ...], view: tuple[tuple[int, ...], ...] | None = None) -> _Layout | None:
        """How a parameter of `shape` is blocked, or `None` if it is not preconditioned. `view`:
        two runs of neighbouring axes (a kernel's inputs and outputs, from its dimension
        numbers) whose merge is the matrix read instead of the stored shape (with
        `best_effort_shape_interpretation`; unused without)."""
        shape = tuple(shape)
        matrix = shape
        if view is not None and self.best_effort_shape_interpretation:
            matrix = tuple(math.prod(shape[a] for a in run) for run in view)
        skip = (
            len(shape) < self.skip_preconditioning_rank_lt
            or any(d > self.skip_preconditioning_dim_size_gt for d in shape)
            or math.prod(shape) == 0
            # Unblocked, a kernel's matrix is a statistic's size: it must pass the rule too.
            or (self.block_size <= 0 and any(d > self.skip_preconditioning_dim_size_gt for d in matrix))
        )
        if skip:
            return None
        merged = (
            merge_small_dims(matrix, self.merge_small_dims_block_size)
            if self.best_effort_shape_interpretation
            else shape
        )
        if not merged:
            return None
        b = self.block_size
        counts = tuple(-(-d // b) if 0 < b < d else 1 for d in merged)
        sizes = tuple(b if n > 1 else d for n, d in zip(counts, merged))
        grid = np.indices(counts).reshape(len(counts), -1)  # block n's position along each dimension
        valid = tuple(
            np.where(grid[j] == n - 1, d - (n - 1) * s, s).astype(np.int32)
            for j, (n, s, d) in enumerate(zip(counts, sizes, merged))
        )
        return _Layout(merged, counts, sizes, valid)

    def exponent(self, layout: _Layout) -> int:
        """The root `p` of a parameter's preconditioners."""
        return self.exponent_override or 2 * len(layout.shape)

    def _units(self, tree: Any) -> tuple[list[_Layout | None], list[bool], UnitStacks]:
        """Each leaf's layout (`None`: not preconditioned); whether its blocks are taller than
        wide, stacked as their transposes; and the stacks of blocks of one `_Kind`."""
        shapes = [jnp.shape(x) for x in jax.tree_util.tree_leaves(tree)]
        views = kernel_views(self.weight_dimension_numbers, tree, "scale_by_shampoo")
        layouts = [self.layout(shape, view) for shape, view in zip(shapes, views)]
        boxes = [None if lay is None else lay.box(shape) for lay, shape in zip(layouts, shapes)]
        flips = [
            lay is not None and len(lay.sizes) == 2 and lay.sizes[0] > lay.sizes[1] and box == lay.sizes
            for lay, box in zip(layouts, boxes)
        ]
        kinds = []
        for lay, flip, box in zip(layouts, flips, boxes):
            if lay is None:
                kinds.append(None)
                continue
            turn = (lambda t: tuple(t[::-1])) if flip else tuple
            kinds.append(
                _Kind(turn(lay.sizes), self.exponent(lay), turn(lay.padded), turn(box))
            )
        return layouts, flips, UnitStacks(kinds, [0 if lay is None else lay.blocks for lay in layouts])

    # -- init -----------------------------------------------------------------------------------

    def init(self, params):
        layouts, flips, stacks = self._units(params)

        def blocks(layout, flip, diagonal):
            if layout is None:
                return None
            out = []
            for j, size in enumerate(layout.sizes):
                valid = jnp.asarray(np.arange(size)[None, :] < layout.valid[j][:, None], jnp.float32)
                eye = valid[:, :, None] * jnp.eye(size, dtype=jnp.float32)
                out.append(self.matrix_epsilon * eye if diagonal else eye)
            return tuple(out[::-1]) if flip else tuple(out)

        statistics = stacks.stack([blocks(lay, flip, True) for lay, flip in zip(layouts, flips)])
        preconditioners = stacks.stack([blocks(lay, flip, False) for lay, flip in zip(layouts, flips)])
        scales = stacks.stack([None if lay is None else jnp.zeros((lay.blocks,), jnp.int32) for lay in layouts])
        diagonal = diagonal_scales = None
        if self.graft_type in _DIAGONAL_GRAFTS:
            diagonal = init_state(params, self.nu_dtype)
            diagonal_scales = jax.tree_util.tree_map(lambda _: jnp.zeros((), jnp.int32), params)
        return ScaleByShampooState(
            count=jnp.zeros([], jnp.int32),
            statistics=tuple(statistics),
            preconditioners=tuple(preconditioners),
            diagonal_statistics=diagonal,
            diagonal_momentum=init_state(params, self.mu_dtype),
            momentum=init_state(params, self.mu_dtype),
            log2_scales=tuple(scales),
            diagonal_log2_scales=diagonal_scales,
        )

    def unstacked(self, state: ScaleByShampooState) -> ScaleByShampooState:
        """`state` with the statistics and preconditioners per parameter: trees shaped like the
        params whose leaves are tuples with one `(blocks, size_j, size_j)` array per dimension
        `j` of the parameter's merged shape (`()` where it is not preconditioned), blocks in
        row-major order of its block grid (for inspection and tests; `update` takes the
        stacked state)."""
        _, flips, stacks = self._units(state.momentum)
        treedef = jax.tree_util.tree_structure(state.momentum)

        def per_parameter(stacked):
            rows = stacks.unstack(stacked)
            return treedef.unflatten(
                [() if row is None else tuple(row[::-1] if flip else row) for row, flip in zip(rows, flips)]
            )

        scales = [None if row is None else row for row in stacks.unstack(state.log2_scales)]
        return state._replace(
            statistics=per_parameter(state.statistics),
            preconditioners=per_parameter(state.preconditioners),
            log2_scales=treedef.unflatten(scales),
        )

    def state_specs(self, params, param_specs):
        # Stacked statistics and roots lie on their owners (OWNED); the rest follows the params.
        shapes = jax.eval_shape(self.init, params)
        owned = lambda tree: jax.tree_util.tree_map(lambda _: OWNED, tree)  # noqa: E731
        return ScaleByShampooState(
            count=REPLICATED,
            statistics=owned(shapes.statistics),
            preconditioners=owned(shapes.preconditioners),
            diagonal_statistics=None if shapes.diagonal_statistics is None else param_specs,
            diagonal_momentum=param_specs,
            momentum=param_specs,
            log2_scales=owned(shapes.log2_scales),
            diagonal_log2_scales=jax.tree_util.tree_map(lambda _: REPLICATED, shapes.diagonal_log2_scales),
        )

    # -- update ---------------------------------------------------------------------------------

    def update(self, updates, state, params=None, **extra_args):
        if params is None and not (is_concrete(self.weight_decay) and float(self.weight_decay) == 0.0):
            require_params(params, self)
        count = state.count
        treedef = jax.tree_util.tree_structure(state.momentum)
        grads = treedef.flatten_up_to(updates)
        for (path, _), g in zip(jax.tree_util.tree_flatten_with_path(state.momentum)[0], grads):
            if g is not None and jnp.iscomplexobj(g):
                raise TypeError(
                    f"scale_by_shampoo takes real updates; the update at {jax.tree_util.keystr(path)} has dtype "
                    f"{g.dtype}. Split complex parameters into real and imaginary parts first "
                    "(`modopt.experimental.split_real_and_imaginary`)."
                )
        param_leaves = [None] * len(grads) if params is None else treedef.flatten_up_to(params)
        diagonal_momentum, momentum = (
            treedef.flatten_up_to(x) for x in (state.diagonal_momentum, state.momentum)
        )
        diagonal = diagonal_scales = [None] * len(grads)
        if state.diagonal_statistics is not None:
            diagonal = treedef.flatten_up_to(state.diagonal_statistics)
            diagonal_scales = treedef.flatten_up_to(state.diagonal_log2_scales)
        preconditioned, statistics, preconditioners, scales = self._blocks(grads, state, params)

        out = []
        for i, g in enumerate(grads):
            if g is None:
                out.append((None, diagonal[i], diagonal_momentum[i], momentum[i], diagonal_scales[i]))
                continue
            out.append(
                self._one(
                    g,
                    preconditioned[i],
                    param_leaves[i],
                    diagonal[i],
                    diagonal_scales[i],
                    diagonal_momentum[i],
                    momentum[i],
                    count,
                )
            )
        new_updates, new_diagonal, new_diagonal_momentum, new_momentum, new_diagonal_scales = (
            treedef.unflatten([o[j] for o in out]) for j in range(5)
        )
        return new_updates, ScaleByShampooState(
            count=safe_increment(count),
            statistics=statistics,
            preconditioners=preconditioners,
            diagonal_statistics=None if state.diagonal_statistics is None else new_diagonal,
            diagonal_momentum=new_diagonal_momentum,
            momentum=new_momentum,
            log2_scales=scales,
            diagonal_log2_scales=None if state.diagonal_statistics is None else new_diagonal_scales,
        )

    def _blocks(self, grads, state, params):
        """Per parameter, the Shampoo direction (`None` where it is not preconditioned or has no
        update), and the new stacked statistics, preconditioners and scales: the blocks' work, on
        their owners on a mesh (`modopt.sharding.run_per_unit`)."""
        layouts, flips, stacks = self._units(state.momentum)
        if not len(stacks):
            return [None] * len(grads), state.statistics, state.preconditioners, state.log2_scales
        mesh = current_mesh()
        shapes = [jnp.shape(m) for m in jax.tree_util.tree_leaves(state.momentum)]
        specs = specs_of(state.momentum, params)  # the state's layout: with ZeRO-1, split further
        # A leaf without an update (`None`) keeps its blocks' state: masked out of the work.
        missing = any(g is None and lay is not None for g, lay in zip(grads, layouts))
        leaves, extras, back = [], [], []
        for g, lay, flip, shape, spec in zip(grads, layouts, flips, shapes, specs):
            back.append(None)
            if lay is None:
                leaves.append(None)
                extras.append(None)
                continue
            turned = flip and mesh is not None  # on a mesh, computed as its transpose
            x = jnp.zeros(shape, jnp.float32) if g is None else g.astype(jnp.float32)
            units = lay.units(shape, boxed=True)._replace(swap=turned)
            if spec is not None and mesh is not None and units.unit_axes(spec, mesh) is None:
                # Split along its blocks: split inside them for the move, and back after it (if it
                # can; otherwise the owner scheme gathers the blocks whole).
                inside = _inside_blocks(units, spec, mesh)
                if inside is not None:
                    spec, back[-1] = inside, NamedSharding(mesh, spec)
            leaves.append(LeafUnits((x,), units, spec))
            valid = np.stack(lay.valid, axis=1)  # per block, its true size along each dimension
            extra = (np.ascontiguousarray(valid[:, ::-1]) if turned else valid,)
            extras.append(extra + ((np.full(lay.blocks, g is not None),) if missing else ()))

        def work(kinds, pieces, states):
            # Each piece in its blocks' order: a flipped leaf's own (without a mesh) reverses its kind's.
            own = [x.shape[1:] != kind.box for kind, (x, _) in zip(kinds, pieces)]
            turn = lambda t, flip: tuple(t[::-1]) if flip else tuple(t)  # noqa: E731
            blocks = [x.reshape(x.shape[0], *turn(k.sizes, f)) for k, (x, _), f in zip(kinds, pieces, own)]
            extra = [e for _, e in pieces]
            stats = [turn(s, f) for (s, _, _), f in zip(states, own)]
            old = [turn(p, f) for (_, p, _), f in zip(states, own)]
            scales = [e for _, _, e in states]
            padded = [turn(kind.padded, f) for kind, f in zip(kinds, own)]
            stats, scales = self._statistics(blocks, stats, scales, extra, state.count)
            precs = self._preconditioners(
                stats, scales, old, padded, [k.exponent for k in kinds], extra, state.count, mesh
            )
            outs = [(_precondition(b, p).reshape(x.shape),) for b, p, (x, _) in zip(blocks, precs, pieces)]
            return outs, [(turn(s, f), turn(p, f), e) for s, p, e, f in zip(stats, precs, scales, own)]

        stacked = list(zip(state.statistics, state.preconditioners, state.log2_scales))
        done, new = run_per_unit(work, stacks, leaves, stacked, mesh, extras=extras)
        preconditioned = [
            None
            if d is None or g is None
            else d[0]
            if b is None
            else jax.lax.with_sharding_constraint(d[0], b)
            for d, g, b in zip(done, grads, back)
        ]
        return preconditioned, *(tuple(x[i] for x in new) for i in range(3))

    def _statistics(self, blocks, statistics, scales, extras, count):
        """The statistics after this step's gradients (every `statistics_compute_steps` steps),
        and their scales.

        Each block's statistics are stored divided by `2**e` (`e` even, per block): where the
        gradient's entries exceed `2**16`, `e` grows to what brings them within it (the stored
        statistics shrink alike), so that the products summed, and their squares in the roots'
        norms, stay finite. A power of two scales exactly: with `e = 0` (every ordinary
        gradient) every number is the unscaled one."""
        beta2 = self.beta2
        w2 = jnp.where(jnp.asarray(beta2) == 1.0, 1.0, 1 - beta2)
        due = count % self.statistics_compute_steps == 0
        new, new_scales = [], []
        for x, stats, e, extra in zip(blocks, statistics, scales, extras):
            e_new = jnp.maximum(e, 2 * overflow_exponent(x, 1, _BOUND))
            shrink = power_of_two(e - e_new)[:, None, None]  # the old statistics'
            x = x * power_of_two(-(e_new >> 1)).reshape(-1, *(1,) * (x.ndim - 1))
            fresh = tuple(jnp.where(due, beta2 * (s * shrink) + w2 * _gram(x, j), s) for j, s in enumerate(stats))
            e_fresh = jnp.where(due, e_new, e)
            if len(extra) > 1:  # blocks without an update keep theirs
                fresh = tuple(jnp.where(extra[1][:, None, None], f, s) for f, s in zip(fresh, stats))
                e_fresh = jnp.where(extra[1], e_fresh, e)
            new.append(fresh)
            new_scales.append(e_fresh)
        return new, new_scales

    def _preconditioners(self, statistics, scales, preconditioners, padded, exponents, extras, count, mesh):
        """The preconditioners, recomputed every `preconditioning_compute_steps` steps (all of
        them under one `lax.cond`).

        Without a mesh, the statistics of one block size are concatenated over the parameters
        (those of sizes 2 to `_SMALL` zero-padded to the largest of them: the padded root is
        the root, padded), so one batched inverse root serves them all (with each block's true
        size as its padding start, where some are padded: a full block's mask is all ones, which
        changes none of its numbers; and, where their roots differ, each block's root `p` as a
        traced value among the batch's `p_values`, which computes each block's unrolled power
        as a static `p` would, the same numbers). On a mesh, each stack's statistics of each dimension are
        one batch, computed where the stack lies."""
        groups: dict[tuple, list] = {}
        # The largest small size (a 1 x 1 statistic's root is exact on its own).
        small = max((s.shape[-1] for stats in statistics for s in stats if 1 < s.shape[-1] <= _SMALL), default=0)
        for i, stats in enumerate(statistics):
            for j, s in enumerate(stats):
                size = small if 1 < s.shape[-1] <= _SMALL else s.shape[-1]
                key = (size,) if mesh is None else (i, j)
                groups.setdefault(key, []).append((i, j))
        keys = list(groups)
        width = [max(statistics[i][j].shape[-1] for i, j in groups[k]) for k in keys]
        stacked = [_concatenate([_pad_to(statistics[i][j], w) for i, j in groups[k]]) for k, w in zip(keys, width)]
        old = [_concatenate([_pad_to(preconditioners[i][j], w) for i, j in groups[k]]) for k, w in zip(keys, width)]
        log2_scales = [_concatenate([scales[i] for i, _ in groups[k]]) for k in keys]
        valid = [_concatenate([extras[i][0][:, j] for i, j in groups[k]]) for k in keys]
        active = [
            _concatenate([extras[i][1] for i, _ in groups[k]]) if len(extras[0]) > 1 else None for k in keys
        ]
        masked = [
            any(padded[i][j] or statistics[i][j].shape[-1] < w for i, j in groups[k]) for k, w in zip(keys, width)
        ]
        # Each batch's roots: one static root, or per matrix its own (see `_root`).
        root_sets = [sorted({exponents[i] for i, _ in groups[k]}) for k in keys]
        powers = [
            p[0]
            if len(p) == 1
            else np.concatenate([np.full(statistics[i][j].shape[0], exponents[i], np.int32) for i, j in groups[k]])
            for k, p in zip(keys, root_sets)
        ]

        def compute(stacked, old, log2_scales):
            new = []
            for stats, previous, e, sizes, keep, pad, p, p_values in zip(
                stacked, old, log2_scales, valid, active, masked, powers, root_sets
            ):
                p_values = tuple(p_values) if len(p_values) > 1 else None
                roots, errors = jax.vmap(
                    lambda m, e, n, p, pad=pad, p_values=p_values: self._root(m, e, p, n if pad else None, p_values),
                    in_axes=(0, 0, 0, None if p_values is None else 0),
                )(stats, e, jnp.asarray(sizes), p)
                failed = jnp.isnan(errors) | (errors >= self.inverse_failure_threshold)
                if keep is not None:
                    failed = failed | ~jnp.asarray(keep)
                new.append(jnp.where(failed[:, None, None], previous, roots))
            return new

        due = count % self.preconditioning_compute_steps == 0
        new = jax.lax.cond(due, compute, lambda _, old, __: old, stacked, old, log2_scales)
        result = [list(p) for p in preconditioners]
        for k, stack in zip(keys, new):
            start = 0
            for i, j in groups[k]:
                n, size = statistics[i][j].shape[0], statistics[i][j].shape[-1]
                piece = stack[start : start + n] if len(groups[k]) > 1 else stack
                result[i][j] = piece[:, :size, :size] if size < piece.shape[-1] else piece
                start += n
        return [tuple(p) for p in result]

    def _root(self, matrix, log2_scale, p, padding_start, p_values=None):
        """The inverse `p`-th root of the statistic `matrix * 2**log2_scale`: the root of `matrix`
        times `2**(-log2_scale / p)` (an absolute damping scaled alike), exactly the root itself
        for `log2_scale = 0`. `p` is static, or traced with its possible values `p_values`
        (the numbers of its static value, see `matrix_inverse_pth_root`)."""
        ridge = self.matrix_epsilon
        if not self.relative_matrix_epsilon:
            ridge = ridge * power_of_two(-log2_scale)
        root, error = matrix_inverse_pth_root(
            matrix,
            p,
            ridge_epsilon=ridge,
            precision=self.precision,
            padding_start=padding_start,
            relative_epsilon=self.relative_matrix_epsilon,
            max_retries=_RETRIES,
            retry_error_threshold=_RETRY_ERROR,
            p_values=p_values,
        )
        factor = jnp.where(log2_scale == 0, 1.0, jnp.exp2(-log2_scale.astype(jnp.float32) / p))
        return root * factor.astype(root.dtype), error

    def _one(self, g, precond, param, diagonal, diagonal_scale, diagonal_momentum, momentum, count):
        """One parameter's update and new grafting state and momenta (the stored state read at
        its accumulation precision, `widen`, and stored back in its dtype)."""
        dtype = update_dtype(g.dtype, self.mu_dtype, self.nu_dtype)
        g32 = g.astype(jnp.float32)
        stored = diagonal
        diagonal = None if diagonal is None else widen(diagonal, self.nu_dtype)
        momentum_in, diagonal_momentum_in = momentum, diagonal_momentum
        momentum, diagonal_momentum = widen(momentum, self.mu_dtype), widen(diagonal_momentum, self.mu_dtype)
        graft, new_diagonal, new_diagonal_scale = self._graft(g32, diagonal, diagonal_scale)
        if precond is None:
            precond = graft
        if self.graft_type == "none":
            shampoo = precond
        else:
            shampoo = precond * (scaled_norm(graft) / (scaled_norm(precond) + _TINY))
        if param is not None:
            shampoo = shampoo + self.weight_decay * param
            graft = graft + self.weight_decay * param
        beta1 = self.beta1
        w = 1 - beta1 if self.moving_average_for_momentum else 1.0
        new_momentum = beta1 * momentum + w * shampoo
        new_diagonal_momentum = beta1 * diagonal_momentum + w * graft
        use_shampoo = count >= self.start_preconditioning_step
        update = jnp.where(use_shampoo, new_momentum, new_diagonal_momentum)
        if self.nesterov:
            update = w * jnp.where(use_shampoo, shampoo, graft) + beta1 * update
        return (
            update.astype(dtype),
            None if new_diagonal is None else new_diagonal.astype(stored.dtype),
            new_diagonal_momentum.astype(diagonal_momentum_in.dtype),
            new_momentum.astype(momentum_in.dtype),
            new_diagonal_scale,
        )

    def _graft(self, g, diagonal, scale):
        """The grafting update of a float32 gradient, the new diagonal statistics and their
        scale: stored divided by `2**scale`, which grows (by even steps) to bring the squared
        entries within float32 where they exceed `2**32` (the stored sums shrink alike, and
        their square root is scaled back); 0, and every number the unscaled one, otherwise."""
        kind = self.graft_type
        if kind in ("sgd", "none"):
            return g, None, None
        if kind == "sqrt_n":
            return jnp.sign(g), None, None
        scaled = g / (scaled_norm(g) + _TINY) if kind.endswith("_normalized") else g
        new_scale = jnp.maximum(scale, 2 * overflow_exponent(scaled))
        diagonal = diagonal * power_of_two(scale - new_scale).astype(diagonal.dtype)
        square = jnp.square(scaled * power_of_two(-(new_scale >> 1)))
        if kind.startswith("adagrad"):
            new_diagonal = diagonal + square
        else:
            beta2 = self.beta2
            w2 = jnp.where(jnp.asarray(beta2) == 1.0, 1.0, 1 - beta2)
            new_diagonal = beta2 * diagonal + w2 * square
        root = jnp.sqrt(new_diagonal) * power_of_two(new_scale >> 1)
        update = scaled / (root + self.diagonal_epsilon)
        if kind.startswith("rmsprop") and self.clip_by_scaled_gradient_norm is not None:
            rms = scaled_norm(update) / jnp.sqrt(float(update.size))
            update = update / jnp.maximum(1.0, rms / self.clip_by_scaled_gradient_norm)
        return update, new_diagonal, new_scale


def _concatenate(arrays: list) -> Any:
    """`arrays` concatenated along axis 0 (NumPy's for NumPy arrays; one array as it is)."""
    if len(arrays) == 1:
        return arrays[0]
    return (np if all(isinstance(a, np.ndarray) for a in arrays) else jnp).concatenate(arrays)


def _pad_to(matrices: jax.Array, size: int) -> jax.Array:
    """A stack of square matrices zero-padded at the end of both axes to `size`."""
    extra = size - matrices.shape[-1]
    return matrices if extra == 0 else jnp.pad(matrices, ((0, 0), (0, extra), (0, extra)))


def _inside_blocks(units: UnitMap, spec: PartitionSpec, mesh: Any) -> PartitionSpec | None:
    """A spec splitting the mesh axes of `spec` (which splits a parameter along its blocks)
    inside the blocks instead: the axes already on a whole axis of the parameter that is a
    dimension of the blocks stay there, and each other goes after them on the largest such axis
    that it divides (so that moving there exchanges the least); `None` if one fits nowhere."""
    entries = [list(_names(e)) for e in spec_entries(spec, len(units.shape))]
    axis_of = list(np.cumsum((0, *units.groups))[:-1])  # each unit map dimension's first parameter axis
    free = {
        axis_of[j]: units.sizes[j] // math.prod(mesh.shape[a] for a in entries[axis_of[j]])
        for j in range(len(units.groups))
        if units.groups[j] == 1
        and units.pieces[j] == 1
        and j not in units.counted
        and units.sizes[j] % math.prod(mesh.shape[a] for a in entries[axis_of[j]]) == 0
    }
    moved = [a for axis, names in enumerate(entries) if axis not in free for a in names]
    inside = [names if axis in free else [] for axis, names in enumerate(entries)]
    for name in moved:
        fits = [a for a, size in free.items() if size % mesh.shape[name] == 0]
        if not fits:
            return None
        axis = max(fits, key=lambda a: free[a])
        free[axis] //= mesh.shape[name]
        inside[axis].append(name)
    result = PartitionSpec(*[None if not n else n[0] if len(n) == 1 else tuple(n) for n in inside])
    return result if units.unit_axes(result, mesh) is not None else None


def _names(entry: Any) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _box(dims: tuple[int, ...], n: int, s: int) -> list[tuple[int, int]] | None:
    """A dimension merged from axes of sizes `dims`, cut in `n` blocks of `s`, as a cut of each
    axis: `(pieces, size)` per axis, or `None` where a block is no box of the axes (padded, or
    not whole slices of one axis by the axes after it)."""
    if n * s != math.prod(dims):
        return None
    trailing, k = 1, len(dims)  # the axes after the cut one, whole in every block
    while k > 0 and s % (trailing * dims[k - 1]) == 0:
        trailing, k = trailing * dims[k - 1], k - 1
    if k == 0:
        return [(1, d) for d in dims]
    rows = s // trailing
    if dims[k - 1] % rows:
        return None
    return [(d, 1) for d in dims[: k - 1]] + [(dims[k - 1] // rows, rows)] + [(1, d) for d in dims[k:]]


def _gram(blocks: jax.Array, dim: int) -> jax.Array:
    """Per block, the Gram matrix of its slices along `dim`: `G_(dim) G_(dim)^T`."""
    x = jnp.moveaxis(blocks, dim + 1, 1)
    x = x.reshape(x.shape[0], x.shape[1], -1)
    return jnp.einsum("nak,nbk->nab", x, x)


def _precondition(blocks: jax.Array, preconditioners: tuple[jax.Array, ...]) -> jax.Array:
    """Per block, `G x_1 P_1 ... x_k P_k`: each dimension in turn contracted with its
    preconditioner (the result's dimensions come back in their order after `k` turns)."""
    for p in preconditioners:
        blocks = jnp.einsum("na...,nab->n...b", blocks, p)
    return blocks


def check_static_ints(tx: Any) -> None:
    """Shampoo's static integers: Python integers, in range."""
    for name, least in (
        ("block_size", None),
        ("exponent_override", 0),
        ("skip_preconditioning_dim_size_gt", 0),
        ("merge_small_dims_block_size", 1),
        ("skip_preconditioning_rank_lt", 0),
    ):
        value = getattr(tx, name)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"Invalid {name}: {value!r} (must be a Python integer) in {type(tx).__name__}.")
        if least is not None and value < least:
            raise ValueError(
                f"Invalid {name}: {value} (must be an integer >= {least}) in {type(tx).__name__}."
            )


scale_by_shampoo = ScaleByShampoo
