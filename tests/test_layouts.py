"""Muon's layout read off the model (`modopt.dimension_numbers`, `Optimizer`, `NnxOptimizer`).

The oracle is a property: an Equinox layer and a Flax layer computing the same function store
the same weight transposed (`(out, in)` against `(in, out)`), so Muon's update of one is the
transposed update of the other; and optax's Muon given the right dimension numbers by hand.
"""

from __future__ import annotations

import warnings

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import modopt
from modopt.contrib import MuonDimensionNumbers
from modopt.integrations.flax import NnxOptimizer

OUT_IN = MuonDimensionNumbers(reduction_axis=1, output_axis=0)
LR = 0.01


# Updates read as differences of parameters carry the parameters' rounding (values up to ~3).
DIFF = dict(rtol=1e-5, atol=3e-7)


def _update(optimizer, model, grads):
    """The change one `Optimizer.step` makes to the model's arrays."""
    new, _ = optimizer.step(model, grads)
    return jax.tree.map(lambda a, b: a - b, eqx.filter(new, eqx.is_array), eqx.filter(model, eqx.is_array))


def _linear_and_gradient():
    model = eqx.nn.Linear(64, 16, key=jax.random.key(0))
    grads = eqx.nn.Linear(64, 16, key=jax.random.key(1))  # a gradient shaped like the model
    return model, eqx.filter(grads, eqx.is_array)


def _optax_muon(params, grads, numbers=None):
    """optax's Muon update (its matrices only: optax 0.2.8 takes no `None` entries)."""
    as_optax = lambda d: optax.contrib.MuonDimensionNumbers(*d)  # noqa: E731
    is_dims = lambda x: isinstance(x, MuonDimensionNumbers)  # noqa: E731
    numbers = None if numbers is None else jax.tree.map(as_optax, numbers, is_leaf=is_dims)
    oracle = optax.contrib.muon(LR, muon_weight_dimension_numbers=numbers)
    return oracle.update(grads, oracle.init(params), params)[0]


def test_issue_example_the_default_update_is_the_correctly_oriented_one():
    """eqx.nn.Linear(64, 16): optax's layout took the (16, 64) weight as 16 inputs, 64 outputs
    and scaled by sqrt(64 / 16) = 2; read off the layer it is 64 inputs, 16 outputs."""
    model, grads = _linear_and_gradient()
    derived = _update(modopt.Optimizer(modopt.contrib.muon(LR), model), model, grads)
    expected = _optax_muon({"weight": model.weight}, {"weight": grads.weight}, {"weight": OUT_IN})
    np.testing.assert_allclose(derived.weight, expected["weight"], **DIFF)
    # The transform on its own (a bare pytree) keeps optax's layout: twice the norm.
    bare = modopt.contrib.muon(LR)
    params = eqx.filter(model, eqx.is_array)
    updates, _ = bare.update(grads, bare.init(params), params)
    np.testing.assert_allclose(jnp.linalg.norm(updates.weight), 2 * jnp.linalg.norm(derived.weight), rtol=1e-5)


@pytest.mark.parametrize("name", ["muon", "normuon", "adamuon"])
def test_equinox_linear_update_is_the_flax_dense_update_transposed(name):
    """The same function stored (out, in) by Equinox and (in, out) by Flax linen."""
    tx = {"muon": modopt.contrib.muon(LR), "normuon": modopt.normuon(LR), "adamuon": modopt.adamuon(LR)}[name]
    model, grads = _linear_and_gradient()
    dense = nn.Dense(16)
    x = jax.random.normal(jax.random.key(2), (3, 64))
    variables = {"params": {"kernel": model.weight.T, "bias": model.bias}}
    np.testing.assert_allclose(dense.apply(variables, x), jax.vmap(model)(x), rtol=1e-5, atol=1e-5)
    ours = _update(modopt.Optimizer(tx, model), model, grads)
    flax_params = variables["params"]
    flax_dims = modopt.dimension_numbers(dense, flax_params, x)  # Dense: optax's (in, out)
    assert flax_dims == {"kernel": MuonDimensionNumbers(0, 1), "bias": None}
    theirs = _update(modopt.Optimizer(tx, flax_params), flax_params, {"kernel": grads.weight.T, "bias": grads.bias})
    np.testing.assert_allclose(ours.weight, theirs["kernel"].T, **DIFF)
    np.testing.assert_allclose(ours.bias, theirs["bias"], **DIFF)


