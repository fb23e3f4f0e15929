"""Sharding rules, ZeRO-1, memory planning and impossible layouts, in-process.

No devices are needed: the mesh is a `jax.sharding.AbstractMesh` (as when planning a pod run
from a laptop) and the optimizers are abstract, from `eqx.filter_eval_shape`. Training on a
real (simulated) 8-device mesh is in `test_sharded.py`.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import subprocess
import sys
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import modopt
from modopt.sharding import bytes_per_device, shardings

MESH = AbstractMesh((2, 4), ("data", "model"))
PARAMS = {"w": jnp.zeros((512, 256)), "b": jnp.zeros((256,)), "cube": jnp.zeros((2, 3, 8)), "s": jnp.zeros(())}
SPECS = {"w": P("model", None), "b": P("model"), "cube": P(None, None, "model"), "s": P()}


def abstract_optimizer(tx, params=PARAMS, **kwargs):
    return eqx.filter_eval_shape(modopt.Optimizer, tx, params, **kwargs)


def specs_by_path(tree):
    """`{path: PartitionSpec}` for a tree of NamedShardings."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, NamedSharding))[0]
    return {jax.tree_util.keystr(path): s.spec for path, s in flat}


def test_adam_state_follows_parameters_and_scalars_are_replicated():
    optimizer = abstract_optimizer(modopt.adam(1e-3))
    found = specs_by_path(shardings(optimizer, SPECS, mesh=MESH))
    for name, spec in SPECS.items():
        assert found[f".state[0].mu['{name}']"] == spec
        assert found[f".state[0].nu['{name}']"] == spec
    assert found[".state[0].count"] == P()
    assert found[".count"] == P()
    assert found[".tx.learning_rate"] == P() and found[".tx.b1.value"] == P() and found[".tx.b1.complement"] == P()


def test_adafactor_statistics_drop_the_reduced_axis():
    """The row statistic is a mean over the largest axis, the column one over the second:
    each statistic's spec is the parameter's spec without the axis it averages over."""
    optimizer = abstract_optimizer(modopt.adafactor(1e-2))
    found = specs_by_path(shardings(optimizer, SPECS, mesh=MESH))
    state = optimizer.state[0]
    w_shape = PARAMS["w"].shape  # (512, 256): largest axis 0, second largest axis 1
    assert state.v_row["w"].shape == (w_shape[1],) and found[".state[0].v_row['w']"] == P(None)
    assert state.v_col["w"].shape == (w_shape[0],) and found[".state[0].v_col['w']"] == P("model")
    assert found[".state[0].v['w']"] == P()  # the (1,) placeholder
    # Leaves too small to factor keep a full second moment that follows the parameter.
    assert found[".state[0].v['cube']"] == SPECS["cube"]
    assert found[".state[0].v_row['cube']"] == P()


def test_history_state_follows_parameters_with_unsplit_leading_axis():
    """optax's L-BFGS keeps `(memory_size, *param.shape)` histories; the generic rule by
    shape gives them the parameter's spec behind an unsplit memory axis."""
    optimizer = abstract_optimizer(modopt.from_optax(optax.scale_by_lbfgs(memory_size=5)))
    found = specs_by_path(shardings(optimizer, SPECS, mesh=MESH))
    history = {path: spec for path, spec in found.items() if "diff_params_memory" in path}
    assert found[".state.weights_memory"] == P()  # (memory_size,): small bookkeeping
    assert history[".state.diff_params_memory['w']"] == P(None, "model", None)
    assert history[".state.diff_params_memory['cube']"] == P(None, None, None, "model")
    assert history[".state.diff_params_memory['s']"] == P(None)


def test_masked_and_partitioned_state_follows_its_group():
    tx = modopt.partition(
        {"adam": modopt.adam(1e-3), "sgd": modopt.sgd(1e-2, momentum=0.9)},
        {"w": "adam", "b": "sgd", "cube": "adam", "s": "sgd"},
    )
    found = specs_by_path(shardings(abstract_optimizer(tx), SPECS, mesh=MESH))
    assert found[".state.inner_states['adam'].inner_state[0].mu['w']"] == SPECS["w"]
    assert found[".state.inner_states['sgd'].inner_state[0].trace['b']"] == SPECS["b"]


