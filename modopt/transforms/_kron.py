"""PSGD Kron: preconditioned SGD with a Kronecker-factored preconditioner fitted to random probes."""

from __future__ import annotations

import functools
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg
import numpy as np

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import FINITE, NONNEGATIVE, POSITIVE, UNIT, choice, hyperparameter, prng_key, static
from .._state.moments import (
    bias_correction,
    init_state,
    store,
    update_dtype,
    widened_update_moment,
)
from .._util.numerics import safe_increment
from ._kernel_views import kernel_views
from .._core.specs import OWNED, REPLICATED
from ..sharding._owners import LeafUnits, UnitStacks, current_mesh, per_unit, run_per_unit, specs_of, whole_map
from .._util.trees import cast_like
from ..schedules._base import AbstractSchedule, ScalarOrSchedule, _scalar_or_schedule, value_at
from .._core.fields import Scalar
from jax.typing import DTypeLike
from ._newton_schulz import as_dimension_numbers
from ._kron_numerics import (  # noqa: F401  (DAMPING, kron_probes: the probes' definition, for the tests)
    DAMPING,
    PADDED_MAX,
    clip_rms,
    damped,
    entry_index,
    entry_numbers,
    fit_padded,
    fit_padded_vector,
    kron_probes,
    normals_at,
    precondition,
    precondition_padded,
    precondition_padded_vector,
    probe_offsets,
    split_offset,
    threefry2x32,
    update_factors,
    balanced,
)

MEMORY_SAVE_MODES = (None, "smart_one_diag", "one_diag", "all_diag")


class PrecondUpdateProbSchedule(AbstractSchedule):
    r"""The reference's anneal of the preconditioner update probability: flat, then exponential.

    `p(count) = clip(max_prob * exp(-decay * (count - flat_start)), min_prob, max_prob)`: `max_prob`
    for the first `flat_start` steps, then an exponential decay down to `min_prob` (with the
    defaults, 1.0 for 500 steps, about 0.1 by step 2800 and the floor 0.03 from about step 4000).
    PSGD fits its preconditioner most at the start of training; once fitted, it needs few updates.

    Args:
        max_prob: the probability during the flat start and the ceiling, in [0, 1].
        min_prob: the floor of the probability, in [0, 1].
        decay: the exponential decay rate per step after the flat start, >= 0.
        flat_start: the number of steps at `max_prob`, finite.

    Example:
        >>> schedule = modopt.precond_update_prob_schedule()
        >>> [round(float(schedule(n)), 3) for n in (0, 500, 2800, 10_000)]
        [1.0, 1.0, 0.1, 0.03]

    Reference: `kron_torch.precond_update_prob_schedule` (Evan Walters), https://github.com/evanatyourservice/kron_torch
    """

    max_prob: Scalar = hyperparameter(1.0, check=UNIT)
    min_prob: Scalar = hyperparameter(0.03, check=UNIT)
    decay: Scalar = hyperparameter(0.001, check=NONNEGATIVE)
    flat_start: Scalar = hyperparameter(500, check=FINITE)

    def probe_counts(self):
        # Flat, then decreasing toward the floor: the extremes are at 0 and far away.
        return (0, max(np.asarray(self.flat_start).item(), 0), 2**30)

    def __call__(self, count):
        elapsed = jnp.asarray(count, jnp.float32) - self.flat_start
        return jnp.clip(self.max_prob * jnp.exp(-self.decay * elapsed), self.min_prob, self.max_prob)


precond_update_prob_schedule = PrecondUpdateProbSchedule


def _probability(value: Any) -> Any:
    """Converter: `None` is the reference's schedule; numbers and schedules as any scheduled field."""
    return PrecondUpdateProbSchedule() if value is None else _scalar_or_schedule(value)


class Layout(NamedTuple):
    """How a parameter is preconditioned: the shape the factors see, and each factor's kind.

    shape: the parameter's shape after merging (a scalar is `(1,)`).
    groups: for each axis of `shape`, the parameter's axes merged into it (in order).
    diagonal: for each axis of `shape`, whether its factor is diagonal (a vector) or triangular.
    """

    shape: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    diagonal: tuple[bool, ...]


