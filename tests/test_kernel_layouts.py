"""Kron's and Shampoo's matrix of a kernel of rank above 2, read off the model's layers.

Oracles: an Equinox `Conv2d` computes `W.reshape(out, in * kh * kw) @ patches(x)` (checked
here against `jax.lax.conv_general_dilated_patches`), so the matrix its layer defines is that
reshape, and the same optimizer given that matrix as a bare pytree is the expected update
(Kron: the same key, probes numbered by the same entries, update probability 1). Shampoo's
unblocked update commutes with transposing a matrix and permuting its rows, so the kernel in
Flax's layout `(kh, kw, in, out)`, which its own rule merges into `(kh * kw * in, out)`, gives
the same update, transposed back.
"""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import modopt
from modopt._step.layouts import with_model_layout
from modopt.contrib import MuonDimensionNumbers
from modopt.integrations.flax import NnxOptimizer

OUT_IN = MuonDimensionNumbers(reduction_axis=1, output_axis=0)
EQX_CONV = MuonDimensionNumbers(reduction_axis=(1, 2, 3), output_axis=0)


def _conv_and_gradient(cin=2, cout=4):
    conv = eqx.nn.Conv2d(cin, cout, 3, key=jax.random.key(0))  # weight (out, in, 3, 3), bias (out, 1, 1)
    grads = eqx.filter(eqx.nn.Conv2d(cin, cout, 3, key=jax.random.key(1)), eqx.is_array)
    return conv, grads


def _step(tx, grads, params):
    """One jitted update of `tx` from its initial state: `(updates, new_state)`."""
    return eqx.filter_jit(lambda tx, g, p: tx.update(g, tx.init(p), p))(tx, grads, params)


def _with_weight(tree, f):
    """`tree` (an Equinox conv's arrays) with `f` applied to its weight, the leaf order kept."""
    return eqx.tree_at(lambda m: m.weight, tree, f(tree.weight))


