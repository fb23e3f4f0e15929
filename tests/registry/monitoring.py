"""Registry entries: monitoring and selection family (see `_entry.Entry`): flatten, freeze,
selective_transform, snapshot, monitor, measure_with_ema. (`scale_gradient` is a function, not
a transform: `tests/test_monitoring.py` checks it.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

import modopt

from ._entry import Entry

# True where frozen: the vector and the scalar (small, so the rest still converges).
FROZEN = {"matrix": False, "vector": True, "scalar": True, "cube": False, "big": False}


# Measures are code, shared by both sides: module-level functions, so that rebuilding a
# transform gives an equal (static) configuration.
def _norm(tree):
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def _clipped(tree):
    return jax.tree.map(lambda x: jnp.clip(x, -1.0, 1.0), tree)


def _optax_monitor(measures):
    """optax's monitor, whose init also holds zeros of each measurement (modopt's init does;
    optax's starts from an empty dict, which a jitted or scanned step cannot carry). Its
    updates are optax's own."""
    tx = optax.monitor(measures)

    def init(params):
        state = tx.init(params)
        shapes = jax.eval_shape(lambda p, s: tx.update(p, s, p)[1].measurements, params, state)
        return state._replace(measurements=jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))

    return optax.GradientTransformationExtraArgs(init, tx.update)


ENTRIES = [
    Entry(
        "flatten",
        lambda learning_rate=0.05: modopt.flatten(modopt.adam(learning_rate)),
        lambda: optax.flatten(optax.adam(0.05)),
        ("learning_rate", 0.01),
        descent=True,
        own_rule=True,
    ),
    Entry(
        "flatten_scale_by_adam",
        lambda b1=0.9: modopt.flatten(
            modopt.chain(modopt.clip_by_global_norm(3.0), modopt.scale_by_adam(b1=b1))
        ),
        lambda: optax.flatten(optax.chain(optax.clip_by_global_norm(3.0), optax.scale_by_adam())),
        ("b1", 0.8),
        descent_lr=0.05,
        own_rule=True,
    ),
    Entry("freeze", lambda: modopt.freeze(FROZEN), lambda: optax.freeze(FROZEN), own_rule=True),
    Entry(
        "freeze_all", lambda: modopt.freeze(True), lambda: optax.freeze(True), converges=False, own_rule=True
    ),
    Entry(
        "selective_transform",
        lambda learning_rate=0.05: modopt.selective_transform(modopt.adam(learning_rate), freeze_mask=FROZEN),
        lambda: optax.selective_transform(optax.adam(0.05), freeze_mask=FROZEN),
        ("learning_rate", 0.01),
        descent=True,
        own_rule=True,
    ),
    Entry("snapshot", lambda: modopt.snapshot("norm", _norm), lambda: optax.snapshot("norm", _norm)),
    # A measurement shaped like the params: its state follows their sharding.
    Entry(
        "snapshot_tree",
        lambda: modopt.snapshot("clipped", _clipped),
        lambda: optax.snapshot("clipped", _clipped),
    ),
    Entry(
        "monitor",
        lambda decay=0.9: modopt.monitor(
            {"norm": _norm, "norm_ema": modopt.measure_with_ema(_norm, decay), "clipped": _clipped}
        ),
        lambda: _optax_monitor(
            {"norm": _norm, "norm_ema": optax.measure_with_ema(_norm, 0.9), "clipped": _clipped}
        ),
        ("decay", 0.8),
        own_rule=True,
    ),
    Entry(
        "measure_with_ema",
        lambda decay=0.9: modopt.measure_with_ema(_clipped, decay),
        lambda: optax.measure_with_ema(_clipped, 0.9),
        ("decay", 0.5),
        descent_lr=0.05,
        own_rule=True,
    ),
    Entry(
        "measure_with_ema_no_debias_f32",
        lambda decay=0.9: modopt.measure_with_ema(
            _clipped, decay, debias=False, accumulator_dtype=jnp.float32
        ),
        lambda: optax.measure_with_ema(_clipped, 0.9, debias=False, accumulator_dtype=jnp.float32),
        ("decay", 0.5),
        descent_lr=0.05,
        own_rule=True,
    ),
]
