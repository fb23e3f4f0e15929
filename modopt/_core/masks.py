"""`weight_decay_mask`: which leaves of a model weight decay applies to."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any, Iterable, Mapping, Optional, Union

import equinox as eqx
import jax

_EQUINOX_NORMS = (eqx.nn.LayerNorm, eqx.nn.RMSNorm, eqx.nn.GroupNorm, eqx.nn.BatchNorm)
# The normalization layers of `flax.nnx`, looked up only where Flax is already imported: a model
# holding one has imported it, and `import modopt` must not import Flax.
_FLAX_NNX_NORMS = ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm", "InstanceNorm")

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

    Decay is usual on weight matrices, kernels and embeddings, not on biases or on the scales
    of normalization layers. Called on a model or its trainable parameters (an Equinox model,
    a Flax NNX module or state, Flax linen's params dict, any pytree), it returns a tree of the
    same structure with `False` for:

    - a leaf whose own name (its attribute or dict key) is in `exclude`: by default `bias`
      and `scale`. Flax's normalization layers (NNX's and linen's `LayerNorm`, `RMSNorm`,
      `GroupNorm`, `BatchNorm`, `InstanceNorm`) hold exactly their `scale` and `bias`, so
      they are excluded this way wherever their types are gone: in the pure `nnx.State` an
      `NnxOptimizer` gives its transform, and in linen's nested params dicts
      (`{"LayerNorm_0": {"scale": ..., "bias": ...}}`). Any other leaf named so is excluded
      too (a weight-normalization `scale`, a custom gain);
    - every leaf inside a module of a type in `exclude_modules`, by default the normalization
      layers: Equinox's `LayerNorm`, `RMSNorm`, `GroupNorm` and `BatchNorm` (whose leaves are
      named `weight` and `bias`), and Flax NNX's `LayerNorm`, `RMSNorm`, `GroupNorm`,
      `BatchNorm` and `InstanceNorm` where the mask sees the modules themselves;
    - leaves that are not floating-point arrays (they are not trained);

    and `True` for every other floating-point array. Inside an NNX variable (`nnx.Param`) the
    name is the variable's (`scale`), not its `value`. Instances compare by value, so
    rebuilding an optimizer with an equal mask does not retrace a jitted step.

    Args:
        exclude: the leaf names (attribute names or dict keys) that get no weight decay.
        exclude_modules: the module types inside which no leaf gets weight decay; `None` (the
            default) for the normalization layers above.

    Example:
        >>> import equinox as eqx, jax, jax.numpy as jnp, modopt
        >>> model = eqx.nn.Sequential([eqx.nn.Linear(2, 3, key=jax.random.key(0)), eqx.nn.LayerNorm(3)])
        >>> modopt.weight_decay_mask(model).layers[0].bias, modopt.weight_decay_mask(model).layers[0].weight
        (False, True)
        >>> modopt.weight_decay_mask({"Dense_0": {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)},
        ...                           "LayerNorm_0": {"scale": jnp.ones(3), "bias": jnp.ones(3)}})
        {'Dense_0': {'bias': False, 'kernel': True}, 'LayerNorm_0': {'bias': False, 'scale': False}}
        >>> optimizer = modopt.Optimizer(modopt.adamw(1e-3, mask=modopt.weight_decay_mask), model)
    """

    exclude: tuple[str, ...] = ("bias", "scale")
    exclude_modules: Optional[tuple[type, ...]] = None

    def __post_init__(self):
        for name, value in (("exclude", self.exclude), ("exclude_modules", self.exclude_modules)):
            if value is None and name == "exclude_modules":
                continue
            if isinstance(value, (str, type)) or not isinstance(value, (tuple, list)):
                raise TypeError(f"WeightDecayMask: `{name}` takes a tuple, got {value!r}.")
            object.__setattr__(self, name, tuple(value))

    def __call__(self, model: Any) -> Any:
        modules = _normalization_layers() if self.exclude_modules is None else self.exclude_modules
        variable = _flax_variable_type()
        excluded_module = lambda x: isinstance(x, modules)  # noqa: E731
        stop = lambda x: excluded_module(x) or isinstance(x, variable)  # noqa: E731

        def decayed(path: tuple, leaf: Any) -> Any:
            if excluded_module(leaf):
                return jax.tree_util.tree_map(lambda _: False, leaf)
            named_out = bool(path) and _name(path[-1]) in self.exclude
            if isinstance(leaf, variable):  # an NNX variable: named by its attribute, not its `value`
                return jax.tree_util.tree_map(lambda x: eqx.is_inexact_array(x) and not named_out, leaf)
            return eqx.is_inexact_array(leaf) and not named_out

        return jax.tree_util.tree_map_with_path(decayed, model, is_leaf=stop)


def _normalization_layers() -> tuple[type, ...]:
    """Equinox's normalization layers, and Flax NNX's where Flax is imported."""
    nnx = sys.modules.get("flax.nnx")
    flax_norms = tuple(getattr(nnx, name) for name in _FLAX_NNX_NORMS if hasattr(nnx, name)) if nnx else ()
    return _EQUINOX_NORMS + flax_norms


def _flax_variable_type() -> tuple[type, ...]:
    """`(flax.nnx.Variable,)` where Flax is imported, else `()` (nothing is an instance of it)."""
    nnx = sys.modules.get("flax.nnx")
    variable = getattr(nnx, "Variable", None) if nnx else None
    return (variable,) if isinstance(variable, type) else ()


def _name(key: Any) -> Any:
    """The name a path entry gives its leaf: an attribute's name, a dict key, an index."""
    for attribute in ("name", "key", "idx"):
        if hasattr(key, attribute):
            return getattr(key, attribute)
    return key


weight_decay_mask = WeightDecayMask()
"""The default `WeightDecayMask`: no weight decay on biases, on leaves named `scale`, and on the
normalization layers of Equinox and Flax (see `WeightDecayMask` for exactly what it excludes).

Pass it as the mask (`modopt.adamw(1e-3, mask=modopt.weight_decay_mask)`) or call it on a model
to see the mask; `WeightDecayMask(exclude=..., exclude_modules=...)` makes another.
"""