def _quiet_optimizer(tx, model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", modopt.StateMemoryWarning)
        return modopt.Optimizer(tx, model)


def test_an_equinox_conv_is_its_reshaped_weight_times_the_patches():
    """The fact the other tests rest on: the layer's matrix is `(out, in * kh * kw)`."""
    conv, _ = _conv_and_gradient()
    x = jax.random.normal(jax.random.key(2), (2, 5, 5))
    patches = jax.lax.conv_general_dilated_patches(x[None], (3, 3), (1, 1), "VALID")[0]  # (in*kh*kw, 3, 3)
    as_matrix = jnp.einsum("ok,khw->ohw", conv.weight.reshape(4, -1), patches) + conv.bias
    np.testing.assert_allclose(conv(x), as_matrix, rtol=1e-5, atol=1e-5)
    assert modopt.dimension_numbers(conv, higher_rank=True).weight == EQX_CONV


def test_kron_sees_an_equinox_conv_as_its_layer_matrix():
    conv, grads = _conv_and_gradient()
    tx = modopt.kron(0.01, preconditioner_update_probability=1.0, key=jax.random.key(7))
    filled = _quiet_optimizer(tx, conv).tx
    params = eqx.filter(conv, eqx.is_array)
    ours, state = _step(filled, grads, params)
    inner = filled.build().transforms[0]
    factors = inner.unstacked(state[0]).Qs
    assert [q.shape for q in factors.weight] == [(4, 4), (18, 18)]  # (out, out), (in*kh*kw, in*kh*kw)
    # The same optimizer on the reshaped matrix, a bare pytree (its own rule: no reshape).
    flat = lambda w: w.reshape(4, -1)  # noqa: E731
    theirs, their_state = _step(tx, _with_weight(grads, flat), _with_weight(params, flat))
    np.testing.assert_allclose(flat(ours.weight), theirs.weight, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(ours.bias, theirs.bias, rtol=1e-6, atol=1e-9)
    their_factors = tx.build().transforms[0].unstacked(their_state[0]).Qs
    for q, expected in zip(factors.weight, their_factors.weight):
        np.testing.assert_allclose(q, expected, rtol=1e-6, atol=1e-9)
    # On its own, the transform keeps the reference's rule: (out * in * kh, kw).
    assert [q.shape for q in tx.build().transforms[0].unstacked(tx.init(params)[0]).Qs.weight] == [(24, 24), (3, 3)]
    # The tree of `dimension_numbers(model, higher_rank=True)` gives it the layer's matrix too.
    given = modopt.kron(0.01, weight_dimension_numbers=modopt.dimension_numbers(conv, higher_rank=True))
    assert [q.shape for q in given.build().transforms[0].unstacked(given.init(params)[0]).Qs.weight] == [(4, 4), (18, 18)]


def test_shampoo_sees_an_equinox_conv_as_the_flax_kernel_transposed():
    """Unblocked (blocks of 64 >= 36): the update of the Equinox kernel is that of Flax's
    `(kh, kw, in, out)` kernel transposed back. With `merge_small_dims_block_size=64` Flax's
    kernel `(3, 3, 2, 4)` merges into `(18, 4)` and the Equinox kernel `(4, 2, 3, 3)`, read
    off its layer, is `(4, 18)` (its stored-order merge would be `(24, 3)`)."""
    conv, grads = _conv_and_gradient()
    tx = modopt.shampoo(0.1, block_size=64, merge_small_dims_block_size=64, start_preconditioning_step=0, graft_type="sgd")
    filled = _quiet_optimizer(tx, conv).tx
    params = eqx.filter(conv, eqx.is_array)
    ours, state = _step(filled, grads, params)
    statistics = filled.build().transforms[0].unstacked(state[0]).statistics
    assert [s.shape for s in statistics.weight] == [(1, 4, 4), (1, 18, 18)]
    assert [s.shape for s in tx.build().transforms[0].unstacked(tx.init(params)[0]).statistics.weight] == [
        (1, 24, 24),
        (1, 3, 3),
    ]
    to_flax = lambda w: jnp.transpose(w, (2, 3, 1, 0))  # noqa: E731
    theirs, their_state = _step(tx, _with_weight(grads, to_flax), _with_weight(params, to_flax))
    their_statistics = tx.build().transforms[0].unstacked(their_state[0]).statistics
    assert [s.shape for s in their_statistics.weight] == [(1, 18, 18), (1, 4, 4)]
    np.testing.assert_allclose(ours.weight, jnp.transpose(theirs.weight, (3, 2, 0, 1)), rtol=2e-4, atol=1e-7)
    np.testing.assert_allclose(ours.bias, theirs.bias, rtol=2e-4, atol=1e-7)
    # The output side's statistic is the same matrix (the input side's, permuted).
    np.testing.assert_allclose(statistics.weight[0], their_statistics.weight[1], rtol=1e-5)


def test_shampoo_blocks_an_equinox_conv_matrix_as_any_matrix():
    """Blocks of 8: the `(4, 18)` matrix in 3 blocks along its 18 inputs (8, 8, 2 padded),
    the same as the kernel stored `(in, kh, kw, out)` (the same rows in the same order),
    transposed."""
    conv, grads = _conv_and_gradient()
    tx = modopt.scale_by_shampoo(block_size=8, merge_small_dims_block_size=64, start_preconditioning_step=0)
    filled = with_model_layout(tx, conv, "test")
    params = eqx.filter(conv, eqx.is_array)
    ours, state = _step(filled, grads, params)
    assert [s.shape for s in filled.unstacked(state).statistics.weight] == [(3, 4, 4), (3, 8, 8)]
    to_rows = lambda w: jnp.transpose(w, (1, 2, 3, 0))  # noqa: E731
    theirs, _ = _step(tx, _with_weight(grads, to_rows), _with_weight(params, to_rows))
    np.testing.assert_allclose(ours.weight, jnp.transpose(theirs.weight, (3, 0, 1, 2)), rtol=2e-4, atol=1e-7)


def test_models_whose_kernels_need_no_reshape_keep_the_transform():
    """Linear layers only (Equinox), or Flax's convolutions (already `(*spatial, in, out)`):
    the transform is left as it is, so its state and updates are those of the bare
    transform (the code path of a bare `tx.init(params)`)."""
    mlp = eqx.nn.MLP(6, 3, 5, 1, key=jax.random.key(0))
    flax_conv = nnx.Conv(2, 4, (3, 3), rngs=nnx.Rngs(0))
    for tx in (modopt.kron(0.01), modopt.shampoo(0.01), modopt.scale_by_kron(), modopt.scale_by_shampoo()):
        assert with_model_layout(tx, mlp, "test") is tx
        assert with_model_layout(tx, flax_conv, "test") is tx
        assert modopt.dimension_numbers(flax_conv, higher_rank=True)["kernel"] == MuonDimensionNumbers((0, 1, 2), 3)
    assert NnxOptimizer(flax_conv, modopt.kron(0.01)).tx.weight_dimension_numbers is None


def test_explicit_choices_are_kept():
    conv, _ = _conv_and_gradient()
    params = eqx.filter(conv, eqx.is_array)
    unmerged = with_model_layout(modopt.scale_by_kron(merge_dims=False), conv, "test")
    assert [q.shape for q in unmerged.unstacked(unmerged.init(params)).Qs.weight] == [(4, 4), (2, 2), (3, 3), (3, 3)]
    # A wrong layout given by hand is used as given: the kernel read as (out * in, kh * kw).
    wrong = {"weight": MuonDimensionNumbers(reduction_axis=(2, 3), output_axis=(0, 1)), "bias": None}
    tx = modopt.scale_by_kron(weight_dimension_numbers=wrong)
    assert with_model_layout(tx, conv, "test") is tx
    as_dict = {"weight": conv.weight, "bias": conv.bias}
    assert [q.shape for q in tx.unstacked(tx.init(as_dict)).Qs["weight"]] == [(8, 8), (9, 9)]


@pytest.mark.parametrize("tx", [modopt.scale_by_kron, modopt.scale_by_shampoo])
@pytest.mark.parametrize(
    "dims, problem",
    [
        (MuonDimensionNumbers(reduction_axis=1, output_axis=0), "no batch axes"),  # axes 2, 3 are batch axes
        (MuonDimensionNumbers(reduction_axis=(0, 2), output_axis=(1, 3)), "run of neighbouring axes"),
        (MuonDimensionNumbers(reduction_axis=4, output_axis=0), "invalid reduction_axis"),
    ],
)
def test_dimension_numbers_that_make_no_matrix_are_an_error_naming_the_path(tx, dims, problem):
    params = {"conv": jnp.zeros((4, 2, 3, 3)), "bias": jnp.zeros(4)}
    transform = tx(weight_dimension_numbers={"conv": dims, "bias": None})
    with pytest.raises(ValueError, match=rf"(?s)(?=.*\['conv'\])(?=.*{problem})"):
        transform.init(params)


def test_muon_gets_the_matrices_and_kron_the_kernels():
    """In one transform, Muon's dimension numbers stay optax's choice (matrices only), Kron's
    name the kernels its own rule would misread; a matrix outside a known layer is no warning
    for Kron (a matrix's orientation does not change its update)."""

    class Net(eqx.Module):
        conv: eqx.nn.Conv2d
        linear: eqx.nn.Linear
        table: jax.Array

    net = Net(eqx.nn.Conv2d(2, 4, 3, key=jax.random.key(0)), eqx.nn.Linear(18, 4, key=jax.random.key(1)), jnp.ones((3, 5)))
    params = eqx.filter(net, eqx.is_array)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kron = with_model_layout(modopt.kron(0.01), net, "test")
    with pytest.warns(UserWarning, match=r"layout of 1 matrix \(\.table\)"):
        both = with_model_layout(modopt.chain(modopt.contrib.scale_by_muon(), modopt.scale_by_kron()), net, "test")
    muon_dims, kron_dims = (t.weight_dimension_numbers(params) for t in both.transforms)
    assert (muon_dims.linear.weight, muon_dims.conv.weight) == (OUT_IN, None)
    assert kron_dims.conv.weight == EQX_CONV and kron.weight_dimension_numbers(params).conv.weight == EQX_CONV


def test_stacks_group_kernels_by_their_matrix():
    """The conv's `(4, 18)` matrix and the Linear(18, 4) weight `(4, 18)` share one stack of
    Kron's factors; Shampoo's statistics of the conv are those of its `(4, 18)` matrix (its
    blocks move in the kernel's own axes, so they stack apart from the Linear's)."""

    class Net(eqx.Module):
        conv: eqx.nn.Conv2d
        linear: eqx.nn.Linear

    net = Net(eqx.nn.Conv2d(2, 4, 3, use_bias=False, key=jax.random.key(0)), eqx.nn.Linear(18, 4, use_bias=False, key=jax.random.key(1)))
    params = eqx.filter(net, eqx.is_array)
    kron = with_model_layout(modopt.scale_by_kron(), net, "test")
    assert [q.shape for q in kron.init(params).Qs[0]] == [(2, 4, 4), (2, 18, 18)] and len(kron.init(params).Qs) == 1
    shampoo = with_model_layout(modopt.scale_by_shampoo(block_size=32, merge_small_dims_block_size=16), net, "test")
    statistics = shampoo.unstacked(shampoo.init(params)).statistics
    assert [s.shape for s in statistics.conv.weight] == [s.shape for s in statistics.linear.weight] == [(1, 4, 4), (1, 18, 18)]


def test_nnx_linear_general_with_several_output_axes():
    """NNX's `LinearGeneral(8, (2, 3))` kernel `(8, 2, 3)` is the matrix `(8, 6)`; the default
    rule would make it `(16, 3)`."""
    layer = nnx.LinearGeneral(8, (2, 3), use_bias=False, rngs=nnx.Rngs(0))
    optimizer = NnxOptimizer(layer, modopt.scale_by_kron())
    factors = optimizer.tx.unstacked(nnx.as_pure(optimizer.opt_state)).Qs["kernel"]
    assert [q.shape for q in factors] == [(8, 8), (6, 6)]