def test_optax_masked_state_follows_parameters_by_path():
    """optax's masked state holds its own MaskedNode where the mask is False."""
    mask = {"w": True, "b": False, "cube": True, "s": False}
    tx = modopt.from_optax(optax.masked(optax.adam(1e-3), mask))
    found = specs_by_path(shardings(abstract_optimizer(tx), SPECS, mesh=MESH))
    assert found[".state.inner_state[0].mu['w']"] == SPECS["w"]
    assert found[".state.inner_state[0].nu['cube']"] == SPECS["cube"]


def test_zero_splits_state_over_the_data_axis_where_a_dimension_divides():
    # Replicated parameters: ZeRO-1 alone splits their state.
    params = {"big": jnp.zeros((64, 30)), "odd": jnp.zeros((15,)), "s": jnp.zeros(())}
    optimizer = abstract_optimizer(modopt.adam(1e-3), params)
    found = specs_by_path(shardings(optimizer, P(), mesh=MESH, zero_axis="data"))
    assert found[".state[0].mu['big']"] == P("data", None)  # 64 divides by 2; 30 does too, 64 is larger
    assert found[".state[0].mu['odd']"] == P()  # 15 is odd: stays replicated, as documented
    assert found[".state[0].mu['s']"] == P()
    assert found[".state[0].count"] == P()


def test_grouped_small_leaves_are_replicated_and_the_rest_follows_the_parameters():
    """An optimizer that keeps small leaves in buffers (planned from abstract values, as the
    jitted init will create it): the buffers are replicated, ZeRO-1 splits them where their
    length divides, and the other leaves' state follows their parameters."""
    params = {"w": jnp.zeros((512, 256)), **{f"b{i}": jnp.zeros((6,)) for i in range(9)}}
    specs = {"w": P("model", None), **{f"b{i}": P() for i in range(9)}}
    optimizer = abstract_optimizer(modopt.adam(1e-3), params)
    assert optimizer.groups is not None
    found = specs_by_path(shardings(optimizer, specs, mesh=MESH))
    assert found[".state[0].mu['grouped'][0]"] == P() and found[".state[0].nu['grouped'][0]"] == P()
    assert found[".state[0].mu['ungrouped']['w']"] == P("model", None)
    zero = specs_by_path(shardings(optimizer, specs, mesh=MESH, zero_axis="data"))
    assert zero[".state[0].mu['grouped'][0]"] == P("data")  # 9 * 6 = 54 elements: 2 divides them
    assert zero[".state[0].mu['ungrouped']['w']"] == P("model", "data")


def test_zero_splits_an_already_split_dimension_when_no_other_fits():
    params = {"v": jnp.zeros((16,))}
    optimizer = abstract_optimizer(modopt.adam(1e-3), params)
    found = specs_by_path(shardings(optimizer, {"v": P("model")}, mesh=MESH, zero_axis="data"))
    assert found[".state[0].mu['v']"] == P(("model", "data"))


def test_galore_projected_state_is_split_over_the_axes_of_the_dimension_projected_away():
    """GaLore's moments `(rank, n)` of a left-projected matrix and its projection `(n, rank)` of
    a right-projected one have no dimension of the parameter that FSDP splits: they take that
    mesh axis on another dimension, so each device holds an even share (worked out by hand
    from the shapes below, rank 16 on 8 devices)."""
    mesh = AbstractMesh((8,), ("fsdp",))
    params = {"tall": jnp.zeros((256, 64)), "wide": jnp.zeros((64, 256))}
    specs = {"tall": P("fsdp", None), "wide": P("fsdp", None)}
    optimizer = abstract_optimizer(modopt.contrib.galore(1e-3, rank=16), params)
    layout = shardings(optimizer, specs, mesh=mesh)
    found = specs_by_path(layout)
    # tall (m >= n): projected on the left, P (256, 16) split like the rows; moments (16, 64)
    # take "fsdp" on the rank axis or the columns.
    assert found[".state[0].projector['tall']"] == P("fsdp", None)
    assert "fsdp" in str(found[".state[0].base_optimizer_state.mu['tall']"])
    # wide: projected on the right, moments (64, 16) split like the rows; P (256, 16) on "fsdp".
    assert found[".state[0].base_optimizer_state.mu['wide']"] == P("fsdp", None)
    assert "fsdp" in str(found[".state[0].projector['wide']"])
    # Every array of 8 or more rows is split 8 ways: 16 x 256 + 2 x 16 x 64 + 2 x 64 x 16
    # float32 elements per projection and moment pair, over 8 devices (a count stays whole).
    state_elements = 2 * (256 * 16 + 16 * 64 * 2)
    assert bytes_per_device(optimizer.state, layout.state) == 4 * state_elements // 8 + 2 * 4


