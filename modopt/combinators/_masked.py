"""Applying a transform to a subset of the parameters: `masked`."""

from __future__ import annotations

from .._core.base import AbstractTransform, AbstractWrapper, inner_transform
from .._core.fields import as_static_tree, static
from .._core.masking import MaskedNode as MaskedNode  # masked's state types, defined with its core
from .._core.masking import MaskedState as MaskedState
from .._core.masking import mask_tree, masked_init, masked_update, resolve_mask
from .._core.masks import MaskOrFn


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
        return mask_tree(tree, resolve_mask(self.mask, params))

    def init(self, params):
        return masked_init(self.inner, self.mask, params)

    def update(self, updates, state, params=None, **extra_args):
        return masked_update(
            self.inner, self.mask, updates, state, params, extra_args, self.mask_compatible_extra_args
        )


masked = Masked
