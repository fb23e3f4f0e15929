"""Registry entries: layer-wise scaling, normalizing, clipping and constraints, and the
optimizers built on them (LARS, LAMB, Fromage, signSGD). See `_entry.Entry`."""

from __future__ import annotations

import jax.numpy as jnp
import optax

import modopt

from ._entry import MASK, Entry, optax_schedule, schedule


def _mask_fn(params):
    return {k: k in ("matrix", "big") for k in params}


def _with_nans(updates, params):
    """Large update elements become NaN, so that `zero_nans` has something to zero."""
    del params
    return {k: jnp.where(jnp.abs(v) > 1.5, jnp.nan, v) for k, v in updates.items()}


ENTRIES = [
    # --- layer-wise scaling and normalizing ------------------------------------------------
    Entry(
        "scale_by_trust_ratio",
        lambda: modopt.scale_by_trust_ratio(),
        lambda: optax.scale_by_trust_ratio(),
        descent_lr=0.02,
    ),
    Entry(
        "scale_by_trust_ratio_min_norm_eps",
        lambda trust_coefficient=0.5: modopt.scale_by_trust_ratio(
            min_norm=3.0, trust_coefficient=trust_coefficient, eps=1e-3
        ),
        lambda: optax.scale_by_trust_ratio(min_norm=3.0, trust_coefficient=0.5, eps=1e-3),
        ("trust_coefficient", 0.25),
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_param_block_norm",
        lambda: modopt.scale_by_param_block_norm(),
        lambda: optax.scale_by_param_block_norm(),
        ("min_scale", 2.0),
        descent_lr=0.004,
    ),
    Entry(
        "scale_by_param_block_rms_min_scale",
        lambda: modopt.scale_by_param_block_rms(min_scale=2.0),  # active: most leaves have rms ~1
        lambda: optax.scale_by_param_block_rms(min_scale=2.0),
        ("min_scale", 0.5),
        descent_lr=0.2,
    ),
    Entry(
        "centralize",
        lambda: modopt.centralize(),
        lambda: optax.centralize(),
        converges=False,  # the mean of each row of a matrix is never updated, by design
    ),
    Entry(
        "normalize_by_update_norm",
        lambda: modopt.normalize_by_update_norm(),
        lambda: optax.normalize_by_update_norm(),
        ("scale_factor", 2.0),
        descent_lr=2.0,  # steps of fixed length: long ones to cross the ~190 to the minimum
    ),
    Entry(
        "normalize_by_update_norm_descent",
        lambda scale_factor=-2.0: modopt.normalize_by_update_norm(scale_factor=scale_factor, eps=1e-2),
        lambda: optax.normalize_by_update_norm(scale_factor=-2.0, eps=1e-2),
        ("scale_factor", -1.0),
        descent=True,
    ),
    Entry("scale_by_sign", lambda: modopt.scale_by_sign(), lambda: optax.scale_by_sign(), descent_lr=0.05),
    # --- clipping ------------------------------------------------------------------------
    Entry(
        "adaptive_grad_clip",
        lambda clipping=0.1: modopt.adaptive_grad_clip(clipping),  # active: random grads ~ params
        lambda: optax.adaptive_grad_clip(0.1),
        ("clipping", 0.05),
        descent_lr=1.0,
    ),
    Entry(
        "adaptive_grad_clip_axis_eps",
        # Masked to the leaves of rank >= 2: a scalar has no axis -1.
        lambda: modopt.masked(modopt.adaptive_grad_clip(0.5, eps=0.5, axis=-1), MASK),
        lambda: optax.masked(optax.adaptive_grad_clip(0.5, eps=0.5, axis=-1), MASK),
        ("eps", 0.1),
        descent_lr=0.5,
        own_rule=True,
    ),
    # --- constraints ---------------------------------------------------------------------
    Entry(
        "keep_params_nonnegative",
        # Last in the chain, after the step size: negative random params are moved to 0.
        lambda: modopt.chain(modopt.scale(-0.1), modopt.keep_params_nonnegative()),
        lambda: optax.chain(optax.scale(-0.1), optax.keep_params_nonnegative()),
        ("step_size", -0.05),
        descent=True,
    ),
    Entry("zero_nans", lambda: modopt.zero_nans(), lambda: optax.zero_nans(), own_rule=True),
    Entry(
        "zero_nans_with_nans",
        lambda: modopt.chain(modopt.stateless(_with_nans), modopt.zero_nans()),
        lambda: optax.chain(optax.stateless(_with_nans), optax.zero_nans()),
        converges=False,  # elements whose gradient stays above 1.5 are never updated
        own_rule=True,
    ),
    # --- optimizers ----------------------------------------------------------------------
    Entry(
        "lars",
        lambda learning_rate=5.0: modopt.lars(learning_rate),
        lambda: optax.lars(5.0),
        ("learning_rate", 2.0),
        descent=True,
    ),
    Entry(
        "lars_masks_nesterov",
        lambda: modopt.lars(
            0.05, weight_decay=1e-2, weight_decay_mask=MASK, trust_coefficient=0.1, eps=1e-6,
            trust_ratio_mask=_mask_fn, momentum=0.8, nesterov=True,
        ),
        lambda: optax.lars(
            0.05, weight_decay=1e-2, weight_decay_mask=MASK, trust_coefficient=0.1, eps=1e-6,
            trust_ratio_mask=_mask_fn, momentum=0.8, nesterov=True,
        ),
        ("trust_coefficient", 0.2),
        descent=True,
        own_rule=True,
    ),
    Entry(
        "lamb",
        lambda learning_rate=0.02: modopt.lamb(learning_rate),
        lambda: optax.lamb(0.02),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "lamb_weight_decay_mask",
        lambda weight_decay=1e-2: modopt.lamb(
            0.02, b1=0.8, eps_root=1e-8, weight_decay=weight_decay, mask=MASK
        ),
        lambda: optax.lamb(0.02, b1=0.8, eps_root=1e-8, weight_decay=1e-2, mask=MASK),
        ("weight_decay", 1e-3),
        descent=True,
        own_rule=True,
    ),
    Entry(
        "fromage",
        lambda learning_rate=0.02: modopt.fromage(learning_rate),
        lambda: optax.fromage(0.02),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "fromage_schedule",
        lambda: modopt.fromage(schedule(), min_norm=1e-3),
        lambda: optax.fromage(optax_schedule(), min_norm=1e-3),
        ("peak_value", 0.07),
        descent=True,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
    ),
    Entry(
        "sign_sgd",
        lambda learning_rate=0.02: modopt.sign_sgd(learning_rate),
        lambda: optax.sign_sgd(0.02),
        ("learning_rate", 0.01),
        descent=True,
    ),
]