def test_bytes_per_device_plans_a_pod_from_abstract_values():
    """A 16x16 pod planned on this machine: the sums are checked against shapes by hand."""
    pod = AbstractMesh((16, 16), ("data", "model"))
    params = {"w": jnp.zeros((4096, 1024)), "b": jnp.zeros((4096,))}
    optimizer = abstract_optimizer(modopt.adam(1e-3), params)
    specs = {"w": P("model", None), "b": P("model")}
    moments = 2 * (4096 * 1024 + 4096) * 4  # mu and nu in float32
    scalars = 4 + 4  # Adam's count and the optimizer's count (int32)
    assert bytes_per_device(optimizer.state) == moments + 4
    plain = shardings(optimizer, specs, mesh=pod)
    assert bytes_per_device(optimizer.state, plain.state) == moments // 16 + 4
    zero = shardings(optimizer, specs, mesh=pod, zero_axis="data")
    assert bytes_per_device(optimizer.state, zero.state) == moments // 256 + 4
    hyperparameters = 6 * 4  # learning_rate, b1 and b2 (each with its complement), eps (eps_root=0.0 is no array)
    assert bytes_per_device(optimizer, zero) == moments // 256 + scalars + hyperparameters


def test_partition_specs_take_the_mesh_from_jax_set_mesh():
    optimizer = abstract_optimizer(modopt.sgd(1e-2, momentum=0.9))
    with pytest.raises(ValueError, match=re.escape("PartitionSpecs need a mesh")):
        shardings(optimizer, SPECS)
    mesh = jax.make_mesh((1, 1), ("data", "model"))  # this process has one device
    with jax.set_mesh(mesh):
        found = shardings(optimizer, SPECS)
    assert all(s.mesh == mesh for s in jax.tree.leaves(found))
    named = {name: NamedSharding(MESH, spec) for name, spec in SPECS.items()}
    assert specs_by_path(shardings(optimizer, named)) == specs_by_path(shardings(optimizer, SPECS, mesh=MESH))


def test_an_eqx_model_with_frozen_and_non_array_leaves():
    model = eqx.nn.MLP(8, 4, 16, 1, key=jax.random.key(0))
    model_specs = jax.tree.map(lambda x: P("model") if x.ndim else P(), eqx.filter(model, eqx.is_array))
    frozen = jax.tree.map(lambda _: True, model)
    frozen = eqx.tree_at(lambda m: m.layers[0].bias, frozen, replace=False)
    optimizer = abstract_optimizer(modopt.adam(1e-3), model, wrt=frozen)
    found = specs_by_path(shardings(optimizer, model_specs, mesh=MESH))
    assert found[".state[0].mu.layers[0].weight"] == P("model")
    assert found[".state[0].nu.layers[1].bias"] == P("model")


# ---- impossible layouts ------------------------------------------------------------------


class OddState(NamedTuple):
    table: jax.Array


class OddTransform(modopt.AbstractTransform):
    """A transform whose state is unrelated to the parameters' shapes and declares no rule."""

    def init(self, params):
        return OddState(table=jnp.zeros((3, 500)))

    def update(self, updates, state, params=None, **extra_args):
        return updates, state


class BadRuleTransform(modopt.AbstractTransform):
    """A transform whose declared rule does not fit its state's rank."""

    def init(self, params):
        return OddState(table=jnp.zeros((8,)))

    def update(self, updates, state, params=None, **extra_args):
        return updates, state

    def state_specs(self, params, param_specs):
        return OddState(table=P("model", None))


