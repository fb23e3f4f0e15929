"""Shardings of an optimizer on a mesh, derived from the model's shardings, and checked."""

from __future__ import annotations

import contextvars
import functools
import math
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._core.checks import _first_difference
from .._state.offload import place, with_memory_kind
from .._state.signature import ModelSignature
from .._core.specs import NoRule, Owned, is_spec, padded
from ._owners import _pad, more_specs, owner_spec, padded_length, spread_spec


class Layout:
    """The `NamedSharding` of every trained parameter and every state leaf of an optimizer.

    Static and hashable (hashed once), so an `Optimizer` can keep it and re-impose it on
    each step's results.

    Args:
        mesh: the mesh.
        params: the `NamedSharding` of each trained parameter, with the params' structure (`None`
            where frozen).
        state: the `NamedSharding` of each state leaf, with the state's structure (in memory kind
            `pinned_host` for an optimizer that keeps its state on the host).
        lengths: per state leaf (in the order of its leaves), the length its axis 0 is padded
            to by `init` (a stack of the owner scheme, `OWNED`), or `None`; default: none.
    """

    __slots__ = ("_hash", "_key", "lengths", "mesh", "params", "state")

    def __init__(self, mesh: Any, params: Any, state: Any, lengths: tuple[int | None, ...] | None = None):
        self.mesh = mesh
        self.params = params  # the params' structure (`None` where frozen)
        self.state = state  # the state's structure
        self.lengths = lengths
        self._key = (
            jax.tree_util.tree_structure(params),
            tuple(jax.tree_util.tree_leaves(params)),
            jax.tree_util.tree_structure(state),
            tuple(jax.tree_util.tree_leaves(state)),
        )
        self._hash = hash(self._key)

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def init(self, tx: Any, params: Any) -> Any:
        """`tx.init(params)` created directly on this layout: never whole on one device (the
        owner scheme's stacks padded to `lengths` with zero units)."""
        return _init_on(self, self.lengths)(tx, params)

    def impose(self, params: Any, state: Any) -> tuple[Any, Any]:
        """`params` and `state` constrained to this layout (inside a jitted step), the state
        moved to host memory where its shardings say so."""
        params = jax.tree_util.tree_map(_constrain, params, self.params)
        return params, jax.tree_util.tree_map(lambda x, s: place(x, s, _constrain), state, self.state)

    @property
    def memory_kind(self) -> str | None:
        """The memory kind of the state: `None` (the accelerator's) or a host's."""
        kinds = {s.memory_kind for s in jax.tree_util.tree_leaves(self.state)} - {None, "device"}
        return kinds.pop() if kinds else None

    def compensation(self, compensation: Any) -> Any:
        """The shardings of an `Optimizer`'s `compensation` (`None` for none), in the state's
        memory kind: buffers follow their parameters; a key is replicated."""
        if compensation is None:
            return None
        kind = self.memory_kind
        return compensation.shardings(with_memory_kind(self.params, kind), with_memory_kind(self.replicated, kind))

    def impose_compensation(self, compensation: Any) -> Any:
        """`compensation` constrained to its shardings (inside a jitted step)."""
        if compensation is None:
            return None
        return jax.tree_util.tree_map(lambda x, s: place(x, s, _constrain), compensation, self.compensation(compensation))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or (isinstance(other, Layout) and self._hash == other._hash and self._key == other._key)

    def __repr__(self):
        return f"Layout(mesh={dict(self.mesh.shape)})"


