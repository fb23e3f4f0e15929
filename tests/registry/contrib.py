"""Registry entries: contrib and experimental (see `_entry.Entry`).

`mechanize` around SGD and Adam, compared with `optax.contrib.mechanize`; its state has one
copy of the parameters (`x0`) and per-beta vectors, placed by its own rule (`own_rule`).
`split_real_and_imaginary` around Adam: the registry's parameters are real, so here it must
pass everything through to Adam unchanged; complex parameters are tested in `test_contrib.py`.
"""

from __future__ import annotations

import optax

import modopt
from modopt.contrib import mechanize
from modopt.experimental import split_real_and_imaginary

from ._entry import Entry

ENTRIES: list[Entry] = [
    Entry(
        "mechanize_sgd",
        lambda: mechanize(modopt.sgd(0.1)),
        lambda: optax.contrib.mechanize(optax.sgd(0.1)),
        ("weight_decay", 0.05),
        descent=True,
        own_rule=True,  # per-beta vectors replicated, x0 like the params, the inner state by SGD's rule
    ),
    Entry(
        "mechanize_adam",
        lambda: mechanize(modopt.adam(0.05), num_betas=4),
        lambda: optax.contrib.mechanize(optax.adam(0.05), num_betas=4),
        ("s_init", 1e-5),
        descent=True,
        own_rule=True,  # as mechanize_sgd
        partial_state_dtypes="the base optimizer has state dtypes of its own",
    ),
    Entry(
        "split_real_and_imaginary_adam",
        lambda: split_real_and_imaginary(modopt.adam(0.05)),
        lambda: optax.contrib.split_real_and_imaginary(optax.adam(0.05)),
        ("learning_rate", 0.01),
        descent=True,
    ),
]