@pytest.mark.parametrize(
    ("make", "specs", "kwargs", "error", "message"),
    [
        (
            lambda: modopt.adam(1e-3),
            {**SPECS, "cube": P(None, "model", None)},
            {},
            ValueError,
            "Cannot shard the parameter at ['cube'] (shape (2, 3, 8)) as P(None, 'model', None): "
            "dimension 1 has size 3, which the 4 devices of mesh axis 'model' do not divide.",
        ),
        (
            lambda: modopt.adam(1e-3),
            {**SPECS, "b": P("model", None)},
            {},
            ValueError,
            "Cannot shard the parameter at ['b'] (shape (256,)) as P('model', None): the spec has 2 "
            "entries but the array has rank 1.",
        ),
        (
            lambda: modopt.adam(1e-3),
            {**SPECS, "w": P("tensor")},
            {},
            ValueError,
            "'tensor' is not an axis of the mesh, whose axes are ('data', 'model').",
        ),
        (
            lambda: modopt.adam(1e-3),
            {**SPECS, "w": P("model", "model")},
            {},
            ValueError,
            "mesh axis 'model' is used twice.",
        ),
        (
            lambda: modopt.chain(modopt.scale(1.0), OddTransform()),
            SPECS,
            {},
            ValueError,
            "No sharding rule places the optimizer state at state[1].table (shape (3, 500)): it is neither "
            "small nor shaped like a parameter. OddTransform must declare its layout in a `state_specs` method.",
        ),
        (
            lambda: modopt.chain(BadRuleTransform()),
            SPECS,
            {},
            ValueError,
            "Cannot shard the optimizer state at state[0].table (shape (8,)) as P('model', None): "
            "the spec has 2 entries but the array has rank 1.",
        ),
        (
            lambda: modopt.adam(1e-3),
            {**SPECS, "b": None},
            {},
            TypeError,
            "The model shardings give a NoneType for the parameter at ['b']; expected a NamedSharding or a "
            "PartitionSpec (PartitionSpec() to replicate it).",
        ),
        (
            lambda: modopt.adam(1e-3),
            {"w": P()},
            {},
            ValueError,
            "The model shardings do not have the model's structure: found no entry for 'b', 'cube', 's' in the dict at the root.",
        ),
        (
            lambda: modopt.adam(1e-3),
            SPECS,
            {"zero_axis": "batch"},
            ValueError,
            "zero_axis='batch' is not an axis of the mesh, whose axes are ('data', 'model').",
        ),
        (
            lambda: modopt.adam(1e-3),
            {**SPECS, "w": P(P.UNCONSTRAINED, "model")},
            {},
            ValueError,
            "The sharding of the parameter at ['w'] is P(UNCONSTRAINED, 'model'): optimizer state needs a "
            "definite layout",
        ),
    ],
    ids=["indivisible", "rank", "unknown-axis", "axis-twice", "no-rule", "bad-rule", "none", "structure", "zero-axis", "unconstrained"],
)
def test_impossible_layout_is_a_clear_error(make, specs, kwargs, error, message):
    optimizer = abstract_optimizer(make())
    with pytest.raises(error, match=re.escape(message)):
        shardings(optimizer, specs, mesh=MESH, **kwargs)


def test_a_sharded_optimizer_can_be_built_abstractly():
    """`eval_shape` of an optimizer created sharded (to plan, or as a restore target)."""
    mesh = jax.make_mesh((1, 1), ("data", "model"))  # this process has one device
    named = {name: NamedSharding(mesh, spec) for name, spec in SPECS.items()}
    make = lambda p: modopt.Optimizer(modopt.adafactor(1e-2), p, shardings=named, zero_axis="data")  # noqa: E731
    abstract = eqx.filter_eval_shape(make, PARAMS)
    concrete = make(PARAMS)
    assert jax.tree.structure(abstract) == jax.tree.structure(concrete)
    for a, c in zip(jax.tree.leaves(abstract), jax.tree.leaves(concrete)):
        assert (a.shape, a.dtype) == (c.shape, c.dtype)


