"""`modopt.microbatching` against optax 0.2.8 and against the unbatched computation.

Every function runs with optax's on the same inputs; independently, microbatched results must
equal the full-batch ones (`jax.vmap`, sums and means in NumPy), and gradients from `micro_grad`
fed to `modopt.Optimizer.step` must give the full-batch gradient's step.
"""

from __future__ import annotations

import doctest
import enum
import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.microbatching as omb
import pytest

import modopt
from modopt import microbatching as mb
from modopt.microbatching import _accumulators, _microbatching

T = mb.AccumulationType


def _their(acc):
    """optax's AccumulationType for ours (the enums are distinct classes with the same members)."""
    return jax.tree_util.tree_map(lambda a: getattr(omb.AccumulationType, a.name), acc)


def _same(a, b, rtol=1e-6, atol=1e-6):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert x.shape == y.shape and x.dtype == y.dtype, (x, y)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


X = jnp.asarray(np.random.default_rng(0).normal(size=(12, 3)).astype(np.float32))
Y = jnp.asarray(np.random.default_rng(1).normal(size=(12,)).astype(np.float32))


def _fun(x, y, scale=1.0):
    return {"rows": scale * x.sum(axis=1) + y, "total": jnp.sum(x * y[:, None]), "max": jnp.max(x, axis=0)}


@pytest.mark.parametrize("acc", ["SUM", "MEAN", "RUNNING_MEAN", "CONCAT"])
@pytest.mark.parametrize("size", [1, 3, 12])
def test_microbatch_parity_with_optax(acc, size):
    accumulator = getattr(T, acc)
    ours = mb.microbatch(_fun, argnums=(0, 1), microbatch_size=size, accumulator=accumulator)
    theirs = omb.microbatch(_fun, argnums=(0, 1), microbatch_size=size, accumulator=_their(accumulator))
    _same(jax.jit(ours)(X, Y), jax.jit(theirs)(X, Y), rtol=1e-5)


def test_microbatch_equals_the_full_batch():
    accumulator = {"rows": T.CONCAT, "total": T.SUM, "max": T.MEAN}
    out = mb.microbatch(_fun, argnums=(0, 1), microbatch_size=4, accumulator=accumulator)(X, Y)
    full = _fun(X, Y)
    np.testing.assert_allclose(out["rows"], full["rows"], rtol=1e-6)  # CONCAT keeps the order
    np.testing.assert_allclose(out["total"], full["total"], rtol=1e-5)
    # MEAN of per-microbatch maxima: microbatch i holds rows i, i + 3, i + 6, i + 9.
    maxima = np.stack([np.asarray(X)[i::3].max(axis=0) for i in range(3)])
    np.testing.assert_allclose(out["max"], maxima.mean(axis=0), rtol=1e-6)


def test_microbatch_keywords_axes_and_a_custom_accumulator():
    largest = mb.Accumulator(
        init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
        update=lambda carry, value, index: jnp.maximum(carry, value),
        finalize=lambda carry: carry,
        aggregate=lambda stacked: stacked.max(axis=0),
    )
    their_largest = omb.Accumulator(largest.init, largest.update, largest.finalize, largest.aggregate)

    def f(x, *, y, scale):
        return _fun(x.T, y, scale)["max"]

    ours = mb.microbatch(f, 0, 4, largest, argnames="y", in_axes=(1, 0))
    theirs = omb.microbatch(f, 0, 4, their_largest, argnames="y", in_axes=(1, 0))
    _same(ours(X.T, y=Y, scale=2.0), theirs(X.T, y=Y, scale=2.0))
    np.testing.assert_allclose(ours(X.T, y=Y, scale=2.0), np.asarray(X).max(axis=0))


