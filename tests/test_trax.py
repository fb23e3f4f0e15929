"""`modopt.trax`: trax's optimizers against an independent NumPy reference (`trax_reference.py`).

Each configuration runs 5 steps on a trax weight tree with weights of shapes (4, 5), (3,) and
(6, 7, 8), starting at step 0 and at step 1, with every hyperparameter changed between steps,
through `tree_update` eagerly and jitted (one trace for both runs), and through
`modopt.Optimizer.step` (the step count from 0, hyperparameters changed with `set`). float32
results must match the float64 reference to 1e-5. Then trax's API details, errors, sharding
rules and the Flax TrainState. The registry (`registry/trax.py`) also runs them through the
shared battery (optax parity where optax has the same math, Orbax resume, no retrace).
"""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P
import pages
from trax_reference import Reference

import modopt
import modopt.trax as trax

STEPS = 5
TOLERANCE = 1e-5
CLASSES = {
    "sgd": trax.SGD, "momentum": trax.Momentum, "rmsprop": trax.RMSProp, "adam": trax.Adam,
    "adafactor": trax.Adafactor, "sm3": trax.SM3,
}  # fmt: skip
EMA, HEAVY_BALL, NESTEROV = trax.MomentumType.EMA, trax.MomentumType.HEAVY_BALL, trax.MomentumType.NESTEROV

CONFIGS = {
    "sgd": ("sgd", {}),
    "sgd_clip_extra_opt_param": ("sgd", {"clip_grad_norm": 5.0, "foo": 2.0}),
    "momentum_nesterov": ("momentum", {}),
    "momentum_plain": ("momentum", {"nesterov": False, "mass": 0.8, "weight_decay_rate": 1e-3}),
    "rmsprop": ("rmsprop", {"learning_rate": 0.01}),
    "rmsprop_clip": ("rmsprop", {"clip_grad_norm": 5.0}),
    "adam": ("adam", {"learning_rate": 1e-2}),
    "adam_clip": ("adam", {"clip_grad_norm": 5.0, "weight_decay_rate": 1e-3}),
    "adam_clip_not_reached": ("adam", {"clip_grad_norm": 1e3}),
    "adafactor": ("adafactor", {}),
    "adafactor_unfactored": ("adafactor", {"factored": False}),
    "adafactor_no_parameter_scale": ("adafactor", {"multiply_by_parameter_scale": False}),
    "adafactor_no_clipping": ("adafactor", {"do_clipping": False}),
    "adafactor_clipping_threshold": ("adafactor", {"clipping_threshold": 0.5}),
    "adafactor_momentum": ("adafactor", {"do_momentum": True, "beta1": 0.9}),
    "adafactor_momentum_bfloat16": ("adafactor", {"do_momentum": True, "momentum_in_bfloat16": True, "beta1": 0.9}),
    "adafactor_decay_ramp": ("adafactor", {"weight_decay_rate": 0.1, "weight_decay_n_steps": 3}),
    "sm3_ema": ("sm3", {}),
    "sm3_heavy_ball": ("sm3", {"momentum_type": HEAVY_BALL}),
    "sm3_nesterov_weight_decay": ("sm3", {"momentum_type": NESTEROV, "weight_decay": 0.01}),
    "sm3_no_momentum": ("sm3", {"momentum": 0.0}),
    "sm3_graft_ema": ("sm3", {"second_moment_averaging": 0.9}),
    "sm3_graft_heavy_ball": ("sm3", {"second_moment_averaging": 0.9, "momentum_type": HEAVY_BALL}),
    "sm3_graft_nesterov": ("sm3", {"second_moment_averaging": 0.95, "momentum_type": NESTEROV, "weight_decay": 1e-3}),
}
BELOW_ONE = {"b1", "b2", "gamma", "mass", "beta1", "momentum", "second_moment_averaging"}