def kron_layout(
    shape: tuple[int, ...],
    *,
    merge_dims: bool = True,
    max_size_triangular: int = 8192,
    min_ndim_triangular: int = 2,
    memory_save_mode: str | None = None,
    view: tuple[tuple[int, ...], ...] | None = None,
) -> Layout:
    """The `Layout` of a parameter of `shape`, by the reference's rules.

    With `merge_dims`, a parameter of three or more axes is seen as the matrix
    `(prod(shape[:-1]), shape[-1])`. (The reference compares it with `(shape[0],
    prod(shape[1:]))` by the signed differences of their sides, a comparison the first always
    wins for nonempty parameters.) `view`, two runs of neighbouring axes (the layer's
    inputs and outputs, see `modopt.dimension_numbers`), replaces that matrix by the merge of
    each run: an Equinox convolution kernel `(out, in, kh, kw)` with `((0,), (1, 2, 3))` is
    `(out, in * kh * kw)`. Without `merge_dims` it is not used. An axis's
    factor is diagonal when its size is 1 or above `max_size_triangular`, when the (merged) rank
    is below `min_ndim_triangular`, or when `memory_save_mode` says so: `"one_diag"` makes the
    largest axis diagonal (the last of equal largest ones), `"smart_one_diag"` does so only when
    it is strictly larger than every other, `"all_diag"` makes every axis diagonal.
    """
    shape = tuple(int(d) for d in shape)
    if not shape:
        return Layout((1,), ((),), (True,))
    groups = tuple((axis,) for axis in range(len(shape)))
    if len(shape) > 2 and merge_dims:
        groups = (tuple(range(len(shape) - 1)), (len(shape) - 1,)) if view is None else tuple(map(tuple, view))
        shape = tuple(math.prod(shape[a] for a in run) for run in groups)
    largest = int(np.argsort(shape)[::-1][0])
    if memory_save_mode is None:
        chosen = [False] * len(shape)
    elif memory_save_mode == "all_diag":
        chosen = [True] * len(shape)
    elif memory_save_mode == "one_diag" or (
        memory_save_mode == "smart_one_diag" and len(shape) > 1 and sorted(shape)[-1] > sorted(shape)[-2]
    ):
        chosen = [axis == largest for axis in range(len(shape))]
    else:
        chosen = [False] * len(shape)
    diagonal = tuple(
        size == 1 or size > max_size_triangular or len(shape) < min_ndim_triangular or chosen[axis]
        for axis, size in enumerate(shape)
    )
    return Layout(shape, groups, diagonal)


class ScaleByKronState(NamedTuple):
    """The state of `scale_by_kron`.

    count: updates made so far (int32 scalar).
    momentum: the EMA of the gradients, like the params (in `mu_dtype`).
    Qs: the preconditioner's factors, stacked: one entry per kind of parameter (the same layout,
        see `kron_layout`), in the order of the first parameter of each kind; an entry is a
        tuple with one factor per axis of the layout, each stacking that factor of every
        parameter of the kind (in the order of the parameters): `(n, d, d)` upper-triangular
        matrices or `(n, d)` diagonals. `ScaleByKron.unstacked` gives them per parameter. On a
        mesh each stack is split over the devices: each parameter's factors live on the one
        device that preconditions it (`modopt.sharding`'s owner scheme). A parameter without
        elements has no factors (`()` in `unstacked`) and gets an empty update.
    key: the PRNG key of the next step (a typed key): the coin flips and the probes.
    """

    count: jax.Array
    momentum: Any
    Qs: Any
    key: jax.Array


