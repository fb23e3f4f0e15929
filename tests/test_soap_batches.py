"""SOAP without a mesh batches its linear algebra: the eigendecompositions (first step) and QR
steps (refreshes) of all same-size statistics, over parameters and dimensions, are one call
each, and a parameter's numbers are those it gets alone (its reference comparison:
tests/references/test_soap.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import modopt

# Statistics of sizes 6, 4 (four of them), 3 and 2: four sizes, seven statistics.
SHAPES = {"a": (6, 4), "b": (4, 6), "c": (4, 3, 2)}


def _run(tx, params, steps):
    state = tx.init(params)
    step = jax.jit(tx.update)
    out = []
    for t in range(steps):
        grads = {k: jax.random.normal(jax.random.key(10 * t + i), x.shape) for i, (k, x) in enumerate(params.items())}
        updates, state = step(grads, state)
        out.append(updates)
    return out


def test_one_eigendecomposition_and_one_qr_per_matrix_size():
    tx = modopt.scale_by_soap(precondition_frequency=2)
    params = {k: jnp.zeros(s) for k, s in SHAPES.items()}
    text = jax.jit(tx.update).lower(params, tx.init(params)).as_text()
    assert text.count("lapack_ssyevd") == 4  # one per size: 6, 4, 3, 2
    assert text.count("lapack_sgeqrf") == 4


def test_each_parameter_gets_its_numbers_alone():
    """Three steps (the first, a plain one, a refresh): batched with the others, each
    parameter's updates are those it gets alone, to float32 rounding (a batched product may sum
    in another order)."""
    tx = modopt.scale_by_soap(precondition_frequency=2)
    params = {k: jnp.zeros(s) for k, s in SHAPES.items()}
    together = _run(tx, params, 3)
    # Each alone, with the very gradients it had together.
    state = {k: tx.init({k: params[k]}) for k in params}
    for t in range(3):
        grads = {k: jax.random.normal(jax.random.key(10 * t + i), x.shape) for i, (k, x) in enumerate(params.items())}
        for k in params:
            updates, state[k] = tx.update({k: grads[k]}, state[k])
            np.testing.assert_allclose(together[t][k], updates[k], rtol=1e-5, atol=1e-6)