def shardings(optimizer: Any, model_shardings: Any, *, mesh: Any = None, zero_axis: str | None = None) -> Any:
    """The `NamedSharding` of every array leaf of `optimizer`, as a tree of its structure.

    `optimizer` is a `modopt.Optimizer`, concrete or abstract (from `jax.eval_shape`).
    `model_shardings` has the model's structure (or is one sharding for all of it), with a
    `NamedSharding` or a `PartitionSpec` for each trained leaf; other leaves may be anything.
    PartitionSpecs are put on `mesh`, or on the mesh set with `jax.set_mesh`.

    - State shaped like a parameter follows the parameter; reduced or factored state
      follows each transform's `state_specs` rule; counters and hyperparameters are
      replicated.
    - `zero_axis` (ZeRO-1) also splits every non-scalar state leaf over that mesh axis:
      along the largest dimension not yet split whose size the axis divides, else along a
      split dimension that stays divisible. A leaf with no such dimension (a small bias of
      odd size) stays replicated along the axis.
    - A layout that cannot work is a `ValueError` naming the path.
    - An optimizer made with `state_memory_kind="pinned_host"` gets its state's shardings in
      that memory kind; Kahan compensation buffers (`compensation="kahan"`) follow their
      parameters, in the state's memory kind.

    The result can be given as `out_shardings` of a jitted init or step.

    Args:
        optimizer: a `modopt.Optimizer`, concrete or abstract.
        model_shardings: a `NamedSharding` or `PartitionSpec` per trained leaf, with the model's
            structure, or one for all.
        mesh: the mesh that `PartitionSpec`s are put on; `None` for the mesh set with
            `jax.set_mesh`.
        zero_axis: the name of a data-parallel mesh axis to split the state over (ZeRO-1), or
            `None`.

    Example:
        >>> opt_shardings = modopt.sharding.shardings(optimizer, model_shardings, zero_axis="data")
        >>> step = jax.jit(train_step, out_shardings=(model_shardings, opt_shardings), donate_argnums=(0, 1))
    """
    if not isinstance(getattr(optimizer, "signature", None), ModelSignature):
        raise TypeError(f"shardings expects a modopt.Optimizer, got {type(optimizer).__name__}.")
    layout = derive_layout(
        optimizer.tx,
        optimizer.signature,
        optimizer.state,
        model_shardings,
        mesh,
        zero_axis,
        optimizer.groups,
        getattr(optimizer, "state_memory_kind", None),
    )
    if optimizer.layout is not None and optimizer.layout != layout:
        raise ValueError(
            "This optimizer was created with other shardings (or another zero_axis): its steps keep "
            "that layout. Pass the same `model_shardings` and `zero_axis` as to `Optimizer(...)`."
        )
    replicated = layout.replicated
    return optimizer._replace(
        tx=jax.tree_util.tree_map(lambda _: replicated, optimizer.tx),
        state=layout.state,
        count=replicated,
        compensation=layout.compensation(optimizer.compensation),
    )


@functools.lru_cache(maxsize=32)
def _init_on(layout: Layout, lengths: tuple[int | None, ...] | None) -> Any:
    """The jitted init onto `layout`, its stacks padded to `lengths` (which layouts' equality
    leaves out), one per layout: an optimizer built again on the same layout (a restart, a
    rebuilt configuration) does not compile its init again."""
    return jax.jit(functools.partial(_init, lengths=lengths), out_shardings=layout.state)


def _init(tx: Any, params: Any, lengths: tuple[int | None, ...] | None = None) -> Any:
    state = tx.init(params)
    if lengths is None:
        return state
    leaves, treedef = jax.tree_util.tree_flatten(state)
    return treedef.unflatten([x if n is None else _pad(x, n) for x, n in zip(leaves, lengths)])


def params_layout(tx: Any, params: Any, param_shardings: Any, zero_axis: str | None = None, state: Any = None) -> Layout:
    """The `Layout` of `tx`'s `state` (default: its init's) for a plain tree of parameters."""
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    if state is None:
        state = jax.eval_shape(tx.init, abstract)
    return derive_layout(tx, ModelSignature(abstract, abstract), state, param_shardings, None, zero_axis)


