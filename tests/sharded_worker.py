"""Sharded checks on 8 simulated CPU devices, run in a subprocess by `test_sharded.py`.

Usage: `python sharded_worker.py CASE [ARG]`. The device count must be set before jax is
imported, and a hung XLA collective must fail one test only, so every case runs in its own
process. Sharded loops block on their results every step: queued sharded steps can deadlock
XLA's CPU collectives on a 2-core machine. Exits non-zero (with the reason) on failure.
"""

from __future__ import annotations

import os
import sys

DEVICES = int(os.environ.get("MODOPT_TEST_DEVICES", "8"))
# The checks compare runs compiled alike in this process; LLVM's optimizations and XLA's default CPU
# fusion emitters only cost compile time here (the elemental emitters, as in the rest of the suite,
# compile these checks in half the time).
os.environ["XLA_FLAGS"] = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),
        "--xla_cpu_use_fusion_emitters=false",
        f"--xla_force_host_platform_device_count={DEVICES}",
        "--xla_backend_optimization_level=0",
    ]
)
sys.path.insert(0, os.path.dirname(__file__))

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from registry import BY_NAME

import modopt
import testing_gc

testing_gc.collect_less()

STEPS = 3
NEWTON_SCHULZ_TOLERANCE = 1e-3
# The registry's leaf names (its masks and labels use them), with shapes the 4-way "model"
# axis divides. "big" is a matrix Adafactor factors; its row statistic drops the split axis.
SHAPES = {"matrix": (6, 8), "vector": (8,), "scalar": (), "cube": (2, 3, 4), "big": (130, 136)}
SPECS = {"matrix": P(None, "model"), "vector": P("model"), "scalar": P(), "cube": P(None, None, "model"), "big": P(None, "model")}


def make_mesh(kind: str = "auto"):
    axis_type = AxisType.Explicit if kind == "explicit" else AxisType.Auto
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type, axis_type))


def named(mesh, specs):
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, P))


def make_params():
    keys = jax.random.split(jax.random.key(0), len(SHAPES))
    return {name: jax.random.normal(k, shape) for k, (name, shape) in zip(keys, SHAPES.items())}


def make_grads(step):
    keys = jax.random.split(jax.random.fold_in(jax.random.key(1), step), len(SHAPES))
    return {name: jax.random.normal(k, shape) for k, (name, shape) in zip(keys, SHAPES.items())}


def numbers(leaf):
    """A leaf as float64 NumPy; a typed PRNG key as its key data."""
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.asarray(leaf, np.float64)


def assert_close(ours, reference, what, tolerance):
    flat_ours = jax.tree_util.tree_flatten_with_path(ours)[0]
    flat_ref = jax.tree_util.tree_leaves(reference)
    assert len(flat_ours) == len(flat_ref), f"{what}: {len(flat_ours)} leaves, expected {len(flat_ref)}"
    for (path, a), b in zip(flat_ours, flat_ref):
        np.testing.assert_allclose(
            numbers(a), numbers(b), rtol=tolerance, atol=tolerance,
            err_msg=f"{what} at {jax.tree_util.keystr(path)}",
        )


def assert_placed(tree, shardings, what):
    """Every array of `tree` lies exactly as `shardings` says."""
    for (path, leaf), sharding in zip(
        jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree_util.tree_structure(tree).flatten_up_to(shardings)
    ):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (
            f"{what} at {jax.tree_util.keystr(path)} is {leaf.sharding}, expected {sharding}"
        )


def loss(params):
    return sum(jnp.sum(x**2) for x in jax.tree.leaves(params))


def stepper(entry=None):
    """`step(params, optimizer, grads)`, passing the extra arguments the entry needs."""

    def step(params, optimizer, grads):
        extra = entry.args(loss(params), params) if entry is not None else {}
        return optimizer.step(params, grads, **extra)

    return step


def reference_run(tx, steps=STEPS, entry=None):
    """The same steps on one device."""
    step = eqx.filter_jit(stepper(entry))
    params, optimizer = make_params(), modopt.Optimizer(tx, make_params())
    for i in range(steps):
        params, optimizer = step(params, optimizer, make_grads(i))
    return params, optimizer


def registry(*names: str) -> None:
    """Registry entries on Auto mesh axes; see `registry_entry`."""
    for name in names:
        registry_entry(name, "auto")


