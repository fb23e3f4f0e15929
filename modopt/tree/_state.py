"""Finding, replacing and mapping values in optimizer states: optax's `tree.get`, `tree.set`,
`tree.get_all_with_path` and `tree.map_params`.

States are pytrees of named nodes: NamedTuples (every transform's state) and Equinox modules
(`modopt.Optimizer`, whose `state` field holds them; a model inside a state). A *key* names a
value in such a tree: a field of a named node, a key of a dict, or the class name of a named
node (which names the node itself). Paths to what is found end with a `NamedTupleKey(class
name, field)` for a field of a named node, so a filter can tell `ScaleByAdamState.count` from
`InjectHyperparamsState.count`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._step.grouping import LeafGroups
from .._step.optimizer import Optimizer

KeyPath = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class NamedTupleKey:
    """A path entry naming a field of a named node: a NamedTuple or an Equinox module.

    `tree.get_all_with_path`, `tree.get` and `tree.set` give it (where `jax.tree_util` would
    give a `GetAttrKey`) so that a `filtering(path, value)` function can check the class of the
    state a value is in: `path[-1].tuple_name == "ScaleByAdamState"`. `str(key)` is
    `"ScaleByAdamState.count"`.

    Args:
        tuple_name: the class name of the node (`ScaleByAdamState`, `Optimizer`).
        name: the name of the field.
    """

    tuple_name: str
    name: str

    def __str__(self):
        return f"{self.tuple_name}.{self.name}"


def _is_named_tuple(node: Any) -> bool:
    return isinstance(node, tuple) and hasattr(node, "_fields")


def _one_level(node: Any) -> tuple[list[tuple[KeyPath, Any]], Any]:
    """The children of a pytree node with their key entries, and its structure one level deep."""
    return jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)


def _fields(node: Any) -> list[tuple[str, Any]] | None:
    """The named children of a named node, `(field, value)` in order; `None` for other nodes.

    A NamedTuple's fields; a dataclass pytree's (an Equinox module's) children that JAX reaches
    by attribute, that is its fields other than static ones (those are structure, not values).
    """
    if _is_named_tuple(node):
        return [(name, getattr(node, name)) for name in node._fields]
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        return None
    children, _ = _one_level(node)
    if not all(len(path) == 1 and isinstance(path[0], jax.tree_util.GetAttrKey) for path, _ in children):
        return None  # a dataclass JAX does not know (a leaf), or one flattened otherwise
    return [(path[0].name, child) for path, child in children]


def _has_key(node: Any, keys: Any) -> bool:
    """Whether `node` holds one of `keys`: as a field or dict key, or as its class name."""
    if isinstance(node, dict):
        return any(_hashable(key) and key in node for key in keys)
    fields = _fields(node)
    if fields is None:
        return False
    names = {name for name, _ in fields} | {type(node).__name__}
    return any(key in names for key in keys if isinstance(key, str))


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _children(path: KeyPath, node: Any) -> list[tuple[KeyPath, Any]]:
    """The children of a dict or a named node, with their paths."""
    if isinstance(node, dict):
        return [((*path, jax.tree_util.DictKey(key)), value) for key, value in node.items()]
    name = type(node).__name__
    return [((*path, NamedTupleKey(name, field)), value) for field, value in _fields(node)]


def _subtrees_with_path(tree: Any, stop: Callable[[Any], bool]) -> list[tuple[KeyPath, Any]]:
    """`(path, node)` for the leaves of `tree` and the nodes where `stop` holds (not entered),
    with `NamedTupleKey` entries through named nodes."""
    found = []
    for path, node in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: stop(x) or _fields(x) is not None)[0]:
        if stop(node) or _fields(node) is None:
            found.append((path, node))
            continue
        for child_path, child in _children(path, node):
            found += [((*child_path, *p), value) for p, value in _subtrees_with_path(child, stop)]
    return found


def _lookup(path: KeyPath, node: Any, key: Any) -> tuple[KeyPath, Any]:
    """`(path, value)` of `key` in a node that holds it; a named node itself for its class name."""
    if isinstance(node, dict):
        return (*path, jax.tree_util.DictKey(key)), node[key]
    if key == type(node).__name__:
        return path, node
    return (*path, NamedTupleKey(type(node).__name__, key)), getattr(node, key)


def _find_all(tree: Any, key: Any) -> list[tuple[KeyPath, Any]]:
    """Every `(path, value)` for `key`: first those in the outermost nodes holding it, in the
    order of the tree, then, for each such node in turn, those further inside it."""
    holds = lambda node: _has_key(node, (key,))  # noqa: E731
    holders = [(path, node) for path, node in _subtrees_with_path(tree, holds) if holds(node)]
    found = [_lookup(path, node, key) for path, node in holders]
    for path, node in holders:
        for child_path, child in _children(path, node):
            found += [((*child_path, *p), value) for p, value in _find_all(child, key)]
    return found


def get_all_with_path(
    tree: Any, key: Any, filtering: Callable[[KeyPath, Any], bool] | None = None
) -> list[tuple[KeyPath, Any]]:
    """Every value of `tree` that `key` names, with its path.

    `key` names a field of a NamedTuple or of an Equinox module (its non-static fields), a key
    of a dict, or the class name of a NamedTuple or module (the node itself). The search goes
    through every container, `modopt.Optimizer` included, and on inside what it finds.

    Args:
        tree: the pytree to search, such as an optimizer state or a `modopt.Optimizer`.
        key: the field, dict key or class name to find.
        filtering: `filtering(path, value) -> bool`, to keep only some of the values found;
            `path` ends with a `NamedTupleKey` for a field of a named node.

    Returns:
        A list of `(path, value)`; `jax.tree_util.keystr(path)` reads a path. Values in the
        outermost nodes holding `key` come first, then those found inside them.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import modopt
        >>> state = modopt.chain(modopt.scale_by_adam(), modopt.scale_by_adam()).init(jnp.zeros(2))
        >>> [jax.tree_util.keystr(path) for path, _ in modopt.tree.get_all_with_path(state, "count")]
        ['[0]ScaleByAdamState.count', '[1]ScaleByAdamState.count']
    """
    found = _find_all(tree, key)
    if filtering is not None:
        found = [(path, value) for path, value in found if filtering(path, value)]
    return found


def get(
    tree: Any, key: Any, default: Any = None, filtering: Callable[[KeyPath, Any], bool] | None = None
) -> Any:
    """The one value of `tree` that `key` names (see `get_all_with_path`), or `default`.

    Args:
        tree: the pytree to search, such as an optimizer state or a `modopt.Optimizer`.
        key: the field, dict key or class name to find.
        default: what to return when nothing is found.
        filtering: `filtering(path, value) -> bool`, to choose among the values found.

    Raises:
        KeyError: when several values are found (choose with `filtering`).

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> state = modopt.adam(1e-3).init(jnp.zeros(2))
        >>> modopt.tree.get(state, "count")
        Array(0, dtype=int32)
    """
    found = get_all_with_path(tree, key, filtering=filtering)
    if len(found) > 1:
        paths = ", ".join(jax.tree_util.keystr(path) for path, _ in found)
        raise KeyError(f"Found multiple values for '{key}' in the tree, at {paths}: choose one with `filtering`.")
    return found[0][1] if found else default


def set(tree: Any, filtering: Callable[[KeyPath, Any], bool] | None = None, /, **kwargs: Any) -> Any:  # noqa: A001
    """A copy of `tree` in which every value named by a keyword is replaced by its value.

    Every value `get_all_with_path(tree, key, filtering)` finds is replaced (a value inside
    one replaced is replaced with it), so afterwards `get_all_with_path` finds the new value
    at each of those paths. NamedTuples, modules and dicts keep their types.

    Note: optax 0.2.8's `tree.set` replaces a value inside another node holding the key only
    when every node between them holds it too: on the state of
    `inject_hyperparams(adam)(...)`, `set(state, count=0)` resets there the outer count but not
    Adam's. modopt replaces every value the key names, as the docstring of optax's function
    says; use `filtering` to choose.

    Args:
        tree: the pytree whose values to replace.
        filtering: `filtering(path, value) -> bool`, to replace only some of the values found.
        **kwargs: the new values, by field, dict key or class name.

    Raises:
        KeyError: when a key names no value (that `filtering` keeps).

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> state = modopt.adam(1e-3).init(jnp.zeros(2))
        >>> modopt.tree.get(modopt.tree.set(state, count=jnp.asarray(5)), "count")
        Array(5, dtype=int32, weak_type=True)
    """
    for key in kwargs:
        if not get_all_with_path(tree, key, filtering):
            given = " given the filtering operation" if filtering is not None else ""
            raise KeyError(f"Found no values matching '{key}'{given} in the tree.")
    return _replace((), tree, kwargs, filtering)


def _replace(path: KeyPath, node: Any, new: dict[str, Any], filtering: Any) -> Any:
    """`node` with the values `new` names replaced, inside it at any depth."""
    keep = lambda p, v: filtering is None or filtering(p, v)  # noqa: E731
    if isinstance(node, dict) or _fields(node) is not None:
        if not isinstance(node, dict) and type(node).__name__ in new and keep(path, node):
            return new[type(node).__name__]
        children = []
        for child_path, child in _children(path, node):
            entry = child_path[-1]
            name = entry.key if isinstance(entry, jax.tree_util.DictKey) else entry.name
            if _hashable(name) and name in new and keep(child_path, child):
                children.append((entry, new[name]))
            else:
                children.append((entry, _replace(child_path, child, new, filtering)))
        return _rebuilt(node, children)
    entries, treedef = _one_level(node)
    if len(entries) == 1 and entries[0][0] == ():
        return node  # a leaf
    return treedef.unflatten([_replace((*path, *p), child, new, filtering) for p, child in entries])


def _rebuilt(node: Any, children: list[tuple[Any, Any]]) -> Any:
    """A dict or named node of `node`'s type with new children (by entry, in its order)."""
    if isinstance(node, dict):
        out = copy.copy(node)
        for entry, value in children:
            out[entry.key] = value
        return out
    if _is_named_tuple(node):
        return node._replace(**{entry.name: value for entry, value in children})
    _, treedef = _one_level(node)  # a module: rebuilt as JAX does, without running __init__
    return treedef.unflatten([value for _, value in children])


# ---- map_params -------------------------------------------------------------------------


@jax.tree_util.register_pytree_node_class
class _ParamsStandIn:
    """Stands for the whole parameter tree in `init`: a node without children, so a state
    built from it holds it wherever the real state holds a tree shaped like the parameters."""

    def tree_flatten(self):
        return (), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        del aux, children
        return cls()


@runtime_checkable
class Initable(Protocol):
    """An object with `init(params) -> state` (a transform)."""

    def init(self, params: Any) -> Any: ...


def map_params(
    initable: Any,
    f: Callable[..., Any],
    state: Any,
    /,
    *rest: Any,
    transform_non_params: Callable[..., Any] | None = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """`f` mapped over every tree in `state` shaped like the parameters (moments, traces...).

    Which subtrees of `state` are shaped like the parameters is found by calling `init` on a
    stand-in for the parameters: wherever the state built from it holds the stand-in, `state`
    holds a parameter-shaped tree, and `f(leaf, *rest_leaves)` is mapped over it. The other
    leaves (step counts, hyperparameters, reduced or factored statistics) go to
    `transform_non_params`, or stay as they are. A typical use: the `PartitionSpec` of every
    leaf of the state from the parameters' specs.

    Masked and partitioned states (`masked`, `multi_transform`): where a mask excludes a
    parameter the state holds `MaskedNode()`, and where `modopt.Optimizer` trains no leaf it
    holds `None`; unless `is_leaf` is given, such subtrees without arrays are kept as they are
    and what `rest` holds there is ignored, so `rest` may be shaped like all the parameters.
    (optax raises there, or with `is_leaf`, calls `f` on the `MaskedNode`; `is_leaf` gives
    optax's behaviour.)

    A `modopt.Optimizer` as `initable` maps over `optimizer.state`. When it steps small leaves
    as flat buffers (`group_small_leaves`, see `Optimizer`), `f` still sees the parameters'
    layout: each buffer is cut into the leaves it holds, and the leaves of `rest` are the
    parameters'. The result is packed back into buffers when `f` gives, for every grouped leaf,
    an array of that leaf's shape (one dtype per buffer), so that it is a state of this
    optimizer; otherwise (specs, shapes, norms) it keeps the parameters' layout in those places,
    a tree to read rather than a state to step with.

    Args:
        initable: what made `state`: a transform (modopt or optax), an `init` function, or a
            `modopt.Optimizer`.
        f: the function of a parameter-shaped leaf of the state and the matching leaves of `rest`.
        state: the state to map over (`optimizer.state` for an `Optimizer`).
        *rest: trees shaped like the parameters, whose leaves `f` also gets.
        transform_non_params: a function applied to every other leaf of the state; `None` keeps
            them as they are.
        is_leaf: passed to `jax.tree.map` over each parameter-shaped tree, to stop at subtrees
            (optax's way of handling `MaskedNode`).

    Example:
        >>> import jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec as P
        >>> import modopt
        >>> params, specs = {"w": jnp.zeros((4, 2))}, {"w": P("data", None)}
        >>> tx = modopt.adam(1e-3)
        >>> modopt.tree.map_params(tx, lambda _, spec: spec, tx.init(params), specs,
        ...                        transform_non_params=lambda _: P())[0].mu
        {'w': P('data', None)}
    """
    groups: LeafGroups | None = None
    if isinstance(initable, Optimizer):
        groups, init = initable.groups, initable.tx.init
    elif isinstance(initable, Initable):
        init = initable.init
    elif callable(initable):
        init = initable
    else:
        raise TypeError(
            f"map_params: `initable` must be a transform, an init function or a modopt.Optimizer, "
            f"got {type(initable).__name__}."
        )
    template = init(_ParamsStandIn())

    def map_one(marker, value):
        if not isinstance(marker, _ParamsStandIn):
            return value if transform_non_params is None else transform_non_params(value)
        if groups is not None:
            return _map_grouped(groups, initable.signature.params(), f, value, rest, is_leaf)
        return _map_tree(f, value, rest, is_leaf)

    return jax.tree_util.tree_map(map_one, template, state, is_leaf=lambda x: isinstance(x, _ParamsStandIn))


def _holds_nothing(tree: Any) -> bool:
    """A subtree without leaves: `None` (not trained), `MaskedNode()` (masked out), `{}`."""
    return not jax.tree_util.tree_leaves(tree)


def _map_tree(f: Callable[..., Any], tree: Any, rest: tuple[Any, ...], is_leaf: Any) -> Any:
    """`f` over the leaves of a parameter-shaped `tree` and `rest`; subtrees without leaves kept
    (unless `is_leaf` is given: then exactly `jax.tree.map`)."""
    if is_leaf is not None:
        return jax.tree_util.tree_map(f, tree, *rest, is_leaf=is_leaf)
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_holds_nothing)
    try:
        others = [treedef.flatten_up_to(other) for other in rest]
    except ValueError as error:
        if isinstance(tree, dict) and tree.keys() == {"grouped", "ungrouped"}:
            raise ValueError(
                "map_params: this state keeps small leaves in flat buffers (an Optimizer's grouped state), so "
                "`rest` does not match it: pass the Optimizer itself as `initable`, and `f` sees the parameters' "
                "layout."
            ) from error
        raise
    out = [leaf if _holds_nothing(leaf) else f(leaf, *more) for leaf, *more in zip(leaves, *others)]
    return treedef.unflatten(out)


def _map_grouped(
    groups: LeafGroups, params: Any, f: Callable[..., Any], packed: Any, rest: tuple[Any, ...], is_leaf: Any
) -> Any:
    """`f` over a grouped parameter-shaped tree of an `Optimizer`'s state, in the parameters'
    layout; packed back into buffers where `f` keeps each grouped leaf's shape."""
    if not (isinstance(packed, dict) and packed.keys() == {"grouped", "ungrouped"}):
        raise ValueError(
            "map_params: this Optimizer groups small leaves into buffers, but its state holds a "
            f"{type(packed).__name__} where a grouped tree ({{'grouped': ..., 'ungrouped': ...}}) is expected: "
            "was `state` made by this optimizer?"
        )
    shapes, treedef = jax.tree_util.tree_flatten(params)
    like = list(shapes)
    for group, buffer in zip(groups.groups, packed["grouped"]):
        for i in group:
            like[i] = jax.ShapeDtypeStruct(shapes[i].shape, buffer.dtype)  # the state's dtype, not the params'
    result = _map_tree(f, groups.unpack(packed, treedef.unflatten(like)), rest, is_leaf)
    try:
        leaves = treedef.flatten_up_to(result)
    except (ValueError, TypeError):
        return result
    if not all(eqx.is_array(leaf) for leaf in leaves):
        return result
    for group in groups.groups:
        values = [leaves[i] for i in group]
        fits = all(jnp.shape(v) == shapes[i].shape for v, i in zip(values, group))
        if not fits or len({jnp.result_type(v) for v in values}) != 1:
            return result
    return groups.pack(result)
