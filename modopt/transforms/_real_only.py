"""A check shared by the transforms whose math needs real parameters (SM3, Rprop)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def reject_complex(params: Any, owner: Any) -> None:
    """Raises `ValueError` naming the first complex parameter, for a transform of real numbers only."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if jnp.iscomplexobj(leaf):
            raise ValueError(
                f"{type(owner).__name__} supports real parameters only; the parameter at "
                f"{jax.tree_util.keystr(path) or 'the root'} is {jnp.result_type(leaf)}. Optimize the real "
                "and imaginary parts as separate real arrays instead."
            )
