"""Registry entries: special family (SM3, Rprop, Polyak, optimistic gradients, gradient noise).

See `_entry.Entry`. Two oracles need a word:

- optax's SM3 fails on a scalar parameter (it indexes the accumulator of a first dimension
  that a scalar lacks); modopt gives a scalar one accumulator, which is optax's rule for a
  vector of one element. The oracle runs optax on scalars viewed as 1-vectors
  (`_scalars_as_vectors`).
- optax 0.2.8's `scale_by_rprop` emits the step of the previous update (its state's old
  `prev_updates`), so its first step is 0 and every later one lags by a step (optax PR
  #1725). modopt emits the step it has just computed, as the paper and `torch.optim.Rprop`
  do: the oracle is optax's own state math, emitting the new `prev_updates` (`_fresh_rprop`).
- optax warns when `add_noise`/`noisy_sgd` get `seed=` or no key; modopt accepts these
  silently. Both warn that `optimistic_adam` is deprecated in favour of `optimistic_adam_v2`
  (checked in test_optax_triage.py). The oracles pass the key explicitly, and both sides of
  the `optimistic_adam` entries silence the deprecation.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import optax

import modopt

from ._entry import Entry


def _value(loss, params):
    del params
    return {"value": loss}


def _scalars_as_vectors(tx):
    """`tx` (an optax transform) run with every rank-0 array, in and out, seen as shape (1,).

    Valid where no array of the state or the updates has shape (1,) of its own, as with the
    registry's parameters.
    """

    def up(tree):
        return jax.tree.map(lambda x: jnp.reshape(x, (1,)) if jnp.ndim(x) == 0 else x, tree)

    def down(tree):
        return jax.tree.map(lambda x: jnp.reshape(x, ()) if jnp.shape(x) == (1,) else x, tree)

    def init(params):
        return down(tx.init(up(params)))

    def update(updates, state, params=None, **extra_args):
        updates, state = tx.update(up(updates), up(state), up(params), **extra_args)
        return down(updates), down(state)

    return optax.GradientTransformationExtraArgs(init, update)


def _fresh_rprop(*args, **kwargs):
    """optax's `scale_by_rprop` emitting the step it has just computed (stored in its state)."""
    tx = optax.scale_by_rprop(*args, **kwargs)

    def update(updates, state, params=None):
        _, state = tx.update(updates, state, params)
        return state.prev_updates, state

    return optax.GradientTransformation(tx.init, update)