class ScaleByKron(AbstractTransform):
    r"""Preconditions the momentum with PSGD's Kronecker-factored preconditioner (PSGD Kron).

    Per parameter, seen as a tensor of `k` axes (see `kron_layout`), the preconditioner is
    `P = (Q_1^T Q_1) ⊗ ... ⊗ (Q_k^T Q_k)`, each `Q_i` upper triangular (or diagonal). A step:

    1. `m = b1 m + (1 - b1) g`, `m_hat = m / (1 - b1^t)`.
    2. With probability `preconditioner_update_probability` (a coin flipped with the state's
       key), update the factors: draw a probe `V ~ N(0, I)`, damp the input
       `G = m_hat + sqrt(eps_f32) mean|m_hat| V` (or `g` with `momentum_into_precond_update=False`),
       and form `A = G ×_i Q_i` and `B = V ×_i Q_i^{-T}` (mode products). For each axis, with
       `A_i`, `B_i` the unfoldings along it, `Q_i -= precond_lr * triu(A_i A_i^T - B_i B_i^T) Q_i
       / lb(A_i A_i^T + B_i B_i^T)`, `lb` a lower bound of the spectral norm (a diagonal factor
       uses the diagonals and the largest entry). This descends Li's criterion
       `E[g^T P g + v^T P^{-1} v]`, whose minimum whitens the gradients: `P = E[g g^T]^{-1/2}`.
       With probability `balance_prob` (another coin), an update first rescales the factors
       to equal largest entries (`P` unchanged).
    3. `update = P m_hat`, scaled down to an RMS of at most 1.1.

    Huge gradients (entries beyond `2**32` in float32, where `A A^T` or the RMS would overflow)
    are handled exactly: `A` and `B` are scaled alike by a power of two before their Gram
    matrices, whose ratio is the factors' step, and the RMS and `mean|m_hat|` are computed
    on a scaled copy. Ordinary gradients are scaled by exactly 1 (no bit changes).

    Randomness: each step splits the state's key into the next step's and one from which it
    draws four words of bits: the update coin (`u < p`, `u` uniform in [0, 1), `p` the
    probability at the step count before this step), the balance coin, and the probes' seed.
    The probes are Threefry's normal numbers of the parameters' entries under that seed,
    numbered in the order of the leaves (`kron_probes`): the same however the work is cut (on
    a mesh, each device draws those of the parameters it owns). The key is a state leaf: runs
    are reproducible and a checkpoint resumes bit for bit. The factors' update is under
    `lax.cond`: under `jit` a skipped update costs nothing.

    Parameters of one layout are stacked and fitted and preconditioned together, one program
    per layout (a matrix taller than wide as its transpose, so that `(m, n)` and `(n, m)`
    weights share a stack). Small matrices of several layouts (no axis above 192) share one
    program, zero-padded to the largest, where that adds at most a tenth to the step's
    estimated arithmetic (`_padded_groups`): the tiny kernels of a network beside a large
    layer do, matrices of similar cost do not. Vectors of at most 192 entries (biases, norms'
    scales), whose one diagonal factor is fitted entry by entry, share one program, each padded
    to the longest. The probes of every program are drawn together. On CPU the triangular
    solves run in blocks of matrix products (`conjugate`): as fast as LAPACK's at 128 x 128,
    2-3 times faster at 2048 x 2048, and free of its stalls on a loaded machine.

    Layout: a matrix's two factors are alike, so `(in, out)` and `(out, in)` storage give the
    same update, transposed. With `merge_dims`, a parameter of higher rank is the matrix
    `(prod(shape[:-1]), shape[-1])` by default (the reference's rule): Flax's `(*spatial, in,
    out)` convolution kernel `(3, 3, 64, 128)` is `(576, 128)`, its layer's matrix. Equinox
    stores a convolution kernel `(out, in, *spatial)`, which that rule would read as
    `(out * in * kh, kw)`; `weight_dimension_numbers` give the layer's matrix instead (the
    reduction axes merged into one side, the output axes into the other, each a run of
    neighbouring axes): `(128, 64, 3, 3)` is `(128, 576)`. `modopt.Optimizer(tx, model)` (and
    `NnxOptimizer`) fill them from the model's layers where they are `None`; for a transform
    used on its own, pass `modopt.dimension_numbers(model, higher_rank=True)`.

    Checked against `kron_torch.Kron` 0.3.3 (tests/test_kron.py: 8 steps, the same probes fed to
    both) and a NumPy float64 implementation of the update from the paper. Departures:
    kron_torch updates deterministically every `ceil(1 / p)`-th step (a counter) and balances
    by Python's `random`; here both are coins from the key (the same at `p = 1`). kron_torch
    adds the damping to the momentum in place, so its preconditioned step sees the damped
    momentum; here (as in psgd_jax and Li's psgd_torch) it sees `m_hat` itself. The momentum is
    kept in the parameter's shape (the reference keeps the merged one); a scalar is a
    one-element diagonal (kron_torch cannot take 0-d parameters). Matrix products run at JAX's
    default precision; for full float32 factors on GPU or TPU, trace the step under
    `jax.default_matmul_precision("float32")`.

    Args:
        b1: the decay rate of the momentum, in [0, 1).
        preconditioner_update_probability: the probability of a preconditioner update at a step,
            in [0, 1]: a number or a schedule of the step count; `None` (the default) is
            `precond_update_prob_schedule()` (1.0 for 500 steps, then down to 0.03).
        max_size_triangular: axes longer than this get a diagonal factor (static).
        min_ndim_triangular: parameters (after merging) of fewer axes get diagonal factors only
            (static).
        memory_save_mode: `None` (triangular factors wherever allowed), `"smart_one_diag"`,
            `"one_diag"` or `"all_diag"`: see `kron_layout` (static).
        momentum_into_precond_update: fit the preconditioner to the debiased momentum (`True`)
            or to the raw gradient (static).
        precond_lr: the normalized step size of the factors' updates, in [0, 1].
        precond_init_scale: the initial preconditioner is this times the identity (each factor
            its `k`-th root), > 0.
        merge_dims: see parameters of three or more axes as matrices (static).
        mu_dtype: the dtype of the momentum; `None` keeps the parameters'. Accumulated in
            float32 at least (see `fields.dtype`).
        precond_dtype: the dtype of the factors and of the preconditioner's arithmetic; `None`
            is float32 (as the reference), whatever the parameters' dtype. Unlike a state dtype
            it also sets the precision of the arithmetic (as the reference's).
        balance_prob: the probability that an update first balances the factors, in [0, 1].
        key: the PRNG key of the first step (`jax.random.key(0)`), its raw data, or an integer
            seed.
        weight_dimension_numbers: which axes of each kernel of rank above 2 form the rows and
            which the columns of the matrix it is merged into (static): `None` (the default
            rule), one `MuonDimensionNumbers` for all, a tree of them (`None` entries: the
            default rule) with the params' structure or a prefix of it, or a function of the
            params returning one. Leaves of rank 2 or less are not reshaped; dimension numbers
            with batch axes or axes that are not runs are an error naming the path.

    Example:
        >>> tx = modopt.chain(modopt.scale_by_kron(preconditioner_update_probability=0.1), modopt.scale(-3e-4))

    Reference: Li, 2015, "Preconditioned Stochastic Gradient Descent", https://arxiv.org/abs/1512.04202;
    Li, 2018, "Preconditioner on Matrix Lie Group for SGD", https://arxiv.org/abs/1809.10232; the
    Kron implementation of https://github.com/evanatyourservice/kron_torch.
    """

    b1: Scalar = fields.decay_rate(0.9)
    preconditioner_update_probability: ScalarOrSchedule = hyperparameter(
        None, check=UNIT, kind="number_or_schedule", converter=_probability
    )
    max_size_triangular: int = static(default=8192)
    min_ndim_triangular: int = static(default=2)
    memory_save_mode: str | None = choice(None, MEMORY_SAVE_MODES)
    momentum_into_precond_update: bool = static(default=True)
    precond_lr: Scalar = hyperparameter(0.1, check=UNIT)
    precond_init_scale: Scalar = hyperparameter(1.0, check=POSITIVE)
    merge_dims: bool = static(default=True)
    mu_dtype: DTypeLike | None = fields.dtype()
    precond_dtype: DTypeLike | None = fields.dtype(of="compute")
    balance_prob: Scalar = hyperparameter(0.01, check=UNIT, kw_only=True)
    key: jax.Array = prng_key(0, kw_only=True)
    weight_dimension_numbers: Any = static(default=None, converter=as_dimension_numbers, kw_only=True)
    # Set from the model by `modopt.Optimizer` where None, with the kernels of rank above 2.
    dimension_numbers_field: ClassVar[str] = "weight_dimension_numbers"
    dimension_numbers_higher_rank: ClassVar[bool] = True

    def __check_init__(self):
        for name in ("max_size_triangular", "min_ndim_triangular"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"Invalid {name}: {value!r} (must be an integer >= 0) in ScaleByKron.")

    def layout(self, shape: tuple[int, ...], view: tuple[tuple[int, ...], ...] | None = None) -> Layout:
        """The `Layout` of a parameter of `shape` under this transform's settings; `view`: the
        runs of axes its dimension numbers merge it into (see `kron_layout`)."""
        return kron_layout(
            shape,
            merge_dims=self.merge_dims,
            max_size_triangular=self.max_size_triangular,
            min_ndim_triangular=self.min_ndim_triangular,
            memory_save_mode=self.memory_save_mode,
            view=view,
        )

    def _dtype(self) -> Any:
        return jnp.float32 if self.precond_dtype is None else self.precond_dtype

    def _units(self, tree: Any) -> tuple[list[Layout], list[bool], UnitStacks]:
        """Each leaf's layout; whether it is a matrix taller than wide, stacked as its transpose
        (so that a `(m, n)` and an `(n, m)` weight share a stack: Kron's math is the same on the
        transpose, with the factors swapped); and the stacks of same-layout leaves (a leaf
        without elements has none: no factors, an empty update)."""
        shapes = [jnp.shape(x) for x in jax.tree_util.tree_leaves(tree)]
        views = kernel_views(self.weight_dimension_numbers, tree, "scale_by_kron")
        layouts = [self.layout(shape, view) for shape, view in zip(shapes, views)]
        flips = [len(lay.shape) == 2 and lay.shape[0] > lay.shape[1] for lay in layouts]
        kinds = [
            None
            if math.prod(shape) == 0
            else (lay.shape[::-1], lay.diagonal[::-1])
            if flip
            else (lay.shape, lay.diagonal)
            for shape, lay, flip in zip(shapes, layouts, flips)
        ]
        return layouts, flips, UnitStacks(kinds, [1] * len(layouts))

    def init(self, params):
        dtype = self._dtype()
        for path, p in jax.tree_util.tree_flatten_with_path(params)[0]:
            if jnp.iscomplexobj(p):
                raise TypeError(
                    f"scale_by_kron: the parameter at {jax.tree_util.keystr(path)} is complex "
                    f"({jnp.result_type(p)}); PSGD Kron's triangular factors are real. Split it into real "
                    "and imaginary parts."
                )
        _, _, stacks = self._units(params)
        factors = []
        for (shape, diagonal), leaves in zip(stacks.kinds, stacks.members):
            scale = jnp.asarray(self.precond_init_scale, dtype) ** (1.0 / len(shape))
            one = [jnp.ones((d,), dtype) if diag else jnp.eye(d, dtype=dtype) for d, diag in zip(shape, diagonal)]
            factors.append(tuple(jnp.broadcast_to(scale * q, (len(leaves), *q.shape)) for q in one))
        return ScaleByKronState(
            count=jnp.zeros([], jnp.int32),
            momentum=init_state(params, self.mu_dtype),
            Qs=tuple(factors),
            key=jnp.copy(self.key),  # not the transform's buffer: both are donated
        )

    def unstacked(self, state: ScaleByKronState) -> ScaleByKronState:
        """`state` with the factors per parameter: `Qs` a tree shaped like the params whose leaves
        are tuples `(Q_1, ..., Q_k)` in the order of the parameter's layout axes (for inspection
        and tests; `update` takes the stacked state)."""
        _, flips, stacks = self._units(state.momentum)
        rows = stacks.unstack(state.Qs)
        treedef = jax.tree_util.tree_structure(state.momentum)
        per_leaf = [
            () if leaf is None else tuple(q[0] for q in (leaf[::-1] if flip else leaf)) for leaf, flip in zip(rows, flips)
        ]
        return state._replace(Qs=treedef.unflatten(per_leaf))

    def state_specs(self, params, param_specs):
        # The momentum follows the parameters; every stack of factors lies on its owners (the
        # owner scheme's OWNED); the count and the key are replicated.
        state = jax.eval_shape(self.init, params)
        return ScaleByKronState(
            count=REPLICATED,
            momentum=param_specs,
            Qs=jax.tree_util.tree_map(lambda _: OWNED, state.Qs),
            key=REPLICATED,
        )

    def update(self, updates, state, params=None, **extra_args):
        dtype = self._dtype()
        count = safe_increment(state.count)
        probability = value_at(self.preconditioner_update_probability, state.count)
        key, update_coin, balance_coin, seed = step_draws(state.key)
        do_update = update_coin < probability
        balance = balance_coin < self.balance_prob

        momentum = widened_update_moment(updates, state.momentum, self.b1, 1, self.mu_dtype)
        if self.mu_dtype is None:  # rounded to the params' dtype before use, as the reference
            momentum = cast_like(momentum, state.momentum)
        debiased = bias_correction(momentum, self.b1, count)
        treedef = jax.tree_util.tree_structure(updates)
        grads, m_hats = (treedef.flatten_up_to(t) for t in (updates, debiased))
        mesh = current_mesh()
        layouts, flips, stacks = self._units(updates)
        # A taller-than-wide matrix is preconditioned as its transpose (see `_units`).
        units = [whole_map(jnp.shape(g), lay.groups)._replace(swap=t) for g, lay, t in zip(grads, layouts, flips)]
        inputs = [(m.astype(dtype),) for m in m_hats]
        if not self.momentum_into_precond_update:
            inputs = [(m, g.astype(dtype)) for (m,), g in zip(inputs, grads)]
        specs = specs_of(state.momentum, params)
        leaves = [
            None if kind is None else LeafUnits(x, u, spec)
            for x, u, spec, kind in zip(inputs, units, specs, stacks.leaf_kinds)
        ]
        # Per parameter, the number of its first entry (its probe's, see `kron_probes`) and
        # whether its unit is turned (the probe is numbered in the parameter's own layout).
        offsets = probe_offsets([jnp.shape(g) for g in grads])
        extras = [(jnp.asarray(split_offset(o)[None]), jnp.asarray([t])) for o, t in zip(offsets, flips)]

        def work(kinds, pieces, factors):
            # Short vectors together, padded; small matrices of several layouts padded together
            # where that adds little work (`_padded_groups`); every other layout in a stack of
            # its own (one program per layout, not per parameter).
            fitted = [piece[0 if self.momentum_into_precond_update else 1] for piece in pieces]
            vectors = [i for i, kind in enumerate(kinds) if _padded_vector(kind)]
            by_kind: dict[Any, list[int]] = {}
            for i, kind in enumerate(kinds):
                if i not in vectors:
                    by_kind.setdefault(kind, []).append(i)
            units = {kind: sum(len(fitted[i]) for i in members) for kind, members in by_kind.items()}
            for i in vectors:
                units[kinds[i]] = units.get(kinds[i], 0) + len(fitted[i])
            padded = [[i for kind in group for i in by_kind.pop(kind)] for group in _padded_groups(units)]
            layouts = [_Padded([kinds[i] for i in members], [len(fitted[i]) for i in members]) for members in padded]
            stacks = list(by_kind.values())

            def fit(factors):
                # The entry numbers of every probe, drawn together (`normals_at`).
                numbers = []
                for members in stacks:
                    x, (offsets, turns) = fitted[members[0]], _joined([pieces[i][-1] for i in members])
                    numbers.append(jax.vmap(lambda o, t, shape=x.shape[1:]: entry_numbers(o, entry_index(shape, t)))(offsets, turns))
                for members, layout in zip(padded, layouts):
                    offsets, turns = _joined([pieces[i][-1] for i in members])
                    rows, cols = jnp.asarray(layout.rows), jnp.asarray(layout.cols)
                    index = jax.vmap(lambda t, r, c: entry_index(layout.shape, t, r, c))(turns, rows, cols)
                    numbers.append(jax.vmap(entry_numbers)(offsets, index))
                if vectors:
                    short = _PaddedVectors([kinds[i] for i in vectors], [len(fitted[i]) for i in vectors])
                    offsets = jnp.concatenate([pieces[i][-1][0] for i in vectors])
                    numbers.append(jax.vmap(entry_numbers, in_axes=(0, None))(offsets, jax.lax.iota(jnp.uint32, short.length)))
                probes = iter(normals_at(seed, numbers, used=do_update))
                new = list(factors)
                for members in stacks:
                    x = _joined([fitted[i] for i in members])
                    q = _joined([factors[i] for i in members])
                    fitted_q = per_unit(self._fit, len(x), x, next(probes).astype(x.dtype), q, balance=balance)
                    for i, part in zip(members, _split(fitted_q, [len(fitted[i]) for i in members])):
                        new[i] = part
                for members, layout in zip(padded, layouts):
                    x = layout.matrices([fitted[i] for i in members])
                    probe = jnp.where(layout.inside(), next(probes), 0).astype(x.dtype)
                    fitted_q = self._fit_padded(layout, x, probe, [factors[i] for i in members], balance)
                    for i, part in zip(members, fitted_q):
                        new[i] = part
                if vectors:
                    x = short.stack([fitted[i] for i in vectors])
                    lengths = jnp.asarray(short.lengths)
                    probe = jnp.where(jax.lax.iota(jnp.uint32, short.length) < lengths[:, None], next(probes), 0).astype(x.dtype)
                    fit_vector = functools.partial(fit_padded_vector, lr=self.precond_lr, tiny=jnp.finfo(x.dtype).tiny)
                    q = short.stack([factors[i][0] for i in vectors], fill=1)
                    for i, part in zip(vectors, short.unpadded(jax.vmap(fit_vector)(x, probe, q, lengths.astype(jnp.float32)))):
                        new[i] = (part,)
                return new

            factors = jax.lax.cond(do_update, fit, list, list(factors))
            out: list[Any] = [None] * len(kinds)
            for members in stacks:
                m = _joined([pieces[i][0] for i in members])
                done = per_unit(_preconditioned, len(m), m, _joined([factors[i] for i in members]))
                for i, part in zip(members, _split(done, [len(pieces[i][0]) for i in members])):
                    out[i] = (part,)
            groups = [(members, _precondition_padded) for members in padded] + ([(vectors, _precondition_padded_vectors)] if vectors else [])
            for members, precondition_group in groups:
                done = precondition_group([kinds[i] for i in members], [pieces[i][0] for i in members], [factors[i] for i in members])
                for i, part in zip(members, done):
                    out[i] = (part,)
            return out, factors

        done, Qs = run_per_unit(work, stacks, leaves, state.Qs, mesh, extras=extras)
        new_updates = [
            jnp.zeros(g.shape, update_dtype(g.dtype, self.mu_dtype))
            if out is None
            else out[0].astype(update_dtype(g.dtype, self.mu_dtype))
            for out, g in zip(done, grads)
        ]
        momentum = store(momentum, self.mu_dtype)
        new_state = ScaleByKronState(count=count, momentum=momentum, Qs=tuple(Qs), key=key)
        return treedef.unflatten(new_updates), new_state

    def _fit(self, fitted: jax.Array, probe: jax.Array, q: tuple, *, balance: jax.Array) -> tuple:
        """One parameter's factors after an update from its probe (see `kron_probes`)."""
        return update_factors(balanced(q, balance), damped(fitted, probe), probe, self.precond_lr, jnp.finfo(fitted.dtype).tiny)


    def _fit_padded(self, layout: "_Padded", x: jax.Array, probe: jax.Array, factors: list, balance: jax.Array) -> list:
        """The factors of small matrices of several layouts (`x`, padded as `layout` says) after an
        update from their probes, fitted together (`fit_padded`)."""
        q1, q2 = layout.factors(factors)
        sizes = [jnp.asarray(f) for f in (layout.rows.astype(np.int32), layout.cols.astype(np.int32), layout.counts.astype(np.float32))]
        # Whether each factor is diagonal: a Python bool where the whole group agrees (static).
        static = {f"diagonal{i + 1}": bool(d[0]) for i, d in enumerate(layout.diagonal) if (d == d[0]).all()}
        batched = {f"diagonal{i + 1}": jnp.asarray(d) for i, d in enumerate(layout.diagonal) if f"diagonal{i + 1}" not in static}
        fit = functools.partial(fit_padded, balance=balance, lr=self.precond_lr, tiny=jnp.finfo(x.dtype).tiny, **static)
        return layout.unpadded_factors(*jax.vmap(fit)(x, probe, q1, q2, *sizes, **batched))