def derive_layout(
    tx: Any,
    signature: ModelSignature,
    state: Any,
    model_shardings: Any,
    mesh: Any,
    zero_axis: str | None,
    groups: Any = None,
    memory_kind: str | None = None,
    pad_owned: bool = False,
) -> Layout:
    """The checked `Layout` of `tx`'s `state` for a model with `signature` and `model_shardings`
    (the state of an `Optimizer` whose small leaves are in `groups`, if given; kept in
    `memory_kind`, if given). With `pad_owned`, the owner scheme's stacks (`OWNED`) are laid out
    padded to a multiple of the device count (`padded_length`), as `Layout.init` makes them."""
    param_specs, mesh = _param_specs(signature, model_shardings, mesh)
    if zero_axis is not None and zero_axis not in mesh.shape:
        raise ValueError(f"zero_axis={zero_axis!r} is not an axis of the mesh, whose axes are {tuple(mesh.axis_names)}.")
    if groups is None:
        state_specs = _state_specs(tx, signature.params(), param_specs, mesh)
    else:
        seen = jax.eval_shape(groups.pack, signature.params())
        state_specs = _state_specs(tx, seen, groups.pack_specs(param_specs, is_spec), mesh)
    state_def = jax.tree_util.tree_structure(state)
    if jax.tree_util.tree_structure(state_specs, is_leaf=is_spec) != state_def:
        raise ValueError(
            f"The state_specs rule of {type(tx).__name__} does not match its state: found "
            f"{_first_difference(state, state_specs)}."
        )
    placed, lengths = [], []
    for (path, leaf), spec in zip(jax.tree_util.tree_flatten_with_path(state)[0], state_def.flatten_up_to(state_specs)):
        where = f"the optimizer state at state{jax.tree_util.keystr(path)}"
        shape = tuple(np.shape(leaf))
        if isinstance(spec, NoRule):
            raise ValueError(
                f"No sharding rule places {where} (shape {shape}): it is neither small nor shaped "
                f"like a parameter. {spec.owner} must declare its layout in a `state_specs` method."
            )
        lengths.append(None)
        spread = spread_spec(shape[0], shape[1:], mesh) if isinstance(spec, Owned) and spec.elementwise and shape else None
        if spread is not None:  # elementwise state of a short stack: unpadded, split inside its units
            spec = spread
        elif isinstance(spec, Owned):  # a stack of units on their owners: whole, never split further
            if pad_owned and shape:
                lengths[-1] = padded_length(shape[0], mesh)
                shape = (lengths[-1], *shape[1:])
            spec = owner_spec(shape[0], mesh)
        elif zero_axis is not None:
            spec = _with_axis(spec, shape, zero_axis, mesh)
        _check(spec, shape, mesh, where)
        placed.append(NamedSharding(mesh, spec, memory_kind=memory_kind))
    params = signature.treedef.unflatten(
        [None if s is None else NamedSharding(mesh, s) for s in signature.treedef.flatten_up_to(param_specs)]
    )
    return Layout(mesh, params, state_def.unflatten(placed), tuple(lengths) if pad_owned else None)


def owned_units(optimizer: Any) -> list[int | None]:
    """Per leaf of `optimizer.state` (in the order of its leaves): the number of units of a stack
    of the owner scheme (`OWNED`), however long the stack is stored (an `Optimizer` made with
    shardings pads it with zero units to a multiple of the device count), or `None` for another
    leaf. Read from shapes alone (`optimizer` may be abstract)."""
    tx, params = optimizer.tx, optimizer.signature.params()
    if optimizer.groups is not None:
        params = jax.eval_shape(optimizer.groups.pack, params)
    specs = jax.tree_util.tree_map(lambda _: PartitionSpec(), params)
    arrays, other = eqx.partition(tx, lambda x: isinstance(x, (jax.Array, jax.ShapeDtypeStruct)))
    logical = jax.eval_shape(lambda a, p: eqx.combine(a, other).init(p), arrays, params)
    rules = jax.tree_util.tree_structure(logical).flatten_up_to(_state_specs(tx, params, specs))
    leaves = jax.tree_util.tree_leaves(logical)
    if len(leaves) != len(jax.tree_util.tree_leaves(optimizer.state)):
        return [None] * len(jax.tree_util.tree_leaves(optimizer.state))
    return [int(x.shape[0]) if isinstance(r, Owned) and x.shape else None for x, r in zip(leaves, rules)]


