"""Registry entries: wrappers family (see `_entry.Entry`): apply_every, apply_if_finite,
MultiSteps, conditionally_transform / conditionally_mask / maybe_update. Each wraps a modopt
optimizer and is compared with the same optax wrapper around optax's. (lookahead trains
`LookaheadParams`, not the registry's dict: it is tested in `test_wrappers.py`.)

Functions given to the wrappers are module-level, so rebuilding an entry reuses the trace.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import optax

import modopt

from ._entry import Entry, optax_schedule, schedule


def _value(loss, params):
    del params
    return {"value": loss}


def _nan_at_some_steps(updates, params):
    """Every update is NaN when the scalar gradient is below -1: steps 0 and 1 of the
    registry's gradients (two in a row), never for the quadratic's gradients."""
    del params
    bad = updates["scalar"] < -1.0
    return {k: jnp.where(bad, jnp.nan, v) for k, v in updates.items()}


def _even(step):
    return step % 2 == 0


def _from_step_two(step):
    return step >= 2


def _even_while_loss_above_one(step, value):
    return jnp.logical_and(step % 2 == 0, value > 1.0)


def _k_schedule(gradient_step):
    """Two mini-steps for the first gradient step, three after."""
    return jnp.where(gradient_step < 1, 2, 3)


# The registry's random gradients have squared norms 17750, 17931, 17505, 17926, 17704 at
# steps 0-4: 17800 skips steps 1 and 3. The quadratic's gradients are larger: all skipped.
_SKIP_LARGE = functools.partial(modopt.skip_large_updates, max_squared_norm=17800.0)
_OPTAX_SKIP_LARGE = functools.partial(optax.skip_large_updates, max_squared_norm=17800.0)


ENTRIES = [
    # --- apply_every ---------------------------------------------------------------------------
    Entry(
        "apply_every",
        lambda k=3: modopt.apply_every(k),
        lambda: optax.apply_every(3),
        ("k", 2),
        descent_lr=0.1,
    ),
    # --- apply_if_finite -----------------------------------------------------------------------
    Entry(
        "apply_if_finite",
        lambda: modopt.apply_if_finite(modopt.adam(0.05), 2),
        lambda: optax.apply_if_finite(optax.adam(0.05), 2),
        ("max_consecutive_errors", 5),
        descent=True,
    ),
    Entry(
        "apply_if_finite_skips_nans",  # steps 0 and 1 are NaN: both dropped and counted
        lambda: modopt.chain(
            modopt.stateless(_nan_at_some_steps), modopt.apply_if_finite(modopt.adam(0.05), 2)
        ),
        lambda: optax.chain(optax.stateless(_nan_at_some_steps), optax.apply_if_finite(optax.adam(0.05), 2)),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "apply_if_finite_adafactor",
        lambda: modopt.apply_if_finite(modopt.adafactor(0.05), 3),
        lambda: optax.apply_if_finite(optax.adafactor(0.05), 3),
        ("learning_rate", 0.01),
        descent=True,
        steps_to_converge=500,
        own_rule=True,  # the inner state is factored: placed by Adafactor's rule
    ),
    Entry(
        "apply_if_finite_polyak_value",  # the loss `value` reaches the inner optimizer
        lambda: modopt.apply_if_finite(modopt.polyak_sgd(), 1),
        lambda: optax.apply_if_finite(optax.polyak_sgd(), 1),
        ("max_learning_rate", 0.5),
        descent=True,
        extra_args=_value,
    ),
    # --- MultiSteps ----------------------------------------------------------------------------
    Entry(
        "multi_steps",
        lambda: modopt.MultiSteps(modopt.adam(0.05), every_k_schedule=2),
        lambda: optax.MultiSteps(optax.adam(0.05), every_k_schedule=2),
        ("every_k_schedule", 3),
        descent=True,
        partial_state_dtypes="the inner optimizer has state dtypes of its own",
    ),
    Entry(
        "multi_steps_schedule",  # the inner schedule advances once per gradient step
        lambda: modopt.MultiSteps(modopt.adam(schedule()), 2),
        lambda: optax.MultiSteps(optax.adam(optax_schedule()), 2),
        ("peak_value", 0.07),
        descent=True,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
        partial_state_dtypes="the inner optimizer has state dtypes of its own",
    ),
    Entry(
        "multi_steps_sum_k_schedule",
        lambda: modopt.MultiSteps(modopt.sgd(0.02), _k_schedule, use_grad_mean=False),
        lambda: optax.MultiSteps(optax.sgd(0.02), _k_schedule, use_grad_mean=False),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "multi_steps_skip_large_updates",
        lambda: modopt.MultiSteps(modopt.sgd(0.02), 2, should_skip_update_fn=_SKIP_LARGE),
        lambda: optax.MultiSteps(optax.sgd(0.02), 2, should_skip_update_fn=_OPTAX_SKIP_LARGE),
        ("learning_rate", 0.01),
        descent=True,
        converges=False,  # the quadratic's gradients are all above the threshold: every step is skipped
        partial_state_dtypes="the skip function's state (the norm it measured) is its own",
    ),
    Entry(
        "multi_steps_skip_not_finite",  # steps 0 and 1 are NaN and skipped
        lambda: modopt.chain(
            modopt.stateless(_nan_at_some_steps),
            modopt.MultiSteps(modopt.adam(0.05), 2, should_skip_update_fn=modopt.skip_not_finite),
        ),
        lambda: optax.chain(
            optax.stateless(_nan_at_some_steps),
            optax.MultiSteps(
                optax.adam(0.05), 2, should_skip_update_fn=optax.skip_not_finite
            ).gradient_transformation(),
        ),
        ("every_k_schedule", 3),
        descent=True,
    ),
    Entry(
        "multi_steps_polyak_value",  # the loss `value` reaches the inner optimizer
        lambda: modopt.MultiSteps(modopt.polyak_sgd(), 2),
        lambda: optax.MultiSteps(optax.polyak_sgd(), 2),
        ("max_learning_rate", 0.5),
        descent=True,
        extra_args=_value,
    ),
    # --- conditional transforms ------------------------------------------------------------------
    Entry(
        "conditionally_transform",  # odd steps pass the gradient through
        lambda: modopt.conditionally_transform(modopt.scale_by_adam(), _even),
        lambda: optax.conditionally_transform(optax.scale_by_adam(), _even),
        ("b1", 0.8),
        descent_lr=0.05,
    ),
    Entry(
        "conditionally_mask",  # odd steps give zero updates
        lambda: modopt.conditionally_mask(modopt.adam(0.05), _even),
        lambda: optax.conditionally_mask(optax.adam(0.05), _even),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "conditionally_mask_forward_extra_args",  # the condition reads the loss `value` too
        lambda: modopt.conditionally_mask(
            modopt.polyak_sgd(), _even_while_loss_above_one, forward_extra_args=True
        ),
        lambda: optax.conditionally_mask(
            optax.polyak_sgd(), _even_while_loss_above_one, forward_extra_args=True
        ),
        ("max_learning_rate", 0.5),
        descent=True,
        extra_args=_value,
    ),
    Entry(
        "maybe_update",  # the older name of conditionally_transform (gone from optax 0.2.8)
        lambda: modopt.maybe_update(modopt.scale_by_adam(), _from_step_two),
        lambda: optax.conditionally_transform(optax.scale_by_adam(), _from_step_two),
        ("b1", 0.8),
        descent_lr=0.05,
    ),
]
