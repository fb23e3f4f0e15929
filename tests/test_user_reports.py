"""What a new user hit (issue 25), each against what is expected by construction or a reference:
Flax models under `weight_decay_mask`, pickling optimizers, a schedule set in place of a number,
complex and other non-real hyperparameters, the checkpoint-mismatch summary, and a save that
fails for a full disk. (Ctrl-C and launching under an ignored SIGINT: `test_main_job.py`.)
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import sys

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from modopt.integrations.flax import NnxOptimizer, TrainState
from modopt.integrations.orbax import CheckpointError, CheckpointManager

import modopt

try:
    import cloudpickle
except ImportError:  # pragma: no cover - it comes with several of the test dependencies
    cloudpickle = None

PICKLERS = [pickle] + ([cloudpickle] if cloudpickle is not None else [])


def close(a, b, rtol=1e-6, atol=1e-7):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def by_path(tree) -> dict[str, object]:
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


# ---- weight_decay_mask on Flax models -------------------------------------------------------


class NnxNet(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(10, 4, rngs=rngs)
        self.dense = nnx.Linear(4, 6, rngs=rngs)
        self.ln = nnx.LayerNorm(6, rngs=rngs)
        self.bn = nnx.BatchNorm(6, rngs=rngs)
        self.rms = nnx.RMSNorm(6, rngs=rngs)
        self.gn = nnx.GroupNorm(6, num_groups=2, rngs=rngs)
        self.head = nnx.Linear(6, 3, use_bias=False, rngs=rngs)

    def __call__(self, tokens):
        x = self.dense(self.embed(tokens))
        return self.head(self.gn(self.rms(self.bn(self.ln(x), use_running_average=True))))


# By construction: decay on the kernels and the embedding table, nowhere else.
NNX_DECAYED = {
    "['bn']['bias']": False, "['bn']['scale']": False, "['dense']['bias']": False, "['dense']['kernel']": True,
    "['embed']['embedding']": True, "['gn']['bias']": False, "['gn']['scale']": False, "['head']['kernel']": True,
    "['ln']['bias']": False, "['ln']['scale']": False, "['rms']['scale']": False,
}  # fmt: skip


def test_weight_decay_mask_on_nnx_state_and_module():
    model = NnxNet(nnx.Rngs(0))
    pure = nnx.as_pure(nnx.state(model, nnx.Param))  # what an NnxOptimizer's transform sees
    assert by_path(modopt.weight_decay_mask(pure)) == NNX_DECAYED
    # On the variables (named by their attribute, not `.value`) and on the module itself, where
    # the normalization layers are also known by type (BatchNorm's statistics included).
    assert by_path(modopt.weight_decay_mask(nnx.state(model, nnx.Param))) == {k + ".value": v for k, v in NNX_DECAYED.items()}
    on_module = by_path(modopt.weight_decay_mask(model))
    assert {k: v for k, v in on_module.items() if v} == {".dense.kernel.value": True, ".embed.embedding.value": True, ".head.kernel.value": True}
    assert on_module[".bn.mean.value"] is False and on_module[".bn.var.value"] is False
    only_names = modopt.WeightDecayMask(exclude=("bias",), exclude_modules=())  # scales decayed again
    assert by_path(only_names(model))[".ln.scale.value"] is True


def _shifted(params):
    """Parameters away from their initial values (biases start at 0, where decay would not show)."""
    return jax.tree.map(lambda p: p + 0.3, params)


def test_nnx_optimizer_with_the_mask_matches_optax_with_the_mask_by_construction():
    model = NnxNet(nnx.Rngs(0))
    nnx.update(model, _shifted(nnx.state(model, nnx.Param)))
    params = nnx.as_pure(nnx.state(model, nnx.Param))
    grads = jax.tree.map(jnp.cos, nnx.state(model, nnx.Param))  # as `nnx.grad` gives them: one step shows the decay
    mask = jax.tree_util.tree_map_with_path(lambda path, _: NNX_DECAYED[jax.tree_util.keystr(path)], params)
    reference = optax.adamw(1e-2, weight_decay=0.5, mask=mask)
    updates, _ = reference.update(nnx.as_pure(grads), reference.init(params), params)
    NnxOptimizer(model, modopt.adamw(1e-2, weight_decay=0.5, mask=modopt.weight_decay_mask)).update(model, grads)
    close(nnx.as_pure(nnx.state(model, nnx.Param)), optax.apply_updates(params, updates))


class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm()(nn.Dense(6)(x))
        x = nn.BatchNorm(use_running_average=True)(x)
        x = nn.GroupNorm(num_groups=2)(nn.RMSNorm(name="final_norm")(x))
        return nn.Dense(3, name="head")(x)


LINEN_DECAYED = {
    "['BatchNorm_0']['bias']": False, "['BatchNorm_0']['scale']": False, "['Dense_0']['bias']": False,
    "['Dense_0']['kernel']": True, "['GroupNorm_0']['bias']": False, "['GroupNorm_0']['scale']": False,
    "['LayerNorm_0']['bias']": False, "['LayerNorm_0']['scale']": False, "['final_norm']['scale']": False,
    "['head']['bias']": False, "['head']['kernel']": True,
}  # fmt: skip


def test_linen_train_state_with_the_mask_matches_optax_with_the_mask_by_construction():
    shapes = jax.eval_shape(LinenNet().init, jax.random.key(0), jnp.zeros((5, 4)))["params"]
    params = _shifted(jax.tree.map(lambda s: jnp.linspace(-1.0, 1.0, np.prod(s.shape)).reshape(s.shape), shapes))
    assert by_path(modopt.weight_decay_mask(params)) == LINEN_DECAYED
    grads = jax.tree.map(jnp.cos, params)
    mask = jax.tree_util.tree_map_with_path(lambda path, _: LINEN_DECAYED[jax.tree_util.keystr(path)], params)
    reference = optax.adamw(1e-2, weight_decay=0.5, mask=mask)
    updates, _ = reference.update(grads, reference.init(params), params)
    state = TrainState.create(apply_fn=None, params=params, tx=modopt.adamw(1e-2, weight_decay=0.5, mask=modopt.weight_decay_mask))
    close(state.apply_gradients(grads=grads).params, optax.apply_updates(params, updates))


def test_the_mask_never_imports_flax(monkeypatch):
    """Flax's types are looked up only where Flax is loaded (a model of it has loaded it)."""
    for name in [name for name in sys.modules if name == "flax" or name.startswith("flax.")]:
        monkeypatch.delitem(sys.modules, name)
    model = eqx.nn.Sequential([eqx.nn.Linear(2, 3, key=jax.random.key(0)), eqx.nn.LayerNorm(3)])
    mask = modopt.weight_decay_mask(model)
    assert (mask.layers[0].weight, mask.layers[0].bias, mask.layers[1].weight) == (True, False, False)
    assert "flax.nnx" not in sys.modules and "flax" not in sys.modules


