"""Registry entries: contrib's learning-rate-free and schedule-free optimizers (see `_entry.Entry`).

Schedule-Free (the wrapper around SGD and Adam, and its SGD and AdamW aliases), D-Adaptation
AdamW, Prodigy and MoMo (with Adam), each compared with its `optax.contrib` namesake. MoMo reads
the loss `value` at each step. `test_contrib_parameter_free.py` covers what the shared checks do
not: `schedule_free_eval_params`, the `Optimizer` path, schedules and bad hyperparameters.
"""

from __future__ import annotations

import optax

import modopt
from modopt import contrib

from ._entry import Entry


ENTRIES: list[Entry] = [
    Entry(
        "schedule_free_sgd_wrapper",
        lambda: contrib.schedule_free(modopt.sgd(0.5), 0.5, b1=0.8),
        lambda: optax.contrib.schedule_free(optax.sgd(0.5), 0.5, b1=0.8),
        ("weight_lr_power", 1.0),
        descent=True,
    ),
    Entry(
        "schedule_free_adam_wrapper",
        lambda: contrib.schedule_free(modopt.adam(0.05, b1=0.0), 0.05),
        lambda: optax.contrib.schedule_free(optax.adam(0.05, b1=0.0), 0.05),
        ("weight_lr_power", 1.0),
        descent=True,
        partial_state_dtypes="the inner optimizer has state dtypes of its own",
    ),
    Entry(
        "schedule_free_sgd",
        lambda: contrib.schedule_free_sgd(0.5, warmup_steps=3, weight_decay=1e-3),
        lambda: optax.contrib.schedule_free_sgd(0.5, warmup_steps=3, weight_decay=1e-3),
        ("b1", 0.8),
        descent=True,
    ),
    Entry(
        "schedule_free_adamw",
        lambda: contrib.schedule_free_adamw(0.05, warmup_steps=3, weight_decay=1e-3),
        lambda: optax.contrib.schedule_free_adamw(0.05, warmup_steps=3, weight_decay=1e-3),
        ("b2", 0.99),
        descent=True,
    ),
    Entry(
        "prodigy",
        lambda: contrib.prodigy(),
        lambda: optax.contrib.prodigy(),
        ("estim_lr_coef", 0.5),
        descent=True,
    ),
    Entry(
        "prodigy_safeguard_warmup",
        lambda: contrib.prodigy(betas=(0.8, 0.99), beta3=0.95, weight_decay=1e-2, safeguard_warmup=True),
        lambda: optax.contrib.prodigy(betas=(0.8, 0.99), beta3=0.95, weight_decay=1e-2, safeguard_warmup=True),
        ("beta3", 0.9),
        descent=True,
    ),
    Entry(
        "dadapt_adamw",
        lambda: contrib.dadapt_adamw(weight_decay=1e-2),
        lambda: optax.contrib.dadapt_adamw(weight_decay=1e-2),
        ("estim_lr0", 1e-5),
        descent=True,
    ),
    Entry(
        "momo",
        lambda: contrib.momo(),
        lambda: optax.contrib.momo(),
        ("beta", 0.8),
        descent=True,
        extra_args=lambda loss, params: {"value": loss},
    ),
    Entry(
        "momo_adapt_lower_bound",
        # No weight decay here: MoMo's decay is not scaled by its adaptive step, and pulls the
        # quadratic's iterates away from its minimum (tested against optax in test_contrib_parameter_free).
        lambda: contrib.momo(lower_bound=-10.0, adapt_lower_bound=True),
        lambda: optax.contrib.momo(lower_bound=-10.0, adapt_lower_bound=True),
        ("lower_bound", -5.0),
        descent=True,
        extra_args=lambda loss, params: {"value": loss},
    ),
    Entry(
        "momo_adam",
        lambda: contrib.momo_adam(0.1),
        lambda: optax.contrib.momo_adam(0.1),
        ("b2", 0.99),
        descent=True,
        extra_args=lambda loss, params: {"value": loss},
    ),
    Entry(
        "momo_adam_adapt_lower_bound",
        lambda: contrib.momo_adam(0.1, weight_decay=1e-3, lower_bound=-1.0, adapt_lower_bound=True),
        lambda: optax.contrib.momo_adam(0.1, weight_decay=1e-3, lower_bound=-1.0, adapt_lower_bound=True),
        ("lower_bound", -0.5),
        descent=True,
        # optax's own jitted and eager runs differ by 1e-6 at step 3: the step size is a ratio of
        # sums that nearly cancel; ours, jitted, equals optax's jitted run.
        tolerance=1e-5,
        extra_args=lambda loss, params: {"value": loss},
    ),
]
