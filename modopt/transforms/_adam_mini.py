"""Adam-mini: Adam with one second-moment scalar per block of parameters (a leaf, a neuron, a head)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import resolve_tree
from .._state.moments import (
    bias_correction,
    init_state,
    state_dtype_for,
    store,
    update_dtype,
    widen,
    widened_update_moment,
)
from .._util.numerics import safe_increment
from .._core.specs import REPLICATED, padded
from .._util.trees import abs_sq
from .._core.fields import Scalar
from jax.typing import DTypeLike

PER_LEAF = "leaf"
PER_ELEMENT = "element"


@dataclasses.dataclass(frozen=True)
class AdamMiniHeads:
    """An Adam-mini block rule: one block per attention head, `num_heads` equal groups of
    consecutive indices along `axis` (for a query or key weight that holds its heads' rows one
    after the other, as `torch.nn.Linear(dim, dim).weight` and Equinox's `Linear` do).

    Where the heads are an axis of their own (Flax's `(features, heads, head_dim)` kernels), give
    that axis as an integer instead.

    Args:
        num_heads: the number of heads, >= 1; it must divide the parameter's size along `axis`.
        axis: the axis holding the heads one after the other (negative counts from the end).
    """

    num_heads: int
    axis: int = 0

    def __post_init__(self):
        if isinstance(self.num_heads, bool) or not isinstance(self.num_heads, int) or self.num_heads < 1:
            raise ValueError(f"Invalid num_heads: {self.num_heads!r} (must be an integer >= 1) in AdamMiniHeads.")
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise ValueError(f"Invalid axis: {self.axis!r} (must be an integer) in AdamMiniHeads.")


def _rule_error(rule: Any, path: str, shape: tuple[int, ...], why: str) -> ValueError:
    return ValueError(
        f"scale_by_adam_mini: the partition gives {rule!r} for the parameter at {path or 'the root'} of shape "
        f"{shape}: {why}. A block rule is 'leaf' (one second moment for the whole parameter), 'element' "
        "(Adam's, one per element), an integer axis (one per index along it: a neuron, a token, a head) or "
        "AdamMiniHeads(num_heads, axis)."
    )


def _checked_axis(rule: Any, axis: int, path: str, shape: tuple[int, ...]) -> int:
    if not -len(shape) <= axis < len(shape):
        raise _rule_error(rule, path, shape, f"axis {axis} is out of range for {len(shape)} dimensions")
    return axis % len(shape)


def _is_rule(rule: Any) -> bool:
    """Whether `rule` is of a block rule's kind (a shape may still not fit it)."""
    if isinstance(rule, str):
        return rule in (PER_LEAF, PER_ELEMENT)
    return isinstance(rule, AdamMiniHeads) or (isinstance(rule, int) and not isinstance(rule, bool))


def _check_rule(rule: Any, path: str, shape: tuple[int, ...]) -> None:
    """Raises a clear error unless `rule` is a block rule that fits a parameter of `shape`."""
    if isinstance(rule, str):
        if rule not in (PER_LEAF, PER_ELEMENT):
            raise _rule_error(rule, path, shape, "unknown rule")
    elif isinstance(rule, AdamMiniHeads):
        axis = _checked_axis(rule, rule.axis, path, shape)
        if shape[axis] % rule.num_heads:
            raise _rule_error(rule, path, shape, f"{rule.num_heads} heads do not divide {shape[axis]}")
    elif isinstance(rule, int) and not isinstance(rule, bool):
        _checked_axis(rule, rule, path, shape)
    else:
        raise _rule_error(rule, path, shape, "not a block rule")


def _kept_axis(rule: Any, ndim: int) -> int | None:
    """The axis whose indices (or heads) each get a second moment; `None` for 'leaf'/'element'."""
    if isinstance(rule, AdamMiniHeads):
        return rule.axis % ndim
    if isinstance(rule, int):
        return rule % ndim
    return None


def block_mean(rule: Any, x: jax.Array) -> jax.Array:
    """The mean of `x` over each block of `rule`: a scalar ('leaf'), `x` itself ('element'), or a
    vector along the kept axis (its length, or the number of heads)."""
    if rule == PER_ELEMENT:
        return x
    if rule == PER_LEAF:
        return jnp.mean(x)
    axis = _kept_axis(rule, x.ndim)
    if isinstance(rule, AdamMiniHeads):
        shape = x.shape[:axis] + (rule.num_heads, x.shape[axis] // rule.num_heads) + x.shape[axis + 1 :]
        x = x.reshape(shape)
    return jnp.mean(x, axis=tuple(a for a in range(x.ndim) if a != axis))


def _block_shape(rule: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of `block_mean(rule, x)` for `x` of `shape`."""
    if rule == PER_ELEMENT:
        return tuple(shape)
    if rule == PER_LEAF:
        return ()
    if isinstance(rule, AdamMiniHeads):
        return (rule.num_heads,)
    return (shape[rule % len(shape)],)


def block_broadcast(rule: Any, v: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """A per-block array from `block_mean`, shaped to broadcast against the parameter's `shape`."""
    axis = _kept_axis(rule, len(shape))
    if axis is None:
        return v
    if isinstance(rule, AdamMiniHeads):
        v = jnp.repeat(v, shape[axis] // rule.num_heads)
    return jnp.expand_dims(v, tuple(a for a in range(len(shape)) if a != axis))


def _block_spec(rule: Any, spec: PartitionSpec, ndim: int) -> PartitionSpec:
    if rule == PER_ELEMENT:
        return spec
    if isinstance(rule, int) and not isinstance(rule, bool):
        return PartitionSpec(padded(spec, ndim)[rule % ndim])  # the vector is split like its axis
    return REPLICATED  # a scalar, or one entry per head (few)


class ScaleByAdamMiniState(NamedTuple):
    """Adam-mini's step count, first moment, and second moment per block."""

    count: jax.Array  # int32 scalar
    mu: Any  # first moment, like the params (in `mu_dtype` if set)
    nu: Any  # per parameter: a scalar, a vector along the kept axis, or one entry per element (or `nu_dtype`)


class ScaleByAdamMini(AbstractTransform):
    r"""Rescales updates like Adam, with one second moment per block of parameters (Adam-mini).

    With `t` the step (from 1) and, for each block `B` of a parameter, `|B|` its size:
    `m = b1 m + (1 - b1) g`, `v_B = b2 v_B + (1 - b2) sum_{i in B} |g_i|^2 / |B|` and
    `update_i = m_hat_i / (sqrt(v_hat_B) + eps)` for `i` in `B`, with Adam's bias corrections
    `m_hat = m / (1 - b1^t)`, `v_hat = v / (1 - b2^t)`. The second moment costs one number per
    block instead of one per element, about half of Adam's state.

    The blocks of each parameter follow its rule in `partition` (a pytree of rules shaped like
    the parameters or a prefix of them, one rule for all, or a function of the params returning
    one; `None`: 'leaf' everywhere):

    - `"leaf"`: the whole parameter is one block (the reference code's rule for a parameter it
      does not recognize by name, and its rule for layer norms);
    - `"element"`: every element is a block: Adam (the reference code's rule for biases);
    - an integer `k`: one block per index along axis `k`: per output neuron (axis 0 of a
      PyTorch/Equinox `(out, in)` weight, axis -1 of a Flax `(in, out)` kernel), per token of an
      embedding, or per head where the heads are an axis;
    - `AdamMiniHeads(num_heads, axis=0)`: one block per head of a weight whose heads are
      consecutive groups along `axis`.

    The paper's partition for Transformers: embeddings and output layers per token, queries and
    keys per head, values, attention projections and MLPs per output neuron, norms per leaf.

    Checked against the reference package `adam_mini.Adam_mini` (1.1.1) in
    `tests/test_beyond_adam.py`, with the partition it picks by parameter names given as rules
    (`Adam_mini` reshapes queries and keys to `(-1, dim * dim / n_heads)`, that is
    `AdamMiniHeads(n_heads)`). Sharding: the first moment follows each parameter; a per-axis
    second moment follows the parameter's split of that axis; scalars and per-head vectors are
    replicated.

    Args:
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the block second moments (EMAs of mean squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        partition: each parameter's block rule (static): a rule for all, a pytree of rules shaped
            like the params (or a prefix), or a function of the params returning one; `None`:
            `"leaf"` for every parameter.
        nu_dtype: the dtype of the block second moments; `None` keeps the parameters' dtype.

    Example:
        >>> partition = {"embed": 0, "mlp": {"w": 0, "b": "element"}, "norm": "leaf"}
        >>> tx = modopt.chain(modopt.scale_by_adam_mini(partition=partition),
        ...                   modopt.scale_by_learning_rate(1e-3))

    Reference: Zhang et al., 2024, "Adam-mini: Use Fewer Learning Rates To Gain More",
    https://arxiv.org/abs/2406.16793
    """

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    mu_dtype: DTypeLike | None = fields.dtype()
    partition: Any = fields.mask()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        # A pytree of rules is checked here (shapes are checked when the parameters are known);
        # a function of the params is checked when it is called.
        if self.partition is None or callable(self.partition):
            return
        for path, rule in jax.tree_util.tree_flatten_with_path(self.partition.tree)[0]:
            if not _is_rule(rule):
                where = jax.tree_util.keystr(path) or "the root"
                raise ValueError(
                    f"Invalid partition: {rule!r} at {where} (must be 'leaf', 'element', an integer axis or "
                    "AdamMiniHeads(num_heads, axis)) in ScaleByAdamMini."
                )

    def acts_elementwise(self) -> bool:
        return self.partition is not None and _all_per_element(self.partition)

    def _rules(self, params: Any) -> list[Any]:
        """Each parameter leaf's block rule, checked against its shape, in leaf order."""
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        if self.partition is None:
            rules = [PER_LEAF] * len(flat)
        else:
            tree = resolve_tree(self.partition, params, "scale_by_adam_mini: the partition")
            rules = treedef.flatten_up_to(jax.tree_util.tree_map(lambda r, sub: jax.tree_util.tree_map(lambda _: r, sub), tree, params))
        for (path, leaf), rule in zip(flat, rules):
            _check_rule(rule, jax.tree_util.keystr(path), tuple(leaf.shape))
        return rules

    def init(self, params):
        rules = self._rules(params)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        nu = [
            jnp.zeros(_block_shape(rule, p.shape), state_dtype_for(self.nu_dtype, p.dtype))
            for rule, p in zip(rules, leaves)
        ]
        return ScaleByAdamMiniState(
            count=jnp.zeros([], jnp.int32), mu=init_state(params, self.mu_dtype), nu=treedef.unflatten(nu)
        )

    def update(self, updates, state, params=None, **extra_args):
        rules = self._rules(updates)
        g, treedef = jax.tree_util.tree_flatten(updates)
        squares = [block_mean(r, abs_sq(x)) for r, x in zip(rules, widen(g, self.nu_dtype))]
        nu = widened_update_moment(squares, treedef.flatten_up_to(state.nu), self.b2, 1, self.nu_dtype)
        mu = widened_update_moment(updates, state.mu, self.b1, 1, self.mu_dtype)
        count = safe_increment(state.count)
        mu_hat = treedef.flatten_up_to(bias_correction(mu, self.b1, count))
        rms = [jnp.sqrt(v) + self.eps for v in bias_correction(nu, self.b2, count)]
        # Each update in its gradient's dtype (promoted with the state dtypes that are set).
        new_updates = [
            (m / block_broadcast(r, d, x.shape)).astype(update_dtype(x.dtype, self.mu_dtype, self.nu_dtype))
            for r, m, d, x in zip(rules, mu_hat, rms, g)
        ]
        new_state = ScaleByAdamMiniState(
            count=count, mu=store(mu, self.mu_dtype), nu=store(treedef.unflatten(nu), self.nu_dtype, state.nu)
        )
        return treedef.unflatten(new_updates), new_state

    def state_specs(self, params, param_specs):
        rules = self._rules(params)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        specs = treedef.flatten_up_to(param_specs)
        nu = [_block_spec(rule, spec, len(p.shape)) for rule, spec, p in zip(rules, specs, leaves)]
        return ScaleByAdamMiniState(count=REPLICATED, mu=param_specs, nu=treedef.unflatten(nu))


def _all_per_element(partition: Any) -> bool:
    """Whether a (static) partition gives every parameter Adam's per-element rule."""
    if callable(partition):
        return False
    return all(rule == PER_ELEMENT for rule in jax.tree_util.tree_leaves(partition.tree))


scale_by_adam_mini = ScaleByAdamMini
