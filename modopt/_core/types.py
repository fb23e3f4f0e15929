"""The names of the trees a transform works on: `Params`, `Updates`, `OptState` (optax's)."""

from __future__ import annotations

from typing import Any

PyTree = Any
Params = Any
"""A pytree of parameter arrays (a model, a dict of arrays...)."""
Updates = Any
"""A pytree of updates (gradients at first), with the structure and shapes of the params."""
OptState = Any
"""A transform's state: a pytree of arrays (a named tuple of each transform's fields)."""