def tree_of(make):
    """A trax weight tree of lists, tuples and a dict, as trax layers nest them.

    (Dicts flatten by insertion order in trax, while `jax.jit` rebuilds them with sorted keys:
    their order is checked eagerly in `test_dict_weights_flatten_in_insertion_order`.)
    """
    return [make((4, 5)), (make((3,)), {"kernel": make((6, 7, 8))})]


def weights_tree(seed=0):
    rng = np.random.default_rng(seed)
    return tree_of(lambda shape: rng.normal(size=shape).astype(np.float32))


def grads_at(step):
    rng = np.random.default_rng(100 + step)
    return tree_of(lambda shape: rng.normal(size=shape).astype(np.float32))


def changed(opt_params, i):
    """The hyperparameters at the `i`-th step: each one moved (rates stay below 1), as float32."""
    out = {}
    for name, value in opt_params.items():
        value = float(value)
        if name == "weight_decay_n_steps":
            out[name] = np.int32(value)
        elif name in BELOW_ONE:
            out[name] = np.float32(value * (1 - 0.02 * i))
        else:
            out[name] = np.float32(value * (1 + 0.1 * i))
    return out


def as_arrays(opt_params):
    return {name: jnp.asarray(value) for name, value in opt_params.items()}


def as_floats(opt_params):
    return {name: float(value) for name, value in opt_params.items()}


def assert_close(ours, expected, what, ordered=True):
    """Same containers (lists, tuples, dicts in order, `None`), values within TOLERANCE.

    `ordered=False` for what comes out of `jax.jit`, which sorts dict keys."""
    if expected is None:
        assert ours is None, f"{what}: expected None, got {type(ours).__name__}"
    elif isinstance(expected, (list, tuple, dict)):
        assert type(ours) is type(expected), f"{what}: {type(ours).__name__} instead of {type(expected).__name__}"
        if isinstance(expected, dict):
            keys = list(ours) if ordered else sorted(ours)
            assert keys == (list(expected) if ordered else sorted(expected)), f"{what}: keys {list(ours)}"
            ours, expected = [ours[k] for k in expected], list(expected.values())
        assert len(ours) == len(expected), f"{what}: {len(ours)} entries instead of {len(expected)}"
        for i, (a, b) in enumerate(zip(ours, expected)):
            assert_close(a, b, f"{what}[{i}]", ordered)
    else:
        assert np.shape(ours) == np.shape(expected), f"{what}: shape {np.shape(ours)} vs {np.shape(expected)}"
        np.testing.assert_allclose(
            np.asarray(ours, np.float64), np.asarray(expected, np.float64), rtol=TOLERANCE, atol=TOLERANCE, err_msg=what
        )


def reference_run(name, kwargs, step0):
    """The reference's weights, slots and metrics after each of STEPS steps from `step0`."""
    ref = Reference(name, **kwargs)
    weights = weights_tree()
    slots, opt_params = ref.tree_init(weights)
    out = []
    for i in range(STEPS):
        params = as_floats(changed(opt_params, i))
        weights, slots, metrics = ref.tree_update(step0 + i, grads_at(i), weights, slots, params)
        out.append((weights, slots, metrics))
    return ref.tree_init(weights_tree())[0], out


@pytest.mark.parametrize("config", list(CONFIGS))
def test_tree_update_matches_the_reference_eager_and_jitted(config):
    name, kwargs = CONFIGS[config]
    traces = []

    def tree_update(opt, *args):
        traces.append(1)
        return opt.tree_update(*args, store_slots=False)

    opt = CLASSES[name](**kwargs)
    jitted = jax.jit(tree_update, static_argnums=0)
    for step0 in (0, 1):
        initial, expected = reference_run(name, kwargs, step0)
        for jit in (False, True):
            slots, opt_params = opt.tree_init(weights_tree())
            assert_close(slots, initial, f"{config}: tree_init slots")
            weights = weights_tree()
            for i in range(STEPS):
                params = as_arrays(changed(opt_params, i))
                if jit:
                    weights, slots, metrics = jitted(opt, step0 + i, grads_at(i), weights, slots, params)
                else:
                    weights, slots, metrics = opt.tree_update(step0 + i, grads_at(i), weights, slots, params)
                    assert opt.slots is slots
                what = f"{config} ({'jitted' if jit else 'eager'}, step0={step0}) step {i}"
                exp_weights, exp_slots, exp_metrics = expected[i]
                assert_close(weights, exp_weights, f"{what}: weights", ordered=not jit)
                assert_close(slots, exp_slots, f"{what}: slots")
                assert_close(metrics, exp_metrics, f"{what}: metrics", ordered=not jit)
    assert len(traces) == 1, "changing the step or opt_params retraced the jitted tree_update"