def test_equinox_conv_update_is_the_flax_conv_update_transposed():
    """With `higher_rank=True` a convolution is Muon's: Equinox's (out, in, kh, kw) kernel and
    Flax's (kh, kw, in, out) hold one matrix, rows ordered differently (Newton-Schulz commutes
    with permuting rows), so the updates agree up to the transposition; and optax's Muon with
    the same dimension numbers by hand gives Equinox's."""
    conv = eqx.nn.Conv2d(4, 16, 4, key=jax.random.key(0))  # a (64, 16) matrix, as the other tests'
    grads = eqx.filter(eqx.nn.Conv2d(4, 16, 4, key=jax.random.key(1)), eqx.is_array)
    to_flax = lambda w: jnp.transpose(w, (2, 3, 1, 0))  # noqa: E731
    module = nn.Conv(16, (4, 4), padding="VALID")
    variables = {"params": {"kernel": to_flax(conv.weight), "bias": conv.bias[:, 0, 0]}}
    x = jax.random.normal(jax.random.key(2), (1, 6, 6, 4))
    np.testing.assert_allclose(module.apply(variables, x)[0], jnp.moveaxis(conv(jnp.moveaxis(x[0], -1, 0)), 0, -1), rtol=1e-4, atol=1e-4)

    dims = modopt.dimension_numbers(conv, higher_rank=True)
    assert dims.weight == MuonDimensionNumbers(reduction_axis=(1, 2, 3), output_axis=0) and dims.bias is None
    flax_dims = modopt.dimension_numbers(module, variables, x, higher_rank=True)["params"]
    assert flax_dims == {"kernel": MuonDimensionNumbers(reduction_axis=(0, 1, 2), output_axis=3), "bias": None}

    params = eqx.filter(conv, eqx.is_array)
    tx = modopt.contrib.muon(LR, muon_weight_dimension_numbers=dims)
    ours, _ = tx.update(grads, tx.init(params), params)
    flax_tx = modopt.contrib.muon(LR, muon_weight_dimension_numbers=flax_dims)
    flax_params = variables["params"]
    flax_grads = {"kernel": to_flax(grads.weight), "bias": grads.bias[:, 0, 0]}
    theirs, _ = flax_tx.update(flax_grads, flax_tx.init(flax_params), flax_params)
    np.testing.assert_allclose(to_flax(ours.weight), theirs["kernel"], rtol=1e-4, atol=1e-8)
    expected = _optax_muon({"weight": conv.weight}, {"weight": grads.weight}, {"weight": dims.weight})
    np.testing.assert_allclose(ours.weight, expected["weight"], rtol=1e-5, atol=1e-9)
    # The Optimizer's own default keeps optax's choice of matrices: a kernel of rank 4 is Adam's.
    assert modopt.dimension_numbers(conv).weight is None


def test_nnx_layers_and_nnx_optimizer():
    """NNX stores a Linear kernel (in, out): optax's layout, so its update is optax's default;
    an `Einsum` kernel written (out, in) is read from its equation, and matches optax's Muon
    given (1, 0) by hand."""

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(64, 16, rngs=rngs)
            self.einsum = nnx.Einsum("bi,oi->bo", (16, 64), rngs=rngs)  # (out, in)

    model = Net(nnx.Rngs(0))
    dims = modopt.dimension_numbers(model)
    assert dims["linear"]["kernel"] == MuonDimensionNumbers(0, 1)
    assert dims["einsum"]["kernel"] == OUT_IN
    params = nnx.as_pure(nnx.state(model, nnx.Param))
    before = jax.tree.map(jnp.copy, params)
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(3), p.shape), params)
    optimizer = NnxOptimizer(model, modopt.contrib.muon(LR))
    optimizer.update(model, grads)
    ours = jax.tree.map(lambda a, b: a - b, nnx.as_pure(nnx.state(model, nnx.Param)), before)
    kernels = lambda tree: {layer: {"kernel": tree[layer]["kernel"]} for layer in ("linear", "einsum")}  # noqa: E731
    numbers = {"linear": {"kernel": MuonDimensionNumbers(0, 1)}, "einsum": {"kernel": OUT_IN}}
    expected = _optax_muon(kernels(before), kernels(grads), numbers)
    for layer in ("linear", "einsum"):
        np.testing.assert_allclose(ours[layer]["kernel"], expected[layer]["kernel"], **DIFF)