# ---- pickling -------------------------------------------------------------------------------


def _mlp(depth=1):
    return eqx.nn.MLP(3, 2, 4, depth, key=jax.random.key(0))


def _optimizers():
    model = _mlp()
    params = eqx.filter(model, eqx.is_inexact_array)
    schedule = modopt.warmup_cosine_decay_schedule(0.0, 1e-2, 3, 20)
    deep = _mlp(depth=5)  # 12 small leaves: grouped into flat buffers
    return {
        "schedule (the report)": (modopt.Optimizer(modopt.adam(schedule), model), model),
        "mask tree shaped like the model": (
            modopt.Optimizer(modopt.adamw(1e-3, mask=modopt.weight_decay_mask(params)), model),
            model,
        ),
        "wrt tree": (modopt.Optimizer(modopt.sgd(1e-2, momentum=0.9), model, wrt=jax.tree.map(lambda _: True, model)), model),
        "grouped small leaves": (modopt.Optimizer(modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adam(schedule)), deep), deep),
    }


def test_optimizers_pickle_round_trip_equal_and_step_alike():
    traces = []

    @eqx.filter_jit
    def step(model, optimizer, grads):
        traces.append(None)
        return optimizer.step(model, grads)

    for name, (optimizer, model) in _optimizers().items():
        grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), eqx.filter(model, eqx.is_inexact_array))
        model, optimizer = step(model, optimizer, grads)  # a state that is not the initial one
        expected = step(model, optimizer, grads)
        for pickler in PICKLERS:
            loaded = pickle.loads(pickler.dumps(optimizer))
            assert eqx.tree_equal(loaded, optimizer), (name, pickler)
            before = len(traces)
            assert eqx.tree_equal(step(model, loaded, grads), expected), (name, pickler)
            assert len(traces) == before, f"{name}: the loaded optimizer retraced the step"  # the same static parts