def unpadded(optimizer: Any) -> Any:
    """`optimizer` with each stack of the owner scheme in its state trimmed to its units.

    An `Optimizer` made with shardings stores the stacked per-matrix state of Shampoo, SOAP and
    Kron padded with zero units to a multiple of the mesh's device count, so that every device
    owns as many units as any other; the same optimizer on one device (or on another device
    count) stores fewer rows. Trimmed, the state has the same shapes and numbers on any mesh:
    for inspection and comparison (steps take the state as stored).

    Args:
        optimizer: a `modopt.Optimizer`.
    """
    leaves, treedef = jax.tree_util.tree_flatten(optimizer.state)
    units = owned_units(optimizer)
    trimmed = [x if n is None or x.shape[0] == n else x[:n] for x, n in zip(leaves, units)]
    return optimizer._replace(state=treedef.unflatten(trimmed))


_MESH: contextvars.ContextVar[Any] = contextvars.ContextVar("modopt_layout_mesh", default=None)


def split_further(spec: PartitionSpec, shape: tuple[int, ...], axes: Any) -> PartitionSpec:
    """`spec`, further split over the mesh axes `axes` (ZeRO-1's way: each on the largest
    dimension of `shape` it divides, if any) when `modopt.sharding` lays the state out on a mesh;
    `spec` itself otherwise.

    For a `state_specs` rule whose state has dimensions no parameter has (a projection's rank):
    the mesh axes that split the parameter along a dimension the state lacks would otherwise
    leave every device holding the whole state along them.

    Args:
        spec: the state leaf's spec from the parameter's.
        shape: the state leaf's shape.
        axes: the mesh axes to split it over too, where a dimension allows: names, or the
            entries of a `PartitionSpec` (the parameter's: `None`, a name or a tuple of names).
    """
    mesh = _MESH.get()
    if mesh is None:
        return spec
    for axis in (name for entry in axes for name in _axis_names(entry)):
        if axis in mesh.shape:
            spec = _with_axis(spec, tuple(shape), axis, mesh)
    return spec


def _state_specs(tx: Any, params: Any, param_specs: Any, mesh: Any = None) -> Any:
    """`tx.state_specs(...)`, also for an abstract `tx` (from `jax.eval_shape`); with `mesh`,
    the rules that place state of their own shape (`split_further`) see its axes.

    Rules depend on structure, not on hyperparameter values: an abstract `tx` is traced.
    """
    token = _MESH.set(mesh)
    try:
        return _rules_of(tx, params, param_specs)
    finally:
        _MESH.reset(token)


def _rules_of(tx: Any, params: Any, param_specs: Any) -> Any:
    if not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(tx)):
        return tx.state_specs(params, param_specs)
    arrays, other = eqx.partition(tx, lambda x: isinstance(x, (jax.Array, jax.ShapeDtypeStruct)))
    found = []

    def trace(arrays):
        found.append(eqx.combine(arrays, other).state_specs(params, param_specs))
        return 0

    jax.eval_shape(trace, arrays)
    return found[0]


def _param_specs(signature: ModelSignature, model_shardings: Any, mesh: Any) -> tuple[Any, Any]:
    """A `PartitionSpec` per trained parameter (the params' structure), and the mesh."""
    treedef = signature.treedef
    if isinstance(model_shardings, (NamedSharding, PartitionSpec)):
        given = [model_shardings] * treedef.num_leaves
    else:
        try:
            given = treedef.flatten_up_to(model_shardings)
        except (ValueError, TypeError):
            found = _first_difference(treedef.unflatten(range(treedef.num_leaves)), model_shardings)
            raise ValueError(f"The model shardings do not have the model's structure: found {found}.") from None
    meshes = {s.mesh for s in given if isinstance(s, NamedSharding)}
    if mesh is None and len(meshes) > 1:
        raise ValueError(f"The model shardings use {len(meshes)} different meshes; the optimizer needs one.")
    if mesh is None:
        mesh = meshes.pop() if meshes else jax.sharding.get_mesh()
    if mesh.empty:
        raise ValueError(
            "PartitionSpecs need a mesh: pass `mesh=`, use NamedShardings, or set one with `jax.set_mesh(mesh)`."
        )
    specs = []
    for path, leaf, sharding in zip(signature.paths(), signature.leaves, given):
        if leaf is None:
            specs.append(None)
            continue
        where = f"the parameter at {path or 'the root'}"
        if isinstance(sharding, NamedSharding):
            if sharding.mesh != mesh:
                raise ValueError(f"The sharding of {where} is on another mesh than {mesh}.")
            sharding = sharding.spec
        if not isinstance(sharding, PartitionSpec):
            raise TypeError(
                f"The model shardings give a {type(sharding).__name__} for {where}; expected a NamedSharding "
                "or a PartitionSpec (PartitionSpec() to replicate it)."
            )
        if PartitionSpec.UNCONSTRAINED in tuple(sharding):
            raise ValueError(
                f"The sharding of {where} is {sharding}: optimizer state needs a definite layout, so use "
                "None (not split) or mesh axes instead of PartitionSpec.UNCONSTRAINED."
            )
        _check(sharding, leaf.shape, mesh, where)
        specs.append(sharding)
    return treedef.unflatten(specs), mesh