def test_shardings_of_an_optimizer_created_sharded_must_match_its_layout():
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    named = {name: NamedSharding(mesh, spec) for name, spec in SPECS.items()}
    optimizer = modopt.Optimizer(modopt.adam(1e-3), PARAMS, shardings=named, zero_axis="data")
    assert specs_by_path(shardings(optimizer, named, zero_axis="data"))[".state[0].mu['w']"] == P("model", "data")
    with pytest.raises(ValueError, match=re.escape("This optimizer was created with other shardings")):
        shardings(optimizer, named)


def test_optimizer_created_sharded_on_a_mixed_mesh_is_a_clear_error():
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Auto))
    named = {name: NamedSharding(mesh, spec) for name, spec in SPECS.items()}
    with pytest.raises(ValueError, match=re.escape("needs a mesh whose axes are all Auto or all Explicit")):
        modopt.Optimizer(modopt.adam(1e-3), PARAMS, shardings=named)


def test_a_pickled_optimizer_matches_one_built_in_another_process(tmp_path):
    """Static fields with cached hashes must not carry one process's string hashes to another."""
    script = f"""
import pickle, jax.numpy as jnp, modopt
optimizer = modopt.Optimizer(modopt.adam(1e-3), {{"w": jnp.zeros((4, 8))}})
pickle.dump(optimizer, open({str(tmp_path / "opt.pkl")!r}, "wb"))
"""
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "PYTHONHASHSEED": "123"}, timeout=120)
    with open(tmp_path / "opt.pkl", "rb") as file:
        loaded = pickle.load(file)
    built = modopt.Optimizer(modopt.adam(1e-3), {"w": jnp.zeros((4, 8))})
    assert jax.tree.structure(loaded) == jax.tree.structure(built)


def test_shardings_needs_an_optimizer():
    with pytest.raises(TypeError, match=re.escape("shardings expects a modopt.Optimizer, got Adam.")):
        shardings(modopt.adam(1e-3), SPECS, mesh=MESH)


def test_mesh_and_zero_axis_need_shardings():
    with pytest.raises(ValueError, match=re.escape("`mesh` and `zero_axis` need `shardings=`")):
        modopt.Optimizer(modopt.adam(1e-3), PARAMS, zero_axis="data")


def test_donating_the_optimizer_leaves_the_transform_usable():
    """The optimizer owns copies of the hyperparameters, so `tx` survives a donated step."""
    tx = modopt.adam(1e-3)
    optimizer = modopt.Optimizer(tx, {"w": jnp.ones(3)})
    step = eqx.filter_jit(lambda p, o: o.step(p, p), donate="all")
    step({"w": jnp.ones(3)}, optimizer)
    assert math.isclose(float(tx.learning_rate), 1e-3, rel_tol=1e-6)


def test_an_optimizer_built_again_on_the_same_layout_compiles_nothing():
    """`Optimizer(shardings=...)` creates its state with a jitted init on the layout: built again
    with the same configuration and shardings (a restart, a rebuilt configuration), it reuses
    that program and the copy of its hyperparameters; on other shardings it compiles anew."""
    from jax._src import monitoring

    mesh = jax.make_mesh((1,), ("model",), axis_types=(AxisType.Auto,))
    params = {"w": jnp.ones((4, 6)), "b": jnp.ones(6)}
    compiled = []
    listener = lambda event, duration, **_: compiled.append(event) if event == "/jax/core/compile/backend_compile_duration" else None  # noqa: E731
    monitoring.register_event_duration_secs_listener(listener)
    try:
        def build(specs):
            compiled.clear()
            optimizer = modopt.Optimizer(modopt.adamw(1e-3, weight_decay=0.1), params, shardings=specs, mesh=mesh)
            jax.block_until_ready(optimizer)
            return len(compiled)

        first = build({"w": P(None, "model"), "b": P("model")})
        again = build({"w": P(None, "model"), "b": P("model")})
        other = build({"w": P("model", None), "b": P()})
    finally:
        monitoring.unregister_event_duration_listener(listener)
    assert first >= 2, first  # the init and the copy of the hyperparameters, at least
    assert again == 0, again
    assert other >= 1, other
