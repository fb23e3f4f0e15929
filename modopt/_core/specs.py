"""Partition specs of optimizer state, derived from the parameters' specs (no mesh needed).

Every transform answers `state_specs(params, param_specs)`: the `PartitionSpec` of each leaf
of `init(params)`. The default, `follow_params`, works by shape; transforms with reduced or
factored state declare their own rule, and combinators ask their parts. `modopt.sharding`
turns the specs into `NamedSharding`s on a mesh and checks them.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.sharding import PartitionSpec

from .types import OptState, Params

REPLICATED = PartitionSpec()
SMALL = 1024  # elements: bookkeeping arrays up to this size are replicated by the generic rule


class NoRule:
    """Stands in for the spec of a state leaf that no rule places.

    `modopt.sharding` turns it into an error naming the leaf's path, so an unplaceable state
    is never replicated silently.

    Args:
        owner: the name of the transform whose state leaf has no rule.
        shape: the shape of that leaf.
    """

    def __init__(self, owner: str, shape: tuple[int, ...]):
        self.owner = owner
        self.shape = shape

    def __repr__(self):
        return f"NoRule({self.owner}, {self.shape})"


class Owned:
    """The spec of a state leaf whose axis 0 stacks units of per-matrix state (statistics, bases,
    factors), each unit kept on the device that owns it (`modopt.sharding`'s owner scheme).

    On a mesh it becomes a split of axis 0 over the mesh axes whose product is the largest
    divisor of the stack's length, and nothing else: ZeRO-1 does not split such a leaf further
    (each unit stays whole on its owner). Use the instance `OWNED`.

    `OWNED_ELEMENTWISE` marks a stack whose state is elementwise within each unit (Adam's
    moments): where padding the stack to a multiple of the device count would at least double
    it (1 to 4 units on 8 devices), it is stored unpadded and split along its units' own
    dimensions over every device, and moves to the owners only for the step's work (see
    `modopt.sharding.spread_spec`); otherwise it is stored as `OWNED`.

    Args:
        elementwise: whether the stack's state is elementwise within each unit.
    """

    def __init__(self, elementwise: bool = False):
        self.elementwise = elementwise

    def __repr__(self):
        return "OWNED_ELEMENTWISE" if self.elementwise else "OWNED"


OWNED = Owned()
OWNED_ELEMENTWISE = Owned(elementwise=True)


def is_spec(x: Any) -> bool:
    """Leaves of a specs tree: `PartitionSpec`s, `OWNED` and `NoRule` markers."""
    return isinstance(x, (PartitionSpec, NoRule, Owned))


def padded(spec: PartitionSpec, ndim: int) -> tuple:
    """The entries of `spec` for an array of rank `ndim` (missing trailing entries are `None`)."""
    return tuple(spec) + (None,) * (ndim - len(spec))


def drop_axis(spec: PartitionSpec, ndim: int, axis: int) -> PartitionSpec:
    """The spec of a reduction over `axis` of an array of rank `ndim` with spec `spec`.

    Args:
        spec: the spec of the array reduced.
        ndim: the array's rank.
        axis: the axis reduced (negative counts from the end).
    """
    entries = list(padded(spec, ndim))
    del entries[axis]
    return PartitionSpec(*entries)


def _leaf_spec(leaf: Any, param: Any, spec: PartitionSpec) -> PartitionSpec | None:
    """The spec of a state leaf paired with a parameter, or `None` if the shapes don't relate.

    Same shape: the parameter's spec. Shape `(*extra, *param.shape)` (a history, a stack of
    copies): the parameter's spec with the extra leading axes unsplit. Scalar: replicated.
    """
    shape, param_shape = tuple(leaf.shape), tuple(param.shape)
    if shape == param_shape:
        return spec
    extra = len(shape) - len(param_shape)
    if extra > 0 and shape[extra:] == param_shape:
        return PartitionSpec(*((None,) * extra + padded(spec, len(param_shape))))
    if shape == ():
        return REPLICATED
    return None


def follow_params(state: OptState, params: Params, param_specs: Any, owner: str) -> Any:
    """Specs for `state` by shape: the generic rule of `AbstractTransform.state_specs`.

    Each subtree of `state` laid out like `params` (moments, traces; entries of frozen or
    masked-out parameters may be empty) follows the parameters leaf by leaf, matched by
    their paths (see `_leaf_spec`). Other leaves of at most `SMALL` elements (counters,
    per-step scalars of a history) are replicated. Any larger leaf gets a `NoRule` marker
    naming `owner`, the transform that should declare a rule: replicating it silently could
    cost every device a large copy.

    Args:
        state: the transform's state, concrete or abstract.
        params: the parameters, concrete or abstract.
        param_specs: the parameters' `PartitionSpec`s, with the structure of `params`.
        owner: the name of the transform, for the `NoRule` markers.
    """
    by_path = {
        path: (param, spec)
        for (path, param), spec in zip(
            jax.tree_util.tree_flatten_with_path(params)[0], jax.tree_util.tree_leaves(param_specs, is_leaf=is_spec)
        )
    }

    def follows_params(node):
        flat = jax.tree_util.tree_flatten_with_path(node)[0]
        if not flat or any(path not in by_path for path, _ in flat):
            return None
        specs = [_leaf_spec(leaf, *by_path[path]) for path, leaf in flat]
        if any(spec is None for spec in specs):
            return None
        return jax.tree_util.tree_structure(node).unflatten(specs)

    def visit(node):
        structure = jax.tree_util.tree_structure(node)
        if structure.num_leaves == 0:
            return node
        specs = follows_params(node)
        if specs is not None:
            return specs
        if jax.tree_util.treedef_is_leaf(structure):
            return REPLICATED if math.prod(node.shape) <= SMALL else NoRule(owner, tuple(node.shape))
        children, node_def = jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)
        return node_def.unflatten([visit(child) for child in children])

    return visit(state)
