"""Shampoo with grafting: blocked Kronecker-factored preconditioners (distributed Shampoo)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import fields
from .._base import AbstractTransform, require_params
from .._fields import (
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
from .._fields import Scalar
from .._moments import init_state, update_dtype, widen
from .._numerics import safe_increment
from .._specs import REPLICATED
from ..linalg import matrix_inverse_pth_root
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

    def split(self, x: jax.Array) -> jax.Array:
        """A parameter-shaped array as its stack of blocks, `(blocks, *sizes)`."""
        x = x.reshape(self.shape)
        x = jnp.pad(x, [(0, n * s - d) for n, s, d in zip(self.counts, self.sizes, self.shape)])
        x = x.reshape([v for pair in zip(self.counts, self.sizes) for v in pair])
        k = len(self.shape)
        x = x.transpose([2 * j for j in range(k)] + [2 * j + 1 for j in range(k)])
        return x.reshape((self.blocks, *self.sizes))

    def merge(self, blocks: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """The inverse of `split`: a stack of blocks back as an array of `shape`."""
        k = len(self.shape)
        x = blocks.reshape((*self.counts, *self.sizes))
        x = x.transpose([i for j in range(k) for i in (j, k + j)])
        x = x.reshape([n * s for n, s in zip(self.counts, self.sizes)])
        return x[tuple(slice(0, d) for d in self.shape)].reshape(shape)


class ScaleByShampooState(NamedTuple):
    """The state of `scale_by_shampoo`; every field but `count` has the params' structure.

    count: updates made so far (int32 scalar).
    statistics: per parameter, one float32 array `(blocks, size_j, size_j)` per dimension `j` of
        its (merged) shape: the decayed sums of the blocks' gradient Gram matrices along `j`;
        `()` for parameters that are not preconditioned.
    preconditioners: per parameter, the inverse roots of `statistics` (same shapes).
    diagonal_statistics: the grafting optimizer's sums of squared gradients (Adagrad, RMSProp
        and their normalized variants), like the params (in `nu_dtype` if set); `None` for the
        other graft types.
    diagonal_momentum: the momentum of the grafting updates, like the params (in `mu_dtype` if set).
    momentum: the momentum of the Shampoo updates, like the params (in `mu_dtype` if set).
    """

    count: jax.Array
    statistics: Any
    preconditioners: Any
    diagonal_statistics: Any
    diagonal_momentum: Any
    momentum: Any


class ScaleByShampoo(AbstractTransform):
    r"""Scales updates by Shampoo's blocked Kronecker-factored preconditioner, grafted onto the
    layer-wise step size of a first-order method (distributed Shampoo).

    Each parameter is reshaped (small neighbouring dimensions merged, see
    `best_effort_shape_interpretation`) to `k` dimensions and cut into blocks of at most
    `block_size` along each. Per block `G` and dimension `j`, the statistic is

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

    Statistics and preconditioners are float32; the grafting state and momenta have the
    params' dtype. Sharding rule (`state_specs`): statistics and preconditioners are stacks of
    block x block matrices, not shaped like the parameters, and are replicated (every device
    holds every block, as the reference's default non-sharded mode does); `zero_axis` (ZeRO-1)
    then splits each stack along its block axis where the axis divides it. The grafting state
    and momenta follow the parameters.

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

    def __check_init__(self):
        check_static_ints(self)

    # -- layout ---------------------------------------------------------------------------------

    def layout(self, shape: tuple[int, ...]) -> _Layout | None:
        """How a parameter of `shape` is blocked, or `None` if it is not preconditioned."""
        shape = tuple(shape)
        skip = (
            len(shape) < self.skip_preconditioning_rank_lt
            or any(d > self.skip_preconditioning_dim_size_gt for d in shape)
            or math.prod(shape) == 0
        )
        if skip:
            return None
        merged = (
            merge_small_dims(shape, self.merge_small_dims_block_size)
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

    # -- init -----------------------------------------------------------------------------------

    def init(self, params):
        def blocks(p, diagonal):
            layout = self.layout(p.shape)
            if layout is None:
                return ()
            out = []
            for j, size in enumerate(layout.sizes):
                valid = jnp.asarray(np.arange(size)[None, :] < layout.valid[j][:, None], jnp.float32)
                eye = valid[:, :, None] * jnp.eye(size, dtype=jnp.float32)
                out.append(self.matrix_epsilon * eye if diagonal else eye)
            return tuple(out)

        statistics = jax.tree_util.tree_map(lambda p: blocks(p, True), params)
        preconditioners = jax.tree_util.tree_map(lambda p: blocks(p, False), params)
        diagonal = None
        if self.graft_type in _DIAGONAL_GRAFTS:
            diagonal = init_state(params, self.nu_dtype)
        return ScaleByShampooState(
            count=jnp.zeros([], jnp.int32),
            statistics=statistics,
            preconditioners=preconditioners,
            diagonal_statistics=diagonal,
            diagonal_momentum=init_state(params, self.mu_dtype),
            momentum=init_state(params, self.mu_dtype),
        )

    def state_specs(self, params, param_specs):
        shapes = jax.eval_shape(self.init, params)
        replicated = lambda tree: jax.tree_util.tree_map(lambda _: REPLICATED, tree)  # noqa: E731
        return ScaleByShampooState(
            count=REPLICATED,
            statistics=replicated(shapes.statistics),
            preconditioners=replicated(shapes.preconditioners),
            diagonal_statistics=None if shapes.diagonal_statistics is None else param_specs,
            diagonal_momentum=param_specs,
            momentum=param_specs,
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
        columns = [
            treedef.flatten_up_to(x)
            for x in (state.statistics, state.preconditioners, state.diagonal_momentum, state.momentum)
        ]
        diagonal = [None] * len(grads)
        if state.diagonal_statistics is not None:
            diagonal = treedef.flatten_up_to(state.diagonal_statistics)
        statistics, preconditioners, diagonal_momentum, momentum = columns
        layouts = [None if g is None else self.layout(g.shape) for g in grads]
        blocks = [None if lay is None else lay.split(g.astype(jnp.float32)) for g, lay in zip(grads, layouts)]

        statistics = self._statistics(blocks, layouts, statistics, count)
        preconditioners = self._preconditioners(statistics, preconditioners, layouts, count)

        out = []
        for i, g in enumerate(grads):
            if g is None:
                out.append((None, diagonal[i], diagonal_momentum[i], momentum[i]))
                continue
            precond = None
            if layouts[i] is not None:
                precond = layouts[i].merge(_precondition(blocks[i], preconditioners[i]), g.shape)
            out.append(
                self._one(g, precond, param_leaves[i], diagonal[i], diagonal_momentum[i], momentum[i], count)
            )
        new_updates, new_diagonal, new_diagonal_momentum, new_momentum = (
            treedef.unflatten([o[j] for o in out]) for j in range(4)
        )
        return new_updates, ScaleByShampooState(
            count=safe_increment(count),
            statistics=treedef.unflatten(statistics),
            preconditioners=treedef.unflatten(preconditioners),
            diagonal_statistics=None if state.diagonal_statistics is None else new_diagonal,
            diagonal_momentum=new_diagonal_momentum,
            momentum=new_momentum,
        )

    def _statistics(self, blocks, layouts, statistics, count):
        """The statistics after this step's gradients (every `statistics_compute_steps` steps)."""
        beta2 = self.beta2
        w2 = jnp.where(jnp.asarray(beta2) == 1.0, 1.0, 1 - beta2)
        due = count % self.statistics_compute_steps == 0
        new = []
        for x, layout, stats in zip(blocks, layouts, statistics):
            if layout is None:
                new.append(stats)
                continue
            new.append(tuple(jnp.where(due, beta2 * s + w2 * _gram(x, j), s) for j, s in enumerate(stats)))
        return new

    def _preconditioners(self, statistics, preconditioners, layouts, count):
        """The preconditioners, recomputed every `preconditioning_compute_steps` steps.

        Statistics of one block size and root are stacked, so one batched inverse root serves
        them all (with each block's true size as its padding start, where some are padded: a
        full block's mask is all ones, which changes none of its numbers)."""
        groups: dict[tuple, list] = {}
        for i, layout in enumerate(layouts):
            if layout is None:
                continue
            for j, size in enumerate(layout.sizes):
                groups.setdefault((size, self.exponent(layout)), []).append((i, j))
        if not groups:
            return preconditioners
        keys = list(groups)
        stacked = [jnp.concatenate([statistics[i][j] for i, j in groups[k]]) for k in keys]
        old = [jnp.concatenate([preconditioners[i][j] for i, j in groups[k]]) for k in keys]
        valid = [np.concatenate([layouts[i].valid[j] for i, j in groups[k]]) for k in keys]

        def compute(stacked, old):
            new = []
            for (size, p), stats, previous, sizes in zip(keys, stacked, old, valid):
                padded = bool(np.any(sizes < size))
                roots, errors = jax.vmap(
                    lambda m, n, p=p, padded=padded: self._root(m, p, n if padded else None)
                )(stats, jnp.asarray(sizes))
                failed = jnp.isnan(errors) | (errors >= self.inverse_failure_threshold)
                new.append(jnp.where(failed[:, None, None], previous, roots))
            return new

        due = count % self.preconditioning_compute_steps == 0
        new = jax.lax.cond(due, compute, lambda _, old: old, stacked, old)
        result = [list(p) for p in preconditioners]
        for k, stack in zip(keys, new):
            start = 0
            for i, j in groups[k]:
                n = layouts[i].blocks
                result[i][j] = stack[start : start + n]
                start += n
        return [tuple(p) for p in result]

    def _root(self, matrix, p, padding_start):
        return matrix_inverse_pth_root(
            matrix,
            p,
            ridge_epsilon=self.matrix_epsilon,
            precision=self.precision,
            padding_start=padding_start,
            relative_epsilon=self.relative_matrix_epsilon,
            max_retries=_RETRIES,
            retry_error_threshold=_RETRY_ERROR,
        )

    def _one(self, g, precond, param, diagonal, diagonal_momentum, momentum, count):
        """One parameter's update and new grafting state and momenta (the stored state read at
        its accumulation precision, `widen`, and stored back in its dtype)."""
        dtype = update_dtype(g.dtype, self.mu_dtype, self.nu_dtype)
        g32 = g.astype(jnp.float32)
        stored = diagonal
        diagonal = None if diagonal is None else widen(diagonal, self.nu_dtype)
        momentum_in, diagonal_momentum_in = momentum, diagonal_momentum
        momentum, diagonal_momentum = widen(momentum, self.mu_dtype), widen(diagonal_momentum, self.mu_dtype)
        graft, new_diagonal = self._graft(g32, diagonal)
        if precond is None:
            precond = graft
        if self.graft_type == "none":
            shampoo = precond
        else:
            shampoo = precond * (jnp.linalg.norm(graft) / (jnp.linalg.norm(precond) + _TINY))
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
        )

    def _graft(self, g, diagonal):
        """The grafting update of a float32 gradient, and the new diagonal statistics."""
        kind = self.graft_type
        if kind in ("sgd", "none"):
            return g, None
        if kind == "sqrt_n":
            return jnp.sign(g), None
        scaled = g / (jnp.linalg.norm(g) + _TINY) if kind.endswith("_normalized") else g
        if kind.startswith("adagrad"):
            new_diagonal = diagonal + jnp.square(scaled)
        else:
            beta2 = self.beta2
            w2 = jnp.where(jnp.asarray(beta2) == 1.0, 1.0, 1 - beta2)
            new_diagonal = beta2 * diagonal + w2 * jnp.square(scaled)
        update = scaled / (jnp.sqrt(new_diagonal) + self.diagonal_epsilon)
        if kind.startswith("rmsprop") and self.clip_by_scaled_gradient_norm is not None:
            rms = jnp.linalg.norm(update) / jnp.sqrt(float(update.size))
            update = update / jnp.maximum(1.0, rms / self.clip_by_scaled_gradient_norm)
        return update, new_diagonal


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
