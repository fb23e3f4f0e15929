"""One owner per matrix: the per-matrix work of many leaves, stacked by kind and split over a mesh.

Matrix optimizers (the Muon family, Shampoo, SOAP, PSGD Kron) do work that needs whole
matrices: Newton-Schulz iterations, eigendecompositions, inverse roots, triangular solves.
Left to XLA's partitioner on sharded parameters, that work is either gathered to every device
and computed N times, or split with collectives inside every iteration. Here instead:

1. each leaf is cut into *units* (a matrix, a slice of a batched weight, a Shampoo block) by
   a `UnitMap`: a leaf of shape `s` becomes an array `(count, *unit_shape)`;
2. units of the same *kind* (the transform says what a kind is: their shape, and whatever
   else changes their computation) are concatenated into one stack per kind (`UnitStacks`);
3. on a mesh, each stack is split along its stack axis over the mesh's devices, so every unit
   has one owner device; each unit's parts move to its owner in one all-to-all (`run_per_unit`
   first lays every unit's local parts out alike, from the parameter's sharding, so that the
   stack's move is one collective);
4. the transform's work runs on the stacks, each device on the whole units it owns;
5. the results come back the same way, laid out as they came.

State that belongs to units (Shampoo's statistics, SOAP's eigenbases, Kron's factors) is kept
stacked in the optimizer state, on its owners (the spec `OWNED`), and never moves. A transform's
`init` makes a stack of its units; an `Optimizer` made with shardings stores it padded with zero
units to a multiple of the device count (`padded_length`), so that every device owns as many
units as any other (a checkpoint of it restores onto another device count by re-padding, see
`modopt.integrations.orbax`). A stored stack is split over the mesh axes whose product is the
largest divisor of its length (`owner_axes`; all of them, for a padded stack), and replicated
over the others. Elementwise state of a stack that padding would at least double (SOAP's moments
of a kind with 2 units on 8 devices) is stored unpadded, split along its units' own dimensions
(`spread_spec`), and joins its owners for the work only. A stack without state is padded likewise for the work alone.

Without a mesh (or on one device), `run_per_unit` hands the transform each leaf's own units:
the single-device code path, unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._core.specs import padded


@dataclasses.dataclass
class _Context:
    mesh: Any
    specs: dict[int, PartitionSpec]
    keep: list  # the arrays whose ids key `specs`, alive while the context is


_CONTEXT: contextvars.ContextVar[_Context | None] = contextvars.ContextVar("modopt_owners", default=None)


@contextlib.contextmanager
def owner_mesh(mesh: Any, placed: Iterable[tuple[Any, PartitionSpec]] = ()) -> Iterator[None]:
    """Within this context, transforms traced give their per-matrix work owners on `mesh`.

    `placed` pairs arrays being traced (parameters, state leaves) with their `PartitionSpec`s,
    so that a transform can say how its inputs are laid out (`spec_of`). `modopt.Optimizer.step`
    enters it with its shardings; outside it, the mesh set with `jax.set_mesh` is used, if any.

    Args:
        mesh: the mesh the owners are on; `None` for no owners (every device does its own work).
        placed: `(array, PartitionSpec)` pairs of the arrays being traced.
    """
    pairs = [(x, s) for x, s in placed if isinstance(s, PartitionSpec)]
    token = _CONTEXT.set(_Context(mesh, {id(x): s for x, s in pairs}, [x for x, _ in pairs]))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


@contextlib.contextmanager
def more_specs(placed: Iterable[tuple[Any, PartitionSpec]]) -> Iterator[None]:
    """Within this context, the `owner_mesh` context's arrays and specs, and those of `placed`
    (the same arrays seen again, inside a function that a transformation traces anew)."""
    context = _CONTEXT.get()
    if context is None:
        yield
        return
    pairs = [(x, s) for x, s in placed if isinstance(s, PartitionSpec)]
    specs = {**context.specs, **{id(x): s for x, s in pairs}}
    token = _CONTEXT.set(_Context(context.mesh, specs, [*context.keep, *(x for x, _ in pairs)]))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def current_mesh() -> Any:
    """The mesh the per-matrix work is split over, or `None` (no mesh, or a single device).

    On a mesh with Explicit axes the work is traced on Auto axes (`jax.sharding.auto_axes`):
    there it is the abstract mesh in effect."""
    context = _CONTEXT.get()
    mesh = None if context is None else context.mesh
    if mesh is None or jax.sharding.AxisType.Explicit in getattr(mesh, "axis_types", ()):
        current = jax.sharding.get_abstract_mesh()
        mesh = mesh if current is None or current.empty else current
        if mesh is None:
            return None
    return mesh if mesh.size > 1 else None


def spec_of(x: Any) -> PartitionSpec | None:
    """The `PartitionSpec` of an array being traced in an `owner_mesh` context, if it says.

    Args:
        x: an array (a tracer) given to `owner_mesh` in its `placed` pairs.
    """
    context = _CONTEXT.get()
    return None if context is None else context.specs.get(id(x))


def specs_of(*trees: Any) -> list[PartitionSpec | None]:
    """Per leaf of the first tree, the `PartitionSpec` of the first of `trees` (with its
    structure, or `None`) whose leaf at that place has one (`spec_of`)."""
    flat = [jax.tree_util.tree_leaves(tree) if tree is not None else None for tree in trees]
    out = []
    for i in range(len(flat[0])):
        found = (spec_of(leaves[i]) for leaves in flat if leaves is not None and i < len(leaves))
        out.append(next((spec for spec in found if spec is not None), None))
    return out


def owner_axes(count: int, mesh: Any) -> tuple[str, ...]:
    """The mesh axes a stored stack of `count` units is split over: of all sets of axes, the one
    whose product is the largest divisor of `count` (the fewest axes, then the first in the
    mesh's order, on ties), in the mesh's order.

    A stack no product of axes divides evenly is held whole by the devices of the other axes.
    A mesh with finer axes ((2, 2, 2) rather than (8,), the same devices) lets more stacks split
    over more devices. (The owners cannot lie on a finer mesh of their own: `jax.jit` under
    `jax.set_mesh` returns arrays only on the mesh set.)"""
    names = [name for name in mesh.axis_names if mesh.shape[name] > 1]
    best: tuple[str, ...] = ()
    for size in range(1, len(names) + 1):
        for axes in itertools.combinations(names, size):
            ways = math.prod(mesh.shape[a] for a in axes)
            if count % ways == 0 and ways > math.prod(mesh.shape[a] for a in best):
                best = axes
    return best


def _spec(axes: Sequence[str]) -> PartitionSpec:
    return PartitionSpec(tuple(axes) if len(axes) > 1 else axes[0]) if axes else PartitionSpec()


def owner_spec(count: int, mesh: Any) -> PartitionSpec:
    """The `PartitionSpec` of a stored stack of `count` units on `mesh` (see `owner_axes`).

    Args:
        count: the length of the stack (its leading axis).
        mesh: the mesh the stack is stored on.
    """
    return _spec(owner_axes(count, mesh))


def padded_length(count: int, mesh: Any) -> int:
    """The length of a stack of `count` units padded to a multiple of the mesh's device count:
    what an `Optimizer` made with shardings stores (`OWNED` state), so that every device owns
    the same number of units.

    Args:
        count: the number of units in the stack.
        mesh: the mesh (`None`, or a single device: no padding).
    """
    size = 1 if mesh is None else mesh.size
    return -(-count // size) * size


def spread_spec(count: int, unit_shape: Sequence[int], mesh: Any) -> PartitionSpec | None:
    """The `PartitionSpec` of a stored stack of `count` units of elementwise state
    (`OWNED_ELEMENTWISE`: Adam's moments of SOAP) split along its units' own dimensions, or
    `None` where it is stored on its owners as `OWNED` state is.

    It is split where padding it to a multiple of the device count would at least double it
    (as many padding units as units, or more: 1 to 4 units on 8 devices): on the owners, most
    devices would hold a padding unit as large as a real one. It is then stored unpadded, its largest unit
    dimension that the device count divides split over every mesh axis, and moves to its
    owners for the step's work only (`run_per_unit`). `None` also where no unit dimension is
    divisible, and without a mesh.

    Args:
        count: the number of units in the stack.
        unit_shape: the shape of one unit.
        mesh: the mesh (`None`, or a single device: never split).
    """
    if mesh is None or mesh.size <= 1 or padded_length(count, mesh) < 2 * count:
        return None
    fits = [d for d, size in enumerate(unit_shape) if size % mesh.size == 0]
    if not fits:
        return None
    dim = max(fits, key=lambda d: unit_shape[d])
    axes = tuple(name for name in mesh.axis_names if mesh.shape[name] > 1)
    entries: list[Any] = [None] * (1 + len(unit_shape))
    entries[1 + dim] = axes[0] if len(axes) == 1 else axes
    return PartitionSpec(*entries)


def _owner_layout(count: int, mesh: Any, stored: int | None) -> tuple[NamedSharding, int]:
    """The sharding of a stack of `count` units, and its length once padded. A stack without
    state is padded to a multiple of the device count and split over every device; one with
    state keeps the length its state is stored with (`stored`, at least `count`: padded or not)
    and is split as that state is (`owner_axes`), so that the state never moves."""
    if stored is not None:
        return NamedSharding(mesh, owner_spec(stored, mesh)), stored
    axes = tuple(name for name in mesh.axis_names if mesh.shape[name] > 1)
    return NamedSharding(mesh, _spec(axes)), padded_length(count, mesh)


class UnitMap(NamedTuple):
    """How a leaf is cut into units: an array `(count, *unit_shape)`.

    The leaf's axes are permuted (`perm`), consecutive axes merged (`groups`: how many go into
    each merged dimension), each merged dimension `j` zero-padded to `pieces[j] * sizes[j]`
    and cut into `pieces[j]` parts of `sizes[j]` (Shampoo's blocks; one part for none). The
    units are the parts, in row-major order of their grid; a dimension listed in `counted` is
    cut into parts of size one and leaves the unit's shape (a batch axis). `swap` transposes
    the last two axes of each unit.
    """

    shape: tuple[int, ...]
    perm: tuple[int, ...]
    groups: tuple[int, ...]
    pieces: tuple[int, ...]
    sizes: tuple[int, ...]
    counted: tuple[int, ...] = ()
    swap: bool = False

    @property
    def merged(self) -> tuple[int, ...]:
        permuted = [self.shape[a] for a in self.perm]
        out, start = [], 0
        for size in self.groups:
            out.append(math.prod(permuted[start : start + size]))
            start += size
        return tuple(out)

    @property
    def count(self) -> int:
        return math.prod(self.pieces)

    @property
    def unit_shape(self) -> tuple[int, ...]:
        shape = [s for j, s in enumerate(self.sizes) if j not in self.counted]
        return (*shape[:-2], shape[-1], shape[-2]) if self.swap else tuple(shape)

    def _padding(self) -> list[tuple[int, int]]:
        return [(0, n * s - d) for n, s, d in zip(self.pieces, self.sizes, self.merged)]

    def _blocked(self) -> bool:
        return any(n > 1 for j, n in enumerate(self.pieces) if j not in self.counted)

    def to_units(self, x: jax.Array) -> jax.Array:
        """The leaf `x` as its stack of units, `(count, *unit_shape)`."""
        if self.perm != tuple(range(len(self.perm))):
            x = jnp.transpose(x, self.perm)
        x = x.reshape(self.merged)
        if any(after for _, after in self._padding()):
            x = jnp.pad(x, self._padding())
        if self._blocked():
            k = len(self.merged)
            x = x.reshape([v for pair in zip(self.pieces, self.sizes) for v in pair])
            x = x.transpose([2 * j for j in range(k)] + [2 * j + 1 for j in range(k)])
        units = x.reshape((self.count, *[s for j, s in enumerate(self.sizes) if j not in self.counted]))
        return jnp.swapaxes(units, -1, -2) if self.swap else units

    def from_units(self, units: jax.Array) -> jax.Array:
        """The inverse of `to_units`: a stack of units back as an array of the leaf's shape."""
        if self.swap:
            units = jnp.swapaxes(units, -1, -2)
        k = len(self.merged)
        if self._blocked():
            x = units.reshape((*self.pieces, *self.sizes))
            x = x.transpose([i for j in range(k) for i in (j, k + j)])
            x = x.reshape([n * s for n, s in zip(self.pieces, self.sizes)])
        else:
            x = units.reshape([n * s for n, s in zip(self.pieces, self.sizes)])
        if any(after for _, after in self._padding()):
            x = x[tuple(slice(0, d) for d in self.merged)]
        x = x.reshape([self.shape[a] for a in self.perm])
        if self.perm != tuple(range(len(self.perm))):
            x = jnp.transpose(x, tuple(int(a) for a in np.argsort(self.perm)))
        return x

    def unit_axes(self, spec: PartitionSpec, mesh: Any) -> tuple[tuple[str, ...], ...] | None:
        """The mesh axes each unit dimension is split over when the leaf is laid out as `spec`,
        or `None` if the units' parts are not whole along the unit dimensions (the split falls
        on the stack axis, inside a merge, or on padding)."""
        entries = [_names(e) for e in padded(spec, len(self.shape))]
        permuted = [entries[a] for a in self.perm]
        sizes = [self.shape[a] for a in self.perm]
        merged_entries, start = [], 0
        for size in self.groups:
            split = [i for i in range(start, start + size) if permuted[i]]
            if len(split) > 1 or (split and any(sizes[i] > 1 for i in range(start, split[0]))):
                return None  # a split that is not the leading part of its merged dimension
            merged_entries.append(permuted[split[0]] if split else ())
            start += size
        unit = []
        for j, names in enumerate(merged_entries):
            if j in self.counted:
                if names:
                    return None
                continue
            if names and (self.pieces[j] > 1 or self.sizes[j] % math.prod(mesh.shape[a] for a in names)):
                return None
            unit.append(names)
        return (*unit[:-2], unit[-1], unit[-2]) if self.swap and len(unit) >= 2 else tuple(unit)


def _names(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def matrix_map(shape: tuple[int, ...], batch: tuple[int, ...], rows: tuple[int, ...], cols: tuple[int, ...], *, swap: bool = False) -> UnitMap:
    """The units of a weight whose `batch` axes index matrices of `rows` x `cols` (each a tuple
    of axes, flattened in order): `(prod(batch), rows, cols)` (columns first with `swap`)."""
    perm = (*batch, *rows, *cols)
    merged = [math.prod(shape[a] for a in group) for group in (batch, rows, cols)]
    return UnitMap(tuple(shape), perm, (len(batch), len(rows), len(cols)), (merged[0], 1, 1), (1, merged[1], merged[2]), (0,), swap)


def whole_map(shape: tuple[int, ...], groups: tuple[tuple[int, ...], ...] | None = None, perm: tuple[int, ...] | None = None) -> UnitMap:
    """One unit per leaf, its axes (permuted by `perm`) merged by `groups` (consecutive runs of
    the permuted axes; default: none merged)."""
    perm = tuple(range(len(shape))) if perm is None else tuple(perm)
    sizes = [len(g) for g in groups] if groups is not None else [1] * len(shape)
    merged, start = [], 0
    for size in sizes:
        merged.append(math.prod(shape[a] for a in perm[start : start + size]))
        start += size
    return UnitMap(tuple(shape), perm, tuple(sizes), (1,) * len(merged), tuple(merged))


class UnitStacks:
    """Which stack each leaf's units go to, and where.

    Built from a kind per leaf (`None` for a leaf without units) and the number of units each
    leaf has. Leaves of one kind stack together, in the order of the leaves; the stacks are in
    the order their kinds first appear. Only shapes and kinds decide it, so the stacks of
    `init` and of every `update` agree, on any mesh.

    Args:
        kinds: per leaf, a hashable kind, or `None`.
        counts: per leaf, its number of units (ignored where the kind is `None`).
    """

    def __init__(self, kinds: Sequence[Hashable | None], counts: Sequence[int]):
        members: dict[Hashable, list[int]] = {}
        for leaf, kind in enumerate(kinds):
            if kind is not None:
                members.setdefault(kind, []).append(leaf)
        self.kinds = tuple(members)
        self.members = tuple(tuple(leaves) for leaves in members.values())
        self.counts = tuple(int(c) if k is not None else 0 for k, c in zip(kinds, counts))
        self.leaf_kinds = tuple(kinds)

    def __len__(self) -> int:
        return len(self.kinds)

    def size(self, stack: int) -> int:
        """The number of units in stack `stack`."""
        return sum(self.counts[leaf] for leaf in self.members[stack])

    def stack(self, per_leaf: Sequence[Any]) -> list[Any]:
        """Per stack, its members' arrays (or pytrees of arrays) concatenated along axis 0."""
        return [_concatenate([per_leaf[leaf] for leaf in leaves]) for leaves in self.members]

    def unstack(self, per_stack: Sequence[Any]) -> list[Any]:
        """Per leaf, its rows of its stack's array, or of every array of its stack's pytree
        (`None` for a leaf without units)."""
        out: list[Any] = [None] * len(self.leaf_kinds)
        for leaves, tree in zip(self.members, per_stack):
            start = 0
            for leaf in leaves:
                end = start + self.counts[leaf]
                out[leaf] = jax.tree_util.tree_map(lambda x, start=start, end=end: x[start:end], tree)
                start = end
        return out


def _concatenate(trees: list[Any]) -> Any:
    return trees[0] if len(trees) == 1 else jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *trees)


class LeafUnits(NamedTuple):
    """A leaf's inputs to the per-matrix work: arrays shaped like the leaf, how they are cut into
    units, and how the leaf is laid out on the mesh (`None` if unknown)."""

    arrays: tuple[jax.Array, ...]
    units: UnitMap
    spec: PartitionSpec | None = None


StackFn = Callable[[Sequence[Hashable], list[tuple[jax.Array, ...]], list[Any]], tuple[list[tuple[jax.Array, ...]], list[Any]]]


def run_per_unit(
    fn: StackFn,
    stacks: UnitStacks,
    leaves: Sequence[LeafUnits | None],
    state: Sequence[Any] | None = None,
    mesh: Any = None,
    *,
    extras: Sequence[Any] | None = None,
    stacked: bool = False,
) -> tuple[list[tuple[jax.Array, ...] | None], list[Any] | None]:
    """Runs a transform's per-matrix work `fn` on the units of every leaf, on their owners.

    `fn(kinds, xs, states)` takes lists with one entry per piece of work: its kind, a tuple of
    input arrays `(units, *unit_shape)` (one per array of `LeafUnits.arrays`), and its state (a
    pytree of arrays with the leading unit axis, or `None`). It returns the list of output
    tuples (each `(units, *unit_shape)`) and the list of new states. It is called once, so the
    transform can put conditionals (refresh steps) around all of its work. On a mesh it runs
    inside `jax.shard_map`: values it closes over (a step's flags, a seed) must be scalars, since
    indexing a captured array there fails when the step runs eagerly (outside `jit`).

    - On a mesh of several devices, a piece is a whole stack of `stacks`, split over the
      devices: every unit's work runs on its owner, the inputs and outputs move there and
      back, the state stays. A stack without state is padded with zero units to a multiple
      of the device count (their outputs are dropped); one with state is worked on at the
      length its state is stored with, padding units included (an `Optimizer` on a mesh
      stores it padded to a multiple of the device count, `padded_length`), split as the
      state is. A padding unit gets zero inputs, and its state stays zero.
    - Without one, a piece is one leaf's units (with its rows of its stack's state): the
      single-device code path, unchanged; or, with `stacked`, a whole stack, as on a mesh (one
      batched program per kind of unit instead of one per leaf: on an accelerator, a few
      large kernels instead of many small ones).

    Args:
        fn: the per-matrix work, as above.
        stacks: which leaves' units stack together (`None` kinds where `leaves` has `None`).
        leaves: per leaf, its `LeafUnits`, or `None` for a leaf without units.
        state: per stack, the state of its units (`None`: no state): its arrays' axis 0 has
            one row per unit, then possibly zero rows of padding units. Arrays stored at the
            stack's number of units beside padded ones (elementwise state split along its
            units, `spread_spec`) are padded and moved to the owners for the work, and come
            back as they were stored.
        mesh: the mesh (`current_mesh()`), or `None`.
        extras: per leaf, a small array (or a pytree of them) with one row per unit that the
            work also needs (a PRNG key per unit, say): handed to `fn` after the inputs, in each
            piece's tuple. On a mesh they are made whole on every device (they are small), and
            each owner takes its rows.
        stacked: without a mesh, hand `fn` whole stacks rather than leaves.

    Returns:
        Per leaf, the tuple of its outputs shaped like the leaf (`None` for a leaf without
        units), and per stack its new state (`None` if `state` was).
    """
    if mesh is None and stacked:
        return _run_stacks(fn, stacks, leaves, state, extras)
    if mesh is None:
        order = [leaf for members in stacks.members for leaf in members]
        rows = stacks.unstack(state) if state is not None else [None] * len(leaves)
        outs, new = fn(
            [stacks.leaf_kinds[leaf] for leaf in order],
            [
                (*(leaves[leaf].units.to_units(x) for x in leaves[leaf].arrays), *([] if extras is None else [extras[leaf]]))
                for leaf in order
            ],
            [rows[leaf] for leaf in order],
        )
        per_leaf: list[Any] = [None] * len(leaves)
        new_rows: list[Any] = [None] * len(leaves)
        for leaf, out, leaf_state in zip(order, outs, new):
            per_leaf[leaf] = tuple(leaves[leaf].units.from_units(y) for y in out)
            new_rows[leaf] = leaf_state
        if state is None:
            return per_leaf, None
        # A state stored padded (by an `Optimizer` on a mesh) keeps its lengths, zero padding.
        for s, st in enumerate(state):
            _stored_length(st, stacks, s)
        return per_leaf, [_pad_like(new_st, st) for new_st, st in zip(stacks.stack(new_rows), state)]

    states = list(state) if state is not None else [None] * len(stacks)
    lengths = [None if st is None else _stored_length(st, stacks, s) for s, st in enumerate(states)]
    # Elementwise state split along its units (`spread_spec`) joins its stack's owners for the work.
    stored = states
    states = [None if st is None else _gathered(st, stacks.size(s), n, mesh) for s, (st, n) in enumerate(zip(states, lengths))]
    moves = [_Move(stacks, s, leaves, mesh, stored=lengths[s]) for s in range(len(stacks))]
    pieces = [move.to_owners() for move in moves]
    if extras is not None:  # small per-unit data: made whole on every device, each owner takes its rows
        replicated = NamedSharding(mesh, PartitionSpec())
        pieces = [
            (*piece, _constrain(_pad_tree(_constrain(stacked, replicated), move.length), move.owner_sharding))
            for piece, stacked, move in zip(pieces, stacks.stack(extras), moves)
        ]
    placed = [None if st is None else _constrain(st, move.owner_sharding) for st, move in zip(states, moves)]
    specs = [move.owner_sharding.spec for move in moves]
    outs, new = _on_each_owner(fn, list(stacks.kinds), pieces, placed, specs, mesh)
    per_leaf = [None] * len(leaves)
    for move, out in zip(moves, outs):
        for leaf, arrays in move.from_owners(out).items():
            per_leaf[leaf] = arrays
    if state is None:
        return per_leaf, None
    # The padding units' state stays zero, whatever the work made of their zero inputs.
    new = [_zero_padding(st, move.size, move.owner_sharding) for st, move in zip(new, moves)]
    new = [_constrain(st, move.owner_sharding) for st, move in zip(new, moves)]
    return per_leaf, [_spread_back(st, old, move.size, mesh) for st, old, move in zip(new, stored, moves)]


def _run_stacks(fn: StackFn, stacks: UnitStacks, leaves: Sequence[LeafUnits | None], state: Any, extras: Any) -> tuple:
    """`run_per_unit` without a mesh, a piece per stack: the members' units concatenated in the
    stack's order, the state's rows beyond the stack's units (stored padded) left zero."""

    def inputs(leaf):
        arrays = tuple(leaves[leaf].units.to_units(x) for x in leaves[leaf].arrays)
        return arrays if extras is None else (*arrays, extras[leaf])

    pieces = stacks.stack([None if leaf is None else inputs(i) for i, leaf in enumerate(leaves)])
    if state is not None:
        for s, st in enumerate(state):
            _stored_length(st, stacks, s)  # raises if the state was made for other parameters
    rows = [None] * len(stacks) if state is None else [_rows(st, stacks.size(s)) for s, st in enumerate(state)]
    outs, new = fn(list(stacks.kinds), pieces, rows)
    per_leaf = [
        None if out is None else tuple(leaf.units.from_units(y) for y in out)
        for leaf, out in zip(leaves, stacks.unstack([tuple(out) for out in outs]))
    ]
    return per_leaf, None if state is None else [_pad_like(new_st, st) for new_st, st in zip(new, state)]


def _rows(tree: Any, count: int) -> Any:
    """A stack's state without its padding rows: the first `count` of every array."""
    return jax.tree_util.tree_map(lambda x: x[:count], tree)


def _stored_length(state: Any, stacks: UnitStacks, stack: int) -> int:
    """The length a stack's state is stored with: its number of units, or more (padding units
    at the end, as an `Optimizer` on a mesh stores it). Leaves of elementwise state split along
    their units (`spread_spec`) are stored at the number of units while the others are padded."""
    lengths = {int(jnp.shape(x)[0]) for x in jax.tree_util.tree_leaves(state)}
    size = stacks.size(stack)
    if len(lengths - {size}) > 1 or min(lengths) < size:
        raise ValueError(
            f"The state of the stack of units of kind {stacks.kinds[stack]} has leading axes of lengths "
            f"{sorted(lengths)}, but the parameters make {size} units of that kind: the state was made for "
            "other parameters."
        )
    return max(lengths)


def _gathered(tree: Any, size: int, length: int, mesh: Any) -> Any:
    """A stack's state with its leaves stored at the stack's `size` while the rest is padded to
    `length` (elementwise state split along its units, `spread_spec`) padded to `length` too:
    zero units added where each device holds its part of every unit, so no data moves for them."""

    def pad(x):
        spec = None if x.shape[0] == length else spread_spec(size, x.shape[1:], mesh)
        if spec is None:
            return _pad(x, length)
        split = NamedSharding(mesh, spec)
        return jax.lax.with_sharding_constraint(_pad(jax.lax.with_sharding_constraint(x, split), length), split)

    return jax.tree_util.tree_map(pad, tree)


def _spread_back(tree: Any, stored: Any, size: int, mesh: Any) -> Any:
    """The inverse of `_gathered`: each leaf back at its `stored` length, those split along their
    units laid out so again before they drop the padding units (each device its parts of them)."""

    def back(x, old):
        if x.shape[0] == old.shape[0]:
            return x
        spec = spread_spec(size, x.shape[1:], mesh)
        if spec is None:
            return x[: old.shape[0]]
        split = NamedSharding(mesh, spec)
        return jax.lax.with_sharding_constraint(jax.lax.with_sharding_constraint(x, split)[: old.shape[0]], split)

    return jax.tree_util.tree_map(back, tree, stored)


def _zero_padding(tree: Any, size: int, sharding: NamedSharding) -> Any:
    """`tree`'s arrays with their rows from `size` on (padding units) set to zero."""

    def zero(x):
        if x.shape[0] == size:
            return x
        rows = jax.lax.with_sharding_constraint(jnp.arange(x.shape[0]) < size, sharding)
        return jnp.where(rows.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))

    return jax.tree_util.tree_map(zero, tree)


_LOCAL: contextvars.ContextVar[bool] = contextvars.ContextVar("modopt_owner_local", default=False)


def _on_each_owner(fn: StackFn, kinds: list, pieces: list, states: list, specs: list, mesh: Any) -> tuple[list, list]:
    """`fn` run by every device on the units it owns (`jax.shard_map`): the partitioner never
    splits the per-matrix work, so it adds no collective inside it."""

    def local(pieces, states):
        token = _LOCAL.set(True)
        try:
            outs, new = fn(kinds, pieces, states)
        finally:
            _LOCAL.reset(token)
        return [tuple(out) for out in outs], list(new)

    # Each piece's specs are a prefix of its inputs, outputs and state: all split as its stack.
    run = jax.shard_map(
        local, mesh=mesh, in_specs=(list(specs), list(specs)), out_specs=(list(specs), list(specs)), check_vma=False
    )
    return run(pieces, states)


def split_rows(stack: jax.Array, mesh: Any) -> jax.Array | None:
    """A stack split along its units over `owner_axes` (as `run_per_unit` returns a state),
    split along its axis 1 over the same axes instead, by one all-to-all: each device then holds
    its rows of every unit, so that taking one unit out of the stack moves nothing (from a stack
    split along its units, a unit taken out is gathered whole to every device). `None` where the
    stack is not split or its axis 1 does not divide over those axes."""
    axes = owner_axes(stack.shape[0], mesh)
    ways = math.prod(mesh.shape[a] for a in axes)
    if not axes or stack.ndim < 2 or stack.shape[1] % ways:
        return None
    entry = _spec(axes)[0]
    run = jax.shard_map(
        lambda x: jax.lax.all_to_all(x, tuple(axes), 1, 0, tiled=True),
        mesh=mesh,
        in_specs=PartitionSpec(entry),
        out_specs=PartitionSpec(None, entry),
        check_vma=False,
    )
    return run(stack)


def per_unit(fn: Callable[..., Any], count: int, *args: Any, sequential: bool = False, **kwargs: Any) -> Any:
    """`fn` on each unit of arguments stacked along axis 0, or called on the one unit as it is
    when `count` is 1 (a leaf that is one unit, a whole matrix, runs the very code of the
    single-device path, unbatched).

    Several units are batched (`jax.vmap`), except on a CPU device's own units in the owner
    scheme, where they run one after the other (`jax.lax.map`): there every simulated device
    runs on the thread pool that jaxlib's batched LAPACK kernels (triangular solves,
    eigendecompositions) split their batches over, and eight devices waiting for their
    batches' tasks can take every thread of it (a deadlock). With `sequential`, they always run
    one after the other: where `fn` holds a conditional on its unit, which batched runs every
    branch of."""
    if count == 1:
        out = fn(*jax.tree_util.tree_map(lambda x: x[0], args), **kwargs)
        return jax.tree_util.tree_map(lambda x: x[None], out)
    if sequential or (_LOCAL.get() and jax.default_backend() == "cpu"):
        return jax.lax.map(lambda xs: fn(*xs, **kwargs), args)
    return jax.vmap(functools.partial(fn, **kwargs))(*args)


def _constrain(tree: Any, sharding: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)


class _Move:
    """One stack's way to its owners and back.

    Each member's units are laid out so that every device holds the same kind of part of
    every unit: each unit dimension split over mesh axes (`layout`, from the leaf's sharding
    where it is known, refined so that all members use the same axes), then packed into
    `(units, parts, part_size)` with the parts along the stack's common axes (`_pack`). The
    stack of those moves to `(units over owners, parts, part_size)` in one all-to-all and is
    unpacked there, member by member's layout; the way back is the reverse.
    """

    def __init__(self, stacks: UnitStacks, stack: int, leaves: Sequence[LeafUnits | None], mesh: Any, stored: int | None):
        self.mesh = mesh
        self.members = stacks.members[stack]
        self.leaves = [leaves[leaf] for leaf in self.members]
        self.counts = [stacks.counts[leaf] for leaf in self.members]
        self.unit_shape = self.leaves[0].units.unit_shape
        self.size = sum(self.counts)
        self.owner_sharding, self.length = _owner_layout(self.size, mesh, stored)
        self.layouts = _common_layouts(self.leaves, self.unit_shape, mesh)
        self.common = () if self.layouts is None else tuple(a for a in mesh.axis_names if any(a in d for d in self.layouts[0]))

    def _sharding(self, *entries: Any) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(*entries))

    def to_owners(self) -> tuple[jax.Array, ...]:
        inputs = []
        for position in range(len(self.leaves[0].arrays)):
            parts = []
            for i, leaf in enumerate(self.leaves):
                x = leaf.arrays[position]
                if self.layouts is not None and leaf.spec is not None:
                    x = jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, leaf.spec))
                units = leaf.units.to_units(x)
                if self.layouts is not None:
                    units = jax.lax.with_sharding_constraint(units, self._sharding(None, *map(_entry, self.layouts[i])))
                    units = jax.lax.with_sharding_constraint(_pack(units, self.layouts[i], self.mesh), self._sharding(None, _entry(self.common)))
                else:  # laid out as XLA chose: gathered whole first (concatenating parts laid out apart
                    # as XLA chose gave wrong numbers on XLA:CPU: O(1) errors in Shampoo's steps)
                    units = jax.lax.with_sharding_constraint(units, self._sharding())
                parts.append(units)
            stacked = _pad(_concatenate(parts), self.length)
            stacked = jax.lax.with_sharding_constraint(stacked, self.owner_sharding)
            inputs.append(self._unpack_all(stacked) if self.layouts is not None else stacked)
        return tuple(inputs)

    def from_owners(self, outputs: Sequence[jax.Array]) -> dict[int, tuple[jax.Array, ...]]:
        per_leaf: dict[int, list] = {leaf: [] for leaf in self.members}
        for y in outputs:
            y = jax.lax.with_sharding_constraint(y, self.owner_sharding)
            if self.layouts is not None:
                y = jax.lax.with_sharding_constraint(self._pack_all(y), self.owner_sharding)
            y = y[: self.size]
            if self.layouts is not None:
                y = jax.lax.with_sharding_constraint(y, self._sharding(None, _entry(self.common)))
            start = 0
            for i, (leaf_index, leaf, count) in enumerate(zip(self.members, self.leaves, self.counts)):
                units = y[start : start + count]
                start += count
                if self.layouts is not None:
                    units = _unpack(units, self.layouts[i], self.unit_shape, self.mesh)
                    units = jax.lax.with_sharding_constraint(units, self._sharding(None, *map(_entry, self.layouts[i])))
                x = leaf.units.from_units(units)
                if self.layouts is not None and leaf.spec is not None:
                    x = jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, leaf.spec))
                per_leaf[leaf_index].append(x)
        return {leaf: tuple(arrays) for leaf, arrays in per_leaf.items()}

    def _which(self) -> tuple[list, jax.Array | None]:
        """The distinct member layouts, and per unit of the padded stack the index of its own."""
        distinct = list(dict.fromkeys(self.layouts))
        if len(distinct) == 1:
            return distinct, None
        index = np.concatenate([np.full(c, distinct.index(lay)) for c, lay in zip(self.counts, self.layouts)])
        index = np.concatenate([index, np.zeros(self.length - self.size, index.dtype)])
        return distinct, jax.lax.with_sharding_constraint(jnp.asarray(index, jnp.int32), self.owner_sharding)

    def _unpack_all(self, packed: jax.Array) -> jax.Array:
        distinct, index = self._which()
        out = _unpack(packed, distinct[0], self.unit_shape, self.mesh)
        for i, layout in enumerate(distinct[1:], 1):
            mask = (index == i).reshape((-1,) + (1,) * len(self.unit_shape))
            out = jnp.where(mask, _unpack(packed, layout, self.unit_shape, self.mesh), out)
        return out

    def _pack_all(self, units: jax.Array) -> jax.Array:
        distinct, index = self._which()
        out = _pack(units, distinct[0], self.mesh)
        for i, layout in enumerate(distinct[1:], 1):
            out = jnp.where((index == i)[:, None, None], _pack(units, layout, self.mesh), out)
        return out


