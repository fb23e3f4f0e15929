"""`weight_decay_mask`: biases and normalization layers excluded, by name and by module type."""

from __future__ import annotations

import doctest

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt
from modopt._core import masks as _masks


def _model():
    keys = jax.random.split(jax.random.key(0), 2)
    return eqx.nn.Sequential(
        [
            eqx.nn.Linear(3, 4, key=keys[0]),
            eqx.nn.LayerNorm(4),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.Linear(4, 2, key=keys[1]),
        ]
    )


def test_mask_excludes_biases_norms_and_non_arrays():
    mask = modopt.weight_decay_mask(_model())
    assert [mask.layers[0].weight, mask.layers[0].bias, mask.layers[3].weight, mask.layers[3].bias] == [
        True, False, True, False
    ]
    assert mask.layers[1].weight is False and mask.layers[1].bias is False  # the LayerNorm
    assert mask.layers[2].fn is False  # a function
    custom = modopt.WeightDecayMask(exclude=("bias", "weight"), exclude_modules=())
    assert not any(jax.tree.leaves(custom(_model())))


def test_adamw_with_the_mask_matches_optax_with_the_same_mask_tree():
    model = _model()
    params = eqx.filter(model, eqx.is_inexact_array)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
    optimizer = modopt.Optimizer(modopt.adamw(1e-2, weight_decay=0.5, mask=modopt.weight_decay_mask), model)
    mask_tree = modopt.weight_decay_mask(params)  # the parameters' structure, `None` at the function
    assert sum(jax.tree.leaves(mask_tree)) == 2  # the two Linear weights
    reference = optax.adamw(1e-2, weight_decay=0.5, mask=mask_tree)
    ref_state = reference.init(params)
    ref_params = params
    for _ in range(3):
        model, optimizer = optimizer.step(model, grads)
        updates, ref_state = reference.update(grads, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, updates)
    for ours, theirs in zip(jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_equal_masks_do_not_retrace():
    traces = []

    @eqx.filter_jit
    def step(model, optimizer, grads):
        traces.append(None)
        return optimizer.step(model, grads)

    model = _model()
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    for mask in (modopt.weight_decay_mask, modopt.WeightDecayMask()):
        step(model, modopt.Optimizer(modopt.adamw(1e-3, mask=mask), model), grads)
    assert len(traces) == 1


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match=r"WeightDecayMask: `exclude` takes a tuple, got 'bias'"):
        modopt.WeightDecayMask(exclude="bias")


def test_docstring_example():
    assert doctest.testmod(_masks, raise_on_error=True).attempted > 0
