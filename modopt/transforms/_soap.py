"""SOAP: Adam run in the eigenbasis of Shampoo's preconditioner."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import POSITIVE_INTEGER, choice, hyperparameter, static
from .._state.moments import state_dtype_for, update_dtype, update_moment, widen
from .._util.numerics import overflow_exponent, power_of_two, safe_increment
from .._core.specs import OWNED, OWNED_ELEMENTWISE, REPLICATED
from ..sharding._owners import (
    LeafUnits,
    UnitMap,
    UnitStacks,
    current_mesh,
    per_unit,
    run_per_unit,
    specs_of,
    whole_map,
)
from .._core.fields import Scalar
from jax.typing import DTypeLike

DATA_FORMATS = ("channels_first", "channels_last")
_CHANNELS_FIRST = (0, 3, 1, 2)  # a channels-last 4-D leaf's axes in channels-first order
_CHANNELS_LAST = (0, 2, 3, 1)  # the inverse permutation
_RIDGE = 1e-30  # added to a statistic's diagonal before its first eigendecomposition (as the reference)
# Gradients' entries are brought within 2**16 before their squares and products are summed into
# `nu` and the statistics (which the eigendecompositions square again): see `ScaleBySoap`.
_BOUND = 16


class ScaleBySoapState(NamedTuple):
    """SOAP's step count, Adam's moments in the eigenbasis, Shampoo's statistics and their
    eigenbases.

    Everything but the count is stored stacked (`modopt.sharding`'s owner scheme): parameters
    of one kind (see `ScaleBySoap`) form a stack, and each field is a tuple with one entry per
    stack, in the order of each kind's first parameter (the order of the leaves). An entry
    stacks that state of every parameter of the kind along a new axis 0, in the order of the
    parameters: `mu` and `nu` `(n, *shape)` in the shape the rotations act on (merged
    dimensions with `merge_dims`, a channels-last 4-D leaf channels first); `statistics` and
    `eigenbases` a tuple with one `(n, d, d)` array per dimension of that shape, or `None`
    for a dimension left in the parameter's basis (larger than `max_precondition_dim`, or a
    vector's without `precondition_1d`). A parameter whose layout is a matrix taller than
    wide is stored transposed: its moments `(n, cols, rows)`, its statistics and bases in
    the order (columns, rows). `ScaleBySoap.unstacked` gives the state per parameter, in the
    parameter's shape and order. A parameter without elements stores nothing. `log2_scales`
    holds per stack an int32 array `(n,)`: each parameter's `nu` and statistics are stored
    divided by `2**log2_scale` (an even number, 0 unless a gradient's entries exceeded `2**16`;
    see `ScaleBySoap`).
    """

    count: jax.Array  # int32 scalar: updates taken; the first only gathers statistics
    mu: Any  # per stack: the first moment, in the eigenbasis (in `mu_dtype` if set)
    nu: Any  # per stack: the second moment, in the eigenbasis (in `nu_dtype` if set), over 2**log2_scale
    statistics: Any  # per stack: a tuple of EMAs of G G^T contracted over the other dimensions, over 2**log2_scale
    eigenbases: Any  # per stack: a tuple of orthogonal matrices (columns: estimated eigenvectors)
    log2_scales: Any  # per stack: int32 (n,), the power of two `nu` and the statistics are divided by


class _Kind(NamedTuple):
    """What the parameters of one stack share (static): what their state and their work are."""

    shape: tuple[int, ...]  # the shape the rotations act on (a taller-than-wide matrix's transposed)
    rotated: tuple[bool, ...]  # per dimension of `shape`: whether it has a statistic and a basis
    dtypes: tuple[Any, Any, Any]  # the stored dtypes of `mu`, of `nu`, and of statistics and bases


class _Layout(NamedTuple):
    """How one parameter is rotated (static: it depends on the shape only)."""

    permute: bool  # a channels-last 4-D leaf, put channels first before merging
    shape: tuple[int, ...]  # the shape the rotations act on
    groups: tuple[tuple[int, ...], ...]  # the parameter's axes making up each dimension of `shape`
    rotated: tuple[bool, ...]  # per dimension of `shape`: whether it has a statistic and a basis


def merged_groups(shape: tuple[int, ...], axes: tuple[int, ...], max_dim: int) -> tuple[tuple[int, ...], ...]:
    """Runs of consecutive `axes` of `shape` merged while their product stays <= `max_dim`.

    The authors' rule (`merge_dims` of their reference): a dimension that would take the
    running product above `max_dim` closes the run (a dimension itself above `max_dim` stands
    alone), and axes of size one join a neighbour. With `max_dim=1024`, `(2, 3, 512, 4)` gives
    runs of sizes `(6, 512, 4)` and `(3, 4, 2)` one run of size 24.
    """
    groups: list[tuple[int, ...]] = []
    run: list[int] = []
    product = 1
    for axis in axes:
        size = shape[axis]
        if product * size > max_dim:
            if product > 1:
                groups.append(tuple(run))
                run, product = [axis], size
            else:
                groups.append((*run, axis))
                run, product = [], 1
        else:
            run.append(axis)
            product *= size
    if product > 1 or not groups:
        groups.append(tuple(run))
    elif run:  # trailing axes of size one
        groups[-1] = (*groups[-1], *run)
    return tuple(groups)


class ScaleBySoap(AbstractTransform):
    r"""Rescales updates by Adam run in the eigenbasis of Shampoo's preconditioner (SOAP).

    For a matrix gradient `G` SOAP keeps Shampoo's statistics `L = EMA(G G^T)` and
    `R = EMA(G^T G)` (decay `shampoo_beta`) and orthogonal bases `Q_L`, `Q_R` of their
    estimated eigenvectors. Each step rotates the gradient, `G' = Q_L^T G Q_R`, runs Adam
    there, and rotates back:

        m = b1 m + (1 - b1) G'             (Adam's moments live in the eigenbasis)
        v = b2 v + (1 - b2) G' * G'
        N = Q_L (m / (sqrt(v) + eps)) Q_R^T
        update = sqrt(1 - b2^t) / (1 - b1^t) * N     (t >= 1 counts the Adam steps)

    then updates `L` and `R` with `G`. A tensor of any rank gets one statistic and one basis
    per dimension (contracting `G` with itself over the others); a dimension larger than
    `max_precondition_dim`, and a vector unless `precondition_1d`, stays in the parameter's
    basis (identity). Scalars run plain Adam.

    The first update only gathers statistics and computes the bases by a full
    eigendecomposition (`jnp.linalg.eigh`); it returns zeros, so the gradient never rotates
    itself. Then, every `precondition_frequency` steps (when the Adam step count `t` is a
    multiple of it), each basis is refined by one step of power iteration and a QR
    decomposition, `Q <- qr(S Q)`, its columns sorted by the estimated eigenvalues
    `diag(Q^T S Q)` (descending); `v` is permuted alike and `m` rotated into the new basis.

    The paper's algorithm keeps `m` in the parameter's basis and rotates it every step; kept
    rotated (as in the authors' first release), it needs one rotation less per step and is
    rotated into the new basis at each refresh: the same numbers up to rounding.

    Cost under `jax.jit`: every step runs Adam in the current bases and the statistics' update
    (the first step discards its Adam step: a zero update, the moments kept); the bases' work
    (first step, refresh, plain) is the branches of one `lax.switch` on the step count, so a
    step pays for the `O(d^3)` eigendecomposition (first step) or QR and the moments' rotation
    (refresh) only when it needs it; a plain step costs two rotations, `O(size * sum(d))`, and
    the statistics' products. The program holds the Adam step once, and one eigendecomposition
    and one QR call per statistic (batching same-size ones deadlocks XLA's CPU runtime inside
    nested scans; see `_per_matrix`). On GPU, XLA may copy the
    branch index to the host to pick the branch, a small synchronisation per step (not
    measured here). Under `jax.vmap` (a batch of optimizers) the switch becomes a select that
    runs all three branches every step.

    Huge gradients: `v` and the statistics sum squares and products of the gradient's
    entries, which overflow float32 beyond about `1e19`. Each parameter's `v` and statistics
    are kept with a power-of-two scale (the state's `log2_scales`, 0 for ordinary gradients):
    where a gradient's entries exceed `2**16`, the scale grows to bring them within it, the
    stored `v` and statistics shrink alike, and `sqrt(v)` is scaled back. They stay finite,
    the numbers of ordinary gradients are unchanged (a scale of 1 changes no bit), and, Adam
    being scale-invariant, the update for gradients `c * g` is the update for `g` (up to
    `eps` and rounding).

    The eigendecomposition and QR run in float32 at least; statistics (computed from the
    gradient widened to float32) and bases are kept in float32 at least (as the authors'
    reference), the moments in the parameters' dtype, or in
    `mu_dtype` and `nu_dtype` (accumulated in float32 at least, see `fields.dtype`).

    State and sharding (`modopt.sharding`'s owner scheme): each parameter is one unit, in the
    shape the rotations act on (see `layout`). Parameters of one kind (that shape, which of its
    dimensions are rotated, and the stored dtypes of the moments and of the statistics) form a
    stack; a matrix taller than wide joins the wide ones of its transposed shape, as its
    transpose (its statistics and bases swapped). Everything SOAP keeps in the eigenbasis is
    stored stacked: Adam's moments, the statistics and the bases (`ScaleBySoapState`;
    `unstacked` gives them per parameter); only the count is replicated. On a mesh each stack
    is split over the devices (`OWNED`: never split further by ZeRO-1): a parameter's state
    stays whole on the device that owns it, its gradient moves there (one all-to-all for all
    parameters; a parameter replicated over a mesh axis is first cut along it, which moves
    nothing) and its update back, and its rotations, eigendecompositions and QR run there,
    once. The moments of a stack that padding to the device count would at least double (the
    stack's padding units as large as its parameters: an embedding and a head of one kind on 8
    devices) are instead stored unpadded, split along their own dimensions over every device,
    and move to the owners and back with the gradient (`OWNED_ELEMENTWISE`, `state_specs`).
    Without a mesh every parameter runs the single-device code. A parameter without elements
    gets an empty update and stores nothing.

    Args:
        b1: the decay rate of the first moment, in [0, 1).
        b2: the decay rate of the second moment, in [0, 1).
        shampoo_beta: the decay rate of the statistics `L`, `R`, in [0, 1); `None` uses `b2`.
        eps: added to `sqrt(v)` in the denominator, >= 0.
        precondition_frequency: refresh the eigenbases every this many steps, an integer >= 1.
        max_precondition_dim: dimensions larger than this are not rotated (static).
        merge_dims: merge consecutive small dimensions of a tensor while their product stays
            within `max_precondition_dim`, then rotate the merged dimensions (static).
        precondition_1d: also rotate vectors (one `(n, n)` statistic each) (static).
        normalize_grads: divide each parameter's rotated-back update `N` by its root mean square
            (plus 1e-30) before the bias correction (static).
        data_format: `"channels_first"` or `"channels_last"`: with `merge_dims`, a 4-D
            channels-last (NHWC) tensor is merged as NCHW (static).
        correct_bias: scale by `sqrt(1 - b2^t) / (1 - b1^t)` (static).
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.

    Example:
        >>> tx = modopt.chain(modopt.scale_by_soap(), modopt.scale_by_learning_rate(3e-3))

    Checked against `pytorch_optimizer.SOAP` 4.1.0 (tests/test_soap.py), which computes what the
    authors' reference computes. Where they differ, this follows the authors' reference
    (https://github.com/nikhilvyas/SOAP): `merge_dims` merges by its rule (pytorch_optimizer's
    collapses a tensor that fits in one dimension to shape `(1,)`), `normalize_grads` adds 1e-30
    (not `eps`) to the root mean square, and statistics and bases are float32 for bf16
    parameters.

    Reference: Vyas et al., 2024, "SOAP: Improving and Stabilizing Shampoo using Adam",
    https://arxiv.org/abs/2409.11321
    """

    b1: Scalar = fields.decay_rate(0.95)
    b2: Scalar = fields.decay_rate(0.95)
    shampoo_beta: Scalar | None = fields.decay_rate(None)
    eps: Scalar = fields.eps(1e-8)
    precondition_frequency: Scalar = hyperparameter(10, check=POSITIVE_INTEGER)
    max_precondition_dim: int = static(10000)
    merge_dims: bool = static(False)
    precondition_1d: bool = static(False)
    normalize_grads: bool = static(False)
    data_format: str = choice("channels_first", DATA_FORMATS)
    correct_bias: bool = static(True)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        value = self.max_precondition_dim
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"Invalid max_precondition_dim: {value!r} (must be an integer >= 1) in {type(self).__name__}."
            )

    def layout(self, shape: tuple[int, ...]) -> _Layout:
        """How a parameter of `shape` is rotated: the shape the rotations act on (merged
        dimensions with `merge_dims`), the parameter's axes forming each of its dimensions, and
        which of them have a statistic and a basis.

        Args:
            shape: the parameter's shape.
        """
        shape = tuple(shape)
        limit = self.max_precondition_dim
        if len(shape) == 0:
            return _Layout(False, (), (), ())
        if len(shape) == 1:
            return _Layout(False, shape, ((0,),), (self.precondition_1d and shape[0] <= limit,))
        axes = tuple(range(len(shape)))
        permute = self.merge_dims and self.data_format == "channels_last" and len(shape) == 4
        if permute:
            axes = _CHANNELS_FIRST
        groups = merged_groups(shape, axes, limit) if self.merge_dims else tuple((a,) for a in axes)
        merged = tuple(math.prod(shape[a] for a in group) for group in groups)
        return _Layout(permute, merged, groups, tuple(d <= limit for d in merged))

    def _kind(self, lay: _Layout, flip: bool, dtype: Any) -> _Kind:
        """The kind of a parameter of layout `lay` and dtype `dtype` (`flip`: a matrix taller
        than wide, its kind the transpose's)."""
        moments = tuple(
            jnp.dtype(dtype) if d is None else state_dtype_for(d, dtype)
            for d in (self.mu_dtype, self.nu_dtype)
        )
        shape, rotated = (lay.shape[::-1], lay.rotated[::-1]) if flip else (lay.shape, lay.rotated)
        return _Kind(shape, rotated, (*moments, _matrix_dtype(dtype)))

    def _units(
        self, leaves: Sequence[Any], dtypes: Sequence[Any]
    ) -> tuple[list[_Layout], list[bool], UnitStacks]:
        """Each leaf's layout; whether it is stored as its transpose (a matrix taller than wide,
        so that `(m, n)` and `(n, m)` weights share a stack: SOAP's numbers on the transpose are
        the transposed numbers, the two dimensions' statistics and bases swapped); and the
        stacks of leaves of one kind (a leaf without elements has none)."""
        layouts = [self.layout(jnp.shape(x)) for x in leaves]
        flips = [_flipped(lay) for lay in layouts]
        kinds = [
            None if math.prod(jnp.shape(x)) == 0 else self._kind(lay, flip, dtype)
            for x, lay, flip, dtype in zip(leaves, layouts, flips, dtypes)
        ]
        return layouts, flips, UnitStacks(kinds, [1] * len(layouts))

    def init(self, params):
        for path, p in jax.tree_util.tree_flatten_with_path(params)[0]:
            if jnp.iscomplexobj(p):
                raise TypeError(
                    f"{type(self).__name__} takes real parameters; the parameter at "
                    f"{jax.tree_util.keystr(path) or 'the root'} is {p.dtype}."
                )
        leaves = jax.tree_util.tree_leaves(params)
        _, _, stacks = self._units(leaves, [jnp.result_type(p) for p in leaves])
        fields = []
        for kind, members in zip(stacks.kinds, stacks.members):
            n, (mu_dtype, nu_dtype, dtype) = len(members), kind.dtypes
            # Before the first update the bases are unused; zeros keep `init` cheap.
            matrices = [
                tuple(jnp.zeros((n, d, d), dtype) if r else None for d, r in zip(kind.shape, kind.rotated))
                for _ in range(2)
            ]
            fields.append(
                (
                    jnp.zeros((n, *kind.shape), mu_dtype),
                    jnp.zeros((n, *kind.shape), nu_dtype),
                    *matrices,
                    jnp.zeros((n,), jnp.int32),
                )
            )
        columns = (tuple(column) for column in zip(*fields)) if fields else ((),) * 5
        return ScaleBySoapState(jnp.zeros([], jnp.int32), *columns)

    def unstacked(self, state: ScaleBySoapState, params: Any) -> ScaleBySoapState:
        """`state` per parameter (for inspection and tests; `update` takes the stacked state):
        `mu` and `nu` shaped like the params, `statistics` and `eigenbases` trees like the params
        whose leaves are tuples with one `(d, d)` array (or `None`) per dimension of the
        parameter's layout (`layout(shape).shape`, in its order). A parameter without elements
        has zero moments and `None` for every statistic and basis.

        Args:
            state: the stacked state.
            params: the parameters the state was made for, or their shapes and dtypes
                (`jax.ShapeDtypeStruct`s).
        """
        leaves, treedef = jax.tree_util.tree_flatten(params)
        dtypes = [jnp.result_type(p) for p in leaves]
        layouts, flips, stacks = self._units(leaves, dtypes)
        rows = stacks.unstack(list(zip(state.mu, state.nu, state.statistics, state.eigenbases, state.log2_scales)))
        per_leaf = []
        for p, dtype, lay, flip, row in zip(leaves, dtypes, layouts, flips, rows):
            if row is None:
                mu_dtype, nu_dtype, _ = self._kind(lay, flip, dtype).dtypes
                nones = (None,) * len(lay.shape)
                zeros = (jnp.zeros(jnp.shape(p), mu_dtype), jnp.zeros(jnp.shape(p), nu_dtype))
                per_leaf.append((*zeros, nones, nones, jnp.zeros((), jnp.int32)))
                continue
            units = _unit_map(jnp.shape(p), lay, swap=flip)  # stored in the kind's orientation
            mu, nu, statistics, bases, scale = row
            in_order = (lambda x: x[::-1]) if flip else (lambda x: x)
            matrices = [tuple(None if s is None else s[0] for s in in_order(m)) for m in (statistics, bases)]
            per_leaf.append((units.from_units(mu), units.from_units(nu), *matrices, scale[0]))
        columns = [treedef.unflatten([leaf[i] for leaf in per_leaf]) for i in range(5)]
        return ScaleBySoapState(state.count, *columns)

    def state_specs(self, params: Any, param_specs: Any) -> Any:
        """Every stack (moments, statistics, bases) lies on its owners (`OWNED`: each
        parameter's state whole on the device that owns it, the stack split over the mesh axes
        that divide its length, never split further by ZeRO-1); the count is replicated. The
        moments are elementwise (`OWNED_ELEMENTWISE`): those of a stack that padding would at
        least double (1 to 4 parameters of a kind on 8 devices) are stored unpadded and split
        along their own dimensions over every device instead, and join their owners for the
        step only (`modopt.sharding.spread_spec`).

        Args:
            params: the parameters, concrete or abstract.
            param_specs: their `PartitionSpec`s (unused: the stacks' layout is the owners').
        """
        del param_specs
        state = jax.eval_shape(self.init, params)
        owned = lambda tree, rule=OWNED: jax.tree_util.tree_map(lambda _: rule, tree)  # noqa: E731
        return ScaleBySoapState(
            REPLICATED,
            owned(state.mu, OWNED_ELEMENTWISE),
            owned(state.nu, OWNED_ELEMENTWISE),
            owned(state.statistics),
            owned(state.eigenbases),
            owned(state.log2_scales),
        )

    def update(self, updates, state, params=None, **extra_args):
        del extra_args
        treedef = jax.tree_util.tree_structure(updates)
        grads = treedef.flatten_up_to(updates)
        # The kinds are the parameters' (as in `init`); without them, the gradients'.
        like = grads if params is None else treedef.flatten_up_to(params)
        layouts, flips, stacks = self._units(grads, [jnp.result_type(x) for x in like])
        _check_stacks(stacks, state)
        mesh = current_mesh()
        # On a mesh a unit is the parameter in the shape the rotations act on, in its kind's
        # orientation; without one, the parameter as it is (the work then runs the
        # single-device code on it: the same arrays, the same numbers).
        units = [
            _unit_map(jnp.shape(g), lay, flip) if mesh is not None else whole_map(jnp.shape(g))
            for g, lay, flip in zip(grads, layouts, flips)
        ]
        specs = specs_of(params) if params is not None else [None] * len(grads)
        leaves = [
            None if kind is None else LeafUnits((g,), u, spec)
            for g, u, kind, spec in zip(grads, units, stacks.leaf_kinds, specs)
        ]
        count = state.count
        branch = jnp.where(count == 0, 0, jnp.where(count % self.precondition_frequency == 0, 1, 2))

        def work(kinds, pieces, states):
            if mesh is None:  # a piece is one parameter as it is: the single-device code runs on it
                owns = [_Own(g.shape[1:], self.layout(g.shape[1:])) for (g,) in pieces]
                lays = [own.lay for own in owns]
                operands = [own.to_work((g, *rows)) for own, (g,), rows in zip(owns, pieces, states)]
            else:  # a piece is a device's units of a stack, in the kind's shape and orientation
                lays = [
                    _Layout(False, k.shape, tuple((a,) for a in range(len(k.shape))), k.rotated)
                    for k in kinds
                ]
                # Each unit with whether it is its parameter's transpose (see `_statistics`).
                operands = [(g, *rows, turned) for (g, turned), rows in zip(pieces, states)]

            def each(fn, lay, *args):
                """`fn(lay, *args)` on a piece: one parameter, or on a mesh each of its units."""
                if mesh is None:
                    return fn(lay, *args)
                return per_unit(lambda *a: fn(lay, *a), len(args[0]), *args)

            # Every step: Adam with the current bases, and the statistics (the first step takes
            # no Adam step: a zero update, the moments kept).
            first = count == 0
            moved = []
            for lay, (g, mu, nu, stats, bases, scale, *turned) in zip(lays, operands):
                if turned:
                    step = lambda lay, *a: self._moments(lay, *a[:-1], count=count, turned=a[-1])  # noqa: E731
                else:
                    step = functools.partial(self._moments, count=count)
                y, new_mu, new_nu, stats, scale = each(step, lay, g, mu, nu, stats, bases, scale, *turned)
                y = jnp.where(first, jnp.zeros((), y.dtype), y)
                new_mu = jnp.where(first, widen(mu, self.mu_dtype), new_mu)
                new_nu = jnp.where(first, widen(nu, self.nu_dtype), new_nu)
                moved.append((y, new_mu, new_nu, stats, scale))
            stats = [m[3] for m in moved]
            bases = [ops[4] for ops in operands]
            moments = [(m[1], m[2]) for m in moved]

            # The bases: one switch around the linear algebra of every piece, a step pays only for
            # its branch.
            def eigh(stats, bases, moments):
                return self._first_bases(stats, bases, mesh), moments

            def refresh(stats, bases, moments):
                return self._refreshed(lays, stats, bases, moments, each, mesh)

            new_bases, moments = jax.lax.switch(
                branch, [eigh, refresh, lambda _, bases, moments: (bases, moments)], stats, bases, moments
            )
            results = [
                [y, mu.astype(ops[1].dtype), nu.astype(ops[2].dtype), st, q, scale]
                for (y, _, _, st, scale), q, (mu, nu), ops in zip(moved, new_bases, moments, operands)
            ]
            if mesh is None:
                results = [own.from_work(r) for own, r in zip(owns, results)]
            return [(y,) for y, *_ in results], [tuple(rows) for _, *rows in results]

        per_stack = list(zip(state.mu, state.nu, state.statistics, state.eigenbases, state.log2_scales))
        turned = [None if kind is None else jnp.asarray([flip]) for kind, flip in zip(stacks.leaf_kinds, flips)]
        done, new_stacks = run_per_unit(work, stacks, leaves, per_stack, mesh, extras=turned if mesh is not None else None)
        out_dtypes = [update_dtype(g.dtype, self.mu_dtype, self.nu_dtype) for g in grads]
        new_updates = [
            jnp.zeros(g.shape, dtype) if out is None else out[0].astype(dtype)
            for g, out, dtype in zip(grads, done, out_dtypes)
        ]
        columns = (tuple(column) for column in zip(*new_stacks)) if new_stacks else ((),) * 5
        return treedef.unflatten(new_updates), ScaleBySoapState(safe_increment(count), *columns)

    def _decay(self):
        return self.b2 if self.shampoo_beta is None else self.shampoo_beta

    def _statistics(self, lay: _Layout, g, stats, turned=None):
        """The statistics' EMAs with the gradient `g`.

        A unit that is its parameter's transpose (`turned`, on a mesh) gets its statistics
        summed as its parameter's would be, the same numbers: where a statistic is rank
        deficient (the larger one of every non-square matrix), its eigenbasis is arbitrary in
        the null space, and sums in another order would pick another basis there, which later
        steps carry to every entry."""
        if turned is not None and len(lay.shape) == 2 and lay.shape[0] != lay.shape[1]:
            own = _Layout(False, lay.shape[::-1], ((0,), (1,)), lay.rotated[::-1])

            def as_its_parameter(g, stats):
                # The transpose made an array of its own (a barrier): XLA would otherwise fold it
                # into the products, which then sum in another order.
                return self._statistics(own, jax.lax.optimization_barrier(g.T), stats[::-1])[::-1]

            return jax.lax.cond(turned, as_its_parameter, lambda g, stats: self._statistics(lay, g, stats), g, stats)
        x = _to_layout(g, lay)
        new = []
        for i, (s, rotated) in enumerate(zip(stats, lay.rotated)):
            if not rotated:
                new.append(None)
                continue
            others = [a for a in range(x.ndim) if a != i]
            wide = x.astype(s.dtype)  # float32 at least: a bfloat16 product would round the statistic
            outer = jnp.tensordot(wide, wide, axes=(others, others))
            new.append(update_moment(outer, s, self._decay(), 1))
        return tuple(new)

    def _rescaled(self, g, scale, stats):
        """The new scale (`ScaleBySoapState.log2_scales`) for the gradient `g`: the old one, or
        what brings `g`'s entries within `2**_BOUND` if larger; the factor that scales `g` (and
        its rotation) so that its squares come out divided by it; and the statistics, stored
        divided by the old scale, divided by the new one. All 1 and unchanged for ordinary
        gradients: a power of two scales exactly."""
        new = jnp.maximum(scale, 2 * overflow_exponent(g, 0, _BOUND))
        shrink = power_of_two(scale - new)
        stats = tuple(None if s is None else s * shrink.astype(s.dtype) for s in stats)
        return new, power_of_two(-(new >> 1)), stats

    def _moments(self, lay, g, mu, nu, stats, bases, scale, *, count, turned=None):
        """Adam in the eigenbasis `bases`, and the statistics' update: the update (in
        `update_dtype`), the moments at their accumulation precision (`widen`), the statistics
        and the scale. `nu` and the statistics are kept divided by `2**scale` (`_rescaled`)."""
        mu, nu = widen(mu, self.mu_dtype), widen(nu, self.nu_dtype)
        old_scale = scale
        scale, factor, stats = self._rescaled(g, scale, stats)
        nu = nu * power_of_two(old_scale - scale).astype(nu.dtype)
        rotated = _rotate(g, lay, bases, back=False)
        mu = update_moment(rotated.astype(mu.dtype), mu, self.b1, 1)
        nu = update_moment((rotated * factor.astype(rotated.dtype)).astype(nu.dtype), nu, self.b2, 2)
        root = jnp.sqrt(nu) * power_of_two(scale >> 1).astype(nu.dtype)
        direction = _rotate(mu / (root + self.eps), lay, bases, back=True)
        if self.normalize_grads:
            direction = direction / (1e-30 + jnp.sqrt(jnp.mean(jnp.square(direction))))
        if self.correct_bias:
            t = count.astype(jnp.float32)
            direction = direction * (jnp.sqrt(1 - self.b2**t) / (1 - self.b1**t)).astype(direction.dtype)
        stats = self._statistics(lay, g * factor.astype(g.dtype), stats, turned)
        direction = direction.astype(update_dtype(g.dtype, self.mu_dtype, self.nu_dtype))
        return direction, mu, nu, stats, scale

    def _first_bases(self, stats, bases, mesh):
        """The first step's bases: the statistics' eigenvectors (per piece, a tuple like its
        statistics)."""
        new = _per_matrix(lambda s: (_eigenvectors(s),), [[None if s is None else (s,) for s in row] for row in stats], mesh)
        return [
            tuple(None if n is None else n[0].astype(q.dtype) for n, q in zip(row, qs))
            for row, qs in zip(new, bases)
        ]

    def _refreshed(self, lays, stats, bases, moments, each, mesh):
        """A refresh step's bases (one power-iteration step and QR each, columns sorted by
        estimated eigenvalue), with per piece `nu` permuted alike and `mu` rotated into them."""
        pairs = [[None if s is None else (s, q) for s, q in zip(st, qs)] for st, qs in zip(stats, bases)]
        new = _per_matrix(_power_qr, pairs, mesh)
        out_bases, out_moments = [], []
        for lay, row, old, (mu, nu) in zip(lays, new, bases, moments):
            fresh = tuple(None if n is None else n[0].astype(q.dtype) for n, q in zip(row, old))
            if any(lay.rotated):
                orders = tuple(None if n is None else n[1] for n in row)
                mu, nu = each(_into_bases, lay, mu, nu, old, fresh, orders)
            out_bases.append(fresh)
            out_moments.append((mu, nu))
        return out_bases, out_moments


def _matrix_dtype(dtype: Any) -> Any:
    """The dtype of statistics, bases and their linear algebra: float32 at least."""
    return jnp.promote_types(dtype, jnp.float32)


def _to_layout(x: jax.Array, lay: _Layout) -> jax.Array:
    """A parameter-shaped array in the shape the rotations act on."""
    if lay.permute:
        x = jnp.transpose(x, _CHANNELS_FIRST)
    return x.reshape(lay.shape)


def _from_layout(x: jax.Array, shape: tuple[int, ...], lay: _Layout) -> jax.Array:
    """The inverse of `_to_layout`."""
    if lay.permute:
        return jnp.transpose(x.reshape(tuple(shape[a] for a in _CHANNELS_FIRST)), _CHANNELS_LAST)
    return x.reshape(shape)


def _rotate(x: jax.Array, lay: _Layout, bases: tuple, back: bool) -> jax.Array:
    """`x` in the eigenbasis (`Q^T` along each rotated dimension), or back from it (`Q`)."""
    shape = x.shape
    y = _to_layout(x, lay)
    for q in bases:
        # Contracting the leading axis moves the result's axis last: after every dimension the
        # axes are back in order.
        y = jnp.moveaxis(y, 0, -1) if q is None else jnp.tensordot(y, q, axes=([0], [1 if back else 0]))
    return _from_layout(y, shape, lay)


def _eigenvectors(s: jax.Array) -> jax.Array:
    """The eigenvectors of a symmetric matrix as columns, by decreasing eigenvalue."""
    ridge = _RIDGE * jnp.eye(s.shape[0], dtype=s.dtype)
    return jnp.flip(jnp.linalg.eigh(s + ridge)[1], axis=1)


def _power_qr(s: jax.Array, q: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One power-iteration step and QR of a basis `q` of the statistic `s`: the new basis (in
    float32 at least) and the order of its columns (by estimated eigenvalue, descending)."""
    product = s @ q
    estimates = jnp.sum(q * product, axis=0)  # diag(Q^T S Q)
    order = jnp.argsort(estimates, descending=True)
    return jnp.linalg.qr(product[:, order])[0], order


def _into_bases(lay: _Layout, mu: jax.Array, nu: jax.Array, old: tuple, new: tuple, orders: tuple) -> tuple:
    """The moments after a refresh: `mu` rotated from the bases `old` into `new`, `nu`
    permuted along each dimension as its basis's columns were (`orders`)."""
    v = _to_layout(nu, lay)
    for axis, order in enumerate(orders):
        if order is not None:
            v = jnp.take(v, order, axis=axis)
    mu = _rotate(_rotate(mu, lay, old, back=True), lay, new, back=False).astype(mu.dtype)
    return mu, _from_layout(v, nu.shape, lay)


def _per_matrix(fn: Any, rows: list, mesh: Any) -> list:
    """`fn` on every entry of `rows` (lists of tuples of arrays, or `None`), its results in the
    same places. Without a mesh an entry is one matrix's arrays; on a mesh an entry stacks a
    device's units along axis 0, each stack run by `per_unit`.

    Same-size matrices are not batched into one `jax.vmap`ped eigendecomposition or QR call:
    on XLA's CPU runtime (jax 0.10.2) such batched LAPACK calls inside nested `lax.scan`s (a
    whole training run in one jit, as `benchmarks/time_to_result.py` compiles it) deadlock."""
    if mesh is not None:
        return [[None if e is None else per_unit(fn, len(e[0]), *e) for e in row] for row in rows]
    return [[None if e is None else fn(*e) for e in row] for row in rows]


class _Own(NamedTuple):
    """Without a mesh: one parameter's piece, its arrays as the single-device code has them
    (the gradient and the moments in the parameter's shape, the statistics and bases in the
    order of its own dimensions) and back to its stack's rows."""

    shape: tuple[int, ...]
    lay: _Layout

    def _stored(self) -> tuple[UnitMap, bool]:
        flip = _flipped(self.lay)
        return _unit_map(self.shape, self.lay, flip), flip

    def to_work(self, arrays: tuple) -> tuple:
        (units, flip), (g, mu, nu, stats, bases, scale) = self._stored(), arrays
        matrices = [jax.tree_util.tree_map(lambda x: x[0], m[::-1] if flip else m) for m in (stats, bases)]
        return (g[0], units.from_units(mu), units.from_units(nu), *matrices, scale[0])

    def from_work(self, arrays: list) -> list:
        (units, flip), (y, mu, nu, stats, bases, scale) = self._stored(), arrays
        matrices = [jax.tree_util.tree_map(lambda x: x[None], m[::-1] if flip else m) for m in (stats, bases)]
        return [y[None], units.to_units(mu), units.to_units(nu), *matrices, scale[None]]


def _flipped(lay: _Layout) -> bool:
    """Whether a parameter of layout `lay` is stored as its transpose (a matrix taller than wide)."""
    return len(lay.shape) == 2 and lay.shape[0] > lay.shape[1]


def _unit_map(shape: tuple[int, ...], lay: _Layout, swap: bool) -> UnitMap:
    """A parameter of `shape` as one unit in the shape the rotations act on (`swap`: transposed)."""
    return whole_map(tuple(shape), lay.groups, _CHANNELS_FIRST if lay.permute else None)._replace(swap=swap)


def _names(entry: Any) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _spec(entries: Sequence[tuple[str, ...]]) -> PartitionSpec:
    return PartitionSpec(
        *(None if not names else names[0] if len(names) == 1 else tuple(names) for names in entries)
    )


def _check_stacks(stacks: UnitStacks, state: ScaleBySoapState) -> None:
    """Raises `ValueError` if the gradients' stacks are not the state's."""
    found = [tuple(jnp.shape(m)) for m in state.mu]
    expected = [(stacks.size(s), *kind.shape) for s, kind in enumerate(stacks.kinds)]
    # A stack may be stored with padding units after its own (an `Optimizer` on a mesh pads it).
    if len(found) != len(expected) or any(f[1:] != e[1:] or f[0] < e[0] for f, e in zip(found, expected)):
        raise ValueError(
            f"ScaleBySoap: the state holds stacks of moments shaped {found}, but these gradients make "
            f"stacks shaped {expected}: the state was made for other parameters (other shapes or dtypes)."
        )


scale_by_soap = ScaleBySoap
