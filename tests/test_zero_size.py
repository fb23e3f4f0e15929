"""Parameters without elements (shape `(0, 3)`: a sliced or masked model's) over the registry.

Every transform handles them as Adam does: `init` and `update` run, and the update of such a
leaf has its shape and the dtype a leaf with elements gets, with no error.
The other leaves of the tree are updated alongside. Checked by abstract evaluation, once per
entry (tracing is where shapes decide: a division by a dimension, a reduction without an
identity over no elements); `test_zero_size_values` runs a few steps of the matrix
optimizers whose per-matrix work had to skip such leaves, and compares the other leaves with
the same transform on them alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from registry import ENTRIES, Entry
from test_registry import make_grads, make_params, quadratic

import modopt

# The registry's leaves, of its ranks (its masks, labels and dimension numbers name them), four
# of them without elements.
EMPTY = {"matrix": (0, 3), "vector": (0,), "cube": (2, 0, 4), "big": (0, 136)}
SHAPES = {**EMPTY, "scalar": ()}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_zero_size_leaves(entry: Entry):
    params = make_params(shapes=SHAPES)
    grads = make_grads(0, params)
    extra = entry.args(quadratic(params), params)  # outside, as the registry's steps take them
    tx = entry.make()

    def step():
        state = tx.init(params)
        updates, state = tx.update(grads, state, params, **extra)
        return tx.update(grads, state, params, **extra)[0]  # a second step reads the stored state

    updates = jax.eval_shape(step)
    assert jax.tree.structure(updates) == jax.tree.structure(params)
    for name, shape in SHAPES.items():
        assert updates[name].shape == shape, (name, updates[name].shape)
        # The dtype the scalar (a leaf with an element, of the same dtype) gets.
        assert updates[name].dtype == updates["scalar"].dtype, (name, updates[name].dtype)


def _run(tx, params, steps=3):
    state = tx.init(params)
    update = jax.jit(tx.update)
    for step in range(steps):
        updates, state = update(make_grads(step, params), state, params)
    return updates


MATRIX_OPTIMIZERS = {
    "contrib.muon": lambda: modopt.contrib.muon(0.02),
    "kron": lambda: modopt.kron(1e-3, preconditioner_update_probability=1.0),
    "soap": lambda: modopt.soap(1e-3, precondition_frequency=2),
    "shampoo": lambda: modopt.shampoo(1e-3, block_size=4, start_preconditioning_step=1),
    "adam": lambda: modopt.adam(1e-3),
}


@pytest.mark.parametrize("name", MATRIX_OPTIMIZERS)
def test_zero_size_values(name):
    """Three steps with a `(0, 3)` and a `(0,)` leaf beside a matrix and a vector: the empty
    updates are empty, and the others equal the transform's on the matrix and vector alone
    (Kron's probes are drawn per leaf from one key, so its updates there are only finite)."""
    shapes = {"matrix": (4, 3), "vector": (3,), "z_empty": (0, 3), "z_none": (0,)}
    tx = MATRIX_OPTIMIZERS[name]()
    params = make_params(shapes=shapes)
    updates = _run(tx, params)
    alone = _run(tx, {k: params[k] for k in ("matrix", "vector")})
    for name in ("z_empty", "z_none"):
        assert updates[name].shape == shapes[name] and updates[name].dtype == jnp.float32
    for name in ("matrix", "vector"):
        assert np.all(np.isfinite(updates[name])), name
        if not isinstance(tx, modopt.Kron):
            np.testing.assert_allclose(updates[name], alone[name], rtol=1e-6, atol=1e-7, err_msg=name)