def test_bare_transforms_schedules_and_flax_optimizers_pickle():
    for pickler in PICKLERS:
        for value in (
            modopt.cosine_decay_schedule(1e-3, 10),
            modopt.adamw(modopt.linear_schedule(1e-3, 0.0, 10), mask=modopt.weight_decay_mask),
            modopt.inject_hyperparams(modopt.adam)(learning_rate=1e-3),
            modopt.partition({"a": modopt.sgd(1e-2), "b": modopt.adam(1e-3)}, {"w": "a", "b": "b"}),
        ):
            assert eqx.tree_equal(pickle.loads(pickler.dumps(value)), value), value
        state = TrainState.create(apply_fn=None, params={"w": jnp.ones(3)}, tx=modopt.adam(modopt.cosine_decay_schedule(1e-3, 10)))
        assert eqx.tree_equal(pickle.loads(pickler.dumps(state)), state)
        model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
        nnx_optimizer = NnxOptimizer(model, modopt.adam(modopt.cosine_decay_schedule(1e-3, 10)))
        loaded = pickle.loads(pickler.dumps(nnx_optimizer))
        assert eqx.tree_equal(loaded.tx, nnx_optimizer.tx) and eqx.tree_equal(nnx.state(loaded), nnx.state(nnx_optimizer))


def test_every_registry_transform_pickles():
    """Every transform and optimizer of the catalog, as the registry builds it, round-trips equal.
    Objects without value equality in a field (a `functools.partial`, a schedule object of the
    test's own) compare by identity: there the arrays and the description must be the same."""
    from registry import ENTRIES

    for entry in ENTRIES:
        tx = entry.make()
        loaded = pickle.loads(pickle.dumps(tx))
        if not eqx.tree_equal(loaded, tx):
            described = lambda x: re.sub(r" at 0x[0-9a-f]+", "", repr(x))  # noqa: E731
            assert described(loaded) == described(tx), entry.name
            close(eqx.filter(loaded, eqx.is_array), eqx.filter(tx, eqx.is_array), rtol=0, atol=0)


# ---- set(): a schedule in place of a number -------------------------------------------------


def test_set_replaces_a_constant_learning_rate_by_a_schedule_counting_from_the_next_step():
    params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array([0.5])}
    grad = lambda p: jax.tree.map(lambda x: 2 * x + 1, p)  # noqa: E731
    schedule = modopt.linear_schedule(1e-2, 1e-3, 4)
    optimizer = modopt.Optimizer(modopt.adam(1e-3), params)
    params_ours = params
    for _ in range(2):
        params_ours, optimizer = optimizer.step(params_ours, grad(params_ours))
    optimizer = optimizer.set(learning_rate=schedule)
    assert float(optimizer.learning_rate) == pytest.approx(1e-2) and int(optimizer.count) == 2
    for _ in range(3):
        params_ours, optimizer = optimizer.step(params_ours, grad(params_ours))
    assert int(optimizer.count) == 5 and float(optimizer.learning_rate) == pytest.approx(1e-2 - 3 * (1e-2 - 1e-3) / 4)

    # The reference: optax's Adam direction, its state carried on, scaled by 1e-3 for two steps,
    # then by the schedule at 0, 1, 2 (optax's own linear schedule).
    adam, rates = optax.scale_by_adam(), [1e-3, 1e-3] + [float(optax.linear_schedule(1e-2, 1e-3, 4)(k)) for k in range(3)]
    reference, state = params, adam.init(params)
    for rate in rates:
        direction, state = adam.update(grad(reference), state)
        reference = jax.tree.map(lambda p, d: p - rate * d, reference, direction)
    close(params_ours, reference)