def _entry(names: Sequence[str]) -> Any:
    return None if not names else names[0] if len(names) == 1 else tuple(names)


def _common_layouts(leaves: Sequence[LeafUnits], unit_shape: tuple[int, ...], mesh: Any) -> list | None:
    """Per member, the mesh axes of each unit dimension, all members over the same axes; or
    `None` where some member's layout is unknown (then the stack moves as XLA decides)."""
    wished = []
    for leaf in leaves:
        if leaf.spec is None:
            return None
        axes = leaf.units.unit_axes(leaf.spec, mesh)
        # A leaf split along its stack of units (or inside a merge) is split inside its units
        # for the move (an all-to-all within the leaf first).
        wished.append(axes if axes is not None else ((),) * len(unit_shape))
    # Every axis, those a leaf is replicated over included: cutting along those moves no data,
    # and the stack then moves in one all-to-all over all devices (from parts replicated over
    # an axis, XLA gathered whole stacks).
    union = [a for a in mesh.axis_names if mesh.shape[a] > 1]
    for size in range(len(union), -1, -1):
        for common in itertools.combinations(union, size):
            layouts = [_assign(w, common, unit_shape, mesh) for w in wished]
            if all(lay is not None for lay in layouts):
                return layouts
    return [((),) * len(unit_shape)] * len(leaves)


