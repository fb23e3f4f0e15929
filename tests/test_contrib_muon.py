"""Muon, ADOPT and MADGRAD beyond the registry: dimension numbers of higher-rank weights
against optax, the orthogonality of Newton-Schulz's output, a NumPy Newton-Schulz written from
the method's definition, bad arguments (errors naming the parameter's path), ADOPT's clipping
and MADGRAD's inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import modopt
from modopt import contrib
from modopt.contrib import MuonDimensionNumbers


def close(ours, theirs, rtol=1e-5, atol=1e-6):
    """Same structure by path, same numbers within tolerance."""
    a = jax.tree_util.tree_flatten_with_path(ours)[0]
    b = jax.tree_util.tree_flatten_with_path(theirs)[0]
    assert [jax.tree_util.keystr(p) for p, _ in a] == [jax.tree_util.keystr(p) for p, _ in b]
    for (path, x), (_, y) in zip(a, b):
        np.testing.assert_allclose(
            np.asarray(x), np.asarray(y), rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path)
        )


def run(tx, params, steps=3):
    """`steps` jitted updates on fixed pseudo-random gradients; the last updates and state."""
    update = jax.jit(tx.update)
    state = tx.init(params)
    for step in range(steps):
        keys = jax.random.split(jax.random.key(step), len(jax.tree.leaves(params)))
        grads = jax.tree.unflatten(
            jax.tree.structure(params),
            [jax.random.normal(k, x.shape) for k, x in zip(keys, jax.tree.leaves(params))],
        )
        updates, state = update(grads, state, params)
        params = jax.tree.map(jnp.add, params, updates)
    return updates, state


PARAMS = {
    "conv": jax.random.normal(jax.random.key(0), (3, 3, 4, 6)),  # HWIO kernel
    "heads": jax.random.normal(jax.random.key(1), (5, 4, 2)),  # (out, heads, in)
    "w": jax.random.normal(jax.random.key(2), (6, 5)),
    "b": jax.random.normal(jax.random.key(3), (6,)),
}
AXES = {"conv": ((0, 1, 2), 3), "heads": (-1, 0), "w": (0, 1), "b": None}


def dims(kind):
    return {name: None if axes is None else kind(*axes) for name, axes in AXES.items()}


@pytest.mark.parametrize("preconditioning", ["frobenius", "schatten"])
def test_muon_dimension_numbers_of_higher_rank_weights_match_optax(preconditioning):
    """A 4-d kernel (reduction axes flattened together), a 3-d weight with a batch axis and a
    negative reduction axis, a matrix, and a vector left to Adam."""
    ours = contrib.muon(
        0.02, preconditioning=preconditioning, muon_weight_dimension_numbers=dims(MuonDimensionNumbers)
    )
    theirs = optax.contrib.muon(
        0.02,
        preconditioning=preconditioning,
        muon_weight_dimension_numbers=dims(optax.contrib.MuonDimensionNumbers),
    )
    close(run(ours, PARAMS), run(theirs, PARAMS))


def test_muon_dimension_numbers_from_a_function_match_optax():
    """A function of the params gives the dimension numbers: Muon for rank >= 3 only (by the
    first and last axes), Adam for matrices and vectors."""

    def by_rank(kind):
        return lambda params: jax.tree.map(lambda x: kind(0, -1) if x.ndim >= 3 else None, params)

    ours = contrib.muon(0.02, weight_decay=0.1, muon_weight_dimension_numbers=by_rank(MuonDimensionNumbers))
    theirs = optax.contrib.muon(
        0.02, weight_decay=0.1, muon_weight_dimension_numbers=by_rank(optax.contrib.MuonDimensionNumbers)
    )
    close(run(ours, PARAMS), run(theirs, PARAMS))


def test_scale_by_muon_alone_matches_optax():
    """`scale_by_muon` on one matrix, on a 3-d weight with its dimension numbers, and with the
    spectral scaling and a table of coefficients."""
    matrix = jax.random.normal(jax.random.key(4), (7, 5))
    close(run(contrib.scale_by_muon(), matrix), run(optax.contrib.scale_by_muon(), matrix))
    cube = {"k": PARAMS["heads"]}
    ours = contrib.scale_by_muon(beta=0.9, weight_dimension_numbers={"k": MuonDimensionNumbers(-1, 0)})
    theirs = optax.contrib.scale_by_muon(
        beta=0.9, weight_dimension_numbers={"k": optax.contrib.MuonDimensionNumbers(-1, 0)}
    )
    close(run(ours, cube), run(theirs, cube))
    table = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037))
    ours = contrib.scale_by_muon(table, ns_steps=3, preconditioning="spectral", nesterov=False)
    theirs = optax.contrib.scale_by_muon(table, ns_steps=3, preconditioning="spectral", nesterov=False)
    close(run(ours, matrix), run(theirs, matrix), rtol=1e-4, atol=1e-5)  # an SVD-based norm


def test_muon_on_transformer_matrices_equals_optax_bit_for_bit():
    """The transformer job's matrices (width 64: square, wide and tall; Equinox's `(out, in)`
    layout) under `jax.jit`: modopt's Muon runs the program optax's runs, so the numbers are the
    same to the last bit, the premise of comparing the two in the time-to-result benchmark (a
    difference of one rounding grows over hundreds of steps)."""
    shapes = {"attention": (64, 64), "up": (256, 64), "down": (64, 256), "norm": (64,)}
    params = {k: jax.random.normal(jax.random.key(i), s) for i, (k, s) in enumerate(shapes.items())}

    def layout(kind):
        return {k: kind(reduction_axis=1, output_axis=0) if len(s) == 2 else None for k, s in shapes.items()}

    ours = contrib.muon(0.02, weight_decay=0.1, muon_weight_dimension_numbers=layout(MuonDimensionNumbers))
    theirs = optax.contrib.muon(
        0.02, weight_decay=0.1, muon_weight_dimension_numbers=layout(optax.contrib.MuonDimensionNumbers)
    )
    close(run(ours, params, steps=4), run(theirs, params, steps=4), rtol=0, atol=0)


def test_optax_dimension_numbers_are_accepted():
    ours = contrib.muon(0.02, muon_weight_dimension_numbers=dims(optax.contrib.MuonDimensionNumbers))
    theirs = contrib.muon(0.02, muon_weight_dimension_numbers=dims(MuonDimensionNumbers))
    close(run(ours, PARAMS, steps=1), run(theirs, PARAMS, steps=1), rtol=0, atol=0)


def numpy_newton_schulz(g, coeffs=(3.4445, -4.7750, 2.0315), steps=5):
    """The quintic Newton-Schulz iteration in float64, from its definition: X = G / ||G||_F,
    then X <- a X + (b A + c A^2) X with A = X X^T, on the wide orientation."""
    x = np.asarray(g, np.float64)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / np.linalg.norm(x)
    a, b, c = coeffs
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def orthogonalized(g, **kwargs):
    """The first update of `scale_by_muon` without momentum effects (beta = 0)."""
    tx = contrib.scale_by_muon(beta=0.0, nesterov=False, **kwargs)
    return tx.update(g, tx.init(g))[0]


@pytest.mark.parametrize("shape", [(48, 32), (32, 48)])
def test_newton_schulz_matches_numpy_and_orthogonalizes(shape):
    """Against the float64 reference; the singular vectors are the input's (the iteration is an
    odd matrix polynomial), and every singular value lands near 1."""
    g = jax.random.normal(jax.random.key(5), shape)
    out = np.asarray(orthogonalized(g), np.float64)
    np.testing.assert_allclose(out, numpy_newton_schulz(g), atol=2e-4)
    u, s, vt = np.linalg.svd(np.asarray(g, np.float64), full_matrices=False)
    rotated = u.T @ out @ vt.T  # diagonal when out = U f(S) V^T
    off = rotated - np.diag(np.diag(rotated))
    assert np.max(np.abs(off)) < 1e-3
    singular = np.linalg.svd(out, compute_uv=False)
    assert singular.min() > 0.6 and singular.max() < 1.25, singular  # the default coefficients' band
    assert np.all(np.diag(rotated) > 0.6)


def test_more_steps_with_convergent_coefficients_reach_exact_orthogonality():
    """With the classic cubic-like coefficients (1.5, -0.5, 0), Newton-Schulz converges to the
    polar factor U V^T: singular values 1 to float precision."""
    g = jax.random.normal(jax.random.key(6), (24, 16))
    out = orthogonalized(g, ns_coeffs=(1.5, -0.5, 0.0), ns_steps=40)
    singular = np.linalg.svd(np.asarray(out, np.float64), compute_uv=False)
    np.testing.assert_allclose(singular, 1.0, atol=1e-4)
    u, _, vt = np.linalg.svd(np.asarray(g, np.float64), full_matrices=False)
    np.testing.assert_allclose(np.asarray(out), u @ vt, atol=1e-4)


def test_each_batch_slice_is_orthogonalized_on_its_own():
    """Axis 0 a batch axis: each (3, 4) slice's update is that slice's Newton-Schulz."""
    g = jax.random.normal(jax.random.key(7), (2, 3, 4))
    out = orthogonalized(g, weight_dimension_numbers=MuonDimensionNumbers(1, 2))
    for i in range(2):
        np.testing.assert_allclose(np.asarray(out[i]), numpy_newton_schulz(g[i]), atol=2e-4)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (
            {"conv": MuonDimensionNumbers(0, 0), "heads": None, "w": None, "b": None},
            r"\['conv'\].*overlapping",
        ),
        (
            {"conv": MuonDimensionNumbers(4, 3), "heads": None, "w": None, "b": None},
            r"reduction_axis 4.*\['conv'\] of rank 4",
        ),
        (
            {"conv": MuonDimensionNumbers((0, 0), 3), "heads": None, "w": None, "b": None},
            r"\['conv'\].*repeat",
        ),
        ({"conv": None, "heads": None, "w": None, "b": MuonDimensionNumbers()}, r"\['b'\] has shape \(6,\)"),
        ({"conv": None, "heads": None, "w": None}, r"no entry for 'b'"),
        ({"conv": "yes", "heads": None, "w": None, "b": None}, r"hold 'yes' \(a str\) at \['conv'\]"),
    ],
    ids=["overlap", "out-of-range", "repeated", "vector", "missing-entry", "not-dimension-numbers"],
)
def test_bad_dimension_numbers_name_the_parameter(spec, match):
    """Errors at init (before any step), naming the path of the offending parameter."""
    with pytest.raises(ValueError, match=match):
        contrib.muon(0.02, muon_weight_dimension_numbers=spec).init(PARAMS)


def test_scale_by_muon_needs_dimension_numbers_for_non_matrices():
    with pytest.raises(ValueError, match=r"\['heads'\] has shape \(5, 4, 2\), not a matrix"):
        contrib.scale_by_muon().init({"heads": PARAMS["heads"]})


def test_bad_coefficients_and_steps():
    with pytest.raises(
        ValueError, match=r"Invalid ns_coeffs: 'jordan' \(the presets are 'standard', 'dion'\)"
    ):
        contrib.muon(0.02, "jordan")
    with pytest.raises(ValueError, match=r"must have shape \(3,\) or \(steps, 3\)"):
        contrib.scale_by_muon((1.0, 2.0))
    with pytest.raises(ValueError, match=r"5 rows of coefficients for ns_steps=3"):
        contrib.muon(0.02, "dion", ns_steps=3)
    with pytest.raises(ValueError, match=r"Invalid ns_steps: -1"):
        contrib.scale_by_muon(ns_steps=-1)
    with pytest.raises(ValueError, match=r"Invalid preconditioning: 'svd'"):
        contrib.muon(0.02, preconditioning="svd")
    with pytest.raises(ValueError, match=r"Invalid beta: 1.0"):
        contrib.muon(0.02, beta=1.0)


def test_muon_state_follows_the_parameters_sharding():
    """Muon's momentum takes its parameter's spec; the count and coefficients are replicated;
    Adam's moments follow the vector."""
    params = {"w": jnp.zeros((8, 4)), "b": jnp.zeros((8,))}
    specs = {"w": P("model", None), "b": P("model")}
    state_specs = contrib.muon(0.02).state_specs(params, specs)
    muon_state = state_specs.inner_states["muon"].inner_state[0]
    assert muon_state.mu["w"] == P("model", None)
    assert muon_state.count == P() and muon_state.ns_coeffs == P()
    adam_state = state_specs.inner_states["adam"].inner_state[0]
    assert adam_state.mu["b"] == P("model") and adam_state.nu["b"] == P("model")