def test_set_schedule_on_a_flax_train_state_and_the_nnx_optimizer_says_how():
    state = TrainState.create(apply_fn=None, params={"w": jnp.ones(3)}, tx=modopt.sgd(0.1, momentum=0.9))
    state = state.apply_gradients(grads={"w": jnp.ones(3)})
    state = state.set(learning_rate=modopt.constant_schedule(0.5))
    assert float(state.learning_rate) == 0.5
    state = state.apply_gradients(grads={"w": jnp.ones(3)})
    # w: 1 - 0.1 * 1 (step 1), then the trace 1 + 0.9 * 1 = 1.9 at the rate 0.5.
    np.testing.assert_allclose(state.params["w"], 1 - 0.1 - 0.5 * 1.9, rtol=1e-6)

    nnx_optimizer = NnxOptimizer(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), modopt.adam(1e-3))
    with pytest.raises(ValueError, match="Cannot set learning_rate to a schedule here: .* build a new optimizer with the schedule"):
        nnx_optimizer.set(learning_rate=modopt.cosine_decay_schedule(1e-3, 10))


def test_set_schedule_on_a_sharded_optimizer_keeps_the_layout():
    mesh = jax.make_mesh((1,), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    params = {"w": jnp.ones((4, 2))}
    optimizer = modopt.Optimizer(modopt.adam(1e-3), params, shardings={"w": sharding})
    optimizer = optimizer.set(learning_rate=modopt.linear_schedule(1e-2, 0.0, 4))
    specs = modopt.sharding.shardings(optimizer, {"w": sharding})
    assert specs.state[1].count.spec == jax.sharding.PartitionSpec() and specs.state[0].mu["w"].spec[0] == "data"
    _, optimizer = jax.jit(lambda p, o: o.step(p, jax.tree.map(jnp.ones_like, p)))(params, optimizer)
    assert float(optimizer.learning_rate) == pytest.approx(7.5e-3)


# ---- non-real and non-numeric hyperparameters -----------------------------------------------

COMPLEX = "is a complex number (hyperparameters are real numbers)"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda o: o.set(learning_rate=1e-3 + 1j), f"Invalid learning_rate: (0.001+1j) {COMPLEX}"),
        (lambda o: o.set(b1=np.complex64(0.5)), f"Invalid b1: (0.5+0j) {COMPLEX}"),
        (lambda o: o.set(eps=jnp.array(1j)), f"Invalid eps: 1j {COMPLEX}"),
        (lambda o: modopt.adam(1e-3, b1=0.9j), f"Invalid b1: 0.9j {COMPLEX} in Adam"),
        (lambda o: modopt.sgd(1e-3 + 0j), f"Invalid learning_rate: (0.001+0j) {COMPLEX} in Sgd"),
        (lambda o: modopt.cosine_decay_schedule(1j, 10), f"Invalid init_value: 1j {COMPLEX} in CosineDecaySchedule"),
        (lambda o: modopt.inject_hyperparams(modopt.adam)(learning_rate=1j), f"Invalid learning_rate: 1j {COMPLEX} in InjectHyperparams"),
        (lambda o: o.set(learning_rate="1e-3"), "Invalid learning_rate: '1e-3' of type str (expected a number or a schedule"),
        (lambda o: o.set(b2=True), "Invalid b2: True of type bool (expected a number) in Adam"),
        (lambda o: o.set(eps=[1e-8, 1e-8]), "Cannot set eps to an array of shape (2,): it has shape ()"),
        (lambda o: modopt.adam(None), "Invalid learning_rate: None (expected a number or a schedule"),
    ],
)
def test_non_real_hyperparameters_are_named(make, message):
    optimizer = modopt.Optimizer(modopt.adam(1e-3), {"w": jnp.ones(2)})
    with pytest.raises(ValueError, match=re.escape(message)):
        make(optimizer)