def _assign(wished: tuple, common: tuple[str, ...], unit_shape: tuple[int, ...], mesh: Any) -> tuple | None:
    """`wished` (the mesh axes of each unit dimension) restricted to `common`, with the other
    axes of `common` placed on the largest dimensions they divide; `None` if they fit nowhere."""
    layout = [tuple(a for a in names if a in common) for names in wished]
    for axis in common:
        if any(axis in names for names in layout):
            continue
        ways = [math.prod(mesh.shape[a] for a in names) for names in layout]
        fits = [d for d in range(len(unit_shape)) if unit_shape[d] % (ways[d] * mesh.shape[axis]) == 0]
        if not fits:
            return None
        dim = max(fits, key=lambda d: unit_shape[d] // ways[d])
        layout[dim] = tuple(a for a in mesh.axis_names if a in (*layout[dim], axis))
    return tuple(layout)


def _factors(layout: tuple, unit_shape: tuple[int, ...], mesh: Any) -> tuple[list[int], list[int], list[int]]:
    """The shape of a unit with each split dimension cut into its axes' factors and the rest,
    the positions of the factors in mesh order, and the positions of the rests."""
    order = {name: i for i, name in enumerate(mesh.axis_names)}
    shape, factors, rests = [], [], []
    for size, names in zip(unit_shape, layout):
        for name in names:
            factors.append((order[name], len(shape)))
            shape.append(mesh.shape[name])
        rests.append(len(shape))
        shape.append(size // math.prod(mesh.shape[name] for name in names))
    return shape, [p for _, p in sorted(factors)], rests


def _pack(units: jax.Array, layout: tuple, mesh: Any) -> jax.Array:
    """`(n, *unit_shape)` units as `(n, parts, part_size)`, the parts in the mesh order of the
    axes that `layout` splits the unit dimensions over."""
    shape, factors, rests = _factors(layout, units.shape[1:], mesh)
    x = units.reshape((units.shape[0], *shape))
    x = jnp.transpose(x, (0, *[p + 1 for p in factors], *[p + 1 for p in rests]))
    parts = math.prod(shape[p] for p in factors)
    return x.reshape((units.shape[0], parts, -1))


def _unpack(packed: jax.Array, layout: tuple, unit_shape: tuple[int, ...], mesh: Any) -> jax.Array:
    """The inverse of `_pack`."""
    shape, factors, rests = _factors(layout, unit_shape, mesh)
    order = [*factors, *rests]
    x = packed.reshape((packed.shape[0], *[shape[p] for p in order]))
    x = jnp.transpose(x, (0, *[int(i) + 1 for i in np.argsort(order)]))
    return x.reshape((packed.shape[0], *unit_shape))


def _pad_tree(tree: Any, length: int) -> Any:
    return jax.tree_util.tree_map(lambda x: _pad(x, length), tree)


def _pad_like(tree: Any, like: Any) -> Any:
    """`tree`'s leaves padded to the lengths of `like`'s (the state as it was stored)."""
    return jax.tree_util.tree_map(lambda x, old: _pad(x, old.shape[0]), tree, like)


def _pad(x: jax.Array, length: int) -> jax.Array:
    """`x` with zero units appended up to `length` (copies of its first unit for PRNG keys)."""
    if x.shape[0] == length:
        return x
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        filler = jnp.repeat(x[:1], length - x.shape[0], axis=0)
    else:
        filler = jnp.zeros((length - x.shape[0], *x.shape[1:]), x.dtype)
    return jnp.concatenate([x, filler])
