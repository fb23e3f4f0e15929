"""Running a transform on one flat vector of all the parameters: `flatten`."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding

from .._core.base import AbstractTransform, Part, inner_transform
from .._core.declared import declared_extra_args
from .._core.specs import REPLICATED


def _leaves(tree: Any, what: str) -> tuple[list[Any], Any]:
    """The array leaves of `tree` (`None` entries skipped) and its structure."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        raise ValueError(f"flatten: the {what} have no array leaves, so there is nothing to flatten.")
    return leaves, treedef


def _explicit_sharding(x: Any) -> NamedSharding | None:
    """The sharding of `x` where its type carries a split on Explicit mesh axes, else `None`.

    On Explicit axes, JAX types every array's sharding and refuses to reshape a split array
    without being told the result's layout: such arrays are gathered before they are raveled,
    and the pieces cut from the flat vector are split again like the leaves they stand for.
    """
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty or AxisType.Explicit not in mesh.axis_types:
        return None
    return sharding if any(entry is not None for entry in sharding.spec) else None


def _replicated(x: jax.Array) -> jax.Array:
    sharding = _explicit_sharding(x)
    return x if sharding is None else jax.sharding.reshard(x, NamedSharding(sharding.mesh, REPLICATED))


def ravel(tree: Any, what: str = "parameters") -> jax.Array:
    """Every leaf of `tree` raveled, in leaf order, and concatenated into one vector.

    Leaves of different dtypes are promoted to a common one, as `jnp.concatenate` does.
    """
    leaves, _ = _leaves(tree, what)
    return jnp.concatenate([jnp.reshape(_replicated(leaf), (-1,)) for leaf in leaves])


def unravel(flat: jax.Array, like: Any) -> Any:
    """The inverse of `ravel`: `flat` cut into pieces shaped (and typed) like the leaves of `like`."""
    leaves, treedef = _leaves(like, "updates")
    sizes = [math.prod(jnp.shape(leaf)) for leaf in leaves]
    if jnp.shape(flat) != (sum(sizes),):
        raise ValueError(
            f"flatten: the inner transform returned updates of shape {jnp.shape(flat)} for a flat vector "
            f"of {sum(sizes)} parameters; it must keep the shape of its updates."
        )
    flat = _replicated(flat)
    pieces, start = [], 0
    for leaf, size in zip(leaves, sizes):
        piece = jnp.reshape(flat[start : start + size], jnp.shape(leaf)).astype(jnp.result_type(leaf))
        sharding = _explicit_sharding(leaf)
        pieces.append(piece if sharding is None else jax.sharding.reshard(piece, sharding))
        start += size
    return treedef.unflatten(pieces)


class Flatten(AbstractTransform):
    """Runs `inner` on a single vector holding every parameter, instead of leaf by leaf.

    Parameters and updates are raveled and concatenated (in the pytree's leaf order) before
    they reach `inner`, and its output is cut back into the original leaves. Many small leaves
    then cost one fused computation instead of one per leaf, at the price of a copy of the
    updates. The state is `inner`'s state for that flat vector, exactly as `inner.init` makes
    it (no wrapper around it), so it has the same layout as optax's `flatten`.

    Updates come back in the dtype of each incoming update: a tree that mixes dtypes is
    promoted to a common one for `inner`, then cast back leaf by leaf.

    Extra arguments reach `inner`. Those `inner` declares as functions of the parameters
    (`value_fn`) are adapted to take the flat vector, and those it declares as trees like the
    parameters (`grad`) are flattened too; others pass as they are.

    Sharding: the flat state is replicated. Its elements do not line up with any parameter's
    shards, the rule is derived without the mesh's axis sizes, and the length (a sum of leaf
    sizes, odd as soon as one bias or scalar is) is rarely divisible by them. With
    `zero_axis=`, ZeRO-1 still splits it over that axis where the length allows.

    Args:
        inner: the transform to run on the flat vector (a modopt or optax transform).

    Example:
        >>> tx = modopt.flatten(modopt.adam(1e-3))
        >>> state = tx.init({"w": jnp.ones((2, 3)), "b": jnp.zeros(3)})  # mu, nu of shape (9,)
    """

    inner: AbstractTransform = inner_transform()

    def init(self, params):
        return self.inner.init(ravel(params))

    def update(self, updates, state, params=None, **extra_args):
        if extra_args:
            extra_args = self._flat_extra_args(extra_args, params)
        flat_params = None if params is None else ravel(params)
        flat_updates, state = self.inner.update(ravel(updates, "updates"), state, flat_params, **extra_args)
        return unravel(flat_updates, updates), state

    def _flat_extra_args(self, extra_args: dict[str, Any], params: Any) -> dict[str, Any]:
        declared = declared_extra_args(self.inner).args
        adapted = dict(extra_args)
        for name, value in extra_args.items():
            if name not in declared:
                continue
            spec = declared[name][0]
            if spec.of_params and callable(value):
                if params is None:
                    raise ValueError(
                        f"flatten: the extra argument `{name}` is a function of the parameters; pass the "
                        "parameters to `update` so it can be called on the flat vector."
                    )
                adapted[name] = lambda flat, *args, fn=value, **kwargs: fn(
                    unravel(flat, params), *args, **kwargs
                )
            elif spec.like_params and value is not None:
                adapted[name] = ravel(value, f"extra argument `{name}`")
        return adapted

    def state_specs(self, params, param_specs):
        # See the class docstring: the flat vector is replicated (ZeRO-1 may split it).
        flat = jax.eval_shape(ravel, params)
        return self.inner.state_specs(flat, REPLICATED)

    def parts(self):
        # The state is the inner state itself (learning rates, injected hyperparameters and
        # skipped steps are found there).
        return (Part("", self.inner, _whole),)


def _whole(state: Any) -> Any:
    return state


flatten = Flatten