def test_a_complex_value_is_never_cast_into_a_state_living_hyperparameter():
    optimizer = modopt.Optimizer(modopt.inject_hyperparams(modopt.adam)(learning_rate=1e-3), {"w": jnp.ones(2)})
    with pytest.raises(ValueError, match=re.escape(f"Invalid learning_rate: (0.01+1j) {COMPLEX}")):
        optimizer.set(learning_rate=1e-2 + 1j)
    assert float(optimizer.hyperparameters["learning_rate"]) == pytest.approx(1e-3)


# ---- checkpoints: the mismatch summary and a save that fails --------------------------------


def test_mismatch_leads_with_a_summary_and_pairs_leaves_by_path(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, model=_mlp(depth=1))
        with pytest.raises(CheckpointError) as error:
            manager.restore(model=_mlp(depth=2))  # one hidden layer more
    message = str(error.value)
    assert message.startswith(
        "Cannot restore 'model' from step 1 into this MLP: the checkpoint holds 6 leaves, the target 8 (by top-level "
        "part: .layers 4 against 6). Only in the target: .layers[2].weight, .layers[2].bias; different at the same "
        "path: at .layers[1].weight the checkpoint has an array of shape (2, 4) and dtype float32, the target an "
        "array of shape (4, 4) and dtype float32;"
    ), message
    assert message.endswith("Nothing was restored.")


def _full_disk(monkeypatch):
    """Orbax's write of the checkpoint's JSON record fails as on a full disk."""
    from orbax.checkpoint._src.handlers import json_checkpoint_handler

    async def full(self, item, directory):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", full)


def _unfinished(directory):
    return [name for name in os.listdir(directory) if ".orbax-checkpoint-tmp" in name]


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_a_save_that_fails_for_a_full_disk_leaves_no_files_behind(tmp_path, monkeypatch, async_save):
    params = {"w": jnp.arange(4.0)}
    with CheckpointManager(tmp_path, async_save=async_save) as manager:
        manager.save(1, params=params)
        manager.wait_until_finished()
        with monkeypatch.context() as patch:
            _full_disk(patch)
            with pytest.raises(OSError) as error:
                manager.save(2, params=params)
                manager.wait_until_finished()  # where a background save's error comes out
        assert error.value.errno == errno.ENOSPC
        assert "unfinished files (2.orbax-checkpoint-tmp" in "\n".join(getattr(error.value, "__notes__", []))
        assert _unfinished(tmp_path) == [] and manager.all_steps() == [1]
        manager.save(2, params=params)  # the disk has room again
    with CheckpointManager(tmp_path) as manager:
        assert manager.all_steps() == [1, 2] and eqx.tree_equal(manager.restore(params=params)["params"], params)


def test_a_new_manager_removes_leftovers_unless_a_writer_holds_the_directory(tmp_path):
    params = {"w": jnp.arange(4.0)}
    writer = CheckpointManager(tmp_path)
    writer.save(1, params=params)
    writer.wait_until_finished()
    in_flight = tmp_path / "2.orbax-checkpoint-tmp"  # as the writer's next save, being written
    in_flight.mkdir()
    (in_flight / "data").write_bytes(b"x" * 1000)
    with CheckpointManager(tmp_path) as reader:  # a reader while the writer holds the lock: leaves it
        assert _unfinished(tmp_path) == ["2.orbax-checkpoint-tmp"] and reader.all_steps() == [1]
    writer.close()
    # Left by a save that never finished (the writer is gone now): the next manager removes it at start.
    with CheckpointManager(tmp_path) as manager:
        assert _unfinished(tmp_path) == [] and manager.all_steps() == [1]
        assert eqx.tree_equal(manager.restore(params=params)["params"], params)