@pytest.mark.parametrize("acc", ["SUM", "MEAN", "RUNNING_MEAN", "CONCAT"])
def test_num_real_microbatches_static_and_traced(acc):
    accumulator = getattr(T, acc)

    @jax.jit
    def both(x, y, real):
        ours = mb.microbatch(_fun, (0, 1), 2, accumulator, num_real_microbatches=real)(x, y)
        theirs = omb.microbatch(_fun, (0, 1), 2, _their(accumulator), num_real_microbatches=real)(x, y)
        return ours, theirs

    for real in (1, 4):
        ours, theirs = both(X, Y, jnp.asarray(real))
        _same(ours, theirs, rtol=1e-5)
    if acc == "RUNNING_MEAN":  # the mean over the microbatches that ran
        out = mb.microbatch(lambda x: x.sum(), 0, 2, accumulator, num_real_microbatches=2)(X[:, 0])
        np.testing.assert_allclose(out, (X[[0, 6, 1, 7], 0]).sum() / 2, rtol=1e-6)


def test_reshape_batch_axis():
    x = jnp.arange(24).reshape(2, 12)
    for axis, tree in [(0, {"a": X, "b": Y}), (1, x)]:
        _same(mb.reshape_batch_axis(tree, 4, axis), omb.reshape_batch_axis(tree, 4, axis))
    out = np.asarray(mb.reshape_batch_axis(x, 4, axis=1))
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out[:, 1], np.asarray(x)[:, 1::3])  # microbatch 1: 1, 4, 7, 10
    with pytest.raises(ValueError, match="not divisible"):
        mb.reshape_batch_axis(Y, 5)


@pytest.mark.parametrize("acc", ["CONCAT", "SUM", "MEAN"])
def test_micro_vmap_equals_vmap_and_optax(acc):
    def f(x, w, y):
        return {"dot": x @ w + y, "sq": x**2}

    w = jnp.array([1.0, -1.0, 0.5])
    accumulator = getattr(T, acc)
    ours = mb.micro_vmap(f, in_axes=(0, None, 0), microbatch_size=3, accumulator=accumulator)(X, w, Y)
    theirs = omb.micro_vmap(f, in_axes=(0, None, 0), microbatch_size=3, accumulator=_their(accumulator))(
        X, w, Y
    )
    _same(ours, theirs, rtol=1e-5)
    full = jax.vmap(f, in_axes=(0, None, 0))(X, w, Y)
    reduce = {"CONCAT": lambda v: v, "SUM": lambda v: v.sum(0), "MEAN": lambda v: v.mean(0)}[acc]
    _same(ours, jax.tree_util.tree_map(reduce, full), rtol=1e-5)


def test_micro_vmap_int_in_axes_keywords_and_no_microbatching():
    def f(x, y, *, z):
        return x.sum() * y + z

    z = jnp.arange(12.0)
    full = jax.vmap(lambda x, y, z: f(x, y, z=z))(X, Y, z)
    # An int in_axes maps every positional argument, as in jax.vmap (optax: the first only).
    np.testing.assert_allclose(mb.micro_vmap(f, microbatch_size=4)(X, Y, z=z), full, rtol=1e-6)
    np.testing.assert_allclose(mb.micro_vmap(f)(X, Y, z=z), full, rtol=1e-6)
    single = mb.micro_vmap(lambda x: x**2, microbatch_size=2)(jnp.arange(8))
    _same(single, omb.micro_vmap(lambda x: x**2, microbatch_size=2)(jnp.arange(8)))
    with pytest.raises(NotImplementedError, match="out_axes"):
        mb.micro_vmap(f, out_axes=1)


@pytest.mark.parametrize("acc", ["SUM", "MEAN", "RUNNING_MEAN", "CONCAT"])
def test_optax_accumulation_types_are_read_by_name(acc):
    """Code ported from optax keeps optax's enum: each member does what ours of that name does,
    in all three functions, as leaves of a pytree of accumulators too, and as optax's own does."""
    theirs = getattr(omb.AccumulationType, acc)
    assert not isinstance(theirs, T)  # two classes: only the name links them
    run = mb.microbatch(_fun, argnums=(0, 1), microbatch_size=3, accumulator=theirs)(X, Y)
    _same(run, mb.microbatch(_fun, argnums=(0, 1), microbatch_size=3, accumulator=getattr(T, acc))(X, Y))
    _same(run, omb.microbatch(_fun, argnums=(0, 1), microbatch_size=3, accumulator=theirs)(X, Y), rtol=1e-5)
    mixed = {"rows": theirs, "total": T.SUM, "max": omb.AccumulationType.CONCAT}
    _same(
        mb.microbatch(_fun, argnums=(0, 1), microbatch_size=4, accumulator=mixed)(X, Y),
        omb.microbatch(_fun, argnums=(0, 1), microbatch_size=4, accumulator=_their(mixed))(X, Y),
        rtol=1e-5,
    )
    _same(
        mb.micro_vmap(lambda x: x**2, microbatch_size=4, accumulator=theirs)(X),
        omb.micro_vmap(lambda x: x**2, microbatch_size=4, accumulator=theirs)(X),
        rtol=1e-5,
    )
    if acc != "CONCAT":  # micro_grad's gradients are reduced
        kwargs = dict(batch_argnums=(1, 2), microbatch_size=4, accumulator=theirs)
        grads, their_grads = (lib.micro_grad(_loss, **kwargs)(PARAMS, X, Y)[0] for lib in (mb, omb))
        _same(grads, their_grads, rtol=1e-5)


