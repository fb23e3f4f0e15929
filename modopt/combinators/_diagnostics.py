"""Step diagnostics kept in the state: gradient and update norms, learning rates, skipped steps."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, AbstractWrapper, OptState, inner_transform, single_learning_rate
from .._util.numerics import safe_increment
from .._util.trees import global_norm


class DiagnosticsState(NamedTuple):
    """What the last step did, and counts over all steps."""

    steps: jax.Array  # int32: updates so far
    skipped_steps: jax.Array  # int32: updates that a wrapper skipped or held back (accumulating)
    grad_norm: jax.Array  # the global L2 norm of the last step's gradients
    update_norm: jax.Array  # the global L2 norm of the last step's updates
    learning_rate: jax.Array  # the learning rate the last step applied (NaN: none, or several)
    inner_state: Any


class WithDiagnostics(AbstractWrapper):
    """Runs `inner` unchanged and records what each step did in the state.

    After a step, the state holds the global norms of the gradients and of the updates, the
    learning rate the step applied (read from the inner transform's state, so a schedule's
    value, or the inner optimizer's behind `MultiSteps`; NaN where there is none or several),
    and counts of all steps and of skipped ones (`apply_if_finite` skipping a non-finite
    gradient, `MultiSteps` accumulating: see `AbstractTransform.skipped_last_step`). Read them with
    `modopt.diagnostics(tx, state)` or `Optimizer.diagnostics`; the ratio
    `update_norm / grad_norm` is the step length per unit of gradient (the learning rate for
    SGD, the effective one for adaptive methods).

    Put it outermost, so that it sees the gradients as they come and the final updates.

    Args:
        inner: the transform to run and watch (a modopt or optax transform).
    """

    inner: AbstractTransform = inner_transform()

    def init(self, params):
        zero, nan = jnp.zeros([], jnp.int32), jnp.full([], jnp.nan, jnp.float32)
        return DiagnosticsState(zero, zero, nan, nan, nan, self.inner.init(params))

    def update(self, updates, state, params=None, **extra_args):
        learning_rate = _one_rate(self.inner, state.inner_state)
        new_updates, inner_state = self.inner.update(updates, state.inner_state, params, **extra_args)
        grad_norm = global_norm(updates).astype(jnp.float32)
        update_norm = global_norm(new_updates).astype(jnp.float32)
        skipped = state.skipped_steps + self.inner.skipped_last_step(inner_state).astype(jnp.int32)
        new_state = DiagnosticsState(
            safe_increment(state.steps), skipped, grad_norm, update_norm, learning_rate, inner_state
        )
        return new_updates, new_state


def _one_rate(tx: AbstractTransform, state: Any) -> jax.Array:
    try:
        return jnp.asarray(single_learning_rate(tx, state), jnp.float32)
    except AttributeError:  # no learning rate, or several
        return jnp.full([], jnp.nan, jnp.float32)


def with_diagnostics(inner: Any) -> WithDiagnostics:
    """Wraps `inner` so that its state records each step's norms, learning rate and skips.

    Args:
        inner: the transform to run and watch (a modopt or optax transform).
    """
    return WithDiagnostics(inner)


def diagnostics(tx: AbstractTransform, state: OptState) -> dict[str, jax.Array]:
    """The diagnostics recorded by the (outermost) `with_diagnostics` inside `tx`, from `state`.

    Keys: `steps`, `skipped_steps`, `grad_norm`, `update_norm`, `learning_rate` and
    `effective_learning_rate` (`update_norm / grad_norm`). A `ValueError` says when `tx` has no
    `with_diagnostics`.

    Args:
        tx: the transform holding a `with_diagnostics`, outermost or inside a combinator.
        state: the state of `tx`, from `tx.init` and `tx.update` (or `Optimizer.state`).
    """
    found = _find(tx, state)
    if found is None:
        raise ValueError(
            f"{type(tx).__name__} records no diagnostics: wrap it, e.g. `modopt.with_diagnostics(modopt.adam(1e-3))`."
        )
    values = found._asdict()
    del values["inner_state"]
    values["effective_learning_rate"] = found.update_norm / found.grad_norm
    return values


def _find(tx: AbstractTransform, state: Any) -> DiagnosticsState | None:
    if isinstance(tx, WithDiagnostics):
        return state
    for part in tx.parts():
        found = _find(part.transform, part.state(state))
        if found is not None:
            return found
    return None