def _quiet(make):
    """Builds a transform whose construction warns about a deprecation, silencing the warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return make()


ENTRIES = [
    # --- SM3: per-dimension accumulators, own sharding rule --------------------------------
    Entry(
        "scale_by_sm3",
        lambda: modopt.scale_by_sm3(),
        lambda: _scalars_as_vectors(optax.scale_by_sm3()),
        ("b2", 0.99),  # 1 sums, below 1 averages: one trace for both
        descent_lr=0.5,
        own_rule=True,
    ),
    Entry(
        "scale_by_sm3_ema_no_momentum",
        lambda: modopt.scale_by_sm3(b1=0.0, b2=0.95, eps=1e-6),
        lambda: _scalars_as_vectors(optax.scale_by_sm3(b1=0.0, b2=0.95, eps=1e-6)),
        ("b1", 0.5),
        descent_lr=0.05,
        own_rule=True,
    ),
    Entry(
        "sm3",
        lambda: modopt.sm3(0.5),
        lambda: _scalars_as_vectors(optax.sm3(0.5)),
        ("learning_rate", 0.2),
        descent=True,
        own_rule=True,
    ),
    Entry(
        "sm3_momentum_none",
        lambda: modopt.sm3(0.5, momentum=None),  # no momentum: optax's sm3 fails on None, takes 0
        lambda: _scalars_as_vectors(optax.sm3(0.5, 0.0)),
        ("momentum", 0.5),
        descent=True,
        own_rule=True,
    ),
    # --- Rprop -------------------------------------------------------------------------------
    Entry(
        "scale_by_rprop",
        lambda: modopt.scale_by_rprop(0.01),
        lambda: _fresh_rprop(0.01),
        ("eta_plus", 1.1),
        descent_lr=1.0,
    ),
    Entry(
        "rprop",
        lambda: modopt.rprop(0.02, eta_minus=0.4, eta_plus=1.3, min_step_size=1e-4, max_step_size=0.5),
        lambda: optax.chain(
            _fresh_rprop(0.02, eta_minus=0.4, eta_plus=1.3, min_step_size=1e-4, max_step_size=0.5),
            optax.scale(-1.0),
        ),
        ("max_step_size", 0.25),
        descent=True,
    ),
    # --- Polyak step size: reads the loss `value` -----------------------------------------------
    Entry(
        "scale_by_polyak",
        lambda: modopt.scale_by_polyak(),
        lambda: optax.scale_by_polyak(),
        ("max_learning_rate", 0.5),
        descent_lr=1.0,
        extra_args=_value,
    ),
    Entry(
        "scale_by_polyak_sps_plus_above_loss",
        lambda: modopt.scale_by_polyak(f_min=1e9, eps=1e-3, variant="sps+"),  # the gap is clipped to 0
        lambda: optax.scale_by_polyak(f_min=1e9, eps=1e-3, variant="sps+"),
        ("f_min", 2e9),
        converges=False,  # every step is 0 by design
        extra_args=_value,
    ),
    Entry(
        "polyak_sgd",
        lambda: modopt.polyak_sgd(),
        lambda: optax.polyak_sgd(),
        ("max_learning_rate", 0.5),
        descent=True,
        extra_args=_value,
    ),
    Entry(
        "polyak_sgd_sps_plus_scaled",
        lambda: modopt.polyak_sgd(max_learning_rate=0.5, scaling=0.9, f_min=-1.0, eps=1e-3, variant="sps+"),
        lambda: optax.polyak_sgd(max_learning_rate=0.5, scaling=0.9, f_min=-1.0, eps=1e-3, variant="sps+"),
        ("scaling", 0.8),
        descent=True,
        extra_args=_value,
    ),
    Entry(
        "polyak_sgd_scaling_schedule",
        lambda: modopt.polyak_sgd(scaling=modopt.linear_schedule(1.0, 0.5, 100)),
        lambda: optax.polyak_sgd(scaling=optax.linear_schedule(1.0, 0.5, 100)),
        ("end_value", 0.25),
        descent=True,
        extra_args=_value,
    ),
    # --- optimistic gradients -------------------------------------------------------------------
    Entry(
        "scale_by_optimistic_gradient",
        lambda: modopt.scale_by_optimistic_gradient(),
        lambda: optax.scale_by_optimistic_gradient(),
        ("beta", 0.5),
        descent_lr=0.05,
    ),
    Entry(
        "optimistic_gradient_descent",
        lambda: modopt.optimistic_gradient_descent(0.05, alpha=0.8, beta=0.3),
        lambda: optax.optimistic_gradient_descent(0.05, alpha=0.8, beta=0.3),
        ("learning_rate", 0.02),
        descent=True,
    ),
    Entry(
        "optimistic_adam",
        lambda: _quiet(lambda: modopt.optimistic_adam(0.05, optimism=0.02)),
        lambda: _quiet(lambda: optax.optimistic_adam(0.05, optimism=0.02)),
        ("optimism", 0.01),
        descent=True,
    ),
    Entry(
        "optimistic_adam_default_optimism_no_nesterov",
        lambda: _quiet(lambda: modopt.optimistic_adam(0.05, b1=0.8, mu_dtype=jnp.float32, nesterov=False)),
        lambda: _quiet(lambda: optax.optimistic_adam(0.05, b1=0.8, mu_dtype=jnp.float32, nesterov=False)),
        ("learning_rate", 0.02),
        descent=True,
    ),
    Entry(
        "optimistic_adam_v2",
        lambda: modopt.optimistic_adam_v2(0.05, alpha=1.0, beta=0.5),
        lambda: optax.optimistic_adam_v2(0.05, alpha=1.0, beta=0.5),
        ("beta", 0.2),
        descent=True,
    ),
    # --- gradient noise: a typed PRNG key in the state --------------------------------------------
    Entry(
        "add_noise",
        lambda: modopt.add_noise(0.01, 0.55, jax.random.key(3)),
        lambda: optax.add_noise(0.01, 0.55, key=jax.random.key(3)),
        ("eta", 0.02),
        descent_lr=0.1,
    ),
    Entry(
        "add_noise_seed",
        lambda: modopt.add_noise(0.1, 1.0, seed=5),  # the seeds' keyword
        lambda: optax.add_noise(0.1, 1.0, key=5),
        ("gamma", 0.5),
        descent_lr=0.1,
    ),
    Entry(
        "noisy_sgd",
        lambda: modopt.noisy_sgd(0.05, key=jax.random.key(1)),
        lambda: optax.noisy_sgd(0.05, key=jax.random.key(1)),
        ("learning_rate", 0.02),
        descent=True,
    ),
    Entry(
        "noisy_sgd_default_key",
        lambda: modopt.noisy_sgd(0.05, eta=0.02, gamma=0.3),  # no key: seed 0
        lambda: optax.noisy_sgd(0.05, eta=0.02, gamma=0.3, key=0),
        ("eta", 0.01),
        descent=True,
    ),
]