@pytest.mark.parametrize("config", list(CONFIGS))
def test_modopt_optimizer_step_matches_the_reference_from_step_0(config):
    """`modopt.Optimizer(trax_optimizer, model).step` takes the step count from its state (from 0)
    and the hyperparameters from `set`, by their opt_params names, without retracing."""
    name, kwargs = CLASSES[CONFIGS[config][0]], CONFIGS[config][1]
    _, expected = reference_run(CONFIGS[config][0], kwargs, step0=0)
    traces = []

    @eqx.filter_jit(donate="all-except-first")
    def train_step(grads, model, optimizer):
        traces.append(1)
        return optimizer.step(model, grads)

    tx = name(**kwargs)
    model = jax.tree.map(jnp.asarray, weights_tree())
    optimizer = modopt.Optimizer(tx, model)
    for i in range(STEPS):
        optimizer = optimizer.set(**changed(tx.opt_params, i))
        model, optimizer = train_step(jax.tree.map(jnp.asarray, grads_at(i)), model, optimizer)
        assert_close(model, expected[i][0], f"{config} through Optimizer.step, step {i}: weights", ordered=False)
    assert len(traces) == 1


# ---- trax's API ------------------------------------------------------------------------


def test_opt_params_are_trax_s():
    """Names in trax's order with learning_rate last, float32 (int32 for ints) arrays, the live dict."""
    opt = trax.Adafactor()
    params = opt.opt_params
    assert list(params) == [
        "beta1", "decay_rate", "clipping_threshold", "weight_decay_rate", "weight_decay_n_steps",
        "epsilon1", "epsilon2", "learning_rate",
    ]  # fmt: skip
    assert params["learning_rate"].dtype == jnp.float32 and params["weight_decay_n_steps"].dtype == jnp.int32
    assert opt.opt_params is params
    slots, returned = opt.tree_init(weights_tree())
    assert returned is params
    assert list(trax.SGD(0.5, foo=1.0).opt_params) == ["foo", "learning_rate"]
    assert list(trax.Adam().opt_params) == ["weight_decay_rate", "b1", "b2", "eps", "learning_rate"]
    assert list(trax.Momentum().opt_params) == ["mass", "weight_decay_rate", "learning_rate"]
    assert list(trax.RMSProp().opt_params) == ["gamma", "eps", "learning_rate"]
    assert list(trax.SM3().opt_params) == ["momentum", "second_moment_averaging", "weight_decay", "learning_rate"]
    opt.opt_params = {"learning_rate": 1.0}
    assert opt.opt_params == {"learning_rate": 1.0}