def _padded_vector(kind: Any) -> bool:
    """Whether the pieces of `kind` are vectors fitted and preconditioned padded, with the other short ones."""
    shape, _ = kind
    return len(shape) == 1 and shape[0] <= PADDED_MAX


# Small matrices of several layouts share one padded program while the padding adds at most this
# fraction of the step's estimated work: on the digits CNN the small kernels (about 0.01% of
# the work, beside a 2048 x 2048 factor) compile as one program instead of three, while on the
# digits MLP, whose (128, 128), (64, 128) and (10, 128) matrices padded together would do about
# twice the work, each keeps its own.
PADDING_BUDGET = 0.1


def _unit_work(shape: tuple[int, ...]) -> float:
    """The estimated arithmetic of one unit's update and preconditioning, up to a constant: per
    axis of length `d` (of `N` entries in all) about `5.5 N d` for the products and solves
    along it and `d^3` for its factor's step."""
    entries = math.prod(shape)
    return sum(5.5 * entries * d + d**3 for d in shape)


def _padded_groups(units: dict[Any, int]) -> list[list[Any]]:
    """The layouts (of `units`: layout -> its number of units) that share padded programs:
    matrices with no axis longer than `PADDED_MAX`, merged greedily, the pair whose padded
    program adds the least work first, while the work added stays within `PADDING_BUDGET` of
    the whole step's. Only groups of two layouts or more are returned."""

    def work(group):
        shape = tuple(max(kind[0][axis] for kind in group) for axis in (0, 1))
        return sum(units[kind] for kind in group) * _unit_work(shape)

    budget = PADDING_BUDGET * sum(count * _unit_work(kind[0]) for kind, count in units.items())
    groups = [[kind] for kind in units if len(kind[0]) == 2 and max(kind[0]) <= PADDED_MAX]
    while len(groups) > 1:
        added, a, b = min(
            (work(a + b) - work(a) - work(b), i, j) for i, a in enumerate(groups) for j, b in enumerate(groups) if i < j
        )
        if added > budget:
            break
        budget -= added
        groups[a] += groups.pop(b)
    return [group for group in groups if len(group) > 1]


