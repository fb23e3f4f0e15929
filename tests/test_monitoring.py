"""What the registry cannot show for the monitoring and selection family: `scale_gradient`'s
gradient, `snapshot`/`monitor` values against independent computations, frozen parameters
left bit-identical by `Optimizer.step`, and `flatten`'s dtypes, extra arguments and sharding."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

import modopt
from modopt._core.extra_args import ExtraArg

# ---- scale_gradient ------------------------------------------------------------------------


def test_scale_gradient_scales_only_the_backward_pass():
    tree = {"a": jnp.arange(3.0), "b": jnp.full((2, 2), -1.5)}

    def loss(t, scale_fn):
        t = scale_fn(t)
        return jnp.sum(t["a"] ** 2) + jnp.sum(jnp.sin(t["b"]))

    ours = lambda t: modopt.scale_gradient(t, 0.25)
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), ours(tree), tree))
    grads = jax.grad(loss)(tree, ours)
    np.testing.assert_allclose(grads["a"], 0.25 * 2 * np.arange(3.0), rtol=1e-6)
    np.testing.assert_allclose(grads["b"], 0.25 * np.cos(np.full((2, 2), -1.5)), rtol=1e-6)
    theirs = jax.grad(loss)(tree, lambda t: optax.scale_gradient(t, 0.25))
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), grads, theirs)
    # Reverse over reverse: the second derivative is scaled too.
    second = jax.grad(lambda x: jax.grad(lambda y: jnp.sum(modopt.scale_gradient(y, 0.5) ** 3))(x).sum())(
        jnp.ones(2)
    )
    np.testing.assert_allclose(second, 0.5 * 6 * np.ones(2), rtol=1e-6)


def test_scale_gradient_special_scales():
    x = jnp.ones(3)
    assert modopt.scale_gradient(x, 1.0) is x
    assert modopt.scale_gradient(x, np.float32(1.0)) is x
    # A concrete 0 stops the gradient: even an infinite cotangent gives 0, not NaN.
    grads = jax.grad(lambda x: jnp.sum(modopt.scale_gradient(x, 0.0) * jnp.inf))(x)
    np.testing.assert_array_equal(grads, np.zeros(3))


def test_scale_gradient_with_a_traced_scale_does_not_retrace_and_keeps_dtypes():
    traces = []

    @jax.jit
    def grad_of(x, scale):
        traces.append(None)
        return jax.grad(
            lambda x, s: jnp.sum(modopt.scale_gradient(x, s).astype(jnp.float32) ** 2), argnums=(0, 1)
        )(x, scale)

    x = jnp.asarray([1.0, 2.0], jnp.bfloat16)
    for scale in (0.5, 3.0, 1.0, 0.0):
        gx, gs = grad_of(x, jnp.float32(scale))
        assert gx.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(gx, np.float32), scale * 2 * np.array([1.0, 2.0]), rtol=1e-2)
        assert float(gs) == 0.0  # no gradient flows to the scale
    assert len(traces) == 1


# ---- snapshot and monitor --------------------------------------------------------------------


def _square_norm_loss(x):
    return jnp.sum(x**2)


def _numpy_sgd_momentum_clip(params, steps, lr=0.1, momentum=0.9, clip=0.05):
    """The norms before clipping of sgd(lr, momentum) then clip_by_global_norm(clip) on sum(x**2)."""
    x, trace, norms = np.asarray(params, np.float64), np.zeros(len(params)), []
    for _ in range(steps):
        trace = 2 * x + momentum * trace
        update = -lr * trace
        norm = np.linalg.norm(update)
        norms.append(norm)
        x = x + update * min(1.0, clip / norm)
    return norms


def test_snapshot_records_the_updates_where_it_stands_in_a_chain():
    solver = modopt.chain(
        modopt.sgd(0.1, momentum=0.9),
        modopt.snapshot("norm_before_clip", modopt.global_norm),
        modopt.clip_by_global_norm(0.05),
    )
    params = jnp.array([1.0, 2.0, 3.0])
    state = solver.init(params)
    assert float(state[1].measurement["norm_before_clip"]) == pytest.approx(
        float(np.linalg.norm([1, 2, 3]))
    )  # measure(params)
    expected = _numpy_sgd_momentum_clip([1.0, 2.0, 3.0], 4)
    for step in range(4):
        updates, state = jax.jit(solver.update)(jax.grad(_square_norm_loss)(params), state, params)
        params = modopt.apply_updates(params, updates)
        assert float(state[1].measurement["norm_before_clip"]) == pytest.approx(expected[step], rel=1e-5)
    assert expected[:2] == pytest.approx([7.48e-1, 1.41], abs=5e-3)  # optax's documented example


def test_monitor_records_plain_and_averaged_measurements():
    clip = 1.0
    solver = modopt.chain(
        modopt.sgd(0.1, momentum=0.9),
        modopt.monitor(
            {
                "norm_before_clip": modopt.global_norm,
                "is_clipped_ema": modopt.measure_with_ema(lambda u: modopt.global_norm(u) > clip, decay=0.9),
                "norm_ema_raw": modopt.measure_with_ema(modopt.global_norm, decay=0.5, debias=False),
            }
        ),
        modopt.clip_by_global_norm(clip),
    )
    params = jnp.array([1.0, 2.0, 3.0])
    optimizer = modopt.Optimizer(solver, params)
    step = eqx.filter_jit(lambda opt, p: opt.step(p, jax.grad(_square_norm_loss)(p)))
    norms = _numpy_sgd_momentum_clip([1.0, 2.0, 3.0], 6, clip=clip)
    clipped_ema = raw_ema = 0.0
    for t in range(1, 7):
        params, optimizer = step(optimizer, params)
        measured = optimizer.state[1].measurements
        clipped_ema = 0.9 * clipped_ema + 0.1 * float(norms[t - 1] > clip)
        raw_ema = 0.5 * raw_ema + 0.5 * norms[t - 1]
        assert float(measured["norm_before_clip"]) == pytest.approx(norms[t - 1], rel=1e-5)
        assert float(measured["is_clipped_ema"]) == pytest.approx(clipped_ema / (1 - 0.9**t), rel=1e-5)
        assert float(measured["norm_ema_raw"]) == pytest.approx(raw_ema, rel=1e-5)
        if t == 2:  # optax's documented example
            assert float(measured["norm_before_clip"]) == pytest.approx(1.27, abs=5e-3)
            assert float(measured["is_clipped_ema"]) == pytest.approx(0.526, abs=5e-4)
    # The bool measurement is averaged in float32, from the first step on.
    assert optimizer.state[1].measure_states[1][1].ema.dtype == jnp.float32


def test_monitor_state_keeps_its_structure_so_steps_scan():
    tx = modopt.chain(
        modopt.monitor(
            {
                "norm": modopt.global_norm,
                "big": modopt.measure_with_ema(lambda u: modopt.global_norm(u) > 2.0, 0.9),
            }
        ),
        modopt.adam(0.1),
    )
    params = {"w": jnp.arange(4.0), "b": jnp.ones(2)}
    optimizer = modopt.Optimizer(tx, params)
    initial = jax.tree.map(lambda x: (x.shape, x.dtype), optimizer.state)

    def body(carry, _):
        params, optimizer = carry
        return optimizer.step(
            params, jax.grad(lambda p: sum(jnp.sum(x**2) for x in jax.tree.leaves(p)))(params)
        ), None

    (params, optimizer), _ = eqx.filter_jit(lambda c: jax.lax.scan(body, c, length=3))((params, optimizer))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), optimizer.state) == initial
    assert float(optimizer.state[0].measurements["norm"]) > 0


def test_monitor_accepts_transforms_and_passes_extra_arguments():
    tx = modopt.monitor({"halved": modopt.scale(0.5), "optax_ema": optax.ema(0.5, debias=False)})
    params = {"w": jnp.ones(3)}
    updates, state = tx.update({"w": jnp.full(3, 4.0)}, tx.init(params), params, value=jnp.float32(1.0))
    np.testing.assert_array_equal(updates["w"], np.full(3, 4.0))  # unchanged
    np.testing.assert_array_equal(state.measurements["halved"]["w"], np.full(3, 2.0))
    np.testing.assert_array_equal(state.measurements["optax_ema"]["w"], np.full(3, 2.0))


def test_bad_measures_and_masks_are_clear_errors():
    with pytest.raises(TypeError, match="monitor measure 'n': expected a function of the updates"):
        modopt.monitor({"n": 3})
    with pytest.raises(TypeError, match="monitor expects a dict of measures by name"):
        modopt.monitor([modopt.global_norm])
    with pytest.raises(ValueError, match="freeze needs a mask"):
        modopt.freeze(None)
    with pytest.raises(ValueError, match="selective_transform needs a mask"):
        modopt.selective_transform(modopt.adam(1e-3), freeze_mask=None)
    with pytest.raises(TypeError):
        modopt.selective_transform(modopt.adam(1e-3), {"w": True})  # the mask is keyword-only, as in optax
    with pytest.raises(ValueError, match="flatten: the parameters have no array leaves"):
        modopt.flatten(modopt.adam(1e-3)).init({})
    shrinking = modopt.flatten(modopt.stateless(lambda updates, params: updates[:2]))
    with pytest.raises(
        ValueError, match=r"returned updates of shape \(2,\) for a flat vector of 5 parameters"
    ):
        shrinking.update(
            {"a": jnp.ones(3), "b": jnp.ones(2)}, shrinking.init({"a": jnp.ones(3), "b": jnp.ones(2)})
        )
    with pytest.raises(ValueError, match=r"Invalid decay: 1.5 \(must be in \[0, 1\]\) in MeasureWithEma"):
        modopt.measure_with_ema(modopt.global_norm, 1.5)


# ---- freeze and selective_transform ----------------------------------------------------------------


def _params():
    keys = jax.random.split(jax.random.key(0), 3)
    return {
        "embedding": jax.random.normal(keys[0], (4, 3)),
        "head": {"w": jax.random.normal(keys[1], (3, 2)), "b": jax.random.normal(keys[2], (2,))},
    }


MASK = {"embedding": True, "head": False}  # a prefix of the params: the embedding is frozen


def _bits(x):
    return np.asarray(x).view(np.uint32)


@pytest.mark.parametrize(
    "make",
    [
        lambda: modopt.chain(modopt.adam(0.1), modopt.freeze(MASK)),
        lambda: modopt.selective_transform(modopt.adam(0.1), freeze_mask=MASK),
        lambda: modopt.selective_transform(
            modopt.adam(0.1), freeze_mask=lambda p: {"embedding": True, "head": False}
        ),
    ],
    ids=["freeze", "selective_transform", "selective_transform_fn"],
)
def test_frozen_parameters_stay_bit_identical_through_optimizer_step(make):
    params = _params()
    before = jax.tree.map(np.asarray, params)
    optimizer = modopt.Optimizer(make(), params)
    step = eqx.filter_jit(lambda opt, p, g: opt.step(p, g), donate="all-except-first")
    for i in range(3):
        grads = jax.tree.map(lambda x, i=i: jnp.full_like(x, 1.0 + i), params)
        params, optimizer = step(optimizer, params, grads)
    np.testing.assert_array_equal(_bits(params["embedding"]), _bits(before["embedding"]))
    assert not np.array_equal(params["head"]["w"], before["head"]["w"])
    assert not np.array_equal(params["head"]["b"], before["head"]["b"])


def test_selective_transform_gives_frozen_parameters_no_state():
    tx = modopt.selective_transform(modopt.adam(0.1), freeze_mask=MASK)
    state = tx.init(_params())
    adam_state = state.inner_states["train"].inner_state[0]
    assert isinstance(adam_state.mu["embedding"], modopt.MaskedNode)
    assert adam_state.mu["head"]["w"].shape == (3, 2)
    # The learning rate is read through the composition.
    assert float(modopt.Optimizer(tx, _params()).learning_rate) == pytest.approx(0.1)


def test_freeze_on_an_equinox_model_with_a_model_shaped_mask():
    model = eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(0))
    mask = jax.tree.map(lambda _: False, model)
    mask = eqx.tree_at(lambda m: (m.layers[0].weight, m.layers[0].bias), mask, replace=(True, True))
    optimizer = modopt.Optimizer(modopt.selective_transform(modopt.sgd(0.1), freeze_mask=mask), model)
    grads = jax.tree.map(lambda x: jnp.ones_like(x) if eqx.is_inexact_array(x) else None, model)
    new_model, _ = eqx.filter_jit(lambda o, m, g: o.step(m, g))(optimizer, model, grads)
    np.testing.assert_array_equal(_bits(new_model.layers[0].weight), _bits(model.layers[0].weight))
    np.testing.assert_array_equal(_bits(new_model.layers[0].bias), _bits(model.layers[0].bias))
    np.testing.assert_allclose(new_model.layers[1].weight, model.layers[1].weight - 0.1)


def _layout(tree):
    """Paths (field names, keys) and shapes of a tree's leaves: a state's layout, whatever its classes."""
    return [
        (jax.tree_util.keystr(path), jnp.shape(leaf))
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def test_freeze_and_selective_transform_match_optax_for_scalar_and_tree_masks():
    params, grads = _params(), jax.tree.map(jnp.ones_like, _params())
    for mask in (True, False, MASK, {"embedding": False, "head": {"w": True, "b": False}}):
        pairs = [
            (modopt.freeze(mask), optax.freeze(mask)),
            (
                modopt.selective_transform(modopt.adam(0.1), freeze_mask=mask),
                optax.selective_transform(optax.adam(0.1), freeze_mask=mask),
            ),
        ]
        for ours, theirs in pairs:
            state, their_state = ours.init(params), theirs.init(params)
            assert _layout(state) == _layout(their_state), (mask, state, their_state)
            for _ in range(2):
                updates, state = ours.update(grads, state, params)
                expected, their_state = theirs.update(grads, their_state, params)
                jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates, expected)


# ---- flatten -------------------------------------------------------------------------------


def test_flatten_gives_the_updates_of_the_unflattened_transform():
    params = _params()
    flat, plain = modopt.flatten(modopt.adam(0.1)), modopt.adam(0.1)
    flat_state, plain_state = flat.init(params), plain.init(params)
    assert flat_state[0].mu.shape == (12 + 6 + 2,)
    for i in range(3):
        grads = jax.tree.map(lambda x, i=i: jnp.sin(x * (i + 1)), params)
        flat_updates, flat_state = flat.update(grads, flat_state, params)
        plain_updates, plain_state = plain.update(grads, plain_state, params)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), flat_updates, plain_updates
        )
        params = modopt.apply_updates(params, plain_updates)


def test_flatten_keeps_each_update_dtype_and_reads_the_learning_rate():
    params = {"w": jnp.ones((2, 3), jnp.bfloat16), "b": jnp.ones(3, jnp.float32)}
    schedule = modopt.linear_schedule(0.1, 0.0, 10)
    tx = modopt.flatten(modopt.sgd(schedule))
    state = tx.init(params)
    updates, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
    assert updates["w"].dtype == jnp.bfloat16 and updates["b"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(updates["w"], np.float32), np.full((2, 3), -0.1), rtol=1e-2)
    optimizer = modopt.Optimizer(tx, params)
    params, optimizer = optimizer.step(params, jax.tree.map(jnp.ones_like, params))
    assert float(optimizer.learning_rate) == pytest.approx(0.09)


def test_flatten_trains_only_the_trainable_leaves_of_a_model():
    model = eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(0))
    optimizer = modopt.Optimizer(modopt.flatten(modopt.sgd(0.1)), model)
    grads = jax.tree.map(lambda x: jnp.ones_like(x) if eqx.is_inexact_array(x) else None, model)
    new_model, _ = eqx.filter_jit(lambda o, m, g: o.step(m, g))(optimizer, model, grads)
    np.testing.assert_allclose(new_model.layers[0].weight, model.layers[0].weight - 0.1, rtol=1e-6)
    assert new_model.activation is model.activation


class _NeedsValueFnAndGrad(modopt.AbstractTransform):
    """Test transform: the update is `value_fn(params) * grad`; it checks what it is given."""

    extra_args_spec = (
        ExtraArg("value_fn", "the loss as a function of the parameters", of_params=True),
        ExtraArg("grad", "the gradient, shaped like the parameters", like_params=True),
    )

    def init(self, params):
        return modopt.EmptyState()

    def update(self, updates, state, params=None, **extra_args):
        value = extra_args["value_fn"](params)
        return jax.tree.map(lambda g: value * g, extra_args["grad"]), state


def test_flatten_adapts_extra_arguments_of_the_parameters():
    params = {"w": jnp.arange(3.0), "b": jnp.ones(2)}

    def value_fn(p: Any):
        return jnp.sum(p["w"]) + 10 * jnp.sum(p["b"])  # needs the tree, not the flat vector

    tx = modopt.flatten(_NeedsValueFnAndGrad())
    grad = {"w": jnp.ones(3), "b": jnp.full(2, 2.0)}
    updates, _ = tx.update(grad, tx.init(params), params, value_fn=value_fn, grad=grad, unrelated=1)
    np.testing.assert_allclose(updates["w"], 23.0 * np.ones(3))
    np.testing.assert_allclose(updates["b"], 46.0 * np.ones(2))


def test_flatten_state_is_replicated_and_zero_splits_it_where_it_divides():
    mesh = AbstractMesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    params = {"w": jnp.zeros((6, 8)), "b": jnp.zeros(8)}  # 56 elements: the data axis divides it
    specs = {"w": P(None, "model"), "b": P("model")}
    tx = modopt.flatten(modopt.adam(1e-3))
    found = tx.state_specs(params, specs)
    assert found[0].mu == P() and found[0].nu == P() and found[0].count == P()
    optimizer = eqx.filter_eval_shape(modopt.Optimizer, tx, params)
    assert modopt.sharding.shardings(optimizer, specs, mesh=mesh).state[0].mu.spec == P()
    assert modopt.sharding.shardings(optimizer, specs, mesh=mesh, zero_axis="data").state[0].mu.spec == P(
        "data"
    )
    odd = {"w": jnp.zeros((6, 8)), "b": jnp.zeros(8), "s": jnp.zeros(())}  # 57: stays replicated
    optimizer = eqx.filter_eval_shape(modopt.Optimizer, tx, odd)
    placed = modopt.sharding.shardings(optimizer, {**specs, "s": P()}, mesh=mesh, zero_axis="data")
    assert placed.state[0].mu.spec == P()


def test_flatten_on_eight_devices_with_zero():
    """On 8 simulated devices (a subprocess: the device count is set before jax starts), on
    Auto and on Explicit mesh axes, the flat state is created replicated, or split over "data"
    with ZeRO-1, stays so, and 3 donated steps equal the single-device ones."""
    script = textwrap.dedent(
        """
        import equinox as eqx, jax, jax.numpy as jnp, numpy as np, modopt
        from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
        make = lambda: {"w": jnp.linspace(-1, 1, 48).reshape(6, 8), "b": jnp.linspace(0, 1, 8)}
        grads = lambda i: jax.tree.map(lambda x: jnp.cos(x * (i + 1)), make())
        tx = modopt.flatten(modopt.adam(0.1))
        step = eqx.filter_jit(lambda o, p, g: o.step(p, g), donate="all-except-first")
        reference, optimizer = make(), modopt.Optimizer(tx, make())
        for i in range(3):
            reference, optimizer = step(optimizer, reference, grads(i))
        for kind in (AxisType.Auto, AxisType.Explicit):
            mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind))
            specs = {"w": P(None, "model"), "b": P("model")}
            shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
            for zero, expected in ((None, P()), ("data", P("data"))):
                expected = NamedSharding(mesh, expected)
                params = jax.device_put(make(), shardings)
                opt = modopt.Optimizer(tx, params, shardings=shardings, zero_axis=zero)
                assert opt.state[0].mu.sharding.is_equivalent_to(expected, 1), opt.state[0].mu.sharding
                for i in range(3):
                    params, opt = step(opt, params, jax.device_put(grads(i), shardings))
                    jax.block_until_ready(params)
                assert opt.state[0].mu.sharding.is_equivalent_to(expected, 1), opt.state[0].mu.sharding
                assert params["w"].sharding.is_equivalent_to(shardings["w"], 2), params["w"].sharding
                for a, b in zip(jax.tree.leaves((params, opt.state)), jax.tree.leaves((reference, optimizer.state))):
                    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        print("ok")
        """
    )
    env = {
        **os.environ,
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8",
    }
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.stdout.strip().endswith("ok"), result.stderr[-3000:]