def test_defaults_are_trax_s():
    expected = {
        trax.SGD: {"learning_rate": 0.01},
        trax.Momentum: {"learning_rate": 0.01, "mass": 0.9, "weight_decay_rate": 1e-5},
        trax.RMSProp: {"learning_rate": 0.001, "gamma": 0.9, "eps": 1e-8},
        trax.Adam: {"learning_rate": 1e-4, "weight_decay_rate": 1e-5, "b1": 0.9, "b2": 0.999, "eps": 1e-5},
        trax.Adafactor: {
            "learning_rate": 0.05, "beta1": 0.0, "decay_rate": 0.8, "clipping_threshold": 1.0,
            "weight_decay_rate": 1e-5, "weight_decay_n_steps": 0, "epsilon1": 1e-16, "epsilon2": 1e-3,
        },
        trax.SM3: {"learning_rate": 0.01, "momentum": 0.9, "second_moment_averaging": 1.0, "weight_decay": 0.0},
    }  # fmt: skip
    for cls, values in expected.items():
        params = cls().opt_params
        assert {k: pytest.approx(float(v), rel=1e-6) for k, v in params.items()} == values, cls.__name__
    assert trax.Momentum().nesterov and trax.SGD().clip_grad_norm is None
    flags = trax.Adafactor()
    assert (flags.factored, flags.multiply_by_parameter_scale, flags.do_clipping) == (True, True, True)
    assert (flags.do_momentum, flags.momentum_in_bfloat16) == (False, False)
    assert trax.SM3().momentum_type is EMA


def test_tree_init_slots_layout_and_dtypes():
    """Slots are a tuple, one per weight in trax's order; stored on the optimizer; dtypes as trax's."""
    weights = {"b": jnp.ones((3,), jnp.bfloat16), "a": jnp.ones((4, 5), jnp.bfloat16)}
    opt = trax.Adafactor(do_momentum=True, momentum_in_bfloat16=True)
    assert opt.slots is None
    slots, _ = opt.tree_init(weights)
    assert opt.slots is slots and isinstance(slots, tuple)
    (v, m_b), (row, col, m_a) = slots
    assert v.shape == (3,) and v.dtype == jnp.bfloat16 and m_b.dtype == jnp.bfloat16
    assert (row.shape, col.shape, row.dtype, col.dtype) == ((4,), (5,), jnp.float32, jnp.float32)
    momentum, v1, v2 = trax.SM3(momentum=0.0).tree_init([jnp.ones((2, 3))])[0][0]
    assert momentum == [] and [a.shape for a in v1] == [(2,), (3,)] and v2 == []
    sgd = trax.SGD()
    assert sgd.tree_init({"w": jnp.ones(2)})[0] == (None,)
    assert isinstance(trax.Adam().weight_init(jnp.ones(3)), tuple)