def test_explicit_dimension_numbers_are_kept():
    """A layout the user gives, even the wrong one, is used as given."""
    model, grads = _linear_and_gradient()
    is_dims = lambda x: isinstance(x, MuonDimensionNumbers)  # noqa: E731
    numbers = eqx.tree_at(lambda m: m.weight, modopt.dimension_numbers(model), MuonDimensionNumbers(0, 1), is_leaf=is_dims)
    wrong = modopt.contrib.muon(LR, muon_weight_dimension_numbers=numbers)
    optimizer = modopt.Optimizer(wrong, model)
    assert optimizer.tx.muon_weight_dimension_numbers == wrong.muon_weight_dimension_numbers
    expected = _optax_muon({"weight": model.weight}, {"weight": grads.weight})  # optax's default: the same layout
    np.testing.assert_allclose(_update(optimizer, model, grads).weight, expected["weight"], **DIFF)


def test_bare_pytrees_and_plain_dicts_keep_optax_layout():
    """`tx.init`/`update` on a pytree, and an `Optimizer` of a plain dict, are optax's Muon."""
    params = {"w": jax.random.normal(jax.random.key(0), (16, 64)), "b": jnp.zeros(64)}
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), p.shape), params)
    expected = _optax_muon(params, grads)
    tx = modopt.contrib.muon(LR)
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], expected["w"], rtol=1e-5, atol=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no layer, no guess to warn about
        optimizer = modopt.Optimizer(tx, params)
    assert optimizer.tx.muon_weight_dimension_numbers is None
    np.testing.assert_allclose(_update(optimizer, params, grads)["w"], expected["w"], **DIFF)


def test_a_matrix_outside_known_layers_warns_and_keeps_optax_layout():
    class Custom(eqx.Module):
        linear: eqx.nn.Linear
        table: jax.Array

    model = Custom(eqx.nn.Linear(4, 3, key=jax.random.key(0)), jnp.ones((5, 4)))
    with pytest.warns(UserWarning, match=r"layout of 1 matrix \(\.table\)"):
        optimizer = modopt.Optimizer(modopt.chain(modopt.clip_by_global_norm(1.0), modopt.contrib.muon(LR)), model)
    muon = optimizer.tx.transforms[1]
    labels = muon.build().param_labels(optimizer.trainable(model))
    assert (labels.linear.weight, labels.table, labels.linear.bias) == ("muon", "muon", "adam")
    assert muon.muon_weight_dimension_numbers(optimizer.trainable(model)).table == MuonDimensionNumbers(0, 1)
    assert muon.muon_weight_dimension_numbers(optimizer.trainable(model)).linear.weight == OUT_IN
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the matrix is not trained: nothing to warn about
        modopt.Optimizer(modopt.contrib.muon(LR), model, wrt=lambda x: eqx.is_inexact_array(x) and x.shape != (5, 4))


def test_linen_einsum_and_dense_general():
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Einsum((4, 6), "bi,oi->bo")(x)
            return nn.DenseGeneral((2, 3), name="heads")(x)

    x = jnp.ones((2, 6))
    variables = Net().init(jax.random.key(0), x)
    dims = modopt.dimension_numbers(Net(), variables["params"], x, higher_rank=True)
    assert dims["Einsum_0"]["kernel"] == OUT_IN
    assert dims["heads"]["kernel"] == MuonDimensionNumbers(reduction_axis=0, output_axis=(1, 2))
    assert dims["heads"]["bias"] is None  # a bias, though of rank 2
    with pytest.raises(TypeError, match="give its variables and an example input"):
        modopt.dimension_numbers(Net())
