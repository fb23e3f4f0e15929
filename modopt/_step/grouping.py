"""Many small parameters stepped as a few flat buffers: how `Optimizer` groups leaves.

A step costs every array that crosses the jit boundary a few microseconds, whatever its size,
so a model of a thousand biases and norms is slowed by the dispatch of its optimizer state,
not by the arithmetic. A transform that acts elementwise (`AbstractTransform.acts_elementwise`)
gives the same numbers on any regrouping of the elements, so `Optimizer` runs it on small
leaves concatenated into flat buffers, one per group, and keeps its state in that layout.

The transform then sees `{"grouped": (buffer, ...), "ungrouped": params}`: the flat buffers,
and the parameters' own tree with `None` where a leaf went into a buffer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .._core.checks import check_state
from .._core.declared import declared_extra_args
from ..combinators._flatten import ravel, unravel

# Measured with an AdamW step on this library's benchmark machine (2 CPU cores): grouping
# leaves of 256-1024 elements made the step 1.7-2x faster, at 4096 it broke even, at 16k the
# copies made it 2.6x slower.
SMALL_LEAF = 1024
"""Leaves of at most this many elements are grouped."""
MIN_SMALL_LEAVES = 8
"""Fewer small leaves of one dtype are left as they are (nothing worth saving)."""
LEAVES_PER_GROUP = 16
"""XLA's compile time grows with the square of the pieces cut from one buffer (1000 pieces of
one buffer took 6 s to compile): with 16 per buffer, 1000 tiny leaves compile in a third of the
leaf-by-leaf step's time, 100 in the same time, and steps are as fast as with 64 per buffer."""


class LeafGroups(NamedTuple):
    """Which trainable leaves share a buffer: per buffer, their indices among the leaves of the
    trainable tree (`None`s skipped), in leaf order. Static: part of the optimizer's type."""

    groups: tuple[tuple[int, ...], ...]

    def pack(self, tree: Any) -> dict[str, Any]:
        """A params-shaped `tree` in the grouped layout the transform sees."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        grouped = self._grouped()
        buffers = tuple(ravel([leaves[i] for i in group]) for group in self.groups)
        rest = treedef.unflatten([None if i in grouped else leaf for i, leaf in enumerate(leaves)])
        return {"grouped": buffers, "ungrouped": rest}

    def unpack(self, packed: dict[str, Any], like: Any) -> Any:
        """The inverse of `pack`: leaves cut from the buffers, shaped like those of `like`."""
        leaves, treedef = jax.tree_util.tree_flatten(like)
        grouped = self._grouped()
        out = list(leaves)
        ungrouped = iter(jax.tree_util.tree_leaves(packed["ungrouped"]))
        for i in range(len(leaves)):
            if i not in grouped:
                out[i] = next(ungrouped)
        for group, buffer in zip(self.groups, packed["grouped"]):
            for i, piece in zip(group, unravel(buffer, [leaves[i] for i in group])):
                out[i] = piece
        return treedef.unflatten(out)

    def pack_specs(self, param_specs: Any, is_spec: Any) -> dict[str, Any]:
        """The `PartitionSpec`s of `pack`'s layout: buffers replicated, the rest as the parameters.

        A buffer's elements do not line up with any parameter's shards (ZeRO-1 may still split
        it, see `modopt.sharding.shardings`).
        """
        specs, treedef = jax.tree_util.tree_flatten(param_specs, is_leaf=is_spec)
        grouped = self._grouped()
        rest = treedef.unflatten([None if i in grouped else spec for i, spec in enumerate(specs)])
        return {"grouped": tuple(PartitionSpec() for _ in self.groups), "ungrouped": rest}

    def _grouped(self) -> frozenset[int]:
        return frozenset(i for group in self.groups for i in group)

    def describe(self) -> str:
        count = sum(len(group) for group in self.groups)
        buffers = "1 buffer" if len(self.groups) == 1 else f"{len(self.groups)} buffers"
        return f"{count} small leaves grouped into {buffers}"


def packed(groups: LeafGroups | None, tree: Any) -> Any:
    """A params-shaped `tree` as the transform sees it: packed by `groups`, or as it is."""
    return tree if groups is None else groups.pack(tree)


def update_in_layout(
    tx: Any, groups: LeafGroups | None, grads: Any, state: Any, params: Any, update: Callable[..., Any]
) -> tuple[Any, Any]:
    """`update(grads, state, params) -> (updates, state)` in the layout `state` was made for.

    Gradients and parameters are packed by `groups` (left as they are for `None`), `state` is
    checked against `tx` on them first, and the updates come back shaped like `params`.
    """
    seen = packed(groups, params)
    check_state(tx, state, seen)
    updates, state = update(packed(groups, grads), state, seen)
    return (updates if groups is None else groups.unpack(updates, params)), state


def plan_groups(tx: Any, params: Any) -> LeafGroups | None:
    """The groups `Optimizer` uses for `tx` on the trainable `params`, or `None` for none.

    Leaves are grouped when `tx` acts elementwise (a transform reducing per-example gradients
    does not) and reads no extra argument shaped like (or a function of) the parameters; a leaf is
    grouped when it holds at most `SMALL_LEAF` elements, with at least `MIN_SMALL_LEAVES` such
    leaves of its dtype. The plan depends on shapes and dtypes only, so an abstract optimizer
    (`jax.eval_shape`) has the layout of the one a jitted init creates.
    """
    if not tx.acts_elementwise():
        return None
    if any(spec.of_params or spec.like_params for spec, *_ in declared_extra_args(tx).args.values()):
        return None
    by_dtype: dict[Any, list[int]] = defaultdict(list)
    for i, leaf in enumerate(jax.tree_util.tree_leaves(params)):
        if math.prod(jnp.shape(leaf)) <= SMALL_LEAF:
            by_dtype[jnp.result_type(leaf)].append(i)
    groups = tuple(
        tuple(indices[start : start + LEAVES_PER_GROUP])
        for indices in by_dtype.values()
        if len(indices) >= MIN_SMALL_LEAVES
        for start in range(0, len(indices), LEAVES_PER_GROUP)
    )
    return LeafGroups(groups) if groups else None

