"""Complex parameters seen by a real transform as pairs of real arrays: `split_real_and_imaginary`."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, AbstractWrapper, inner_transform
from .._core.declared import adapt_to_params, declared_extra_args


class RealAndImaginary(NamedTuple):
    """The two real arrays a complex array is split into: `real + 1j * imaginary`."""

    real: Any
    imaginary: Any


class SplitRealAndImaginaryState(NamedTuple):
    """The state of `split_real_and_imaginary`: the inner transform's state, built on the split
    parameters (a complex leaf's moments are a `RealAndImaginary` pair)."""

    inner_state: Any


def _is_complex(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating)


def _split_leaf(x: Any) -> Any:
    """A complex array (or abstract array) as its real pair; anything else as it is."""
    if not _is_complex(x):
        return x
    if isinstance(x, jax.ShapeDtypeStruct):
        part = jax.ShapeDtypeStruct(x.shape, jnp.finfo(x.dtype).dtype, sharding=x.sharding)
        return RealAndImaginary(part, part)
    return RealAndImaginary(jnp.real(x), jnp.imag(x))


def _merge_leaf(x: Any) -> Any:
    """A real pair as the complex array it stands for; anything else as it is."""
    if not isinstance(x, RealAndImaginary):
        return x
    real, imaginary = jnp.asarray(x.real), jnp.asarray(x.imaginary)
    dtype = jnp.promote_types(jnp.promote_types(real.dtype, imaginary.dtype), jnp.float32)
    return jax.lax.complex(real.astype(dtype), imaginary.astype(dtype))


def split(tree: Any) -> Any:
    """Every complex leaf of `tree` as a `RealAndImaginary` pair of real arrays."""
    return jax.tree_util.tree_map(_split_leaf, tree)


def merge(tree: Any) -> Any:
    """The inverse of `split`: every `RealAndImaginary` pair as one complex array."""
    return jax.tree_util.tree_map(_merge_leaf, tree, is_leaf=lambda x: isinstance(x, RealAndImaginary))


class SplitRealAndImaginary(AbstractWrapper):
    """Runs a transform on the real and imaginary parts of complex parameters, as real arrays.

    Each complex leaf `z` of the updates and parameters is given to `inner` as the pair of
    real arrays `RealAndImaginary(z.real, z.imag)`; the pair of updates `inner` returns for
    it is merged back into one complex update `u_re + 1j * u_im`. Real leaves pass through to
    `inner` unchanged. So `inner` treats the two parts as independent real parameters: an
    adaptive method (Adam) keeps separate second moments for them, instead of one for `|z|**2`
    as it does on complex arrays directly.

    Extra arguments reach `inner`: a function of the parameters (`value_fn`) is called with
    the complex parameters merged back, and a tree like the parameters (`grad`) is split.

    Args:
        inner: the transform of the real parts (a modopt or optax transform).

    Example:
        >>> tx = modopt.experimental.split_real_and_imaginary(modopt.adam(1e-3))
        >>> params = {"w": jnp.ones(3, jnp.complex64)}
        >>> state = tx.init(params)
        >>> updates, state = tx.update(grads, state, params)
    """

    inner: AbstractTransform = inner_transform()

    def __init__(self, inner: Any):
        self.inner = inner

    def inner_view(self, tree, params):
        # Split where the parameter is complex, also for trees of PartitionSpecs.
        leaves, treedef = jax.tree_util.tree_flatten(params)
        parts = treedef.flatten_up_to(tree)
        return treedef.unflatten([_pair_like(part, leaf) for part, leaf in zip(parts, leaves)])

    def init(self, params):
        return SplitRealAndImaginaryState(inner_state=self.inner.init(split(params)))

    def update(self, updates, state, params=None, **extra_args):
        inner_args = self._inner_extra_args(extra_args)
        split_params = None if params is None else split(params)
        inner_updates, inner_state = self.inner.update(
            split(updates), state.inner_state, split_params, **inner_args
        )
        return merge(inner_updates), SplitRealAndImaginaryState(inner_state=inner_state)

    def _inner_extra_args(self, extra_args):
        """The extra arguments as `inner` needs them for the split parameters."""
        return adapt_to_params(declared_extra_args(self.inner), extra_args, merge, split)


def _pair_like(part: Any, param: Any) -> Any:
    """What `inner` sees of `part`, the entry for `param` of a tree laid out like the
    parameters: split if it is complex (the parameter itself), else a pair of it (a
    PartitionSpec) where the parameter is complex."""
    if _is_complex(part):
        return _split_leaf(part)
    return RealAndImaginary(part, part) if _is_complex(param) else part


split_real_and_imaginary = SplitRealAndImaginary
