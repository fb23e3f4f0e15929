"""Registry entries: adaptive family (see `_entry.Entry`): RMS scalings, Adam variants, Lion,
NovoGrad and the optimizers built on them."""

from __future__ import annotations

import jax.numpy as jnp
import optax

import modopt

from ._entry import MASK, Entry

# A `b2` whose complement is a power of two, so `rho_inf = 2 / (1 - b2) - 1` is exact in
# float32 as in optax's double precision; with `threshold=4.5` RAdam's rectified step is
# taken from the fifth step on (rho_5 is about 4.99), within the parity check's five steps.
_RADAM_B2 = 1 - 2.0**-10

ENTRIES: list[Entry] = [
    # --- RMS scalings ----------------------------------------------------------------------
    Entry(
        "scale_by_rss",
        lambda initial_accumulator_value=0.1: modopt.scale_by_rss(initial_accumulator_value),
        lambda: optax.scale_by_rss(),
        ("eps", 1e-6),
        descent_lr=0.5,
    ),
    Entry(
        "scale_by_rms",
        lambda decay=0.9: modopt.scale_by_rms(decay),
        lambda: optax.scale_by_rms(),
        ("decay", 0.8),
        descent_lr=0.02,
    ),
    Entry(
        "scale_by_rms_bias_correction",
        lambda: modopt.scale_by_rms(0.95, 1e-6, initial_scale=0.1, eps_in_sqrt=False, bias_correction=True),
        lambda: optax.scale_by_rms(0.95, 1e-6, initial_scale=0.1, eps_in_sqrt=False, bias_correction=True),
        ("initial_scale", 0.2),
        descent_lr=0.02,
    ),
    Entry(
        "scale_by_stddev",
        lambda decay=0.9: modopt.scale_by_stddev(decay),
        lambda: optax.scale_by_stddev(),
        ("decay", 0.8),
        descent_lr=0.02,
    ),
    Entry(
        "scale_by_stddev_bias_correction",
        lambda: modopt.scale_by_stddev(0.95, 1e-6, initial_scale=0.1, eps_in_sqrt=False, bias_correction=True),
        lambda: optax.scale_by_stddev(0.95, 1e-6, initial_scale=0.1, eps_in_sqrt=False, bias_correction=True),
        ("eps", 1e-5),
        descent_lr=0.02,
    ),
    Entry(
        "scale_by_adadelta",
        lambda rho=0.9: modopt.scale_by_adadelta(rho, eps=1e-3),
        lambda: optax.scale_by_adadelta(0.9, eps=1e-3),
        ("rho", 0.8),
        descent_lr=1.0,
    ),
    # --- Adam variants ---------------------------------------------------------------------
    Entry(
        "scale_by_adamax",
        lambda b1=0.9: modopt.scale_by_adamax(b1),
        lambda: optax.scale_by_adamax(),
        ("b1", 0.8),
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_amsgrad",
        lambda b2=0.999: modopt.scale_by_amsgrad(b2=b2),
        lambda: optax.scale_by_amsgrad(),
        ("b2", 0.99),
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_amsgrad_uncorrected",
        lambda: modopt.scale_by_amsgrad(b2=0.99, eps_root=1e-8, bias_correction_mu=False, bias_correction_nu=False),
        lambda: optax.scale_by_amsgrad(b2=0.99, eps_root=1e-8, bias_correction_mu=False, bias_correction_nu=False),
        ("eps", 1e-6),
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_amsgrad_mu_dtype",
        lambda: modopt.scale_by_amsgrad(mu_dtype=jnp.bfloat16),
        lambda: optax.scale_by_amsgrad(mu_dtype=jnp.bfloat16),
        ("b1", 0.8),
        tolerance=1e-2,  # the first moment is kept in bfloat16 (8 bits of mantissa)
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_belief",
        lambda b1=0.9: modopt.scale_by_belief(b1),
        lambda: optax.scale_by_belief(),
        ("b1", 0.8),
        descent_lr=0.02,
    ),
    Entry(
        "scale_by_belief_nesterov",
        lambda: modopt.scale_by_belief(b2=0.99, eps=1e-8, nesterov=True),
        lambda: optax.scale_by_belief(b2=0.99, eps=1e-8, nesterov=True),
        ("b2", 0.9),
        descent_lr=0.02,
    ),
    Entry(
        "scale_by_yogi",
        lambda b1=0.9: modopt.scale_by_yogi(b1, initial_accumulator_value=1e-3, eps_root=1e-8),
        lambda: optax.scale_by_yogi(initial_accumulator_value=1e-3, eps_root=1e-8),
        ("b1", 0.8),
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_radam",  # rho_t stays below the default threshold: the unrectified branch
        lambda b1=0.9: modopt.scale_by_radam(b1),
        lambda: optax.scale_by_radam(),
        ("b1", 0.8),
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_radam_rectified_nesterov",
        lambda: modopt.scale_by_radam(b2=_RADAM_B2, threshold=4.5, nesterov=True),
        lambda: optax.scale_by_radam(b2=_RADAM_B2, threshold=4.5, nesterov=True),
        ("threshold", 4.8),
        descent_lr=0.05,
    ),
    Entry(
        "scale_by_adan",
        lambda b1=0.98: modopt.scale_by_adan(b1, eps_root=1e-8),
        lambda: optax.scale_by_adan(eps_root=1e-8),
        ("b1", 0.9),
        descent_lr=0.05,
    ),
    # --- Lion and NovoGrad -------------------------------------------------------------------
    Entry(
        "scale_by_lion",
        lambda b1=0.9: modopt.scale_by_lion(b1),
        lambda: optax.scale_by_lion(),
        ("b1", 0.8),
        descent_lr=0.01,
    ),
    Entry(
        "scale_by_lion_smooth",
        lambda: modopt.scale_by_lion(mu_dtype=jnp.float32, mode="smooth", smooth_beta=2.0),
        lambda: optax.scale_by_lion(mu_dtype=jnp.float32, mode="smooth", smooth_beta=2.0),
        ("smooth_beta", 3.0),
        descent_lr=0.01,
    ),
    Entry(
        "scale_by_lion_refined",
        lambda: modopt.scale_by_lion(b2=0.9, mode="refined"),
        lambda: optax.scale_by_lion(b2=0.9, mode="refined"),
        ("b2", 0.95),
        descent_lr=0.02,
    ),
    Entry(
        "scale_by_novograd",
        lambda b2=0.25: modopt.scale_by_novograd(b2=b2, weight_decay=1e-3),
        lambda: optax.scale_by_novograd(weight_decay=1e-3),
        ("b2", 0.5),
        descent_lr=0.3,
        own_rule=True,
    ),
    Entry(
        "scale_by_novograd_mu_dtype",
        lambda: modopt.scale_by_novograd(b1=0.8, eps_root=1e-8, mu_dtype=jnp.bfloat16),
        lambda: optax.scale_by_novograd(b1=0.8, eps_root=1e-8, mu_dtype=jnp.bfloat16),
        ("eps", 1e-6),
        tolerance=1e-2,  # the momentum is kept in bfloat16 (8 bits of mantissa)
        descent_lr=0.3,
        own_rule=True,
    ),
    # --- optimizers ------------------------------------------------------------------------
    Entry(
        "adabelief",
        lambda learning_rate=0.05: modopt.adabelief(learning_rate),
        lambda: optax.adabelief(0.05),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "adabelief_nesterov",
        lambda: modopt.adabelief(0.05, b1=0.8, nesterov=True),
        lambda: optax.adabelief(0.05, b1=0.8, nesterov=True),
        ("b1", 0.7),
        descent=True,
    ),
    Entry(
        # optax's `adadelta(learning_rate=None)` does not flip the sign (it ascends); modopt's
        # descends as with a learning rate of 1 (see `Adadelta`).
        "adadelta",
        lambda rho=0.9: modopt.adadelta(rho=rho, eps=1e-3),
        lambda: optax.adadelta(1.0, rho=0.9, eps=1e-3),
        ("rho", 0.8),
        descent=True,
    ),
    Entry(
        "adadelta_weight_decay",
        lambda: modopt.adadelta(2.0, eps=1e-3, weight_decay=1e-2, weight_decay_mask=MASK),
        lambda: optax.adadelta(2.0, eps=1e-3, weight_decay=1e-2, weight_decay_mask=MASK),
        ("learning_rate", 1.0),
        descent=True,
    ),
    Entry(
        "adagrad",
        lambda learning_rate=0.5: modopt.adagrad(learning_rate),
        lambda: optax.adagrad(0.5),
        ("learning_rate", 0.2),
        descent=True,
    ),
    Entry(
        "adamax",
        lambda learning_rate=0.05: modopt.adamax(learning_rate),
        lambda: optax.adamax(0.05),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "adamaxw",
        lambda weight_decay=1e-2: modopt.adamaxw(0.05, weight_decay=weight_decay, mask=MASK),
        lambda: optax.adamaxw(0.05, weight_decay=1e-2, mask=MASK),
        ("weight_decay", 1e-3),
        descent=True,
    ),
    Entry(
        "amsgrad",
        lambda learning_rate=0.05: modopt.amsgrad(learning_rate),
        lambda: optax.amsgrad(0.05),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "adan",
        lambda weight_decay=1e-2: modopt.adan(0.05, weight_decay=weight_decay, mask=MASK),
        lambda: optax.adan(0.05, weight_decay=1e-2, mask=MASK),
        ("weight_decay", 1e-3),
        descent=True,
    ),
    Entry(
        "lion",
        lambda learning_rate=0.01: modopt.lion(learning_rate),
        lambda: optax.lion(0.01),
        ("learning_rate", 0.005),
        descent=True,
    ),
    Entry(
        # optax's `lion` has no `mode`: the oracle is its chain spelled out.
        "lion_smooth_masked",
        lambda: modopt.lion(0.01, mask=MASK, mode="smooth", smooth_beta=2.0),
        lambda: optax.chain(
            optax.scale_by_lion(mode="smooth", smooth_beta=2.0),
            optax.add_decayed_weights(1e-3, MASK),
            optax.scale_by_learning_rate(0.01),
        ),
        ("smooth_beta", 3.0),
        descent=True,
    ),
    Entry(
        "novograd",
        lambda learning_rate=0.1: modopt.novograd(learning_rate, weight_decay=1e-3),
        lambda: optax.novograd(0.1, weight_decay=1e-3),
        ("learning_rate", 0.05),
        descent=True,
        own_rule=True,
    ),
    Entry(
        "radam",
        lambda learning_rate=0.05: modopt.radam(learning_rate),
        lambda: optax.radam(0.05),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "rmsprop",
        lambda learning_rate=0.02: modopt.rmsprop(learning_rate),
        lambda: optax.rmsprop(0.02),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "rmsprop_momentum",
        lambda momentum=0.5: modopt.rmsprop(0.01, momentum=momentum, bias_correction=True),
        lambda: optax.rmsprop(0.01, momentum=0.5, bias_correction=True),
        ("momentum", 0.7),
        descent=True,
    ),
    Entry(
        "rmsprop_centered_nesterov",
        lambda: modopt.rmsprop(0.01, centered=True, momentum=0.5, nesterov=True, eps_in_sqrt=False),
        lambda: optax.rmsprop(0.01, centered=True, momentum=0.5, nesterov=True, eps_in_sqrt=False),
        ("decay", 0.8),
        descent=True,
    ),
    Entry(
        "yogi",
        lambda learning_rate=0.05: modopt.yogi(learning_rate),
        lambda: optax.yogi(0.05),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "nadam",
        lambda learning_rate=0.05: modopt.nadam(learning_rate),
        lambda: optax.nadam(0.05),
        ("learning_rate", 0.01),
        descent=True,
    ),
    Entry(
        "nadamw",
        lambda weight_decay=1e-2: modopt.nadamw(0.05, weight_decay=weight_decay, mask=MASK),
        lambda: optax.nadamw(0.05, weight_decay=1e-2, mask=MASK),
        ("weight_decay", 1e-3),
        descent=True,
    ),
]