def dict_tree(seed):
    """A dict out of sorted key order (`jax.tree.map` would sort it: not used on it)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    return {"dense": [normal(4, 5), normal(3)], "conv": (normal(2, 3, 4),)}


def test_dict_weights_flatten_in_insertion_order():
    """trax flattens dicts by insertion order (here dense before conv; jax would sort them)."""
    for name, kwargs in [("adafactor", {"do_momentum": True, "beta1": 0.5}), ("sm3", {"second_moment_averaging": 0.9})]:
        ours, ref = CLASSES[name](**kwargs), Reference(name, **kwargs)
        weights = dict_tree(0)
        slots, params = ours.tree_init(weights)
        expected_weights, expected_slots = weights, ref.tree_init(weights)[0]
        assert_close(slots, expected_slots, f"{name}: tree_init")
        for step in range(2):
            grads = dict_tree(step + 1)
            weights, slots, _ = ours.tree_update(step, grads, weights, slots, params)
            expected_weights, expected_slots, _ = ref.tree_update(step, grads, expected_weights, expected_slots, as_floats(params))
            assert_close(weights, expected_weights, f"{name} step {step}: weights")
            assert_close(slots, expected_slots, f"{name} step {step}: slots")


def test_tree_update_returns_three_values_and_keeps_the_tree():
    opt = trax.Adam()
    weights = dict_tree(0)
    slots, params = opt.tree_init(weights)
    new_weights, new_slots, metrics = opt.tree_update(0, weights, weights, slots, params, store_slots=False)
    assert opt.slots is slots  # store_slots=False leaves the stored slots alone
    assert list(new_weights) == ["dense", "conv"] and isinstance(new_weights["dense"], list)
    assert isinstance(new_weights["conv"], tuple) and set(metrics) == {"gradients_l2", "weights_l2"}
    np.testing.assert_allclose(metrics["weights_l2"], trax.l2_norm(weights), rtol=1e-6)
    listed = weights_tree()
    listed_slots, _ = opt.tree_init(listed)
    with pytest.raises(ValueError, match="store_slots=False"):
        jax.jit(lambda w, s: opt.tree_update(0, w, w, s, params))(listed, listed_slots)
    opt.slots = ("mine",)
    assert opt.slots == ("mine",)


def test_weight_update_and_scalar_weights_match_the_reference():
    """Per weight (trax's `update`), including a scalar: SM3 gives it one accumulator of shape ()
    (trax fails there), Adafactor treats it as unfactored."""
    for name, kwargs in [("sm3", {"second_moment_averaging": 0.9}), ("adafactor", {}), ("adam", {})]:
        ours, ref = CLASSES[name](**kwargs), Reference(name, **kwargs)
        params = {k: float(v) for k, v in ours.opt_params.items()}
        for shape in [(), (3,), (4, 5), (6, 7, 8)]:
            w = np.random.default_rng(1).normal(size=shape).astype(np.float32)
            slot, expected_slot = ours.weight_init(w), ref.init(w)
            for step in range(3):
                g = np.random.default_rng(step).normal(size=shape).astype(np.float32)
                new_w, slot = ours.weight_update(step, g, w, slot, ours.opt_params)
                expected_w, expected_slot = ref.update(step, g, w, expected_slot, params)
                assert_close(new_w, expected_w, f"{name} {shape} step {step}: weight")
                assert_close(slot, expected_slot, f"{name} {shape} step {step}: slots")
                w = np.asarray(new_w)


def test_l2_norm_and_clip_grads_follow_trax():
    grads = {"b": [jnp.full(3, 2.0)], "a": (jnp.full((2, 2), 1.0),)}
    assert float(trax.l2_norm(grads)) == pytest.approx(4.0)
    clipped = trax.clip_grads(grads, 2.0)
    assert isinstance(clipped["b"], list) and isinstance(clipped["a"], tuple) and list(clipped) == ["b", "a"]
    assert float(trax.l2_norm(clipped)) == pytest.approx(2.0)
    same = trax.clip_grads(grads, 4.0)  # kept only when the norm is strictly below the threshold
    assert float(trax.l2_norm(same)) == pytest.approx(4.0)
    np.testing.assert_array_equal(trax.clip_grads(grads, 4.5)["b"][0], grads["b"][0])


def test_deviations_in_the_modopt_path():
    """trax's decay is not scaled by the learning rate: with learning_rate 0 weights still shrink."""
    model = {"w": jnp.ones(3)}
    optimizer = modopt.Optimizer(trax.Adam(0.0, weight_decay_rate=0.1), model)
    new, _ = optimizer.step(model, {"w": jnp.ones(3)})
    np.testing.assert_allclose(new["w"], 0.9, rtol=1e-6)
    assert float(modopt.Optimizer(trax.Adam(3e-4), model).learning_rate) == pytest.approx(3e-4)
    # RMSProp's accumulator starts at one.
    optimizer = modopt.Optimizer(trax.RMSProp(0.1, gamma=0.5, eps=0.0), model)
    new, _ = optimizer.step(model, {"w": jnp.full(3, 2.0)})
    np.testing.assert_allclose(new["w"], 1.0 - 0.1 * 2.0 / np.sqrt(0.5 + 0.5 * 4.0), rtol=1e-6)


# ---- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: trax.Adam(b1=1.0), "Invalid b1: 1.0 (must be in [0, 1)) in Adam."),
        (lambda: trax.Adam(learning_rate=-1.0), "Invalid learning_rate: -1.0 (must be >= 0 and finite) in Adam."),
        (lambda: trax.RMSProp(clip_grad_norm=0.0), "Invalid clip_grad_norm: 0.0 (must be > 0) in RMSProp."),
        (lambda: trax.Adafactor(clipping_threshold=None), "Invalid clipping_threshold: None (expected a number) in Adafactor."),
        (lambda: trax.SM3(momentum_type=5), "Invalid momentum_type: 5 (must be one of"),
        (lambda: trax.SM3(momentum=1.5), "Invalid momentum: 1.5 (must be in [0, 1]) in SM3."),
        (lambda: trax.SGD(foo="x"), "Invalid foo: 'x' (expected a number or a schedule) in SGD."),
    ],
)
def test_bad_hyperparameters_are_named(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_bad_calls_are_explained():
    opt = trax.Adam()
    weights = dict_tree(0)
    slots, params = opt.tree_init(weights)
    with pytest.raises(KeyError, match="opt_params lacks 'b2'"):
        opt.tree_update(0, weights, weights, slots, {k: v for k, v in params.items() if k != "b2"})
    with pytest.raises(ValueError, match=re.escape("Invalid learning_rate: -0.5 (must be >= 0 and finite) in Adam.")):
        opt.tree_update(0, weights, weights, slots, {**params, "learning_rate": -0.5})
    with pytest.raises(ValueError, match="got 3 gradients and 2 slots for 3 weights"):
        opt.tree_update(0, weights, weights, slots[:2], params)
    with pytest.raises(ValueError, match=re.escape("the gradient has shape (3,) but its weight has shape (4, 5) (weight 0")):
        opt.tree_update(0, {"dense": [jnp.ones(3), jnp.ones(3)], "conv": (jnp.ones((2, 3, 4)),)}, weights, slots, params)
    with pytest.raises(TypeError, match="weight_update"):
        opt.update(0, weights, weights, slots, params)
    with pytest.raises(ValueError, match="concrete number"):
        jax.jit(lambda m: trax.SM3(momentum=m))(0.5)


# ---- sharding and Flax ------------------------------------------------------------------


def test_sharding_rules_of_factored_and_sm3_state():
    mesh = AbstractMesh((2, 4), ("data", "model"))
    params = {"w": jnp.zeros((8, 4, 12)), "b": jnp.zeros((12,))}
    specs = {"w": P("data", None, "model"), "b": P("model")}
    cases = [
        (trax.Adafactor(do_momentum=True), lambda s: (s[0].v, s[4].ema)),
        (trax.SM3(second_moment_averaging=0.9, momentum_type=NESTEROV), lambda s: (s[0].v1, s[0].v2, s[2].trace)),
    ]
    expected = [
        ({"b": [P("model")], "w": [P("data", None), P("data", "model")]}, specs),
        ({"b": [P("model")], "w": [P("data"), P(None), P("model")]},) * 2 + (specs,),
    ]
    for (tx, pick), want in zip(cases, expected):
        optimizer = eqx.filter_eval_shape(modopt.Optimizer, tx, params)
        for zero_axis in (None, "data"):
            placed = modopt.sharding.shardings(optimizer, specs, mesh=mesh, zero_axis=zero_axis)
            got = jax.tree.map(lambda s: s.spec, pick(placed.state))
            if zero_axis is None:
                assert got == want, type(tx).__name__


def test_flax_train_state_takes_a_trax_optimizer():
    from flax.training import train_state

    params = {"w": jnp.ones((4, 5)), "b": jnp.ones(3)}
    grads = {"w": jnp.full((4, 5), 0.5), "b": jnp.full(3, 0.5)}
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=trax.Adafactor(learning_rate=0.1))
    state = jax.jit(lambda s: s.apply_gradients(grads=grads))(state)
    optimizer = modopt.Optimizer(trax.Adafactor(learning_rate=0.1), params)
    expected, _ = optimizer.step(params, grads)
    for name in params:
        np.testing.assert_allclose(state.params[name], expected[name], rtol=1e-6)


def test_the_readme_trax_example_runs(capsys):

    section = pages.section("docs/guides/training.md", "trax optimizers")
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert blocks
    exec(compile("\n".join(blocks), "docs/guides/training.md", "exec"), {})
    assert "['gradients_l2', 'weights_l2']" in capsys.readouterr().out
