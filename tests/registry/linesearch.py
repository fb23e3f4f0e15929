"""Registry entries: line searches and L-BFGS (see `_entry.Entry`).

A line search needs a descent direction, so its entries chain it after `scale(-1)` (as
optax's examples do after `sgd(1.0)`) and descend by themselves. They read `value`, `grad`
and `value_fn` of one objective, `_quadratic` (the registry's convergence loss), whatever loss
the caller passes: the sharded worker's loss differs, and the three must agree. `value_fn`
is a `jax.tree_util.Partial`, so it can be an argument of a jitted `update`.

In the parity check the incoming updates are random rather than gradients, so the searched
directions are often not descent directions: that exercises the searches' failure paths (the
fallbacks to a safe or zero step). Their success paths are compared with optax on real
gradients in `test_lbfgs.py`.

Sharding: `scale_by_lbfgs` declares its rule (the memories `(memory_size, *shape)` follow
their parameters with the memory axis unsplit, the weights are replicated); its entries and
`lbfgs_no_linesearch` run on 8 devices (`own_rule=True`). The entries with a line search do
not: on random directions, nearly orthogonal to the gradient, a search's accept/reject
decisions hinge on the last bits of its inner products, which a sharded reduction sums in
another order, so a sharded run cannot be compared with one device (optax's searches would
diverge the same way). Their states are placed by the generic rule, checked on the abstract
mesh here, and `test_lbfgs.py` runs them on 8 devices with real gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

import modopt

from ._entry import Entry


def _quadratic(params):
    """`test_registry.quadratic`: 0.5 * sum_i a_i (x_i - 1)^2 with curvatures a in [0.5, 1.5]."""

    def leaf(x):
        a = jnp.linspace(0.5, 1.5, x.size).reshape(x.shape)
        return 0.5 * jnp.sum(a * (x.astype(jnp.float32) - 1.0) ** 2)

    return sum(leaf(x) for x in jax.tree.leaves(params))


def _loss_args(loss, params):
    del loss  # the caller's loss may be another objective; see the module docstring
    return {
        "value": _quadratic(params),
        "grad": jax.grad(_quadratic)(params),
        "value_fn": jax.tree_util.Partial(_quadratic),
    }


def _descending(linesearch):
    return modopt.chain(modopt.scale(-1.0), linesearch)


def _optax_descending(linesearch):
    return optax.chain(optax.scale(-1.0), linesearch)


# `memory_dtype` sets the memories of `s` and `y` only: the last parameters and gradients (whose
# differences they are), and a line search's state, keep the parameters' dtype. Its numbers are
# checked in `test_state_dtypes.py` (L-BFGS against the float32 computation on a rounded memory).
LBFGS_PARTIAL = "memory_dtype sets the memories of s and y only"

ENTRIES = [
    # --- line searches, after the negative gradient ------------------------------------
    Entry(
        "scale_by_backtracking_linesearch",
        lambda: _descending(
            modopt.scale_by_backtracking_linesearch(
                10, decrease_factor=0.5, increase_factor=2.0, store_grad=True
            )
        ),
        lambda: _optax_descending(
            optax.scale_by_backtracking_linesearch(
                10, decrease_factor=0.5, increase_factor=2.0, store_grad=True
            )
        ),
        ("slope_rtol", 1e-3),
        descent=True,
        steps_to_converge=60,
        extra_args=_loss_args,
    ),
    Entry(
        "scale_by_zoom_linesearch",
        lambda: _descending(modopt.scale_by_zoom_linesearch(12, max_learning_rate=2.0)),
        lambda: _optax_descending(optax.scale_by_zoom_linesearch(12, max_learning_rate=2.0)),
        ("curv_rtol", 0.8),
        descent=True,
        steps_to_converge=30,
        extra_args=_loss_args,
    ),
    # --- L-BFGS ---------------------------------------------------------------------------
    Entry(
        "scale_by_lbfgs",
        lambda: modopt.scale_by_lbfgs(),
        lambda: optax.scale_by_lbfgs(),
        own_rule=True,
        partial_state_dtypes=LBFGS_PARTIAL,
    ),
    Entry(
        "scale_by_lbfgs_unscaled",
        lambda: modopt.scale_by_lbfgs(memory_size=3, scale_init_precond=False),
        lambda: optax.scale_by_lbfgs(memory_size=3, scale_init_precond=False),
        own_rule=True,
        partial_state_dtypes=LBFGS_PARTIAL,
    ),
    Entry(
        "lbfgs",
        lambda: modopt.lbfgs(),
        lambda: optax.lbfgs(),
        ("slope_rtol", 1e-3),
        descent=True,
        steps_to_converge=20,
        extra_args=_loss_args,
        partial_state_dtypes=LBFGS_PARTIAL,
    ),
    Entry(
        "lbfgs_backtracking",
        lambda: modopt.lbfgs(memory_size=4, linesearch=modopt.scale_by_backtracking_linesearch(15)),
        lambda: optax.lbfgs(memory_size=4, linesearch=optax.scale_by_backtracking_linesearch(15)),
        ("decrease_factor", 0.7),
        descent=True,
        steps_to_converge=30,
        extra_args=_loss_args,
        partial_state_dtypes=LBFGS_PARTIAL,
    ),
    Entry(
        "lbfgs_no_linesearch",
        lambda: modopt.lbfgs(learning_rate=0.5, linesearch=None),
        lambda: optax.lbfgs(learning_rate=0.5, linesearch=None),
        ("learning_rate", 0.25),
        descent=True,
        steps_to_converge=60,
        own_rule=True,
        partial_state_dtypes=LBFGS_PARTIAL,
    ),
]
