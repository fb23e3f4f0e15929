"""Applying a transform to a subset of the parameters: `masked`."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from .._core.base import AbstractTransform, AbstractWrapper, inner_transform
from .._core.fields import as_static_tree, resolve_tree, static
from .._core.masks import MaskOrFn


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


class Masked(AbstractWrapper):
    """Applies `inner` only where `mask` is `True`; other updates pass through unchanged.

    `mask` is a pytree of bools whose structure is a prefix of the params, or a function of
    the params (or updates) returning one. With `mask_compatible_extra_args=True`, extra
    arguments with the params' structure are masked too.

    Args:
        inner: the transform applied where the mask is `True` (a modopt or optax transform).
        mask: a pytree of bools whose structure is a prefix of the params', or a function of the
            params returning one (static).
        mask_compatible_extra_args: also mask the extra arguments of `update` that have the params'
            structure, so that `inner` sees them restricted like the updates (static).
    """

    inner: AbstractTransform = inner_transform()
    mask: MaskOrFn = static(converter=as_static_tree)
    mask_compatible_extra_args: bool = static(default=False, kw_only=True)

    def __check_init__(self):
        if self.mask is None:
            raise ValueError("masked needs a mask (a pytree of bools or a function returning one).")

    def inner_view(self, tree, params):
        return mask_tree(tree, self._mask(params))

    def _mask(self, tree):
        """The mask for `tree`, checked: a prefix of its structure, booleans at the leaves."""
        mask = resolve_tree(self.mask, tree, "masked: the mask")
        for path, leaf in jax.tree_util.tree_flatten_with_path(mask)[0]:
            if not isinstance(leaf, (bool, np.bool_)):
                raise ValueError(
                    f"masked: the mask holds {leaf!r} (a {type(leaf).__name__}) at "
                    f"{jax.tree_util.keystr(path) or 'the root'}; a mask holds booleans (True: transformed). "
                    "To give parameters labels, use `partition` (`multi_transform`)."
                )
        return mask

    def init(self, params):
        if stands_in_for_params(params):
            return MaskedState(inner_state=self.inner.init(params))
        return MaskedState(inner_state=self.inner.init(self.inner_view(params, params)))

    def update(self, updates, state, params=None, **extra_args):
        mask = self._mask(updates)
        if self.mask_compatible_extra_args:
            structure = jax.tree_util.tree_structure(updates)
            extra_args = {
                k: mask_tree(v, mask) if jax.tree_util.tree_structure(v) == structure else v
                for k, v in extra_args.items()
            }
        inner_updates, inner_state = self.inner.update(
            mask_tree(updates, mask),
            state.inner_state,
            None if params is None else mask_tree(params, mask),
            **extra_args,
        )
        updates = jax.tree_util.tree_map(lambda m, new, old: new if m else old, mask, inner_updates, updates)
        return updates, MaskedState(inner_state=inner_state)


masked = Masked
