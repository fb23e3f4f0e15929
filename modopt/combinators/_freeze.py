"""Freezing parameters: `freeze` and `selective_transform`."""

from __future__ import annotations

import functools
from typing import Any

import jax

from .._core.base import AbstractComposite, AbstractTransform, inner_transform
from .._core.fields import as_static_tree, resolve_tree, static
from ..transforms._stateless import SetToZero
from ._masked import Masked
from ._partition import Partition
from .._core.masks import MaskOrFn

TRAIN, FREEZE = "train", "freeze"  # the group labels of `selective_transform`, as in optax


def _check_mask(mask: Any, where: str) -> None:
    if mask is None:
        raise ValueError(
            f"{where} needs a mask: True (or a pytree of bools shaped like a prefix of the params, "
            "True where frozen), or a function of the params returning one."
        )


class Freeze(AbstractComposite):
    """Zeroes the updates of the parameters where `mask` is `True`, so they stay fixed.

    `mask` is one bool for all the parameters, a pytree of bools whose structure is a prefix
    of the params' (`True`: frozen), or a function of the params returning one. It is static:
    it decides the structure of the computation. The other updates pass through unchanged.
    The state is that of `masked(set_to_zero(), mask)`, which it is.

    Frozen parameters still get a state in the transforms chained before `freeze`; to give
    them none, use `selective_transform`.

    Args:
        mask: `True` where frozen: one bool, a pytree of bools whose structure is a prefix of the
            params', or a function of the params returning one (static).

    Example:
        >>> tx = modopt.chain(modopt.adam(1e-3), modopt.freeze({"embedding": True, "head": False}))
    """

    mask: MaskOrFn = static(converter=as_static_tree)

    def __check_init__(self):
        _check_mask(self.mask, "freeze")

    def build(self) -> AbstractTransform:
        return Masked(SetToZero(), self.mask)


def _labels(mask: Any) -> Any:
    return jax.tree_util.tree_map(lambda frozen: FREEZE if frozen else TRAIN, mask)


def _labels_of(mask_fn: Any, params: Any) -> Any:
    return _labels(resolve_tree(mask_fn, params))


class SelectiveTransform(AbstractComposite):
    """Runs `optimizer` on the parameters that `freeze_mask` leaves trainable; zeroes the rest.

    `freeze_mask` is `True` where frozen: one bool for all the parameters, a pytree of bools
    whose structure is a prefix of the params', or a function of the params returning one
    (static, like every mask). Unlike `chain(optimizer, freeze(mask))`, the frozen
    parameters get no state in `optimizer` (no moments for a frozen embedding).

    It is `partition({"train": optimizer, "freeze": set_to_zero()}, labels)` with the labels
    read off the mask, and has that state.

    Args:
        optimizer: the transform run on the trainable parameters (a modopt or optax transform).
        freeze_mask: `True` where frozen: one bool, a pytree of bools whose structure is a prefix of
            the params', or a function of the params returning one (static).

    Example:
        >>> tx = modopt.selective_transform(modopt.adam(1e-3), freeze_mask={"embedding": True, "head": False})
    """

    optimizer: AbstractTransform = inner_transform()
    freeze_mask: MaskOrFn = static(converter=as_static_tree, kw_only=True)

    def __check_init__(self):
        _check_mask(self.freeze_mask, "selective_transform")

    def build(self) -> AbstractTransform:
        if callable(self.freeze_mask):
            labels = functools.partial(_labels_of, self.freeze_mask)
        else:
            labels = _labels(resolve_tree(self.freeze_mask, None))
        return Partition({TRAIN: self.optimizer, FREEZE: SetToZero()}, labels)


freeze = Freeze
selective_transform = SelectiveTransform
