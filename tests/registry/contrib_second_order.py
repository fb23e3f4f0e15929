"""Registry entries: Sophia and its Hutchinson estimator, GaLore, SAM and reduce_on_plateau
(`modopt.contrib`), compared with `optax.contrib` 0.2.8 (see `_entry.Entry`).

- Sophia and the estimator read `obj_fn`, the objective as a function of the parameters.
  Like the line searches' `value_fn` it is a `jax.tree_util.Partial` (an argument of a jitted
  `update`) of `_quadratic`, the registry's convergence loss, whatever loss the caller passes.
  Keys are given explicitly: optax's default key is raw `PRNGKey(0)` data, modopt's a typed
  key (the same stream; the states' dtypes differ). The estimator alone returns `z * (H z)`,
  not a descent direction: it does not converge.
- GaLore's entries project the 2-D leaves (and, with dimension numbers, the 3-D one) with a
  short refresh gap, so the parity steps cross a refresh of the SVD projections: at the default
  rank 128 (`galore`, which converges) and at rank 3 (`scale_by_galore_dimension_numbers`,
  too low a rank to fit the 130 x 136 leaf in 300 steps). Their projections and projected
  moments have their own sharding rule (`own_rule`).
- SAM runs in both modes; the opaque entry reads `grad_fn`, a `Partial` of the gradient of
  `_quadratic`. Its state holds both optimizers' states, each placed by its own rule.
- reduce_on_plateau reads the loss `value`. In the parity check the updates are random and
  ascend, so the loss rises and the scale is reduced within the 5 steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

import modopt
from modopt import contrib

from ._entry import MASK, Entry


def _quadratic(params):
    """`test_registry.quadratic`: 0.5 * sum_i a_i (x_i - 1)^2 with curvatures a in [0.5, 1.5]."""

    def leaf(x):
        a = jnp.linspace(0.5, 1.5, x.size).reshape(x.shape)
        return 0.5 * jnp.sum(a * (x.astype(jnp.float32) - 1.0) ** 2)

    return sum(leaf(x) for x in jax.tree.leaves(params))


def _quadratic_grad(params, step):
    del step
    return jax.grad(_quadratic)(params)


def _objective(loss, params):
    del loss, params
    return {"obj_fn": jax.tree_util.Partial(_quadratic)}


def _grad_fn(loss, params):
    del loss, params
    return {"grad_fn": jax.tree_util.Partial(_quadratic_grad)}


def _value(loss, params):
    del params
    return {"value": loss}


def _hutchinson(seed):
    return contrib.hutchinson_estimator_diag_hessian(jax.random.key(seed))


def _optax_hutchinson(seed):
    return optax.contrib.hutchinson_estimator_diag_hessian(jax.random.key(seed))


# The 3-D leaf of the registry's parameters, projected as a (2, 12) matrix; the others default.
_CUBE_DIMS = {"matrix": "default", "vector": None, "scalar": None, "cube": ((0,), (1, 2)), "big": "default"}


def _dims(numbers_type):
    def one(spec):
        if spec is None:
            return None
        return numbers_type() if spec == "default" else numbers_type(*spec)

    return {name: one(spec) for name, spec in _CUBE_DIMS.items()}


ENTRIES = [
    # --- Sophia --------------------------------------------------------------------------------
    Entry(
        "sophia",
        lambda: contrib.sophia(0.05, update_interval=2, hessian_diagonal_fn=_hutchinson(0)),
        lambda: optax.contrib.sophia(0.05, update_interval=2, hessian_diagonal_fn=_optax_hutchinson(0)),
        ("gamma", 0.02),
        descent=True,
        extra_args=_objective,
        own_rule=True,  # the moments follow the params, the estimator's key by its rule
        # Unclipped elements are `m / (gamma * h)` with `gamma * h` ~ 1e-4 here: the rounding
        # of an EMA `m` near 0 (jitted arithmetic rounds differently) grows 1e4-fold.
        tolerance=1e-4,
    ),
    Entry(
        "sophia_unclipped_masked",
        lambda: contrib.sophia(
            0.1,
            b1=0.9,
            eps=1.0,
            weight_decay=1e-3,
            weight_decay_mask=MASK,
            clip_threshold=None,
            update_interval=1,
            hessian_diagonal_fn=_hutchinson(3),
        ),
        lambda: optax.contrib.sophia(
            0.1,
            b1=0.9,
            eps=1.0,
            weight_decay=1e-3,
            weight_decay_mask=MASK,
            clip_threshold=None,
            update_interval=1,
            hessian_diagonal_fn=_optax_hutchinson(3),
        ),
        ("eps", 0.5),
        descent=True,
        extra_args=_objective,
    ),
    Entry(
        "hutchinson_estimator_diag_hessian",
        lambda: _hutchinson(5),
        lambda: _optax_hutchinson(5),
        converges=False,  # it returns the Hessian diagonal, not a step
        extra_args=_objective,
    ),
    # --- GaLore --------------------------------------------------------------------------------
    Entry(
        "galore",
        # The default rank 128: the 130 x 136 leaf is projected on 128 of its 130 directions.
        lambda: contrib.galore(0.05, update_proj_gap=2, weight_decay=1e-3),
        lambda: optax.contrib.galore(0.05, update_proj_gap=2, weight_decay=1e-3),
        ("learning_rate", 0.01),
        descent=True,
        own_rule=True,  # projections (m, r) / (n, r) and moments (r, n) / (m, r), see ScaleByGalore
    ),
    Entry(
        "scale_by_galore_dimension_numbers",
        lambda: contrib.scale_by_galore(
            rank=3,
            update_proj_gap=3,
            scale=0.5,
            base_optimizer=modopt.scale_by_lion(),
            weight_dimension_numbers=_dims(contrib.GaLoreDimensionNumbers),
        ),
        lambda: optax.contrib.scale_by_galore(
            rank=3,
            update_proj_gap=3,
            scale=0.5,
            base_optimizer=optax.scale_by_lion(),
            weight_dimension_numbers=_dims(optax.contrib.GaLoreDimensionNumbers),
        ),
        ("scale", 0.25),
        # Each step moves a matrix in a rank-3 subspace: 300 steps cannot fit a 130 x 136 one.
        converges=False,
        own_rule=True,  # as galore; the cube's merged columns (1, 2) are split on axis 2: unsplit
        partial_state_dtypes="the base optimizer (lion) has state dtypes of its own",
    ),
    # --- SAM -----------------------------------------------------------------------------------
    Entry(
        "sam",
        lambda: contrib.sam(modopt.adam(0.05), modopt.chain(contrib.normalize(), modopt.sgd(0.05))),
        lambda: optax.contrib.sam(optax.adam(0.05), optax.chain(optax.contrib.normalize(), optax.sgd(0.05))),
        ("b1", 0.8),
        descent=True,
        own_rule=True,  # each optimizer's state by its own rule, the cache like the params
    ),
    Entry(
        "sam_opaque",
        lambda: contrib.sam(
            modopt.adam(0.05),
            modopt.chain(contrib.normalize(), modopt.sgd(0.05)),
            sync_period=3,
            reset_state=False,
            opaque_mode=True,
        ),
        lambda: optax.contrib.sam(
            optax.adam(0.05),
            optax.chain(optax.contrib.normalize(), optax.sgd(0.05)),
            sync_period=3,
            reset_state=False,
            opaque_mode=True,
        ),
        ("b1", 0.8),
        descent=True,
        extra_args=_grad_fn,
        own_rule=True,  # as sam, without a cache
    ),
    # --- reduce_on_plateau ---------------------------------------------------------------------
    Entry(
        "reduce_on_plateau",
        lambda: contrib.reduce_on_plateau(factor=0.5, patience=1, accumulation_size=2, min_scale=0.1),
        lambda: optax.contrib.reduce_on_plateau(factor=0.5, patience=1, accumulation_size=2, min_scale=0.1),
        ("factor", 0.3),
        extra_args=_value,
    ),
]
