"""8-bit optimizer state: `quantized_state` keeps an inner transform's moments block-wise quantized."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .._core.base import AbstractTransform, AbstractWrapper, inner_transform
from .._core.fields import choice, static
from .._state.quantization import QUANTIZATIONS, QuantizedArray, block_layout, quantize_blockwise
from .._core.specs import padded
from .._state.roles import moment_mask


class QuantizedInnerState(NamedTuple):
    """The state of `quantized_state`.

    inner_state: the wrapped transform's state, each moment of at least `min_size` elements
        replaced by a `QuantizedArray` (8-bit codes and per-block scales).
    """

    inner_state: Any


def is_quantized(x: Any) -> bool:
    """Whether `x` is a `QuantizedArray` (a leaf of a quantized state)."""
    return isinstance(x, QuantizedArray)


class QuantizedState(AbstractWrapper):
    """Keeps the moments of a transform in 8 bits per element: 8-bit Adam, Lion, momentum, ...

    The state leaves that hold *moments* (running averages or sums of the gradients kept per
    parameter element: Adam's `mu` and `nu`, a momentum trace, Adagrad's sum of squares,
    SOAP's moments in its eigenbasis, Kron's momentum) with at least `min_size` elements are
    stored block-wise quantized (`modopt.quantize_blockwise`): one byte per element and one
    float32 scale per block of `block_size` elements. Each `update` dequantizes the state,
    runs `inner.update` on it in the state's own dtype, and quantizes the new state. Adam's
    state then takes about 2.03 bytes per parameter instead of 8.

    Which state is a moment is decided by its role, never by its shape: each state type
    declares its moment fields (`modopt._state.roles.MOMENTS`, by name, for modopt's state
    types and optax's). Everything else is kept as it is: counters, keys, copies of the
    parameters or of a gradient, histories (L-BFGS), a preconditioner's statistics,
    eigenbases and factors (Shampoo, SOAP, Kron), reduced or factored moments (Adafactor's
    rows and columns), and small leaves (biases, norms: little memory, and sensitive). A
    transform that keeps no moment at all is refused at `init`, naming its state.

    A block holding a negative number is coded with a signed table, a block of numbers >= 0
    (a second moment) with an unsigned one of twice the resolution, as the 8-bit optimizers
    of bitsandbytes do for their first and second states; here the choice is made per block
    from the values, so any transform works without saying which of its states are signed.

    The update rule of `inner` is unchanged; only its state is rounded between steps (to
    the nearest of 256 values of its block's table, never stochastically), so a step is
    deterministic and a checkpoint resumes bit-exactly. A checkpoint records each quantized
    leaf's `block_size`, `quantization` and dtype, and `modopt.integrations.orbax` refuses to
    restore it into a state quantized otherwise (the codes mean nothing with other tables).

    Non-finite gradients: an `inf` or `NaN` in a gradient element makes that element's
    update NaN, as float32 Adam does, and nothing else: the element's moment is stored as the
    largest finite magnitude of its block (for `inf`, with its sign) or 0 (for `NaN`), and the
    rest of the block keeps its moments (bitsandbytes' scale would become `inf` and poison all
    of them). Wrap in `modopt.apply_if_finite` to skip such a step altogether.

    Sharding: the codes lie like the state leaf they replace (like its parameter, or on
    its owners for a stack of per-matrix state: SOAP's, Kron's). The
    scales keep the leaf's leading axes and their split, and hold the blocks along one
    unsplit last axis: blocks run along the flattened trailing axes, whose split by the
    parameter's rule may cut a block, so each device keeps every block scale of its rows
    (4 bytes per `block_size` elements of a row). ZeRO-1 (`zero_axis`) splits them too.

    Args:
        inner: the wrapped transform (a modopt or optax one), e.g. `modopt.adamw(1e-3)`.
        block_size: the number of elements sharing one scale, an integer >= 1 (static). Blocks
            run along the flattened trailing axes of each leaf (see
            `modopt.quantize_blockwise`); 256 is bitsandbytes' default.
        min_size: leaves with fewer elements stay unquantized, an integer >= 0 (static); 4096
            is bitsandbytes' `min_8bit_size`.
        quantization: the tables, "dynamic" (dynamic tree quantization, the 8-bit optimizers'
            table: about two significant digits for large and small values of a block alike)
            or "linear" (static). Linear tables round a second moment's small values to zero,
            whose steps then blow up: on the digits job linear 8-bit AdamW lost 15 to 26 points
            of accuracy where dynamic lost none; keep "linear" for states without small values.

    Example:
        >>> tx = modopt.quantized_state(modopt.adamw(1e-3, weight_decay=0.01))
        >>> optimizer = modopt.Optimizer(tx, model)   # 8-bit AdamW
        >>> model, optimizer = optimizer.step(model, grads)

    Reference: Dettmers, Lewis, Shleifer and Zettlemoyer, 2022, "8-bit Optimizers via
    Block-wise Quantization", https://arxiv.org/abs/2110.02861
    """

    inner: AbstractTransform = inner_transform()
    block_size: int = static(default=256)
    min_size: int = static(default=4096)
    quantization: str = choice("dynamic", QUANTIZATIONS)

    def __check_init__(self):
        for name, low in (("block_size", 1), ("min_size", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Invalid {name}: {value!r} (must be an integer >= {low}) in QuantizedState.")

    def init(self, params):
        inner_state = self.inner.init(params)
        nodes = jax.tree_util.tree_flatten_with_path(inner_state, is_leaf=is_quantized)[0]
        if stored := [path for path, node in nodes if is_quantized(node)]:
            raise ValueError(
                f"quantized_state: the state of {type(self.inner).__name__} is already in 8 bits (at "
                f"inner_state{jax.tree_util.keystr(stored[0])}): wrap a transform in `quantized_state` once."
            )
        moments = moment_mask(inner_state)
        flat = zip(jax.tree_util.tree_leaves(inner_state), jax.tree_util.tree_leaves(moments))
        if not any(moment and _is_real_array(leaf) for leaf, moment in flat):
            raise ValueError(
                f"quantized_state: {type(self.inner).__name__} keeps no moments (running averages of the gradients "
                f"per parameter element, such as Adam's mu and nu) to store in 8 bits; {_held(inner_state)}. "
                "Wrap the transforms that keep moments (e.g. `chain(quantized_state(adam(...)), ...)`), or drop "
                "`quantized_state`."
            )

        def quantize(leaf, moment):
            if not (moment and _is_real_array(leaf) and leaf.size >= max(self.min_size, 1)):
                return leaf
            return quantize_blockwise(leaf, self.block_size, self.quantization)

        return QuantizedInnerState(inner_state=jax.tree_util.tree_map(quantize, inner_state, moments))

    def update(self, updates, state, params=None, **extra_args):
        inner_state = dequantized(state.inner_state)
        new_updates, new_inner_state = self.inner.update(updates, inner_state, params, **extra_args)

        def requantize(old, new):
            if not is_quantized(old):
                return new
            return quantize_blockwise(new.astype(old.dtype), old.block_size, old.quantization)

        quantized = jax.tree_util.tree_map(requantize, state.inner_state, new_inner_state, is_leaf=is_quantized)
        return new_updates, QuantizedInnerState(inner_state=quantized)

    def state_specs(self, params, param_specs):
        # The inner rule places each leaf; a quantized leaf's codes lie as it does, and its
        # scales keep its leading axes' split (see the class docstring).
        abstract = jax.eval_shape(self.init, params).inner_state
        nodes, treedef = jax.tree_util.tree_flatten(abstract, is_leaf=is_quantized)
        specs = treedef.flatten_up_to(self.inner.state_specs(params, param_specs))
        placed = [_quantized_specs(node, spec) if is_quantized(node) else spec for node, spec in zip(nodes, specs)]
        return QuantizedInnerState(inner_state=treedef.unflatten(placed))


def _is_real_array(leaf: Any) -> bool:
    """A real floating array of at least one dimension (what a quantized leaf may be)."""
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating) and len(leaf.shape) >= 1


def _held(state: Any) -> str:
    """What a state without moments holds, for the error: its largest floating leaves, by path."""
    flat = [(path, x) for path, x in jax.tree_util.tree_flatten_with_path(state)[0] if _is_real_array(x)]
    if not flat:
        return "its state holds no floating array"
    flat.sort(key=lambda item: -item[1].size)
    shown = ", ".join(f"inner_state{jax.tree_util.keystr(p)} (shape {tuple(x.shape)})" for p, x in flat[:3])
    more = f" and {len(flat) - 3} more" if len(flat) > 3 else ""
    return f"its state holds {shown}{more}, none of them a moment"


def dequantized(tree: Any) -> Any:
    """`tree` with every `QuantizedArray` replaced by the array it stores.

    Args:
        tree: a pytree, e.g. the state of `quantized_state`.
    """
    return jax.tree_util.tree_map(lambda x: x.dequantize() if is_quantized(x) else x, tree, is_leaf=is_quantized)


def _quantized_specs(node: QuantizedArray, spec: Any) -> Any:
    """The specs of a `QuantizedArray` whose array lies as `spec`: the codes as `spec`, the
    scales as its leading axes (the axis of blocks unsplit)."""
    if not isinstance(spec, PartitionSpec):
        return jax.tree_util.tree_map(lambda _: spec, node)  # a `NoRule`: reported on both leaves
    lead, _ = block_layout(node.shape, node.block_size)
    scales = PartitionSpec(*padded(spec, len(node.shape))[: len(lead)], None)
    return jax.tree_util.tree_structure(node).unflatten([spec, scales])


quantized_state = QuantizedState
