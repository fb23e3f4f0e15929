"""The registry entries of the transforms and optimizers that came first: scaling, Adam,
accumulation, weight decay, clipping, combinators, SGD, Adam(W), Adafactor."""

from __future__ import annotations

import jax.numpy as jnp
import optax

import modopt

from ._entry import LABELS, MASK, Entry, optax_schedule, schedule

ENTRIES = [
    # --- stateless and scaling -----------------------------------------------------------
    Entry("identity", lambda: modopt.identity(), lambda: optax.identity(), converges=True),
    Entry("set_to_zero", lambda: modopt.set_to_zero(), lambda: optax.set_to_zero(), converges=False),
    Entry(
        "stateless",
        lambda: modopt.stateless(_halve_tree),
        lambda: optax.stateless(_halve_tree),
    ),
    Entry(
        "stateless_with_tree_map",
        lambda: modopt.stateless_with_tree_map(_halve_leaf),
        lambda: optax.stateless_with_tree_map(_halve_leaf),
    ),
    Entry("scale", lambda step_size=0.5: modopt.scale(step_size), lambda: optax.scale(0.5), ("step_size", 0.25)),
    Entry(
        "scale_by_learning_rate",
        lambda learning_rate=0.1: modopt.scale_by_learning_rate(learning_rate),
        lambda: optax.scale_by_learning_rate(0.1),
        ("learning_rate", 0.05),
        descent=True,
    ),
    Entry(
        "scale_by_learning_rate_schedule",
        lambda: modopt.scale_by_learning_rate(schedule()),
        lambda: optax.scale_by_learning_rate(optax_schedule()),
        ("peak_value", 0.07),
        descent=True,
        steps_to_converge=50,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
    ),
    Entry(
        "scale_by_schedule",
        lambda: modopt.scale_by_schedule(schedule()),
        lambda: optax.scale_by_schedule(optax_schedule()),
        ("peak_value", 0.07),
        converges=False,
    ),
    # --- adaptive ------------------------------------------------------------------------
    Entry(
        "scale_by_adam",
        lambda b1=0.9: modopt.scale_by_adam(b1=b1),
        lambda: optax.scale_by_adam(),
        ("b1", 0.8),
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_adam_nesterov_mu_dtype",
        lambda: modopt.scale_by_adam(b2=0.99, eps_root=1e-8, mu_dtype=jnp.bfloat16, nesterov=True),
        lambda: optax.scale_by_adam(b2=0.99, eps_root=1e-8, mu_dtype=jnp.bfloat16, nesterov=True),
        ("eps", 1e-6),
        tolerance=1e-2,
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_factored_rms",
        lambda decay_rate=0.8: modopt.scale_by_factored_rms(decay_rate=decay_rate),
        lambda: optax.scale_by_factored_rms(),
        ("decay_rate", 0.7),
        descent_lr=0.02,
        own_rule=True,
    ),
    Entry(
        "scale_by_param_block_rms",
        lambda: modopt.scale_by_param_block_rms(),
        lambda: optax.scale_by_param_block_rms(),
        ("min_scale", 1e-2),
    ),
    # --- accumulation --------------------------------------------------------------------
    Entry("trace", lambda decay=0.9: modopt.trace(decay), lambda: optax.trace(0.9), ("decay", 0.5), descent_lr=0.02),
    Entry(
        "trace_nesterov",
        lambda: modopt.trace(0.9, nesterov=True, accumulator_dtype=jnp.float32),
        lambda: optax.trace(0.9, nesterov=True, accumulator_dtype=jnp.float32),
        ("decay", 0.5),
        descent_lr=0.02,
    ),
    Entry("ema", lambda: modopt.ema(0.9), lambda: optax.ema(0.9), ("decay", 0.5), descent_lr=0.05),
    Entry(
        "ema_no_debias",
        lambda: modopt.ema(0.9, debias=False),
        lambda: optax.ema(0.9, debias=False),
        ("decay", 0.5),
        descent_lr=0.05,
    ),
    # --- weight decay and clipping ---------------------------------------------------------
    Entry(
        "add_decayed_weights",
        lambda: modopt.add_decayed_weights(0.1),
        lambda: optax.add_decayed_weights(0.1),
        ("weight_decay", 0.2),
    ),
    Entry(
        "add_decayed_weights_masked",
        lambda: modopt.add_decayed_weights(0.1, mask=MASK),
        lambda: optax.add_decayed_weights(0.1, mask=MASK),
        ("weight_decay", 0.2),
    ),
    Entry(
        "add_decayed_weights_schedule_mask_fn",
        lambda: modopt.add_decayed_weights(schedule(), mask=_mask_fn),
        lambda: optax.add_decayed_weights(optax_schedule(), mask=_mask_fn),
        ("peak_value", 0.2),
    ),
    Entry("clip", lambda: modopt.clip(0.5), lambda: optax.clip(0.5), ("max_delta", 0.25), descent_lr=0.05),
    Entry(
        "clip_by_global_norm",
        lambda: modopt.clip_by_global_norm(100.0),  # active: random grads have norm ~135
        lambda: optax.clip_by_global_norm(100.0),
        ("max_norm", 2.0),
        descent_lr=0.5,
    ),
    Entry(
        "clip_by_block_rms",
        lambda: modopt.clip_by_block_rms(0.5),
        lambda: optax.clip_by_block_rms(0.5),
        ("threshold", 0.25),
        descent_lr=0.2,
    ),
    # --- combinators ---------------------------------------------------------------------
    Entry(
        "chain",
        lambda: modopt.chain(modopt.clip_by_global_norm(1.0), modopt.scale_by_adam(), modopt.scale(-0.05)),
        lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.scale(-0.05)),
        ("max_norm", 2.0),
        descent=True,
        own_rule=True,
    ),
    Entry(
        "named_chain",
        lambda: modopt.named_chain(("clip", modopt.clip(1.0)), ("momentum", modopt.trace(0.5))),
        lambda: optax.named_chain(("clip", optax.clip(1.0)), ("momentum", optax.trace(0.5))),
        ("decay", 0.6),
        descent_lr=0.05,
    ),
    Entry(
        "masked",
        lambda: modopt.masked(modopt.scale_by_adam(), MASK),
        lambda: optax.masked(optax.scale_by_adam(), MASK),
        ("b1", 0.8),
        descent_lr=0.05,
        own_rule=True,
    ),
    Entry(
        "partition",
        lambda: modopt.partition(
            {"a": modopt.scale_by_adam(), "b": modopt.trace(0.5), "c": modopt.scale_by_factored_rms()}, LABELS
        ),
        lambda: optax.partition(
            {"a": optax.scale_by_adam(), "b": optax.trace(0.5), "c": optax.scale_by_factored_rms()}, LABELS
        ),
        ("b1", 0.8),
        descent_lr=0.02,
        own_rule=True,
    ),
    Entry(
        "multi_transform_label_fn",
        lambda: modopt.multi_transform({"a": modopt.sgd(0.05), "b": modopt.set_to_zero()}, _label_fn),
        lambda: optax.multi_transform({"a": optax.sgd(0.05), "b": optax.set_to_zero()}, _label_fn),
        ("learning_rate", 0.02),
        descent=True,
        converges=False,  # the vector and scalar are frozen by set_to_zero
    ),
    # --- optimizers ----------------------------------------------------------------------
    Entry(
        "sgd",
        lambda learning_rate=0.1: modopt.sgd(learning_rate),
        lambda: optax.sgd(0.1),
        ("learning_rate", 0.05),
        descent=True,
    ),
    Entry(
        "sgd_momentum",
        lambda momentum=0.9: modopt.sgd(0.02, momentum),
        lambda: optax.sgd(0.02, 0.9),
        ("momentum", 0.8),
        descent=True,
    ),
    Entry(
        "sgd_nesterov",
        lambda: modopt.sgd(0.02, 0.9, nesterov=True, accumulator_dtype=jnp.float32),
        lambda: optax.sgd(0.02, 0.9, nesterov=True, accumulator_dtype=jnp.float32),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "adam",
        lambda learning_rate=0.05: modopt.adam(learning_rate),
        lambda: optax.adam(0.05),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "adam_schedule_nesterov",
        lambda: modopt.adam(schedule(), b1=0.8, nesterov=True),
        lambda: optax.adam(optax_schedule(), b1=0.8, nesterov=True),
        ("peak_value", 0.1),
        descent=True,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
    ),
    Entry(
        "adamw",
        lambda weight_decay=1e-2: modopt.adamw(0.05, weight_decay=weight_decay),
        lambda: optax.adamw(0.05, weight_decay=1e-2),
        ("weight_decay", 1e-3),
        descent=True,
    ),
    Entry(
        "adamw_mask",
        lambda: modopt.adamw(0.05, weight_decay=1e-2, mask=MASK),
        lambda: optax.adamw(0.05, weight_decay=1e-2, mask=MASK),
        ("learning_rate", 0.01),
        descent=True,
        own_rule=True,
    ),
    Entry(
        "adafactor",
        lambda learning_rate=0.05: modopt.adafactor(learning_rate),
        lambda: optax.adafactor(0.05),
        ("learning_rate", 0.01),
        descent=True,
        steps_to_converge=500,
        own_rule=True,
    ),
    Entry(
        "adafactor_full",
        lambda: modopt.adafactor(
            0.05, momentum=0.9, weight_decay_rate=1e-3, weight_decay_mask=MASK, multiply_by_parameter_scale=False
        ),
        lambda: optax.adafactor(
            0.05, momentum=0.9, weight_decay_rate=1e-3, weight_decay_mask=MASK, multiply_by_parameter_scale=False
        ),
        ("momentum", 0.8),
        descent=True,
        own_rule=True,
    ),
]


def _halve_tree(updates, params):
    del params
    return {k: 0.5 * v for k, v in updates.items()}


def _halve_leaf(update, param):
    del param
    return 0.5 * update


def _mask_fn(params):
    return {k: k != "vector" for k in params}


def _label_fn(params):
    return {k: "a" if k in ("matrix", "cube", "big") else "b" for k in params}