def test_muon_hyperparameters_change_without_rebuilding():
    """The rates are leaves: `Optimizer.set` changes them, and Adam's rate follows Muon's unless given."""
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones((3,))}
    optimizer = modopt.Optimizer(contrib.muon(0.02), params)
    changed = optimizer.set(learning_rate=0.01, adam_b1=0.8)
    expected = modopt.Optimizer(contrib.muon(0.01, adam_b1=0.8), params)
    grads = jax.tree.map(jnp.ones_like, params)
    close(changed.step(params, grads)[0], expected.step(params, grads)[0], rtol=0, atol=0)


def test_adopt_first_update_is_zero_and_clipping_bounds_the_second():
    """Step 0 only measures v (update 0); at step 1 the default bound is 1 ** 0.25 = 1, so a
    gradient 1000x the first one moves m by (1 - b1) * 1, not (1 - b1) * 1000."""
    params = jnp.zeros(3)
    first, big = jnp.ones(3), 1000.0 * jnp.ones(3)
    for use_clipping, expected in ((True, 0.1), (False, 100.0)):
        tx = contrib.scale_by_adopt(b1=0.9, use_clipping=use_clipping)
        updates, state = tx.update(first, tx.init(params))
        np.testing.assert_array_equal(updates, 0.0)
        updates, state = tx.update(big, state)
        np.testing.assert_allclose(updates, expected, rtol=1e-6)