def registry_explicit(*names: str) -> None:
    """Registry entries on Explicit mesh axes; see `registry_entry`."""
    for name in names:
        registry_entry(name, "explicit")


# Stepped eagerly on Explicit axes too (its last step, with ZeRO-1): the owner scheme's
# `shard_map` with Kron's draws, captured from outside it. Op by op on 8 devices this costs
# about 15 s, so one entry only.
STEPPED_EAGERLY = {"kron"}


def registry_entry(name: str, kind: str) -> None:
    """One registry entry on the 2x4 mesh, the parameters split over "model", with ZeRO-1 (and,
    on Explicit axes, also without).

    The derived shardings serve as `out_shardings` of a jitted init and a jitted, donated
    step; the arrays land as derived, and the steps equal the single-device steps.

    On Auto axes the run with ZeRO-1 alone: its layout is the plain one with "data" added where
    a dimension allows (`_with_axis`; a leaf no dimension of which allows it keeps the plain
    spec), and nothing in the step depends on the layout there (sharding constraints only, no
    typed shardings), so a plain run would repeat the ZeRO-1 run's check with fewer splits.
    Both layouts are derived and checked for every entry in `test_registry.
    test_state_placed_on_a_mesh`; below, each leaf of the ZeRO-1 state is checked against its
    plain sharding. On Explicit axes the shardings are typed and the update runs under
    `update_on_mesh`'s `auto_axes` with the state's own specs: there both layouts run.
    """
    entry = BY_NAME[name]
    tx = entry.make()
    mesh = make_mesh(kind)
    param_shardings = named(mesh, SPECS)
    abstract = eqx.filter_eval_shape(modopt.Optimizer, tx, make_params())
    reference_params, reference = reference_run(tx, entry=entry)
    # Newton-Schulz iterations (the Muon family) amplify the rounding of matrix products split
    # over devices: up to 2.5e-4 from one device's run (muon_dion_adaptive). Orthogonalizing each
    # shard on its own instead of the whole matrix would be off by far more.
    tolerance = max(entry.tolerance, NEWTON_SCHULZ_TOLERANCE if "muon" in name else 1e-5)
    plain = modopt.sharding.shardings(abstract, param_shardings)
    zero = modopt.sharding.shardings(abstract, param_shardings, zero_axis="data")

    for opt_shardings in (plain, zero) if kind == "explicit" else (zero,):
        params = jax.device_put(make_params(), param_shardings)
        # Blocked on before the first step: a sharded init may hold collectives (see the module's docstring).
        optimizer = jax.block_until_ready(jax.jit(lambda p: modopt.Optimizer(tx, p), out_shardings=opt_shardings)(params))
        assert_placed(optimizer, opt_shardings, "new optimizer")
        step = jax.jit(stepper(entry), out_shardings=(param_shardings, opt_shardings), donate_argnums=(0, 1))
        for i in range(STEPS):
            if i == STEPS - 1 and kind == "explicit" and name in STEPPED_EAGERLY and opt_shardings is zero:
                # The step run eagerly (op by op, not under jit) under `jax.set_mesh`: the jitted step's numbers.
                grads = jax.device_put(make_grads(i), param_shardings)
                with jax.set_mesh(mesh):
                    eager_params, eager_optimizer = stepper(entry)(params, optimizer, grads)
                params, optimizer = jax.block_until_ready(step(params, optimizer, grads))
                assert_close(eager_params, params, "params stepped eagerly", tolerance)
                assert_close(eager_optimizer.state, optimizer.state, "state stepped eagerly", tolerance)
                continue
            params, optimizer = step(params, optimizer, jax.device_put(make_grads(i), param_shardings))
            jax.block_until_ready((params, optimizer))
        assert_placed(optimizer, opt_shardings, "optimizer after the steps")
        assert_close(params, reference_params, "params", tolerance)
        assert_close(optimizer.state, reference.state, "state", tolerance)

    # ZeRO-1 halves (the data axis has 2 devices) what each device holds of every state leaf a
    # dimension of whose plain shard the 2-way axis divides; a leaf with none (a scalar, an
    # odd-length vector) stays as it was, and so does a stack of the owner scheme (`OWNED`:
    # each matrix's state whole on its owner; `OWNED_ELEMENTWISE`: split over every device). Measured on the devices, for leaves of every size.
    rules = jax.tree_util.tree_leaves(
        tx.state_specs(abstract.signature.params(), SPECS),
        is_leaf=lambda x: x is modopt.sharding.OWNED or x is modopt.sharding.OWNED_ELEMENTWISE,
    )
    for (path, leaf), plain_sharding, rule in zip(
        jax.tree_util.tree_flatten_with_path(optimizer.state)[0], jax.tree_util.tree_leaves(plain.state), rules
    ):
        held = max(shard.data.nbytes for shard in leaf.addressable_shards)
        unsplit = int(np.prod(plain_sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize
        owned = rule is modopt.sharding.OWNED or rule is modopt.sharding.OWNED_ELEMENTWISE  # split over every device already
        halved = not owned and any(d % 2 == 0 for d in plain_sharding.shard_shape(leaf.shape))
        assert held * (2 if halved else 1) == unsplit, (
            f"state{jax.tree_util.keystr(path)}: {held} bytes per device, {unsplit} without ZeRO"
        )
    print(f"ok {name} {kind}")


def mlp_shardings(model, mesh):
    """Weights over "model" (Megatron style: hidden units split), biases alike, the rest replicated."""

    def spec(path, leaf):
        if not eqx.is_array(leaf):
            return None
        name = jax.tree_util.keystr(path)
        if name.startswith(".layers[0]"):
            return P("model", None) if leaf.ndim == 2 else P("model")
        if name.startswith(".layers[1]"):
            return P(None, "model") if leaf.ndim == 2 else P()
        return P()

    return named(mesh, jax.tree_util.tree_map_with_path(spec, model))


def mse(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def mse_on_auto_axes(model, x, y):
    # Under Explicit axes, eqx.nn.Linear's matmuls would need an out_sharding each; the loss
    # runs on Auto axes instead (the optimizer itself needs no such help).
    arrays, rest = eqx.partition(model, eqx.is_array)
    return jax.sharding.auto_axes(lambda a, x, y: mse(eqx.combine(a, rest), x, y), out_sharding=P())(arrays, x, y)


def mlp(kind: str, zero: str = "") -> None:
    """An MLP trained 32 steps on the 2x4 mesh (batch over "data", weights over "model") has
    the same loss curve as on one device. The optimizer is created directly sharded."""
    steps = 32
    mesh = make_mesh(kind)
    model = eqx.nn.MLP(16, 8, 32, 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (64, 16))
    y = jnp.sin(x[:, :8])
    tx = modopt.adamw(3e-3, weight_decay=1e-2)
    loss_fn = mse

    @eqx.filter_jit(donate="all-except-first")
    def step(batch, model, optimizer):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, *batch)
        model, optimizer = optimizer.step(model, grads)
        return loss, model, optimizer

    reference_model = jax.tree.map(lambda x: jnp.copy(x) if eqx.is_array(x) else x, model)  # the loop donates it
    reference_opt, reference_losses = modopt.Optimizer(tx, reference_model), []
    for _ in range(steps):
        loss, reference_model, reference_opt = step((x, y), reference_model, reference_opt)
        reference_losses.append(float(loss))

    loss_fn = mse_on_auto_axes if kind == "explicit" else mse
    with jax.set_mesh(mesh):  # a context: the next case in this process starts without a mesh
        model_shardings = mlp_shardings(model, mesh)
        batch = jax.device_put((x, y), NamedSharding(mesh, P("data", None)))
        model = jax.tree.map(lambda x, s: x if s is None else jax.device_put(x, s), model, model_shardings)
        optimizer = modopt.Optimizer(tx, model, shardings=model_shardings, zero_axis="data" if zero else None)
        expected = modopt.sharding.shardings(optimizer, model_shardings, zero_axis="data" if zero else None)
        assert_placed(optimizer, expected, "new optimizer")
        losses = []
        for _ in range(steps):
            loss, model, optimizer = step(batch, model, optimizer)
            losses.append(float(loss))  # blocks every step
        assert_placed(optimizer, expected, "optimizer after training")
        assert_placed(eqx.filter(model, eqx.is_array), model_shardings, "model after training")
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-5, atol=1e-7)
    assert losses[-1] < 0.5 * losses[0], losses
    print(f"ok mlp {kind} zero={bool(zero)}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def created() -> None:
    """`Optimizer(..., shardings=..., zero_axis=...)` creates the state on its shardings, and the
    compiled init allocates on each device only that device's part, never the whole state."""
    mesh = make_mesh()
    param_shardings = {"w": NamedSharding(mesh, P(None, "model")), "b": NamedSharding(mesh, P("model"))}
    params = jax.device_put({"w": jnp.ones((1024, 1024)), "b": jnp.ones((1024,))}, param_shardings)
    for tx in (modopt.adam(1e-3), modopt.adafactor(1e-2, min_dim_size_to_factor=1)):
        # On these simulated CPU devices the constructor waits for its sharded init (what it waits on: counted here).
        waited, wait = [], jax.block_until_ready
        jax.block_until_ready = lambda tree: waited.append(tree) or wait(tree)
        try:
            optimizer = modopt.Optimizer(tx, params, shardings=param_shardings, zero_axis="data")
        finally:
            jax.block_until_ready = wait
        state_leaves = {id(x) for x in jax.tree.leaves(optimizer.state)}
        assert any(state_leaves <= {id(x) for x in jax.tree.leaves(tree)} for tree in waited), "the constructor did not wait for the state"
        expected = modopt.sharding.shardings(optimizer, param_shardings, zero_axis="data")
        assert_placed(optimizer, expected, f"{type(tx).__name__} created sharded")
        per_device = modopt.sharding.bytes_per_device(optimizer.state, expected.state)
        whole = modopt.sharding.bytes_per_device(jax.eval_shape(tx.init, params))
        # Split 8 ways, except Adafactor's row statistic: "model" split the axis it reduces.
        assert per_device * 3 < whole, (per_device, whole)
        # The function and out_shardings that `Layout.init` (used by `Optimizer.__init__`) jits.
        init = jax.jit(modopt.sharding._shardings._init, out_shardings=optimizer.layout.state)
        memory = init.lower(optimizer.tx, params).compile().memory_analysis()
        allocated = memory.output_size_in_bytes + memory.temp_size_in_bytes
        assert allocated <= per_device + 64, f"{type(tx).__name__}: init allocates {allocated} bytes per device, the state's part is {per_device}"
        print(f"{type(tx).__name__}: {allocated} bytes allocated per device by the init, {whole} for the whole state")
    bad = {"w": NamedSharding(mesh, P(None, "model")), "b": NamedSharding(mesh, P("model"))}
    odd = jax.device_put({"w": jnp.ones((8, 8)), "b": jnp.ones((6,))}, NamedSharding(mesh, P()))
    try:
        modopt.Optimizer(modopt.adam(1e-3), odd, shardings=bad)
    except ValueError as error:
        expected = "Cannot shard the parameter at ['b'] (shape (6,)) as P('model',): dimension 0 has size 6"
        assert expected in str(error), str(error)
    else:
        raise AssertionError("an indivisible layout was accepted")
    print("ok created")


def checkpoint(directory: str, action: str, *devices: str) -> None:
    """Adam with ZeRO-1 on a (data, model) mesh: `save` trains 3 steps on all 8 devices and
    saves; `resume 4 1` (a new process, as after a restart) restores onto a mesh of 4 of its
    devices and, separately, onto a mesh of 1, trains 3 more on each, and checks each result
    against 6 steps on one device (within float tolerance: XLA fuses sharded steps differently).
    The meshes of fewer devices than the process has stand for processes of that many devices
    (Orbax places what it restores by the target's shardings alone); one process serves both
    restores and the one-device reference."""
    from modopt.integrations.orbax import CheckpointManager

    tx = modopt.adam(1e-2)
    step = eqx.filter_jit(lambda p, o, g: o.step(p, g), donate="all-except-first")

    def start(count):
        mesh = jax.make_mesh((2, count // 2) if count > 1 else (1, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2,
                             devices=jax.devices()[:count])  # fmt: skip
        param_shardings = named(mesh, SPECS)
        params = jax.device_put(make_params(), param_shardings)
        optimizer = modopt.Optimizer(tx, params, shardings=param_shardings, zero_axis="data")
        return param_shardings, params, optimizer

    def train(param_shardings, params, optimizer, steps):
        for i in steps:
            params, optimizer = step(params, optimizer, jax.device_put(make_grads(i), param_shardings))
            jax.block_until_ready(params)
        return params, optimizer

    if action == "save":
        param_shardings, params, optimizer = start(DEVICES)
        params, optimizer = train(param_shardings, params, optimizer, range(STEPS))
        with CheckpointManager(directory) as manager:
            manager.save(STEPS, params=params, optimizer=optimizer)
        print(f"ok saved on {DEVICES} devices")
        return
    reference_params, reference = reference_run(tx, 2 * STEPS)
    for count in map(int, devices):
        param_shardings, params, optimizer = start(count)
        with CheckpointManager(directory) as manager:
            restored = manager.restore(params=params, optimizer=optimizer)
        params, optimizer = restored["params"], restored["optimizer"]
        expected = modopt.sharding.shardings(optimizer, param_shardings, zero_axis="data")
        assert_placed(optimizer, expected, "restored")
        assert {d.id for leaf in jax.tree.leaves(optimizer) for d in leaf.sharding.device_set} == set(range(count))
        params, optimizer = train(param_shardings, params, optimizer, range(STEPS, 2 * STEPS))
        assert_close(params, reference_params, "params", 1e-6)
        assert_close(optimizer.state, reference.state, "state", 1e-6)
        print(f"ok resumed on {count} devices")


def flax_train_state() -> None:
    """A linen TrainState sharded from logical axis rules alone (no hand-written specs), trained
    5 steps with Adafactor (whose factored statistics drop the split axis): one device's numbers."""
    import flax.linen as nn
    from modopt.integrations.flax import TrainState, param_shardings, state_shardings

    def dense(features, names):
        init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)
        return nn.Dense(features, kernel_init=init, bias_init=nn.with_logical_partitioning(nn.initializers.zeros, names[1:]))

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return dense(8, ("mlp", "vocab"))(nn.relu(dense(256, ("embed", "mlp"))(x)))

    model, mesh = Model(), make_mesh()
    rules = (("embed", None), ("mlp", "model"), ("vocab", None))
    x = jax.random.normal(jax.random.key(0), (32, 136))
    y = jnp.cos(x[:, :8])
    tx = modopt.adafactor(1e-2)

    def create(key):
        params = nn.unbox(model.init(key, x)["params"])
        return TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    def train_step(state, batch):
        loss_fn = lambda p: jnp.mean((state.apply_fn({"params": p}, batch[0]) - batch[1]) ** 2)  # noqa: E731
        return state.apply_gradients(grads=jax.grad(loss_fn)(state.params))

    reference = jax.jit(create)(jax.random.key(1))
    for _ in range(5):
        reference = jax.jit(train_step)(reference, (x, y))

    params_sharding = param_shardings(jax.eval_shape(model.init, jax.random.key(1), x)["params"], mesh, rules)
    hidden = "Dense_1"  # Python builds the output layer (Dense_0) first
    assert params_sharding[hidden]["kernel"].spec == P(None, "model")
    shardings = state_shardings(jax.eval_shape(create, jax.random.key(1)), params_sharding)
    assert shardings.opt_state[0].v_row[hidden]["kernel"].spec == P(None)  # (136,): "model" was reduced
    assert shardings.opt_state[0].v_col[hidden]["kernel"].spec == P("model")  # (256,)
    state = jax.jit(create, out_shardings=shardings)(jax.random.key(1))
    batch = jax.device_put((x, y), NamedSharding(mesh, P("data")))
    step = jax.jit(train_step, out_shardings=shardings, donate_argnums=0)
    for _ in range(5):
        state = step(state, batch)
        jax.block_until_ready(state)
    assert_close(state.params, reference.params, "params", 1e-5)
    assert_close(state.opt_state, reference.opt_state, "opt_state", 1e-5)
    print("ok flax")


def nnx_optimizer() -> None:
    """An NNX model sharded by its variables' metadata; the NnxOptimizer's state (Adafactor,
    ZeRO-1) derived from it with no hand-written specs; 5 steps equal one device's."""
    from flax import nnx
    from modopt.integrations.flax import NnxOptimizer, param_shardings

    class Model(nnx.Module):
        def __init__(self, rngs):
            split = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
            self.hidden = nnx.Linear(136, 256, kernel_init=split, rngs=rngs)
            self.out = nnx.Linear(256, 8, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.relu(self.hidden(x)))

    x = jax.random.normal(jax.random.key(0), (32, 136))
    y = jnp.cos(x[:, :8])

    @nnx.jit
    def step(model, optimizer, x, y):
        optimizer.update(model, nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model))

    one_device = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:1])
    with jax.set_mesh(one_device):  # the annotations need a mesh; this one has a single device
        reference_model = Model(nnx.Rngs(0))
        reference = NnxOptimizer(reference_model, modopt.adafactor(1e-2), wrt=nnx.Param)
        for _ in range(5):
            step(reference_model, reference, x, y)

    mesh = make_mesh()
    with jax.set_mesh(mesh):
        model = Model(nnx.Rngs(0))
        shardings = param_shardings(nnx.state(model, nnx.Param), mesh)
        optimizer = NnxOptimizer(model, modopt.adafactor(1e-2), wrt=nnx.Param, shardings=shardings, zero_axis="data")
        v_col = nnx.as_pure(optimizer.opt_state)[0].v_col["hidden"]["kernel"]  # (256,): the split axis
        assert v_col.sharding.spec == P(("model", "data")), v_col.sharding
        batch = jax.device_put((x, y), NamedSharding(mesh, P("data")))
        for _ in range(5):
            step(model, optimizer, *batch)
            jax.block_until_ready(nnx.state(model))
    assert_close(nnx.state(model, nnx.Param), nnx.state(reference_model, nnx.Param), "params", 1e-5)
    print("ok nnx")


