"""Per-example clipping (`per_example_global_norm_clip`, `per_example_layer_norm_clip`):
functions of per-example gradients with a leading batch axis, compared with optax and with a
NumPy computation of their definitions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt

BATCH = 6


def per_example_grads(dtype=jnp.float32):
    """A batch of gradients of a small model; example 0 is all zeros, example 1 is tiny."""
    shapes = {"w": (3, 4), "b": (4,), "s": ()}
    keys = jax.random.split(jax.random.key(3), len(shapes))
    grads = {
        k: jax.random.normal(key, (BATCH, *shape), dtype) for key, (k, shape) in zip(keys, shapes.items())
    }
    scale = jnp.array([0.0, 1e-3, 1.0, 2.0, 0.5, 3.0], dtype)
    return {k: g * scale.reshape((BATCH,) + (1,) * (g.ndim - 1)) for k, g in grads.items()}


def reference_clip(leaves, clip):
    """NumPy, in float64: each example's leaves scaled by min(1, clip / their joint norm), summed."""
    leaves = [np.asarray(g, np.float64) for g in leaves]
    norms = np.sqrt(sum(np.sum(g.reshape(BATCH, -1) ** 2, axis=1) for g in leaves))
    with np.errstate(divide="ignore", invalid="ignore"):
        factors = np.where(norms > clip, clip / norms, 1.0)
    sums = [np.einsum("b,b...->...", factors, g) for g in leaves]
    return sums, int(np.sum(factors < 1.0))


def assert_close(ours, expected, rtol=1e-6):
    assert jax.tree.structure(ours) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(expected)):
        assert jnp.shape(a) == jnp.shape(b)
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("clip", [0.0, 0.5, 2.0, np.inf])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_global_norm_clip(clip, jit):
    grads = per_example_grads()
    fn = jax.jit(modopt.per_example_global_norm_clip) if jit else modopt.per_example_global_norm_clip
    summed, clipped = fn(grads, clip)
    their_summed, their_clipped = optax.per_example_global_norm_clip(grads, clip)
    assert_close(summed, their_summed)
    assert int(clipped) == int(their_clipped)
    assert jnp.result_type(clipped) == jnp.result_type(their_clipped)
    leaves, treedef = jax.tree.flatten(grads)
    expected_sums, expected_clipped = reference_clip(leaves, clip)
    assert_close(summed, treedef.unflatten(expected_sums), rtol=1e-5)
    assert int(clipped) == expected_clipped


def test_global_norm_clip_integer_grads_and_list():
    """The example of the documentation: integer gradients in a list."""
    grads = [jnp.array([[0, 0, 0], [0, 3, 4], [4, 0, 3], [3, 4, 0]])]
    for clip in (jnp.inf, 0.0, 1.25):
        ours = modopt.per_example_global_norm_clip(grads, clip)
        theirs = optax.per_example_global_norm_clip(grads, clip)
        assert_close(ours[0], theirs[0])
        assert jax.tree.map(jnp.result_type, ours[0]) == jax.tree.map(jnp.result_type, theirs[0])
        assert int(ours[1]) == int(theirs[1])


def test_global_norm_clip_keeps_bf16():
    grads = per_example_grads(jnp.bfloat16)
    ours = modopt.per_example_global_norm_clip(grads, 1.0)
    theirs = optax.per_example_global_norm_clip(grads, 1.0)
    assert jax.tree.map(jnp.result_type, ours) == jax.tree.map(jnp.result_type, theirs)
    assert_close(ours[0], theirs[0], rtol=1e-2)


@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("clip", [0.0, 1.0, 3.0, np.inf])
def test_layer_norm_clip(uniform, clip):
    grads = per_example_grads()
    summed, clipped = modopt.per_example_layer_norm_clip(grads, clip, uniform=uniform)
    their_summed, their_clipped = optax.per_example_layer_norm_clip(grads, clip, uniform=uniform)
    assert_close(summed, their_summed)
    assert jax.tree.map(int, clipped) == jax.tree.map(int, their_clipped)
    # The definition: each layer clipped on its own, to C / sqrt(K) or C * sqrt(D_k / D).
    leaves, treedef = jax.tree.flatten(grads)
    sizes = [np.prod(g.shape[1:]) for g in leaves]
    budgets = [clip / np.sqrt(len(leaves)) if uniform else clip * np.sqrt(d / sum(sizes)) for d in sizes]
    expected = [reference_clip([g], c) for g, c in zip(leaves, budgets)]
    assert_close(summed, treedef.unflatten([s[0] for s, _ in expected]), rtol=1e-5)
    assert jax.tree.leaves(jax.tree.map(int, clipped)) == [n for _, n in expected]


def test_layer_norm_clip_with_one_layer_is_global_clip():
    grads = [per_example_grads()["w"]]
    layer = modopt.per_example_layer_norm_clip(grads, 1.0)
    global_ = modopt.per_example_global_norm_clip(grads, 1.0)
    assert_close(layer[0], global_[0])
    assert int(layer[1][0]) == int(global_[1])


def test_clipped_sum_has_global_norm_at_most_clip_per_example():
    """Clipping one example at a time, every clipped gradient has norm <= C (layer-wise too)."""
    grads = per_example_grads()
    for b in range(BATCH):
        one = jax.tree.map(lambda g: g[b : b + 1], grads)
        for uniform in (True, False):
            summed, _ = modopt.per_example_layer_norm_clip(one, 1.0, uniform=uniform)
            assert float(modopt.global_norm(summed)) <= 1.0 + 1e-5
        summed, _ = modopt.per_example_global_norm_clip(one, 1.0)
        assert float(modopt.global_norm(summed)) <= 1.0 + 1e-5


@pytest.mark.parametrize("fn", [modopt.per_example_global_norm_clip, modopt.per_example_layer_norm_clip])
def test_errors(fn):
    grads = per_example_grads()
    with pytest.raises(ValueError, match=r"batch on axis 0.*\['b'\] has shape \(5,\)"):
        fn({**grads, "b": jnp.ones(5)}, 1.0)
    with pytest.raises(ValueError, match=r"\['s'\] has shape \(\)"):
        fn({**grads, "s": jnp.ones(())}, 1.0)
    with pytest.raises(ValueError, match="empty tree"):
        fn({}, 1.0)
    with pytest.raises(ValueError, match=r"Invalid .*clip: -1.0 \(must be >= 0\)"):
        fn(grads, -1.0)
