"""Huge gradients in the matrix optimizers, whose statistics and norms square them (issue 39).

Entries of `2**100` (about 1.3e30) square to about 1.6e60, beyond float32 (3.4e38). Shampoo and
SOAP keep their statistics (and SOAP its second moment) with a power-of-two scale, Kron and
Newton-Schulz scale their Gram matrices, so the numbers stay finite and follow each
optimizer's scale behaviour:

- SOAP is Adam in an eigenbasis of statistics whose eigenvectors do not change with a common
  scale of the gradients: the update for `c * g` is the update for `g`;
- Shampoo's direction does not change with the scale (its inverse roots of `c**2 L` are
  `c**(-1/2)` times those of `L`, for two sides), and grafting sets its norm: SGD grafting's is
  `||c g||`, so the update is `c` times the update for `g`; Adagrad's, normalized and
  `sqrt_n` grafting's do not change;
- Muon's Newton-Schulz divides its matrix by a norm: the orthogonalized momentum for `c * g`
  is the one for `g`;

up to the damping (`matrix_epsilon`, `eps`, relative 1e-6 and less) and rounding. Kron is
compared with NumPy in float64 (`tests/references/test_kron.py`). Ordinary gradients give the
numbers they gave: the reference tests of each optimizer still hold.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modopt

C = 2.0**100


def _grads(shapes, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for _ in range(steps)]


def _run(tx, params, grads, scale=1.0):
    state = tx.init(params)
    update = jax.jit(tx.update)
    updates = []
    for g in grads:
        u, state = update(jax.tree.map(lambda x: jnp.asarray(x * scale), g), state, params)
        updates.append(jax.tree.map(np.asarray, u))
    return updates, state


def _assert_finite(tree, what):
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if jnp.issubdtype(jnp.result_type(x), jnp.floating):
            assert np.all(np.isfinite(np.asarray(x))), f"{what}{jax.tree_util.keystr(path)}"


def _assert_updates_close(ours, expected, what, rtol=1e-4):
    for step, (u, e) in enumerate(zip(ours, expected)):
        for name in e:
            top = float(np.max(np.abs(e[name])))
            np.testing.assert_allclose(u[name], e[name], rtol=rtol, atol=0.1 * rtol * top, err_msg=f"{what}: {name}, step {step}")


@pytest.mark.parametrize("graft, power", [("sgd", 1), ("adagrad", 0), ("rmsprop_normalized", 0), ("sqrt_n", 0)])
def test_shampoo_follows_the_scale_of_the_gradients(graft, power):
    """Six steps (preconditioned from the fifth, when every statistic has full rank: a rank
    deficient one's null space takes the damping, whose rounding the roots amplify), a matrix
    in one block, one cut into padded blocks of 4, and a vector: the updates for `C * g` are
    `C**power` times those for `g`; the statistics stay finite, scaled by a power of two where
    the gradients were huge only."""
    shapes = {"w": (4, 3), "blocked": (9, 6), "v": (5,)}
    params = {k: jnp.zeros(s) for k, s in shapes.items()}
    # Sums (beta2 = 1): the statistics' small eigenvalues are then far above the initial
    # `matrix_epsilon * I`, which the huge gradients make negligible and the ordinary ones do not.
    tx = modopt.scale_by_shampoo(
        block_size=4,
        beta2=1.0,
        start_preconditioning_step=4,
        graft_type=graft,
        best_effort_shape_interpretation=False,  # matrices stay matrices
    )
    grads = _grads(shapes, 6)
    ordinary, ordinary_state = _run(tx, params, grads)
    huge, huge_state = _run(tx, params, grads, C)
    _assert_finite(huge_state, "state")
    # Within 1e-3: float32 determines the inverse roots of the statistics (condition numbers
    # ~1e2 here) only to ~1e-4 (tests/test_shampoo.py's ROOT_TOL), and the two runs' statistics
    # differ by the initial `matrix_epsilon * I`, so their Newton iterations stop at other errors.
    _assert_updates_close([jax.tree.map(lambda u: u / C**power, u) for u in huge], ordinary, "Shampoo", 1e-3)
    assert all(int(np.max(e)) == 0 for e in ordinary_state.log2_scales)
    assert all(int(np.min(e)) > 0 for e in huge_state.log2_scales)
    if graft == "adagrad":  # its sums of squares too: scaled only where huge
        assert all(int(e) == 0 for e in jax.tree.leaves(ordinary_state.diagonal_log2_scales))
        assert all(int(e) > 0 for e in jax.tree.leaves(huge_state.diagonal_log2_scales))
    # The statistics the scales stand for are C**2 times the ordinary ones (but for the initial
    # `matrix_epsilon * I`, which the huge ones make negligible).
    ours, theirs = tx.unstacked(huge_state), tx.unstacked(ordinary_state)
    for name in shapes:
        scale = np.asarray(ours.log2_scales[name], np.float64)[:, None, None]
        for s, t in zip(ours.statistics[name], theirs.statistics[name]):
            true = np.asarray(s, np.float64) * np.exp2(scale) / C**2
            np.testing.assert_allclose(true, t, rtol=1e-5, atol=1e-5, err_msg=f"statistics of {name}")


def test_soap_updates_do_not_change_with_the_scale_of_the_gradients():
    """Five steps, bases refreshed every other step, on a square matrix, a 3-d weight (each
    statistic of full rank from the first step: a rank-deficient one's eigenbasis is arbitrary
    in its null space) and a vector: the updates for `C * g` are those for `g`, and the
    state, stored with its scale, stays finite."""
    shapes = {"w": (4, 4), "cube": (2, 3, 4), "v": (5,)}
    params = {k: jnp.zeros(s) for k, s in shapes.items()}
    tx = modopt.scale_by_soap(precondition_frequency=2)
    grads = _grads(shapes, 5, seed=1)
    ordinary, ordinary_state = _run(tx, params, grads)
    huge, huge_state = _run(tx, params, grads, C)
    _assert_finite(huge_state, "state")
    _assert_updates_close(huge, ordinary, "SOAP")
    assert all(int(np.max(e)) == 0 for e in ordinary_state.log2_scales)
    assert all(int(np.min(e)) > 0 for e in huge_state.log2_scales)


@pytest.mark.parametrize("name", ["shampoo", "soap", "kron"])
def test_parameters_stay_finite(name):
    """The issue's case: `Optimizer` steps with gradients of 1e30 at the defaults."""
    params = {"w": jnp.ones((8, 6)), "b": jnp.ones(6)}
    optimizer = modopt.Optimizer(getattr(modopt, name)(1e-3), params)
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 1e30) * jnp.linspace(-1, 1, p.size).reshape(p.shape), params)
    for _ in range(2):
        params, optimizer = optimizer.step(params, grads)
    _assert_finite(params, "params")
    _assert_finite(optimizer.state, "state")


@pytest.mark.parametrize("preconditioning", ["frobenius", "spectral", "aol", "schatten"])
def test_muon_orthogonalizes_huge_momenta(preconditioning):
    """Newton-Schulz divides its matrix by a norm first (or, for AOL and Schatten, by norms of
    `X X^T`): the orthogonalized update for `C * g` is the one for `g`."""
    shapes = {"tall": (6, 4), "wide": (3, 5)}
    params = {k: jnp.zeros(s) for k, s in shapes.items()}
    tx = modopt.contrib.scale_by_muon(preconditioning=preconditioning)
    grads = _grads(shapes, 3, seed=2)
    ordinary, _ = _run(tx, params, grads)
    huge, huge_state = _run(tx, params, grads, C)
    _assert_finite(huge_state, "state")
    _assert_updates_close(huge, ordinary, f"Muon ({preconditioning})")