def test_madgrad_needs_params_and_real_numbers():
    tx = contrib.madgrad(0.01)
    params = jnp.ones(3)
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(params, tx.init(params))
    with pytest.raises(TypeError, match="complex"):
        tx.init(jnp.ones(3, jnp.complex64))


def test_madgrad_reports_its_scheduled_learning_rate():
    schedule = modopt.linear_schedule(0.1, 0.05, 10)
    params = jnp.ones(3)
    optimizer = modopt.Optimizer(contrib.madgrad(schedule), params)
    params, optimizer = optimizer.step(params, jnp.ones(3))
    assert float(optimizer.learning_rate) == pytest.approx(0.095)


def test_scale_by_muon_without_dimension_numbers_takes_a_tree_of_matrices():
    """optax 0.2.8's `scale_by_muon()` fails on a tree of several matrices without dimension
    numbers; modopt's treats each as a matrix, as optax does given the default numbers per leaf."""
    params = {
        "a": jax.random.normal(jax.random.key(8), (3, 4)),
        "b": jax.random.normal(jax.random.key(9), (6, 5)),
    }
    default = {name: optax.contrib.MuonDimensionNumbers() for name in params}
    close(
        run(contrib.scale_by_muon(), params),
        run(optax.contrib.scale_by_muon(weight_dimension_numbers=default), params),
    )