class _Padded:
    """Pieces of small matrices (by their kinds) zero-padded to one shape `(rows, cols)`, and
    their factors as dense `(rows, rows)` and `(cols, cols)` matrices."""

    def __init__(self, kinds: list, counts: list[int]):
        self.kinds, self.counts_per_piece = kinds, counts
        self.shape = tuple(max(shape[axis] for shape, _ in kinds) for axis in (0, 1))
        per_unit = lambda values: np.concatenate([np.full(c, v) for c, v in zip(counts, values)])  # noqa: E731
        self.rows = per_unit([shape[0] for shape, _ in kinds]).astype(np.uint32)
        self.cols = per_unit([shape[1] for shape, _ in kinds]).astype(np.uint32)
        self.counts = per_unit([math.prod(shape) for shape, _ in kinds])
        self.diagonal = tuple(per_unit([diag[axis] for _, diag in kinds]) for axis in (0, 1))

    def inside(self) -> np.ndarray:
        """Whether each entry of the padded stack is a matrix's own, not padding."""
        rows, cols = (np.arange(n) for n in self.shape)
        return (rows[:, None] < self.rows[:, None, None]) & (cols < self.cols[:, None, None])

    def matrices(self, pieces: list) -> jax.Array:
        """The pieces `(count, rows, cols)` as one padded stack `(units, rows, cols)`."""
        return jnp.concatenate([_pad(x, self.shape) for x in pieces])

    def unpadded(self, stack: jax.Array) -> list:
        """A padded stack of matrices back as the pieces."""
        parts = _split((stack,), self.counts_per_piece)
        return [p[0][:, : shape[0], : shape[1]] for p, (shape, _) in zip(parts, self.kinds)]

    def factors(self, factors: list) -> tuple[jax.Array, jax.Array]:
        """The pieces' factors as two padded stacks of dense matrices."""
        firsts, seconds = [], []
        for q, (shape, _) in zip(factors, self.kinds):
            dense = [jnp.eye(d, dtype=f.dtype) * f[:, None, :] if f.ndim == 2 else f for f, d in zip(q, shape)]
            firsts.append(_pad(dense[0], (self.shape[0],) * 2))
            seconds.append(_pad(dense[1], (self.shape[1],) * 2))
        return jnp.concatenate(firsts), jnp.concatenate(seconds)

    def unpadded_factors(self, q1: jax.Array, q2: jax.Array) -> list:
        """Two padded stacks of dense factors back as each piece's factors (stacked, by kind)."""
        out = []
        for (first, second), (shape, diag) in zip(_split((q1, q2), self.counts_per_piece), self.kinds):
            dense = [first[:, : shape[0], : shape[0]], second[:, : shape[1], : shape[1]]]
            out.append(tuple(jnp.diagonal(f, axis1=1, axis2=2) if d else f for f, d in zip(dense, diag)))
        return out