def test_unknown_accumulator_names_its_place():
    class AccumulationType(enum.Enum):  # another enum of that name, without the member
        MAX = 1

    for bad in ("sum", AccumulationType.MAX):
        with pytest.raises(ValueError, match=r"Unknown accumulator at accumulator\['total'\]: .*CONCAT"):
            mb.microbatch(_fun, (0, 1), 3, {"rows": T.SUM, "total": bad, "max": T.SUM})(X, Y)


def _loss(params, x, y):
    pred = x @ params["w"] + params["b"]
    return 0.5 * jnp.mean((pred - y) ** 2)


PARAMS = {"w": jnp.array([0.3, -0.2, 0.1]), "b": jnp.array(0.05)}


@pytest.mark.parametrize("size", [None, 1, 4])
def test_micro_grad_parity_with_optax(size):
    kwargs = dict(
        batch_argnums=(1, 2),
        microbatch_size=size,
        transform_fn=lambda g: (g, jax.tree_util.tree_map(jnp.square, g)),
        metrics_fn=lambda g: jnp.sqrt(sum(jnp.sum(v**2) for v in jax.tree_util.tree_leaves(g))),
    )
    ours = jax.jit(mb.micro_grad(_loss, accumulator=T.MEAN, **kwargs))(PARAMS, X, Y)
    theirs = jax.jit(omb.micro_grad(_loss, accumulator=omb.AccumulationType.MEAN, **kwargs))(PARAMS, X, Y)
    _same(ours[0], theirs[0], rtol=1e-5)
    _same(tuple(ours[1]), tuple(theirs[1]), rtol=1e-5)
    assert type(ours[1]).__name__ == "Aux" and ours[1]._fields == ("values", "metrics", "aux")
    # Independently: the per-example gradients by jax.vmap(jax.grad), averaged.
    per_example = jax.vmap(jax.grad(_loss), in_axes=(None, 0, 0))(PARAMS, X[:, None], Y[:, None])
    _same(ours[0][0], jax.tree_util.tree_map(lambda g: g.mean(0), per_example), rtol=1e-5)
    _same(ours[0][1], jax.tree_util.tree_map(lambda g: (g**2).mean(0), per_example), rtol=1e-5)
    np.testing.assert_allclose(ours[1].values, 0.5 * (X @ PARAMS["w"] + PARAMS["b"] - Y) ** 2, rtol=1e-5)


def test_micro_grad_aux_argnums_and_no_batch_dim():
    def loss(w, b, x, y):
        residual = x @ w + b - y
        return 0.5 * residual**2, {"residual": residual}

    w, b = PARAMS["w"], PARAMS["b"]
    kwargs = dict(has_aux=True, argnums=(0, 1), batch_argnums=(2, 3), keep_batch_dim=False, microbatch_size=3)
    ours = mb.micro_grad(loss, **kwargs)(w, b, X, Y)
    theirs = omb.micro_grad(loss, **kwargs)(w, b, X, Y)
    _same(ours[0], theirs[0], rtol=1e-5)
    _same(tuple(ours[1]), tuple(theirs[1]), rtol=1e-5)
    np.testing.assert_allclose(ours[1].aux["residual"], X @ w + b - Y, rtol=1e-5)
    # SUM (the default) of per-example gradients: the gradient of the summed loss.
    total = jax.grad(lambda w, b: jnp.sum(loss(w, b, X, Y)[0]), argnums=(0, 1))(w, b)
    _same(ours[0], total, rtol=1e-5)