def _axis_names(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _check(spec: PartitionSpec, shape: tuple[int, ...], mesh: Any, where: str) -> None:
    """Raises `ValueError` naming `where` if `spec` cannot shard an array of `shape` on `mesh`."""
    problem = f"Cannot shard {where} (shape {tuple(shape)}) as {spec}"
    if len(spec) > len(shape):
        raise ValueError(f"{problem}: the spec has {len(spec)} entries but the array has rank {len(shape)}.")
    used: set[str] = set()
    for dim, entry in enumerate(spec):
        names = _axis_names(entry)
        for name in names:
            if name not in mesh.shape:
                raise ValueError(f"{problem}: {name!r} is not an axis of the mesh, whose axes are {tuple(mesh.axis_names)}.")
            if name in used:
                raise ValueError(f"{problem}: mesh axis {name!r} is used twice.")
            used.add(name)
        ways = math.prod(mesh.shape[name] for name in names)
        if shape[dim] % ways:
            raise ValueError(
                f"{problem}: dimension {dim} has size {shape[dim]}, which the {ways} devices of mesh "
                f"{'axis ' + repr(names[0]) if len(names) == 1 else 'axes ' + repr(names)} do not divide."
            )


def _with_axis(spec: PartitionSpec, shape: tuple[int, ...], axis: str, mesh: Any) -> PartitionSpec:
    """`spec` further split over mesh axis `axis` (ZeRO-1), where a dimension allows it."""
    entries = list(padded(spec, len(shape)))
    if not shape or any(axis in _axis_names(entry) for entry in entries):
        return spec
    size = mesh.shape[axis]
    ways = [math.prod(mesh.shape[n] for n in _axis_names(entry)) for entry in entries]
    fits = [d for d in range(len(shape)) if shape[d] % (ways[d] * size) == 0]
    if not fits:
        return spec  # too small or indivisible: replicated along `axis`
    dim = max(fits, key=lambda d: (not _axis_names(entries[d]), shape[d] // ways[d]))
    names = _axis_names(entries[dim])
    entries[dim] = (*names, axis) if names else axis
    return PartitionSpec(*entries)


def bytes_per_device(tree: Any, shardings: Any = None, *, memory_kind: str | None = None) -> int:
    """The bytes each device holds of `tree`'s arrays, computed from shapes alone.

    `tree` may be abstract (from `jax.eval_shape`). `shardings` has its structure (for
    instance from `shardings(...)`); without it, each leaf's own `.sharding` is used, and a
    leaf without one counts whole. With `memory_kind`, only the arrays in that memory count:
    `"device"` for the accelerator's own (where an array without a memory kind is), or
    `"pinned_host"` for an optimizer's state kept on the host.

    What the state costs whole, per trained parameter and by its largest arrays (or by
    parameter), before anything is allocated: `modopt.state_bytes(tx, params)`, or
    `optimizer.state_bytes()`. Matrix optimizers can keep far more than Adam's 8 bytes per
    float32 parameter: SOAP keeps two `d x d` matrices per dimension `d` up to
    `max_precondition_dim` (10000), Kron one per axis up to `max_size_triangular` (8192), Shampoo
    two per block dimension up to `block_size`; `modopt.Optimizer` warns once
    (`modopt.StateMemoryWarning`) above 16 bytes per parameter, naming the largest arrays.

    Args:
        tree: a pytree of arrays or `jax.ShapeDtypeStruct`s.
        shardings: a sharding per leaf, with the structure of `tree`, or `None` to read each leaf's
            own.
        memory_kind: count only the arrays in this memory kind; `None` counts all.

    Example:
        >>> abstract = jax.eval_shape(lambda m: modopt.Optimizer(tx, m, state_memory_kind="pinned_host"), model)
        >>> placed = modopt.sharding.shardings(abstract, model_shardings)
        >>> on_accelerator = modopt.sharding.bytes_per_device(abstract, placed, memory_kind="device")
        >>> on_host = modopt.sharding.bytes_per_device(abstract, placed, memory_kind="pinned_host")
    """
    leaves = jax.tree_util.tree_leaves(tree)
    if shardings is None:
        given = [getattr(leaf, "sharding", None) for leaf in leaves]
    else:
        given = jax.tree_util.tree_structure(tree).flatten_up_to(shardings)
    total = 0
    for leaf, sharding in zip(leaves, given):
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            continue
        if memory_kind is not None and (getattr(sharding, "memory_kind", None) or "device") != memory_kind:
            continue
        shape = sharding.shard_shape(tuple(leaf.shape)) if sharding is not None else leaf.shape
        total += math.prod(shape) * _itemsize(leaf.dtype)
    return total


def _itemsize(dtype: Any) -> int:
    """Bytes per element, also for PRNG keys (whose dtype knows its key data's size)."""
    size = getattr(dtype, "itemsize", None)
    return size if isinstance(size, int) else np.dtype(dtype).itemsize


def _is_explicit(sharding: Any) -> bool:
    mesh = getattr(sharding, "mesh", None)
    return mesh is not None and jax.sharding.AxisType.Explicit in getattr(mesh, "axis_types", ())


def _constrain(x: jax.Array, sharding: Any) -> jax.Array:
    """`x` laid out as `sharding` (a reshard on Explicit mesh axes, a constraint on Auto ones)."""
    if _is_explicit(sharding):
        return jax.sharding.reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)


def _explicit_mesh(tree: Any) -> Any:
    """The mesh of `tree`'s arrays if their shardings are typed on Explicit mesh axes, else `None`."""
    for leaf in jax.tree_util.tree_leaves(tree):
        sharding = jax.typeof(leaf).sharding
        if _is_explicit(sharding):
            return sharding.mesh
    return None


def update_on_mesh(tx: Any, grads: Any, state: Any, params: Any, extra_args: dict) -> tuple[Any, Any]:
    """`tx.update(grads, state, params, **extra_args)`, also on Explicit mesh axes.

    Explicit axes type every array's sharding, and a ZeRO-split state would clash with the
    gradients it meets. There the update runs on Auto axes, and its results come back
    sharded like the parameters (updates) and like the old state.
    """
    mesh = _explicit_mesh(params)
    if mesh is None:
        return tx.update(grads, state, params, **extra_args)
    arrays, other = eqx.partition((tx, grads, state, params, extra_args), eqx.is_array)
    specs = [jax.typeof(x).sharding.spec for x in jax.tree_util.tree_leaves(arrays)]

    def update(arrays):
        tx, *args, extra = eqx.combine(arrays, other)
        # The arrays traced anew keep their specs for the owner scheme of matrix optimizers.
        with more_specs(zip(jax.tree_util.tree_leaves(arrays), specs)):
            return tx.update(*args, **extra)

    out_sharding = (_specs_of(params), _specs_of(state))
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.sharding.auto_axes(update, out_sharding=out_sharding)(arrays)


def _specs_of(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: jax.typeof(x).sharding.spec, tree)