class _PaddedVectors:
    """Pieces of small vectors (by their kinds) padded to the longest: `(units, length)`."""

    def __init__(self, kinds: list, counts: list[int]):
        self.counts = counts
        self.sizes = [shape[0] for shape, _ in kinds]
        self.length = max(self.sizes)
        self.lengths = np.concatenate([np.full(c, n) for c, n in zip(counts, self.sizes)]).astype(np.uint32)

    def stack(self, pieces: list, fill: float = 0) -> jax.Array:
        """The pieces `(count, size)` as one stack, padded with `fill`."""
        return jnp.concatenate([jnp.pad(x, ((0, 0), (0, self.length - x.shape[1])), constant_values=fill) for x in pieces])

    def unpadded(self, stack: jax.Array) -> list:
        """A padded stack back as the pieces."""
        return [part[0][:, :n] for part, n in zip(_split((stack,), self.counts), self.sizes)]


def _precondition_padded_vectors(kinds: list, pieces: list, factors: list) -> list:
    """Small vectors' pieces preconditioned together, padded (`precondition_padded_vector`)."""
    padded = _PaddedVectors(kinds, [len(x) for x in pieces])
    q = padded.stack([f[0] for f in factors], fill=1)
    done = jax.vmap(precondition_padded_vector)(padded.stack(pieces), q, jnp.asarray(padded.lengths, jnp.float32))
    return padded.unpadded(done)


