"""Different transforms for different groups of parameters: `partition`."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, NamedTuple

import equinox as eqx
import jax

from .._core.base import AbstractTransform, Part, as_transform
from .._core.fields import as_static_tree, resolve_tree, static
from .._core.masking import MaskedState, stands_in_for_params
from ._masked import Masked


class PartitionState(NamedTuple):
    """One (masked) inner state per group label."""

    inner_states: Mapping[Hashable, Any]


MultiTransformState = PartitionState
"""`PartitionState` under the name optax kept for `multi_transform`'s state."""


def _as_transform_dict(transforms: Mapping[Hashable, Any]) -> dict[Hashable, AbstractTransform]:
    return {label: as_transform(tx, f"partition transform {label!r}") for label, tx in transforms.items()}


class Partition(AbstractTransform):
    """Applies `transforms[label]` to the parameters labelled `label`.

    `param_labels` is a pytree of labels with the params' structure (or a prefix of it), or
    a function of the params returning one. Every label must have a transform.

    Args:
        transforms: a mapping from each label to its transform (modopt or optax).
        param_labels: a pytree of labels with the params' structure (or a prefix of it), or a
            function of the params returning one (static).
        mask_compatible_extra_args: give each transform the extra arguments of `update` that have
            the params' structure restricted to its own parameters (static).

    Example:
        >>> tx = modopt.partition({"adam": modopt.adam(1e-3), "frozen": modopt.set_to_zero()},
        ...                       {"w": "adam", "embedding": "frozen"})
    """

    transforms: dict[Hashable, AbstractTransform] = eqx.field(converter=_as_transform_dict)
    param_labels: Any = static(converter=as_static_tree)
    mask_compatible_extra_args: bool = static(default=False, kw_only=True)

    def _groups(self, tree) -> dict[Hashable, Masked]:
        labels = resolve_tree(self.param_labels, tree, "partition: the labels")
        used = set(jax.tree_util.tree_leaves(labels))
        missing = used - set(self.transforms)
        if missing:
            keys = {str(key): key for key in self.transforms}
            alike = [(label, keys[str(label)]) for label in missing if str(label) in keys]
            hint = "".join(
                f" The label {label!r} ({type(label).__name__}) and the transform key {key!r} "
                f"({type(key).__name__}) look alike but their types differ."
                for label, key in alike
            )
            raise ValueError(
                f"partition: the labels {sorted(map(repr, missing))} have no transform; "
                f"transforms are given for {sorted(map(repr, self.transforms))}.{hint}"
            )
        return {
            label: Masked(
                tx,
                jax.tree_util.tree_map(lambda lab, label=label: lab == label, labels),
                mask_compatible_extra_args=self.mask_compatible_extra_args,
            )
            for label, tx in self.transforms.items()
        }

    def init(self, params):
        if stands_in_for_params(params):  # no labels to resolve on `tree.map_params`' stand-in
            return PartitionState({label: MaskedState(tx.init(params)) for label, tx in self.transforms.items()})
        return PartitionState({label: g.init(params) for label, g in self._groups(params).items()})

    def state_specs(self, params, param_specs):
        return PartitionState({label: g.state_specs(params, param_specs) for label, g in self._groups(params).items()})

    def parts(self):
        return tuple(
            Part(f"[{label!r}]", tx, lambda state, label=label: state.inner_states[label].inner_state)
            for label, tx in self.transforms.items()
        )

    def update(self, updates, state, params=None, **extra_args):
        new_states = {}
        for label, group in self._groups(updates).items():
            updates, new_states[label] = group.update(updates, state.inner_states[label], params, **extra_args)
        return updates, PartitionState(new_states)


partition = Partition
multi_transform = Partition
