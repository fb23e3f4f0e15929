"""Path-aware checks of gradients and states, run at trace time before anything changes."""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .._util.trees import is_none
from .specs import Owned


def _children(tree: Any) -> list[tuple[str, Any]]:
    """The direct children of a pytree node, with their path suffixes."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)[0]
    return [(jax.tree_util.keystr(path), child) for path, child in flat]


def _node(tree: Any) -> Any:
    """The one-level structure of a pytree node (its type, keys and static data)."""
    return jax.tree_util.tree_structure(tree, is_leaf=lambda x: x is not tree)


def _first_difference(expected: Any, found: Any, path: str = "", leaf: str = "a single array") -> str | None:
    """A human description of where `found`'s structure first departs from `expected`'s.

    `leaf` names what a leaf of `expected` stands for in the message.
    """
    if _node(expected) != _node(found):
        return _describe(expected, found, path or "the root", leaf)
    if _node(expected).num_nodes == 1:  # a leaf (or an empty node)
        return None
    for (key, want), (_, got) in zip(_children(expected), _children(found)):
        difference = _first_difference(want, got, path + key, leaf)
        if difference:
            return difference
    return None


def prefix_difference(prefix: Any, full: Any, path: str = "") -> str | None:
    """Where `prefix` (a mask or labels tree, the structure of `full` or a prefix of it) first
    departs from `full`'s structure: `None` if it does not. A leaf of `prefix` stands for the
    whole subtree of `full` at its place."""
    if prefix is not None and jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(prefix)):
        return None
    if _node(prefix) != _node(full):
        return _describe(full, prefix, path or "the root", "one value for the parameter")
    for (key, part), (_, whole) in zip(_children(prefix), _children(full)):
        difference = prefix_difference(part, whole, path + key)
        if difference:
            return difference
    return None


def _describe(expected: Any, found: Any, where: str, leaf: str) -> str:
    if _node(expected).num_nodes == 1 and _node(expected).num_leaves == 1:
        return f"a {type(found).__name__} at {where}, where {leaf} is expected"
    if type(expected) is not type(found):
        return f"a {type(found).__name__} at {where}, where a {type(expected).__name__} is expected"
    if isinstance(expected, Mapping):  # dicts, and Flax's FrozenDict and nnx.State
        missing = sorted(map(repr, set(expected) - set(found)))
        extra = sorted(map(repr, set(found) - set(expected)))
        parts = [f"no entry for {', '.join(missing)}"] if missing else []
        parts += [f"unexpected entries {', '.join(extra)}"] if extra else []
        if parts:
            return f"{' and '.join(parts)} in the {type(found).__name__} at {where}"
    if isinstance(expected, (tuple, list)) and len(expected) != len(found):
        return f"{len(found)} entries in the {type(found).__name__} at {where}, where {len(expected)} are expected"
    if isinstance(expected, eqx.Module):
        for f in dataclasses.fields(expected):
            want, got = getattr(expected, f.name, None), getattr(found, f.name, None)
            if f.metadata.get("static", False) and want != got:
                return f"a {type(found).__name__} at {where} whose static field {f.name} is {got!r}, where {want!r} is expected"
    return f"a different {type(found).__name__} at {where}: expected {_node(expected)}, found {_node(found)}"


_KINDS = ((jnp.complexfloating, "complex"), (jnp.floating, "floating"), (jnp.integer, "integer"), (jnp.bool_, "bool"))


def _kind(dtype) -> str:
    return next((name for kind, name in _KINDS if jnp.issubdtype(dtype, kind)), str(dtype))


def align_gradients(
    model: Any,
    params: Any,
    grads: Any,
    per_example: bool = False,
    *,
    of: str = "the model",
    how: str = "`eqx.filter_grad` (or `jax.grad`) of a loss of this model",
    how_per_example: str = "`jax.vmap(eqx.filter_grad(loss), in_axes=(None, 0, 0))(model, x, y)`, `loss` taking one example",
) -> Any:
    """`grads` checked against `model`, restricted to its trainable leaves `params`.

    `params` is `model` with `None` at frozen leaves. Returns grads with exactly `params`'
    structure: `None` where a leaf is frozen or has no gradient. Raises `ValueError` naming
    the path of the first mismatch in structure, shape or dtype kind.

    With `per_example`, each gradient has exactly one axis more than its parameter, in front
    (the batch), of the same size for every leaf.

    The messages call `model` `of`, and say to compute the gradients with `how` (per example:
    `how_per_example`); the defaults speak of an Equinox model, the Flax adapters of theirs.
    """
    treedef = jax.tree_util.tree_structure(model)
    try:
        subtrees = treedef.flatten_up_to(grads)
    except (ValueError, TypeError):
        raise ValueError(
            f"The gradients do not have the structure of {of}: found {_first_difference(model, grads)}. "
            f"Compute them with {how}."
        ) from None
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(model)[0]]
    aligned, batch = [], None  # batch: (size, path) of the first per-example gradient
    for path, param, grad in zip(paths, treedef.flatten_up_to(params), subtrees):
        if param is None or grad is None:  # frozen, or no gradient: no change
            aligned.append(None)
            continue
        if not hasattr(grad, "shape") or not hasattr(grad, "dtype"):
            raise ValueError(f"The gradient at {path} is a {type(grad).__name__}, expected an array.")
        batched = grad.ndim == param.ndim + 1 and grad.shape[1:] == param.shape
        if per_example and not batched:
            raise ValueError(
                f"The gradient at {path} has shape {grad.shape}, but this optimizer takes per-example "
                f"gradients: the parameter's shape {param.shape} after one leading batch axis, "
                f"{_batched_shape(param.shape)}. Compute them with {how_per_example}."
            )
        if per_example and batch is not None and grad.shape[0] != batch[0]:
            raise ValueError(
                f"The per-example gradients disagree on the batch size: the gradient at {path} has shape "
                f"{grad.shape} (batch {grad.shape[0]}), the one at {batch[1]} has batch {batch[0]}."
            )
        if per_example and batch is None:
            batch = (grad.shape[0], path)
        if not per_example and grad.shape != param.shape:
            hint = (
                f" It looks like per-example gradients (a leading batch axis of size {grad.shape[0]}): only an "
                "optimizer that reduces them takes those (`dpsgd`, or a chain that starts with "
                "`differentially_private_aggregate`); otherwise take the gradient of the mean loss over the batch."
                if batched
                else ""
            )
            raise ValueError(
                f"The gradient at {path} has shape {grad.shape}, but the parameter has shape {param.shape}.{hint}"
            )
        if _kind(grad.dtype) != _kind(param.dtype) and not (
            _kind(param.dtype) == "complex" and _kind(grad.dtype) == "floating"
        ):
            raise ValueError(
                f"The gradient at {path} has dtype {grad.dtype} ({_kind(grad.dtype)}), but the "
                f"parameter has dtype {param.dtype} ({_kind(param.dtype)})."
            )
        wider = jnp.promote_types(param.dtype, jax.dtypes.canonicalize_dtype(grad.dtype))  # NumPy float64: float32 without x64
        if wider != param.dtype:
            raise ValueError(
                f"The gradient at {path} has dtype {grad.dtype}, wider than the parameter's {param.dtype}: the "
                f"update and the optimizer state would become {wider} after "
                "this step (with x64 on, float64 inputs to the loss give float64 gradients). Cast the loss's "
                f"inputs, or the gradients (`jax.tree.map(lambda g: g.astype(jnp.{param.dtype}), grads)`)."
            )
        aligned.append(grad)
    return treedef.unflatten(aligned)


def check_update_shapes(params: Any, updates: Any, owner: str) -> None:
    """Raises `ValueError` naming the first parameter whose update would change its shape.

    An update broadcasting to its parameter's shape (a scalar, as optax allows) passes; one of
    another shape (which would fail inside the sum, or broadcast the parameter to a larger
    shape) is an error naming the path. Structure mismatches are left to the caller.

    Args:
        params: the parameters (possibly with `None` leaves).
        updates: the updates, with the structure of `params`.
        owner: the function's name, for the message.
    """
    structure = jax.tree_util.tree_structure(params, is_leaf=is_none)
    try:
        update_leaves = structure.flatten_up_to(updates)
    except (ValueError, TypeError):
        return
    for i, (p, u) in enumerate(zip(structure.flatten_up_to(params), update_leaves)):
        if p is None or u is None:
            continue
        shape, found = jnp.shape(p), jnp.shape(u)
        if found == shape:
            continue
        try:
            fits = jnp.broadcast_shapes(shape, found) == shape
        except ValueError:
            fits = False
        if not fits:
            path = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_none)[0][i][0]
            raise ValueError(
                f"{owner}: the update at {jax.tree_util.keystr(path) or 'the root'} has shape {found}, but the "
                f"parameter has shape {shape}."
            )


def _batched_shape(shape: tuple[int, ...]) -> str:
    """`(batch_size, 3, 4)` for a parameter of shape `(3, 4)`; `(batch_size,)` for a scalar."""
    return f"({', '.join(['batch_size', *map(str, shape)])}{',' if not shape else ''})"


def check_state(transform: Any, state: Any, params: Any) -> None:
    """Raises `ValueError` naming the path where `state` differs from `transform.init(params)`.

    Compares structures, shapes and dtypes (by abstract evaluation: nothing is computed), so
    a state restored from elsewhere or made by another optimizer is caught before a step.

    Args:
        transform: the transform the state should belong to.
        state: the optimizer state to check.
        params: the parameters the state was made for.
    """
    expected = jax.eval_shape(transform.init, params)
    found_def = jax.tree_util.tree_structure(state, is_leaf=is_none)
    expected_def = jax.tree_util.tree_structure(expected, is_leaf=is_none)
    where = f"{type(transform).__name__}"
    if found_def != expected_def:
        raise ValueError(
            f"The optimizer state does not belong to this transform ({where}): found "
            f"{_first_difference(expected, state)}. Was it made by another optimizer's init?"
        )
    owned = None
    for i, ((path, want), got) in enumerate(
        zip(jax.tree_util.tree_flatten_with_path(expected)[0], jax.tree_util.tree_leaves(state))
    ):
        shape = jnp.shape(got)
        if shape != want.shape and shape[1:] == want.shape[1:] and shape and shape[0] > want.shape[0]:
            # A stack of the owner scheme stored with padding units (an `Optimizer` on a mesh).
            owned = _owned_leaves(transform, params, expected) if owned is None else owned
            shape = want.shape if owned[i] else shape
        if shape != want.shape or jnp.result_type(got) != want.dtype:
            raise ValueError(
                f"The optimizer state at {jax.tree_util.keystr(path)} has shape {jnp.shape(got)} and dtype "
                f"{jnp.result_type(got)}, but {where} expects {want.shape} {want.dtype}. "
                "Was it made by another optimizer's init, or for other parameters?"
            )


def _owned_leaves(transform: Any, params: Any, expected: Any) -> list[bool]:
    """Per leaf of the state `expected`, whether `transform`'s rule puts it on the owner scheme's
    owners (`OWNED`: a stack of units, which may be stored padded)."""
    try:
        specs = transform.state_specs(params, jax.tree_util.tree_map(lambda _: PartitionSpec(), params))
        rules = jax.tree_util.tree_structure(expected).flatten_up_to(specs)
    except Exception:  # noqa: BLE001 - a transform without a rule for these params has no stacks
        return [False] * len(jax.tree_util.tree_leaves(expected))
    return [isinstance(rule, Owned) for rule in rules]


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # modopt/, above this folder


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn` attributed to the first caller outside modopt, its integrations and equinox
    (whose bound methods sit between a user and modopt's methods)."""
    packages = [_PACKAGE, os.path.dirname(eqx.__file__)]
    integrations = sys.modules.get("modopt.integrations")
    if integrations is not None and getattr(integrations, "__file__", None):
        packages.append(os.path.dirname(integrations.__file__))
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(tuple(packages)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