def _pad(x: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """A stack of matrices `(n, a, b)` zero-padded to `(n, *shape)`."""
    return jnp.pad(x, ((0, 0), (0, shape[0] - x.shape[1]), (0, shape[1] - x.shape[2])))


def _joined(trees: list) -> Any:
    """Pytrees of stacks (of one structure) concatenated along their leading axes."""
    return trees[0] if len(trees) == 1 else jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *trees)


def _split(tree: Any, counts: list[int]) -> list:
    """The inverse of `_joined`: the pytree's stacks cut into parts of `counts` rows."""
    if len(counts) == 1:
        return [tree]
    bounds = np.cumsum([0, *counts])
    return [jax.tree_util.tree_map(lambda x, a=a, b=b: x[a:b], tree) for a, b in zip(bounds[:-1], bounds[1:])]


def _precondition_padded(kinds: list, pieces: list, factors: list) -> list:
    """Small matrices' pieces of several layouts preconditioned together, padded (`precondition_padded`)."""
    padded = _Padded(kinds, [len(x) for x in pieces])
    q1, q2 = padded.factors(factors)
    done = jax.vmap(precondition_padded)(padded.matrices(pieces), q1, q2, jnp.asarray(padded.counts.astype(np.float32)))
    return padded.unpadded(done)


