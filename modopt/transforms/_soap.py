"""SOAP: Adam run in the eigenbasis of Shampoo's preconditioner."""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .. import fields
from .._base import AbstractTransform
from .._fields import POSITIVE_INTEGER, choice, hyperparameter, static
from .._moments import init_state, update_dtype, update_moment, widen
from .._numerics import safe_increment
from .._specs import REPLICATED, padded
from .._fields import Scalar
from jax.typing import DTypeLike

DATA_FORMATS = ("channels_first", "channels_last")
_CHANNELS_FIRST = (0, 3, 1, 2)  # a channels-last 4-D leaf's axes in channels-first order
_CHANNELS_LAST = (0, 2, 3, 1)  # the inverse permutation
_RIDGE = 1e-30  # added to a statistic's diagonal before its first eigendecomposition (as the reference)


class ScaleBySoapState(NamedTuple):
    """SOAP's step count, Adam's moments in the eigenbasis, Shampoo's statistics and their
    eigenbases.

    `statistics` and `eigenbases` hold, per parameter, a tuple with one entry per dimension
    that SOAP rotates (the parameter's dimensions, or its merged dimensions with
    `merge_dims=True`): a `(d, d)` array, or `None` for a dimension left in the parameter's
    basis (larger than `max_precondition_dim`, or a vector's without `precondition_1d`).
    """

    count: jax.Array  # int32 scalar: updates taken; the first only gathers statistics
    mu: Any  # first moment, like the params, in the eigenbasis (in `mu_dtype` if set)
    nu: Any  # second moment, like the params, in the eigenbasis (in `nu_dtype` if set)
    statistics: Any  # per parameter: a tuple of EMAs of G G^T contracted over the other dimensions
    eigenbases: Any  # per parameter: a tuple of orthogonal matrices (columns: estimated eigenvectors)


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

    Cost under `jax.jit`: the three kinds of step (first, refresh, plain) are the branches of
    one `lax.switch` on the step count, so a step runs only its branch and pays for the
    `O(d^3)` eigendecomposition (first step) or QR (refresh) only when it needs it; a plain
    step costs two rotations, `O(size * sum(d))`, and the statistics' products. All three
    branches are compiled (the program holds the Adam step twice). On GPU, XLA may copy the
    branch index to the host to pick the branch, a small synchronisation per step (not
    measured here). Under `jax.vmap` (a batch of optimizers) the switch becomes a select that
    runs all three branches every step.

    The eigendecomposition and QR run in float32 at least; statistics (computed from the
    gradient widened to float32) and bases are kept in float32 at least (as the authors'
    reference), the moments in the parameters' dtype, or in
    `mu_dtype` and `nu_dtype` (accumulated in float32 at least, see `fields.dtype`).

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

    def init(self, params):
        def one(p):
            dtype = _matrix_dtype(p.dtype)
            lay = self.layout(p.shape)
            zeros = tuple(jnp.zeros((d, d), dtype) if r else None for d, r in zip(lay.shape, lay.rotated))
            # Before the first update the bases are unused; zeros keep `init` cheap.
            bases = tuple(jnp.zeros((d, d), dtype) if r else None for d, r in zip(lay.shape, lay.rotated))
            return zeros, bases

        for path, p in jax.tree_util.tree_flatten_with_path(params)[0]:
            if jnp.iscomplexobj(p):
                raise TypeError(
                    f"{type(self).__name__} takes real parameters; the parameter at "
                    f"{jax.tree_util.keystr(path) or 'the root'} is {p.dtype}."
                )
        leaves, treedef = jax.tree_util.tree_flatten(params)
        pairs = [one(p) for p in leaves]
        return ScaleBySoapState(
            count=jnp.zeros([], jnp.int32),
            mu=init_state(params, self.mu_dtype),
            nu=init_state(params, self.nu_dtype),
            statistics=treedef.unflatten([s for s, _ in pairs]),
            eigenbases=treedef.unflatten([q for _, q in pairs]),
        )

    def state_specs(self, params: Any, param_specs: Any) -> Any:
        """Moments follow the parameters. The statistic and the basis of a dimension are split
        along their first axis (rows) as the parameter splits that dimension (the mesh axes of
        the parameter's axes a merged dimension gathers), and not along the second; the count
        is replicated.

        The split is valid: the parameter's spec splits that dimension evenly, so the rows do
        too. It keeps the memory of a `(d, d)` matrix per device at `d^2 / ways`, and the
        rotations contract the parameter's split axis with the basis' split rows. The
        eigendecomposition and QR are not partitioned: XLA gathers each matrix for them (at the
        first step and at refreshes). With `merge_dims`, merging a split axis with others is a
        reshape that XLA may only do by gathering the tensor.

        Args:
            params: the parameters, concrete or abstract.
            param_specs: their `PartitionSpec`s.
        """
        treedef = jax.tree_util.tree_structure(params)

        def one(p, spec):
            lay = self.layout(p.shape)
            entries = padded(spec, len(p.shape))
            specs = []
            for group, rotated in zip(lay.groups, lay.rotated):
                if not rotated:
                    specs.append(None)
                    continue
                names = tuple(n for a in group for n in _axis_names(entries[a]))
                row = None if not names else names[0] if len(names) == 1 else names
                specs.append(PartitionSpec(row, None))
            return tuple(specs)

        stats = [one(p, s) for p, s in zip(treedef.flatten_up_to(params), treedef.flatten_up_to(param_specs))]
        return ScaleBySoapState(
            count=REPLICATED,
            mu=param_specs,
            nu=param_specs,
            statistics=treedef.unflatten(stats),
            eigenbases=treedef.unflatten(stats),
        )

    def update(self, updates, state, params=None, **extra_args):
        del params, extra_args
        treedef = jax.tree_util.tree_structure(updates)
        layouts = [self.layout(g.shape) for g in treedef.flatten_up_to(updates)]
        columns = [treedef.flatten_up_to(t) for t in (updates, state.mu, state.nu, state.statistics, state.eigenbases)]
        operands = [list(leaf) for leaf in zip(*columns)]
        count = state.count
        branch = jnp.where(count == 0, 0, jnp.where(count % self.precondition_frequency == 0, 1, 2))

        def steps(step):
            return lambda ops: [step(lay, *leaf) for lay, leaf in zip(layouts, ops)]

        refresh = functools.partial(self._adam_step, count=count, refresh=True)
        plain = functools.partial(self._adam_step, count=count, refresh=False)
        results = jax.lax.switch(branch, [steps(self._first_step), steps(refresh), steps(plain)], operands)
        new = [treedef.unflatten([r[i] for r in results]) for i in range(5)]
        return new[0], ScaleBySoapState(safe_increment(count), *new[1:])

    def _decay(self):
        return self.b2 if self.shampoo_beta is None else self.shampoo_beta

    def _statistics(self, lay: _Layout, g, stats):
        """The statistics' EMAs with the gradient `g`."""
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

    def _first_step(self, lay, g, mu, nu, stats, bases):
        """Statistics from the first gradient, bases by eigendecomposition, a zero update."""
        stats = self._statistics(lay, g, stats)
        bases = tuple(None if s is None else _eigenvectors(s).astype(q.dtype) for s, q in zip(stats, bases))
        return [jnp.zeros(g.shape, update_dtype(g.dtype, self.mu_dtype, self.nu_dtype)), mu, nu, stats, bases]

    def _adam_step(self, lay, g, mu, nu, stats, bases, *, count, refresh):
        """Adam in the eigenbasis; the statistics' update; with `refresh`, the bases' one. The
        moments are read and updated at their accumulation precision (`widen`) and returned in
        their stored dtypes, the update in `update_dtype`."""
        stored_mu, stored_nu = mu.dtype, nu.dtype
        mu, nu = widen(mu, self.mu_dtype), widen(nu, self.nu_dtype)
        rotated = _rotate(g, lay, bases, back=False)
        mu = update_moment(rotated.astype(mu.dtype), mu, self.b1, 1)
        nu = update_moment(rotated.astype(nu.dtype), nu, self.b2, 2)
        direction = _rotate(mu / (jnp.sqrt(nu) + self.eps), lay, bases, back=True)
        if self.normalize_grads:
            direction = direction / (1e-30 + jnp.sqrt(jnp.mean(jnp.square(direction))))
        if self.correct_bias:
            t = count.astype(jnp.float32)
            direction = direction * (jnp.sqrt(1 - self.b2**t) / (1 - self.b1**t)).astype(direction.dtype)
        stats = self._statistics(lay, g, stats)
        if refresh and any(lay.rotated):
            old = bases
            bases, nu = _power_qr(stats, bases, nu, lay)
            mu = _rotate(_rotate(mu, lay, old, back=True), lay, bases, back=False).astype(mu.dtype)
        direction = direction.astype(update_dtype(g.dtype, self.mu_dtype, self.nu_dtype))
        return [direction, mu.astype(stored_mu), nu.astype(stored_nu), stats, bases]


def _matrix_dtype(dtype: Any) -> Any:
    """The dtype of statistics, bases and their linear algebra: float32 at least."""
    return jnp.promote_types(dtype, jnp.float32)


def _axis_names(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


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


def _power_qr(stats: tuple, bases: tuple, nu: jax.Array, lay: _Layout) -> tuple[tuple, jax.Array]:
    """One power-iteration step and QR per basis, columns sorted by estimated eigenvalue;
    `nu` permuted alike along each dimension."""
    v = _to_layout(nu, lay)
    new = []
    for axis, (s, q) in enumerate(zip(stats, bases)):
        if s is None:
            new.append(None)
            continue
        product = s @ q
        estimates = jnp.sum(q * product, axis=0)  # diag(Q^T S Q)
        order = jnp.argsort(estimates, descending=True)
        v = jnp.take(v, order, axis=axis)
        new.append(jnp.linalg.qr(product[:, order])[0].astype(q.dtype))
    return tuple(new), _from_layout(v, nu.shape, lay)


scale_by_soap = ScaleBySoap
