"""Running a transform on the leaves a mask selects: the core of `masked`, and of every
transform with a `mask` field (`add_decayed_weights(mask=...)`).

Excluded leaves (and subtrees) are replaced by `MaskedNode()` before the inner transform sees
them, so its state holds nothing for them; its state is kept in a `MaskedState`, and the
updates of excluded leaves pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from .fields import resolve_tree


class MaskedNode(NamedTuple):
    """Stands in for a leaf (or subtree) that a mask excludes. It holds no arrays."""


class MaskedState(NamedTuple):
    """The inner transform's state, built on the params with excluded leaves as `MaskedNode`."""

    inner_state: Any


def stands_in_for_params(tree: Any) -> bool:
    """Whether `tree` stands in for a whole parameter tree: a pytree node without children that is
    no container. `tree.map_params` (modopt's and optax's) calls `init` on one to find where a
    state holds trees shaped like the parameters; there is nothing to mask or label in it."""
    treedef = jax.tree_util.tree_structure(tree)
    return (
        treedef.num_nodes == 1
        and treedef.num_leaves == 0
        and tree is not None
        and not isinstance(tree, (dict, list, tuple))
    )


def mask_tree(tree: Any, mask: Any) -> Any:
    """`tree` with every subtree whose mask entry is `False` replaced by `MaskedNode()`."""
    return jax.tree_util.tree_map(lambda m, t: t if m else MaskedNode(), mask, tree)


def resolve_mask(mask: Any, tree: Any) -> Any:
    """The mask (a static tree or a function of `tree`, as a `mask` field holds it) for `tree`,
    checked: a prefix of its structure, booleans at the leaves."""
    mask = resolve_tree(mask, tree, "masked: the mask")
    for path, leaf in jax.tree_util.tree_flatten_with_path(mask)[0]:
        if not isinstance(leaf, (bool, np.bool_)):
            raise ValueError(
                f"masked: the mask holds {leaf!r} (a {type(leaf).__name__}) at "
                f"{jax.tree_util.keystr(path) or 'the root'}; a mask holds booleans (True: transformed). "
                "To give parameters labels, use `partition` (`multi_transform`)."
            )
    return mask


def masked_init(inner: Any, mask: Any, params: Any) -> MaskedState:
    """The state of `inner` run where `mask` is `True`: `inner.init` of the masked params."""
    if stands_in_for_params(params):
        return MaskedState(inner_state=inner.init(params))
    return MaskedState(inner_state=inner.init(mask_tree(params, resolve_mask(mask, params))))


def masked_update(
    inner: Any,
    mask: Any,
    updates: Any,
    state: MaskedState,
    params: Any,
    extra_args: Mapping[str, Any],
    mask_compatible_extra_args: bool = False,
) -> tuple[Any, MaskedState]:
    """`inner.update` where `mask` is `True`; the other updates pass through unchanged. With
    `mask_compatible_extra_args`, extra arguments with the params' structure are masked too."""
    mask = resolve_mask(mask, updates)
    if mask_compatible_extra_args:
        structure = jax.tree_util.tree_structure(updates)
        extra_args = {
            k: mask_tree(v, mask) if jax.tree_util.tree_structure(v) == structure else v
            for k, v in extra_args.items()
        }
    inner_updates, inner_state = inner.update(
        mask_tree(updates, mask),
        state.inner_state,
        None if params is None else mask_tree(params, mask),
        **extra_args,
    )
    updates = jax.tree_util.tree_map(lambda m, new, old: new if m else old, mask, inner_updates, updates)
    return updates, MaskedState(inner_state=inner_state)
