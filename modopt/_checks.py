"""Path-aware checks of gradients and states, run at trace time before anything changes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

_is_none = lambda x: x is None  # noqa: E731


def _paths(tree: Any) -> list[str]:
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_none)[0]
    return [jax.tree_util.keystr(path) for path, _ in leaves]


def _first_difference(expected: Any, found: Any) -> str:
    """A human description of where two pytree structures first differ."""
    want, got = _paths(expected), _paths(found)
    missing = [p for p in want if p not in set(got)]
    extra = [p for p in got if p not in set(want)]
    if missing:
        return f"nothing at {missing[0] or '<root>'} (expected a leaf there)"
    if extra:
        return f"an unexpected entry at {extra[0] or '<root>'}"
    expected_def = jax.tree_util.tree_structure(expected, is_leaf=_is_none)
    found_def = jax.tree_util.tree_structure(found, is_leaf=_is_none)
    return f"a different structure: expected {expected_def}, found {found_def}"


def _kind(dtype) -> str:
    for kind in (jnp.complexfloating, jnp.floating, jnp.integer, jnp.bool_):
        if jnp.issubdtype(dtype, kind):
            return {jnp.complexfloating: "complex", jnp.floating: "floating", jnp.integer: "integer"}.get(kind, "bool")
    return str(dtype)


def align_gradients(params: Any, grads: Any) -> Any:
    """`grads` checked against `params` (the trainable leaves, `None` elsewhere).

    Returns grads with exactly `params`' structure: `None` where a leaf is frozen or has no
    gradient. Raises `ValueError` naming the path of the first mismatch in structure, shape
    or dtype kind.
    """
    treedef = jax.tree_util.tree_structure(params)
    try:
        subtrees = treedef.flatten_up_to(grads)
    except (ValueError, TypeError):
        raise ValueError(
            f"The gradients do not have the structure of the model: found {_first_difference(params, grads)}. "
            "Compute them with `eqx.filter_grad` (or `jax.grad`) of a loss of this model."
        ) from None
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    aligned = []
    for path, param, grad in zip(paths, treedef.flatten_up_to(params), subtrees):
        if grad is None:
            aligned.append(None)
            continue
        if not hasattr(grad, "shape") or not hasattr(grad, "dtype"):
            raise ValueError(f"The gradient at {path} is a {type(grad).__name__}, expected an array.")
        if grad.shape != param.shape:
            raise ValueError(
                f"The gradient at {path} has shape {grad.shape}, but the parameter has shape {param.shape}."
            )
        if _kind(grad.dtype) != _kind(param.dtype) and not (
            _kind(param.dtype) == "complex" and _kind(grad.dtype) == "floating"
        ):
            raise ValueError(
                f"The gradient at {path} has dtype {grad.dtype} ({_kind(grad.dtype)}), but the "
                f"parameter has dtype {param.dtype} ({_kind(param.dtype)})."
            )
        aligned.append(grad)
    return treedef.unflatten(aligned)


def check_state(transform: Any, state: Any, params: Any) -> None:
    """Raises `ValueError` naming the path where `state` differs from `transform.init(params)`."""
    expected = jax.eval_shape(transform.init, params)
    found_def = jax.tree_util.tree_structure(state, is_leaf=_is_none)
    expected_def = jax.tree_util.tree_structure(expected, is_leaf=_is_none)
    where = f"{type(transform).__name__}"
    if found_def != expected_def:
        raise ValueError(
            f"The optimizer state does not belong to this transform ({where}): found "
            f"{_first_difference(expected, state)}. Was it made by another optimizer's init?"
        )
    for (path, want), got in zip(
        jax.tree_util.tree_flatten_with_path(expected)[0], jax.tree_util.tree_leaves(state)
    ):
        if jnp.shape(got) != want.shape or jnp.result_type(got) != want.dtype:
            raise ValueError(
                f"The optimizer state at {jax.tree_util.keystr(path)} has shape {jnp.shape(got)} and dtype "
                f"{jnp.result_type(got)}, but {where} expects {want.shape} {want.dtype}. "
                "Was it made by another optimizer's init, or for other parameters?"
            )