def test_micro_grad_feeds_optimizer_step():
    """micro_grad's mean of per-example gradients gives the full-batch gradient's step."""
    model = PARAMS
    full_grads = jax.grad(_loss)(model, X, Y)
    grad_fn = mb.micro_grad(_loss, batch_argnums=(1, 2), microbatch_size=3, accumulator=T.MEAN)

    @eqx.filter_jit
    def micro_step(model, optimizer, x, y):
        grads, _ = grad_fn(model, x, y)
        return optimizer.step(model, grads)

    @eqx.filter_jit
    def full_step(model, optimizer, grads):
        return optimizer.step(model, grads)

    for tx in (modopt.adam(0.1), modopt.sgd(0.5, momentum=0.9)):
        m1, o1 = model, modopt.Optimizer(tx, model)
        m2, o2 = model, modopt.Optimizer(tx, model)
        for _ in range(3):
            m1, o1 = micro_step(m1, o1, X, Y)
            m2, o2 = full_step(m2, o2, jax.grad(_loss)(m2, X, Y))
        _same(m1, m2, rtol=1e-5)
    # And the first step is optax's on the same gradients.
    updates, _ = optax.adam(0.1).update(full_grads, optax.adam(0.1).init(model), model)
    one, _ = full_step(model, modopt.Optimizer(modopt.adam(0.1), model), full_grads)
    _same(one, optax.apply_updates(model, updates), rtol=1e-6)


def test_bad_input():
    with pytest.raises(ValueError, match="not divisible"):
        mb.microbatch(_fun, (0, 1), 5)(X, Y)
    with pytest.raises(ValueError, match="different sizes"):
        mb.microbatch(_fun, (0, 1), 2)(X, Y[:6])
    with pytest.raises(ValueError, match="MEAN.*floating"):
        mb.microbatch(lambda x: x.sum(), 0, 2, T.MEAN)(jnp.arange(4))
    with pytest.raises(ValueError, match="Unknown accumulator"):
        mb.microbatch(lambda x: x.sum(), 0, 2, "sum")(X)
    with pytest.raises(ValueError, match="in_axes has 1 entries"):
        mb.microbatch(_fun, (0, 1), 2, in_axes=(0,))
    with pytest.raises(ValueError, match="Invalid microbatch_size"):
        mb.microbatch(_fun, 0, 0)
    assert mb.microbatch(_fun, 0, None) is _fun
    assert modopt.microbatch is mb.microbatch


_EXPLICIT_SHARDING = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    from modopt import microbatching as mb

    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Explicit,))
    X = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    with jax.sharding.set_mesh(mesh):
        x = jax.device_put(X, NamedSharding(mesh, P("data")))
        split = jax.jit(lambda x: mb.reshape_batch_axis(x, 4))(x)
        assert jax.typeof(split).sharding.spec == P(None, "data", None), jax.typeof(split)
        out = jax.jit(mb.micro_vmap(lambda v: v * 2, microbatch_size=4))(x)
        assert jax.typeof(out).sharding.spec == P("data", None) and np.allclose(out, 2 * X)
        grad_fn = mb.micro_grad(lambda w, x: jnp.sum((x @ w) ** 2), microbatch_size=4,
                                accumulator=mb.AccumulationType.MEAN)
        g, aux = jax.jit(grad_fn)(jnp.ones(3), x)
        np.testing.assert_allclose(g, 2 * X.T @ (X @ np.ones(3)) / 16, rtol=1e-5)
        try:
            mb.reshape_batch_axis(x, 2)
        except ValueError as error:
            assert "4 shards" in str(error)
        else:
            raise AssertionError("no error for a microbatch smaller than the number of shards")
    print("ok")
    """
)


def test_explicit_sharding_on_four_simulated_devices():
    """A batch sharded over 4 devices stays sharded along each microbatch (optax 0.2.8 compares
    version strings and takes its unsharded path on jax 0.10, where this reshape fails)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", _EXPLICIT_SHARDING], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_doctests():
    for module in (_microbatching, _accumulators):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0
