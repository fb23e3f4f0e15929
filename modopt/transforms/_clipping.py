"""Clipping updates: element-wise, by global norm, by per-block RMS, unit-wise relative to
the parameters (AGC), and per example (for differential privacy)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import fields
from .._core.base import AbstractTransform, EmptyState, Updates, init_empty_state, require_params
from .._core.fields import NONNEGATIVE, POSITIVE, Check, hyperparameter, is_concrete, static
from .._util.numerics import abs_sq, global_norm
from .._util.trees import map_updates
from .._core.fields import Scalar


class Clip(AbstractTransform):
    """Clips each update element to `[-max_delta, max_delta]`.

    Args:
        max_delta: the largest magnitude an element keeps, >= 0.
    """

    elementwise_updates = True

    max_delta: Scalar = hyperparameter(check=NONNEGATIVE)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        clip = lambda g: jnp.clip(g, -self.max_delta, self.max_delta)  # noqa: E731
        return jax.tree_util.tree_map(clip, updates), state


class ClipByGlobalNorm(AbstractTransform):
    """Rescales all updates together so that their global L2 norm is at most `max_norm`.

    Args:
        max_norm: the largest global L2 norm, over all leaves together, that the updates keep, > 0.

    Reference: Pascanu et al., 2012, https://arxiv.org/abs/1211.5063
    """

    max_norm: Scalar = hyperparameter(check=POSITIVE)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        norm = global_norm(updates)
        within = norm < self.max_norm
        clip = lambda g: jax.lax.select(within, g, (g / norm.astype(g.dtype)) * self.max_norm)  # noqa: E731
        return jax.tree_util.tree_map(clip, updates), state


class ClipByBlockRms(AbstractTransform):
    """Divides each update leaf by `max(1, rms(leaf) / threshold)`.

    Args:
        threshold: the largest root mean square an update leaf keeps, > 0.

    Reference: Shazeer & Stern, 2018 (Adafactor), https://arxiv.org/abs/1804.04235
    """

    threshold: Scalar = hyperparameter(check=POSITIVE)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        def clip(u):
            return u / jnp.maximum(1.0, jnp.sqrt(jnp.mean(abs_sq(u))) / self.threshold)

        return jax.tree_util.tree_map(clip, updates), state


def _as_axis(axis: Any) -> Any:
    """An `axis` field as a hashable value: a list of axes becomes a tuple."""
    return tuple(axis) if isinstance(axis, list) else axis


class AdaptiveGradClip(AbstractTransform):
    r"""Clips updates unit-wise to at most `clipping` times the norm of their parameters.

    A unit is a slice of a leaf (see `axis`). With `G` and `W` the L2 norms of a unit of the
    update and of its parameter, `max_norm = clipping * max(W, eps)`, and the unit becomes
    `u * max_norm / G` where `G >= max_norm`; it is unchanged otherwise.

    `axis` are the axes a unit's norm is taken over. By default they follow common layouts:
    the whole leaf for scalars and vectors (any leaf with at most one axis longer than 1),
    axis 0 for rank 2 and 3 (dense and multi-head kernels, inputs first), axes (0, 1, 2) for
    rank 4 (HWIO convolutions) and (0, 1, 2, 3) for rank 5; other ranks need `axis`.

    Args:
        clipping: the largest ratio of a unit's update norm to its parameter norm, >= 0.
        eps: the floor of the parameter norm `W`, >= 0, so that zero-initialized units can still
            move.
        axis: the axes a unit's norm is taken over: an int, a tuple of ints, or `None` for the
            defaults by rank described above (static).

    Reference: Brock et al., 2021 (NFNets), https://arxiv.org/abs/2102.06171
    """

    clipping: Scalar = hyperparameter(check=NONNEGATIVE)
    eps: Scalar = fields.eps(1e-3)
    axis: int | tuple[int, ...] | None = static(default=None, converter=_as_axis)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        for path, p in jax.tree_util.tree_flatten_with_path(params)[0]:
            _unit_axes(jnp.shape(p), self.axis, jax.tree_util.keystr(path))

        def clip_units(g, p):
            g_norm, p_norm = unitwise_norm(g, self.axis), unitwise_norm(p, self.axis)
            return unitwise_clip(g_norm, self.clipping * jnp.maximum(p_norm, self.eps), g)

        return map_updates(clip_units, updates, params), state


def _unit_axes(shape: tuple[int, ...], axis: Any, where: str = "") -> Any:
    """The axes of a unit of a leaf of `shape` (`None`: all of them); see `AdaptiveGradClip`."""
    if axis is not None:
        for a in axis if isinstance(axis, tuple) else (axis,):
            if not -len(shape) <= a < len(shape):
                raise ValueError(
                    f"adaptive_grad_clip: axis {a} is out of range for the rank-{len(shape)} leaf {where} of "
                    f"shape {shape}; use `masked` to clip only the leaves `axis` fits."
                )
        return axis
    if sum(d != 1 for d in shape) <= 1:
        return None
    defaults = {2: (0,), 3: (0,), 4: (0, 1, 2), 5: (0, 1, 2, 3)}
    if len(shape) not in defaults:
        raise ValueError(
            f"adaptive_grad_clip has no default unit for the rank-{len(shape)} leaf {where} of "
            f"shape {shape}: pass `axis=` (the axes each unit's norm is taken over)."
        )
    return defaults[len(shape)]


def unitwise_norm(x: Any, axis: int | tuple[int, ...] | None = None) -> jax.Array:
    """The L2 norm of each unit of `x`, broadcast back to the shape of `x`.

    A unit is a slice of `x`: its norm is taken over `axis`. With `axis=None` the axes follow
    common layouts, as in `adaptive_grad_clip`: all of `x` for scalars and vectors (arrays with
    at most one axis longer than 1), axis 0 for rank 2 and 3 (dense and multi-head kernels,
    inputs first), axes (0, 1, 2) for rank 4 (HWIO convolutions) and (0, 1, 2, 3) for rank 5;
    other ranks need `axis`.

    Args:
        x: the array whose units are measured.
        axis: the axis or axes each unit's norm is taken over, or `None` for the defaults by rank.

    Returns:
        An array of the shape of `x` holding, at each element, the norm of its unit.

    Example:
        >>> modopt.unitwise_norm(jnp.array([[3.0, 1.0], [4.0, 0.0]]))
        Array([[5., 1.],
               [5., 1.]], dtype=float32)
    """
    x = jnp.asarray(x)
    squares = jnp.sum(abs_sq(x), axis=_unit_axes(jnp.shape(x), _as_axis(axis)), keepdims=True)
    return jnp.broadcast_to(jnp.sqrt(squares), jnp.shape(x))


def unitwise_clip(g_norm: Any, max_norm: Any, grad: Any, div_eps: Any = 1e-6) -> jax.Array:
    """Rescales each unit of `grad` whose norm `g_norm` is at least `max_norm` to that norm.

    `grad * max_norm / max(g_norm, div_eps)` where `g_norm >= max_norm`, `grad` elsewhere. The
    three arrays have the same shape: the norms are given element by element, as
    `unitwise_norm` returns them. `div_eps` only guards the division against a zero norm.

    Args:
        g_norm: the norm of each element's unit of `grad`.
        max_norm: the largest norm each element's unit keeps.
        grad: the array to clip.
        div_eps: the floor of `g_norm` in the division.

    Returns:
        The clipped array, of the shape of `grad`.

    Example:
        >>> g = jnp.array([3.0, 4.0])
        >>> modopt.unitwise_clip(modopt.unitwise_norm(g), jnp.full(2, 1.0), g)
        Array([0.6, 0.8], dtype=float32)
    """
    for name, value in (("max_norm", max_norm), ("grad", grad)):
        if jnp.shape(value) != jnp.shape(g_norm):
            raise ValueError(
                f"unitwise_clip: {name} has shape {jnp.shape(value)}, g_norm has shape {jnp.shape(g_norm)}; "
                "the three arrays must have the same shape (the norms broadcast as unitwise_norm returns them)."
            )
    clipped = grad * (max_norm / jnp.maximum(g_norm, div_eps))
    return jnp.where(g_norm < max_norm, grad, clipped)


def per_example_global_norm_clip(grads: Updates, l2_norm_clip: Scalar) -> tuple[Any, jax.Array]:
    """Clips each example's gradient to global L2 norm `l2_norm_clip`, then sums over examples.

    Every leaf of `grads` has the batch on axis 0 (per-example gradients, e.g. from
    `jax.vmap(jax.grad(loss))`). Example `i`'s gradient is multiplied by
    `min(1, l2_norm_clip / ||g_i||)`, its norm taken over all leaves together (a zero
    gradient is left as it is). This is a function, not a transform: it reduces the batch.

    Args:
        grads: per-example gradients: a pytree whose every leaf has the batch on axis 0.
        l2_norm_clip: the largest global L2 norm an example's gradient keeps, >= 0.

    Returns:
        `(sum of the clipped gradients, number of examples that were clipped)`; the sum has
        the structure of `grads` without the batch axis.

    Example:
        >>> grads = [jnp.array([[0.0, 0.0], [3.0, 4.0]])]
        >>> modopt.per_example_global_norm_clip(grads, 1.0)
        ([Array([0.6, 0.8], dtype=float32)], Array(1, dtype=int32))

    Reference: Abadi et al., 2016, https://arxiv.org/abs/1607.00133
    """
    _check_batched(grads, "per_example_global_norm_clip")
    _check_number(l2_norm_clip, "l2_norm_clip", NONNEGATIVE, "per_example_global_norm_clip")
    norms = jax.vmap(global_norm)(grads)
    multipliers = jnp.nan_to_num(jnp.minimum(l2_norm_clip / norms, 1.0), nan=1.0)
    clipped_sum = jax.tree_util.tree_map(lambda g: jnp.tensordot(multipliers, g, axes=1), grads)
    return clipped_sum, jnp.sum(multipliers < 1.0)


def per_example_layer_norm_clip(
    grads: Updates, global_l2_norm_clip: Any, uniform: bool = True
) -> tuple[Any, Any]:
    """Clips each example's gradient layer by layer, then sums over examples.

    Like `per_example_global_norm_clip` applied to each leaf (layer) of `grads` on its own,
    with a budget per layer: with `C = global_l2_norm_clip` and `K` leaves, `C / sqrt(K)`
    each when `uniform`, else `C * sqrt(D_k / D)` for a layer of `D_k` of the model's `D`
    parameters. Either way the clipped example's global norm is at most `C`.

    Args:
        grads: per-example gradients: a pytree whose every leaf has the batch on axis 0.
        global_l2_norm_clip: `C`, the bound of a clipped example's global L2 norm, >= 0.
        uniform: give every layer the same budget `C / sqrt(K)`; `False` gives each a budget
            proportional to the root of its size.

    Returns:
        `(sum of the clipped gradients, number of examples clipped)`, each a tree with the
        structure of `grads`: the counts are per layer.

    Reference: McMahan et al., 2017, https://arxiv.org/abs/1710.06963
    """
    _check_batched(grads, "per_example_layer_norm_clip")
    _check_number(global_l2_norm_clip, "global_l2_norm_clip", NONNEGATIVE, "per_example_layer_norm_clip")
    leaves, treedef = jax.tree_util.tree_flatten(grads)
    if uniform:
        shares = [1.0 / len(leaves)] * len(leaves)
    else:
        sizes = [np.prod(g.shape[1:], dtype=int) for g in leaves]
        shares = [size / sum(sizes) for size in sizes]
    results = [
        per_example_global_norm_clip(g, global_l2_norm_clip * share**0.5) for g, share in zip(leaves, shares)
    ]
    return treedef.unflatten([s for s, _ in results]), treedef.unflatten([n for _, n in results])


def _check_batched(grads: Any, where: str) -> None:
    """Every leaf has a leading batch axis, of the same size for all (the most common one)."""
    flat = jax.tree_util.tree_flatten_with_path(grads)[0]
    if not flat:
        raise ValueError(f"{where} got no gradients (an empty tree).")
    sizes = [jnp.shape(g)[0] for _, g in flat if jnp.ndim(g) >= 1]
    batch = max(set(sizes), key=sizes.count) if sizes else None
    for path, g in flat:
        if jnp.ndim(g) < 1 or jnp.shape(g)[0] != batch:
            shapes = {jax.tree_util.keystr(p): jnp.shape(x) for p, x in flat}
            raise ValueError(
                f"{where} expects per-example gradients, every leaf with the batch on axis 0 (batch "
                f"size {batch}); the leaf at {jax.tree_util.keystr(path) or 'the root'} has shape "
                f"{jnp.shape(g)}. Shapes: {shapes}."
            )


def _check_number(value: Any, name: str, check: Check, where: str) -> None:
    """A concrete argument of a function checked like a transform's hyperparameter."""
    if is_concrete(value) and not check.predicate(np.asarray(value)):
        raise ValueError(f"Invalid {name}: {np.asarray(value)} (must be {check.description}) in {where}.")


clip = Clip
clip_by_global_norm = ClipByGlobalNorm
clip_by_block_rms = ClipByBlockRms
adaptive_grad_clip = AdaptiveGradClip

# The states of the stateless clipping transforms, named as in optax.
ClipState = EmptyState
ClipByGlobalNormState = EmptyState
AdaptiveGradClipState = EmptyState