def _preconditioned(m_hat: jax.Array, q: tuple) -> jax.Array:
    """One parameter's update: `P m_hat`, its RMS capped."""
    return clip_rms(precondition(q, m_hat))


scale_by_kron = ScaleByKron


def step_draws(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, tuple[jax.Array, jax.Array]]:
    """A step's random draws from the state's key: `(next_key, update_coin, balance_coin,
    probe_seed)`, the coins uniform in [0, 1) and the probes' seed a pair of uint32 scalars
    (see `kron_probes`; scalars, since the owners' work closes over it: see `run_per_unit`);
    all from one split and four words of bits.

    For a Threefry key these are the numbers of `jax.random.split` and `jax.random.bits`
    (partitionable Threefry, JAX's default), computed by `threefry2x32`: straight-line code,
    where JAX's own Threefry compiles to a loop on CPU (two loops and a dozen small kernels
    more in the step); other keys go through `jax.random`."""
    if str(jax.random.key_impl(key)) != "threefry2x32" or not jax.config.jax_threefry_partitionable:
        next_key, key = jax.random.split(key)
        words = jax.random.bits(key, (4,), jnp.uint32)
    else:
        # split: the counters 0 and 1 (high word 0); key i is the pair of words of counter i.
        hi, lo = threefry2x32(jax.random.key_data(key), jnp.zeros(2, jnp.uint32), jax.lax.iota(jnp.uint32, 2))
        next_key = jax.random.wrap_key_data(jnp.stack([hi[0], lo[0]]), impl="threefry2x32")
        # bits: the counters 0 to 3 under the second key, each the exclusive or of its two words.
        hi, lo = threefry2x32(jnp.stack([hi[1], lo[1]]), jnp.zeros(4, jnp.uint32), jax.lax.iota(jnp.uint32, 4))
        words = hi ^ lo
    coins = jax.lax.bitcast_convert_type((words[:2] >> jnp.uint32(9)) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    return next_key, coins[0], coins[1], (words[2], words[3])
