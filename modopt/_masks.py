"""`weight_decay_mask`: which leaves of an Equinox model weight decay applies to."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Iterable, Mapping, Optional, Union

import equinox as eqx
import jax

_NORMS = (eqx.nn.LayerNorm, eqx.nn.RMSNorm, eqx.nn.GroupNorm, eqx.nn.BatchNorm)

# Built as optax 0.2.8 builds its aliases, of the same members, so that they compare equal to
# optax's (`typing.Union` compares its members).
ArrayTree = Union[jax.typing.ArrayLike, Iterable["ArrayTree"], Mapping[Any, "ArrayTree"]]
MaskOrFn = Optional[Union[Any, Callable[[ArrayTree], Any]]]
"""The type of a `mask` argument: a pytree of bools shaped like (a prefix of) the params, a
function of the params returning one, or `None` for no mask."""


@dataclasses.dataclass(frozen=True)
class WeightDecayMask:
    """A mask function for `mask=` of `adamw`, `add_decayed_weights`, `lamb`...: `True` where
    weight decay applies.

    Decay is usual on weight matrices and kernels, not on biases or normalization scales.
    Called on a model (or its trainable parameters), it returns a tree of the same structure
    with `False` for:

    - a leaf whose own name (its attribute or dict key) is in `exclude`, by default `bias`;
    - every leaf inside a module of a type in `exclude_modules`, by default Equinox's
      `LayerNorm`, `RMSNorm`, `GroupNorm` and `BatchNorm`;
    - leaves that are not floating-point arrays (they are not trained);

    and `True` for every other floating-point array. Instances compare by value, so
    rebuilding an optimizer with an equal mask does not retrace a jitted step.

    Args:
        exclude: the leaf names (attribute names or dict keys) that get no weight decay.
        exclude_modules: the module types inside which no leaf gets weight decay (normalization
            layers by default).

    Example:
        >>> import equinox as eqx, jax, modopt
        >>> model = eqx.nn.Sequential([eqx.nn.Linear(2, 3, key=jax.random.key(0)), eqx.nn.LayerNorm(3)])
        >>> modopt.weight_decay_mask(model).layers[0].bias, modopt.weight_decay_mask(model).layers[0].weight
        (False, True)
        >>> optimizer = modopt.Optimizer(modopt.adamw(1e-3, mask=modopt.weight_decay_mask), model)
    """

    exclude: tuple[str, ...] = ("bias",)
    exclude_modules: tuple[type, ...] = _NORMS

    def __post_init__(self):
        for name, value in (("exclude", self.exclude), ("exclude_modules", self.exclude_modules)):
            if isinstance(value, (str, type)) or not isinstance(value, (tuple, list)):
                raise TypeError(f"WeightDecayMask: `{name}` takes a tuple, got {value!r}.")
            object.__setattr__(self, name, tuple(value))

    def __call__(self, model: Any) -> Any:
        excluded_module = lambda x: isinstance(x, self.exclude_modules)  # noqa: E731

        def decayed(path: tuple, leaf: Any) -> Any:
            if excluded_module(leaf):
                return jax.tree_util.tree_map(lambda _: False, leaf)
            named_out = bool(path) and _name(path[-1]) in self.exclude
            return eqx.is_inexact_array(leaf) and not named_out

        return jax.tree_util.tree_map_with_path(decayed, model, is_leaf=excluded_module)


def _name(key: Any) -> Any:
    """The name a path entry gives its leaf: an attribute's name, a dict key, an index."""
    for attribute in ("name", "key", "idx"):
        if hasattr(key, attribute):
            return getattr(key, attribute)
    return key


weight_decay_mask = WeightDecayMask()
"""The default `WeightDecayMask`: no weight decay on biases and on Equinox's normalization layers.

Pass it as the mask (`modopt.adamw(1e-3, mask=modopt.weight_decay_mask)`) or call it on a model
to see the mask; `WeightDecayMask(exclude=..., exclude_modules=...)` makes another.
"""