def readme() -> None:
    """The guide's "Sharded training" examples (docs/guides/devices.md) run as written."""
    import textwrap

    import pages

    blocks = [textwrap.dedent(block) for block in pages.python_blocks(pages.section("docs/guides/devices.md", "Sharded training"))]
    assert len(blocks) == 2, f"expected the example and the planning snippet, found {len(blocks)} blocks"
    namespace: dict = {}
    exec(compile("\n".join(blocks), "docs/guides/devices.md", "exec"), namespace)
    assert namespace["optimizer"].state[0].mu.layers[1].weight.sharding.spec == P("model", "data")
    print("ok readme")


def galore_both_ways() -> None:
    """GaLore on weights of shapes (24, 8) and (8, 24), six of each split over "model": one stack
    of twelve units (the tall ones transposed), two per device (one of them padding on four
    devices), each unit through the SVD of its own orientation. Two steps, the first a refresh:
    one device's numbers."""
    shapes = {**{f"tall{i}": (24, 8) for i in range(6)}, **{f"wide{i}": (8, 24) for i in range(6)}}
    specs = {name: P("model", None) if name.startswith("tall") else P(None, "model") for name in shapes}
    keys = dict(zip(shapes, jax.random.split(jax.random.key(2), len(shapes))))

    def draw(step):
        return {name: jax.random.normal(jax.random.fold_in(keys[name], step), shape) for name, shape in shapes.items()}

    tx = modopt.contrib.galore(0.1, rank=4, update_proj_gap=2)
    step = stepper()
    one_params, one = draw(100), modopt.Optimizer(tx, draw(100))
    mesh = make_mesh()
    shardings = named(mesh, specs)
    params = jax.device_put(draw(100), shardings)
    optimizer = modopt.Optimizer(tx, params, shardings=shardings)
    jitted = jax.jit(step)
    for i in range(2):
        one_params, one = eqx.filter_jit(step)(one_params, one, draw(i))
        params, optimizer = jax.block_until_ready(jitted(params, optimizer, jax.device_put(draw(i), shardings)))
    assert_close(params, one_params, "params", 1e-5)
    assert_close(optimizer.state, one.state, "state", 1e-5)
    print("ok galore both ways")


CASES = {"registry": registry, "registry_explicit": registry_explicit, "mlp": mlp, "created": created, "checkpoint": checkpoint, "flax": flax_train_state, "nnx": nnx_optimizer, "readme": readme, "galore_both_ways": galore_both_ways}

if __name__ == "__main__":
    # Several cases may share a process, separated by "+": `mlp auto + mlp auto zero + flax`.
    words = sys.argv[1:]
    while words:
        case = words[: words.index("+")] if "+" in words else words
        words = words[len(case) + 1 :]
        CASES[case[0]](*case[1:])
