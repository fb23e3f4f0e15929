"""SOAP (`scale_by_soap`, `soap`) against `pytorch_optimizer.SOAP` 4.1.0, the authors'
reference rules, NumPy and its own sharding rule.

Both sides run in float32. Updates agree to about 1e-6 of their size; the tolerance 1e-4 allows
for two LAPACK eigensolvers (JAX's and torch's) giving eigenvectors that differ in the last
bits, amplified where Adam divides by a small `sqrt(v)`. Eigenvectors are defined up to sign: a
column's sign cancels in the update (the basis rotates there and back), so bases are compared up
to the sign of each column.

Shapes are chosen so that every rotated dimension's statistic has full rank from the first
gradient on (a `(6, 4)` matrix rotates only its 4-dimension, with `max_precondition_dim=5`): the
eigenvectors of a repeated (zero) eigenvalue are arbitrary, and in float32 the rounding noise in
those directions is of the size of `eps = 1e-8`. `test_rank_deficient_statistics` covers that
case with a larger `eps`, where the update no longer depends on the arbitrary vectors.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

import modopt
from modopt.transforms._soap import merged_groups

torch = pytest.importorskip("torch")
pytorch_optimizer = pytest.importorskip("pytorch_optimizer")

SHAPES = {"square": (4, 4), "tall": (6, 4), "vector": (5,), "cube": (3, 4, 2), "scalar": ()}
STEPS = 10
TOLERANCE = 1e-4


def make(shapes, seed=0, steps=STEPS):
    rng = np.random.RandomState(seed)
    params = {k: np.asarray(rng.randn(*s), np.float32) for k, s in shapes.items()}
    grads = [{k: np.asarray(rng.randn(*s), np.float32) for k, s in shapes.items()} for _ in range(steps)]
    return params, grads


def torch_run(params, grads, sync=None, **kwargs):
    """`pytorch_optimizer.SOAP`'s parameter changes per step and its states after each step.

    `sync(step)`, if given, returns the parameters to set before that step (to compare one
    step at a time from the same parameters)."""
    tensors = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()}
    optimizer = pytorch_optimizer.SOAP(list(tensors.values()), **kwargs)
    deltas, states = [], []
    for step, g in enumerate(grads):
        if sync is not None:
            with torch.no_grad():
                for k, v in sync(step).items():
                    tensors[k].copy_(torch.tensor(v))
        before = {k: t.detach().clone() for k, t in tensors.items()}
        for k, t in tensors.items():
            t.grad = torch.tensor(g[k])
        optimizer.step()
        deltas.append({k: (t.detach() - before[k]).numpy() for k, t in tensors.items()})
        states.append({k: _torch_state(optimizer.state[t]) for k, t in tensors.items()})
    return deltas, states


def _torch_state(state):
    def matrices(ms):
        return [None if len(m) == 0 else m.numpy().copy() for m in ms]

    return {
        "mu": state["exp_avg"].numpy().copy(),
        "nu": state["exp_avg_sq"].numpy().copy(),
        "statistics": matrices(state["GG"]),
        "eigenbases": matrices(state["Q"]),
    }


def jax_run(tx, params, grads, jit=True):
    """The updates, and the states per parameter (`unstacked`), after each step."""
    state = tx.init(jax.tree.map(jnp.asarray, params))
    update = jax.jit(tx.update) if jit else tx.update
    updates, states = [], []
    for g in grads:
        u, state = update(jax.tree.map(jnp.asarray, g), state)
        updates.append(u)
        states.append(tx.unstacked(state, params))
    return updates, states


def back_to_parameter_basis(x, bases):
    """NumPy: `x` rotated by `Q` along each dimension that has a basis (`Q x` for a vector)."""
    for axis, q in enumerate(bases):
        if q is not None:
            x = np.moveaxis(np.tensordot(q, x, axes=([1], [axis])), 0, axis)
    return x


def assert_close(ours, theirs, what, tolerance=TOLERANCE):
    np.testing.assert_allclose(np.asarray(ours, np.float64), np.asarray(theirs, np.float64), rtol=tolerance, atol=tolerance, err_msg=what)


def assert_same_basis(ours, theirs, what):
    """Equal orthogonal matrices up to the sign of each column."""
    ours = np.asarray(ours, np.float64)
    signs = np.sign(np.sum(ours * theirs, axis=0))
    assert_close(ours * signs, theirs, what)


def compare(updates, states, deltas, torch_states, shapes, scale=1.0, sign_free=True):
    for step, (u, state, delta, theirs) in enumerate(zip(updates, states, deltas, torch_states)):
        for k in shapes:
            where = f"{k} at step {step}"
            assert_close(-scale * np.asarray(u[k]), delta[k], f"update of {where}")
            ref = theirs[k]
            assert_close(state.nu[k], ref["nu"], f"nu of {where}")
            ours_bases = [None if q is None else np.asarray(q) for q in state.eigenbases[k]]
            if step > 0:
                # Ours is in the eigenbasis, pytorch_optimizer's in the parameter's basis.
                mu = back_to_parameter_basis(np.asarray(state.mu[k]), ours_bases)
                assert_close(mu, ref["mu"], f"mu of {where}")
            assert len(state.statistics[k]) == len(ref["statistics"]), where
            for i, (s, rs, q, rq) in enumerate(zip(state.statistics[k], ref["statistics"], ours_bases, ref["eigenbases"])):
                assert (s is None) == (rs is None) == (q is None) == (rq is None), f"identity dimension {i} of {where}"
                if s is not None:
                    assert_close(s, rs, f"statistic {i} of {where}")
                    assert_same_basis(q, rq, f"eigenbasis {i} of {where}")


def torch_kwargs(b1=0.95, b2=0.95, **kwargs):
    return {"lr": 1.0, "betas": (b1, b2), "weight_decay": 0.0, **kwargs}


CONFIGS = {
    "defaults": {},
    "betas_and_shampoo_beta": {"b1": 0.9, "b2": 0.99, "shampoo_beta": 0.8},
    "no_bias_correction": {"correct_bias": False, "b1": 0.8},
}


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_scale_by_soap_matches_pytorch_optimizer(config):
    """10 steps, eigenbases refreshed at steps 2, 4, ... (frequency 2): updates, both moments,
    statistics and bases equal pytorch_optimizer's (lr=1, no weight decay). The (6, 4)
    matrix's 6-dimension, the vector and the scalar stay in the parameter's basis."""
    kwargs = {"precondition_frequency": 2, "max_precondition_dim": 5, **CONFIGS[config]}
    params, grads = make(SHAPES)
    ours = jax_run(modopt.scale_by_soap(**kwargs), params, grads)
    theirs = torch_run(params, grads, **torch_kwargs(**kwargs))
    compare(*ours, *theirs, SHAPES)
    assert all(ours[0][0][k].shape == SHAPES[k] for k in SHAPES)
    assert not np.any(np.asarray(ours[0][0]["square"])), "the first update gathers statistics only"


def test_eager_equals_jitted():
    params, grads = make(SHAPES, steps=3)
    tx = modopt.scale_by_soap(precondition_frequency=2, max_precondition_dim=5)
    jitted, _ = jax_run(tx, params, grads)
    eager, _ = jax_run(tx, params, grads, jit=False)
    for a, b in zip(jitted, eager):
        for k in SHAPES:
            assert_close(a[k], b[k], k, 1e-6)


def test_normalize_grads():
    """pytorch_optimizer adds `eps` to the root mean square, the authors' code (and ours) 1e-30:
    with root mean squares near 1 the two agree far inside the tolerance."""
    kwargs = {"precondition_frequency": 3, "max_precondition_dim": 5, "normalize_grads": True}
    params, grads = make(SHAPES, seed=1)
    ours = jax_run(modopt.scale_by_soap(**kwargs), params, grads)
    kwargs["normalize_gradient"] = kwargs.pop("normalize_grads")
    theirs = torch_run(params, grads, **torch_kwargs(**kwargs))
    compare(*ours, *theirs, SHAPES)


MERGED = {"cube": (2, 2, 4), "image": (1, 3, 3, 9)}


@pytest.mark.parametrize("data_format", ["channels_first", "channels_last"])
def test_merge_dims_matches_pytorch_optimizer(data_format):
    """With `merge_dims` (max 12): (2, 2, 4) rotates as (4, 4); the 4-D leaf as (9, 9) either
    way, from axes (0, 1, 2), (3) channels first, or (0, 3), (1, 2) channels last (NHWC read as
    NCHW). Shapes on which pytorch_optimizer's merge rule and the authors' agree (its rule
    turns a tensor that fits in one dimension, a vector included, into shape (1,), which fails)."""
    kwargs = {"precondition_frequency": 2, "max_precondition_dim": 12, "merge_dims": True, "data_format": data_format}
    params, grads = make(MERGED, seed=2)
    updates, states = jax_run(modopt.scale_by_soap(**kwargs), params, grads)
    deltas, torch_states = torch_run(params, grads, **torch_kwargs(**kwargs))
    for step, (u, state, delta, ref) in enumerate(zip(updates, states, deltas, torch_states)):
        for k in MERGED:
            where = f"{k} at step {step}"
            assert_close(-np.asarray(u[k]), delta[k], f"update of {where}")
            assert_close(state.nu[k], ref[k]["nu"], f"nu of {where}")
            for s, rs, q, rq in zip(state.statistics[k], ref[k]["statistics"], state.eigenbases[k], ref[k]["eigenbases"]):
                assert_close(s, rs, f"statistic of {where}")
                assert_same_basis(q, rq, f"eigenbasis of {where}")
    assert [s.shape for s in states[-1].statistics["cube"]] == [(4, 4), (4, 4)]
    assert [s.shape for s in states[-1].statistics["image"]] == [(9, 9), (9, 9)]


def test_rank_deficient_statistics():
    """A (6, 4) matrix rotated on both dimensions (its 6x6 statistic has rank 4 after the first
    gradient) and a 2-vector (`precondition_1d`: rank one at first). The eigenvectors of a zero
    eigenvalue are arbitrary, each eigensolver picks its own, and the next gradient has a part
    along them: so the first bases are taken from pytorch_optimizer, and from there on (the
    refresh at step 2 sees full-rank statistics) everything agrees."""
    shapes = {"tall": (6, 4), "vector": (2,)}
    kwargs = {"precondition_frequency": 2, "precondition_1d": True}
    params, grads = make(shapes, seed=3)
    deltas, torch_states = torch_run(params, grads, **torch_kwargs(**kwargs))
    tx = modopt.scale_by_soap(**kwargs)
    state = tx.init(jax.tree.map(jnp.asarray, params))
    update = jax.jit(tx.update)
    updates, states = [], []
    for step, g in enumerate(grads):
        u, state = update(jax.tree.map(jnp.asarray, g), state)
        if step == 0:
            theirs = {k: [jnp.asarray(q)[None] for q in torch_states[0][k]["eigenbases"]] for k in shapes}
            # Stacked (see `ScaleBySoapState`): the (6, 4) matrix as its transpose, its bases
            # in the order (columns, rows), then the vector.
            state = state._replace(eigenbases=(tuple(theirs["tall"][::-1]), tuple(theirs["vector"])))
        updates.append(u)
        states.append(tx.unstacked(state, params))
    compare(updates, states, deltas, torch_states, shapes)


def test_soap_weight_decay_departure():
    """`soap` decays the parameters as AdamW (`- lr * wd * p` with `p` before the step, also at
    the first step); pytorch_optimizer (as the authors' code) multiplies the stepped parameters
    by `1 - lr * wd` and skips the first step whole. From the same parameters each step:
    ours = theirs - lr * wd * (p - theirs / (1 - lr * wd))."""
    lr, wd = 0.1, 0.3
    params, grads = make(SHAPES, seed=4, steps=5)
    tx = modopt.soap(lr, weight_decay=wd, precondition_frequency=2, max_precondition_dim=5)
    state = tx.init(jax.tree.map(jnp.asarray, params))
    trajectory = [params]
    update = jax.jit(tx.update)
    for g in grads:
        p = trajectory[-1]
        u, state = update(jax.tree.map(jnp.asarray, g), state, jax.tree.map(jnp.asarray, p))
        trajectory.append({k: np.asarray(p[k] + u[k]) for k in SHAPES})
    deltas, _ = torch_run(params, grads, sync=lambda step: trajectory[step], lr=lr, betas=(0.95, 0.95), weight_decay=wd,
                          precondition_frequency=2, max_precondition_dim=5)
    for step, delta in enumerate(deltas):
        for k in SHAPES:
            p = trajectory[step][k]
            theirs = p + delta[k]
            if step == 0:  # theirs: no step at all; ours: the decay alone
                np.testing.assert_array_equal(theirs, p)
                expected = (1 - lr * wd) * p
            else:
                expected = theirs - lr * wd * (p - theirs / (1 - lr * wd))
            assert_close(trajectory[step + 1][k], expected, f"{k} at step {step}")


def authors_merge(shape, max_dim):
    """The merged shape by the authors' reference (github.com/nikhilvyas/SOAP, `merge_dims`)."""
    new_shape, current = [], 1
    for size in shape:
        product = current * size
        if product > max_dim:
            if current > 1:
                new_shape.append(current)
                current = size
            else:
                new_shape.append(size)
                current = 1
        else:
            current = product
    if current > 1 or not new_shape:
        new_shape.append(current)
    return new_shape


def test_merged_groups_follow_the_authors_rule():
    rng = np.random.RandomState(5)
    shapes = [(2, 3, 512, 4), (1, 2, 512, 1, 2048, 1, 3, 4), (3, 4), (5000, 1), (1, 5000), (1, 1), (7,), (20, 30, 1)]
    shapes += [tuple(int(d) for d in rng.choice([1, 2, 3, 5, 16, 200, 2000], size=rng.randint(1, 6))) for _ in range(200)]
    for shape in shapes:
        for max_dim in (1, 10, 1024):
            groups = merged_groups(shape, tuple(range(len(shape))), max_dim)
            assert sorted(a for g in groups for a in g) == list(range(len(shape))), (shape, groups)
            assert all(list(g) == list(range(g[0], g[-1] + 1)) for g in groups if g), (shape, groups)
            sizes = [int(np.prod([shape[a] for a in g])) for g in groups]
            assert sizes == authors_merge(shape, max_dim), (shape, max_dim, groups)


def test_layouts():
    tx = modopt.scale_by_soap(max_precondition_dim=10, merge_dims=True, data_format="channels_last")
    assert tx.layout((2, 3, 3, 4)).shape == (8, 9)  # NHWC read as (2, 4, 3, 3)
    assert tx.layout((2, 3, 3, 4)).groups == ((0, 3), (1, 2))
    assert tx.layout((20, 3)).rotated == (False, True)
    assert tx.layout(()).shape == ()
    plain = modopt.scale_by_soap(max_precondition_dim=5)
    assert plain.layout((6, 4)).rotated == (False, True)
    assert plain.layout((4,)).rotated == (False,)
    assert modopt.scale_by_soap(precondition_1d=True).layout((4,)).rotated == (True,)


def test_refresh_schedule():
    """Bases: eigenvectors of the first statistics (NumPy), then unchanged except at the Adam
    steps that are multiples of the frequency, where they are `qr(S Q)` sorted (NumPy)."""
    shapes = {"square": (3, 3)}
    params, grads = make(shapes, seed=6, steps=7)
    _, states = jax_run(modopt.scale_by_soap(precondition_frequency=3), params, grads)
    s0 = np.asarray(states[0].statistics["square"][0], np.float64)
    eigenvectors = np.linalg.eigh(s0)[1][:, ::-1]
    assert_same_basis(states[0].eigenbases["square"][0], eigenvectors, "first basis")
    for step in range(1, 7):
        old, new = (np.asarray(states[i].eigenbases["square"][0], np.float64) for i in (step - 1, step))
        if step % 3:
            np.testing.assert_array_equal(old, new, err_msg=f"step {step}")
            continue
        s = np.asarray(states[step].statistics["square"][0], np.float64)
        product = s @ old
        order = np.argsort(-np.sum(old * product, axis=0))
        assert_same_basis(new, np.linalg.qr(product[:, order])[0], f"refresh at step {step}")


def test_first_step_is_zero_and_keeps_moments():
    params, grads = make(SHAPES, steps=1)
    (u,), (state,) = jax_run(modopt.scale_by_soap(), params, grads)
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves((u, state.mu, state.nu)))
    g = grads[0]["square"]
    assert_close(state.statistics["square"][0], 0.05 * g @ g.T, "G G^T", 1e-6)
    assert_close(state.statistics["square"][1], 0.05 * g.T @ g, "G^T G", 1e-6)


def test_bf16_statistics_in_float32():
    params = {"w": jnp.ones((3, 4), jnp.bfloat16)}
    tx = modopt.soap(1e-3)
    state = tx.init(params)
    soap_state = tx.build().transforms[0].unstacked(state[0], params)
    assert soap_state.mu["w"].dtype == jnp.bfloat16
    assert all(s.dtype == jnp.float32 for s in soap_state.statistics["w"] + soap_state.eigenbases["w"])
    updates, state = jax.jit(tx.update)({"w": jnp.full((3, 4), 0.5, jnp.bfloat16)}, state, params)
    assert updates["w"].dtype == jnp.bfloat16


def test_frequency_changes_without_retrace():
    params, grads = make({"m": (3, 3)}, steps=4)
    traces = []

    @eqx.filter_jit
    def step(tx, g, state):
        traces.append(1)
        return tx.update(g, state)

    for frequency in (1, 3):
        tx = modopt.scale_by_soap(precondition_frequency=frequency)
        state = tx.init(params)
        for g in grads:
            _, state = step(tx, g, state)
        if frequency == 1:
            first = [np.asarray(q) for q in tx.unstacked(state, params).eigenbases["m"]]
    assert len(traces) == 1
    # With frequency 3 the bases were refreshed once (step 3), with 1 at every step: they differ.
    assert not np.allclose(first[0], np.asarray(tx.unstacked(state, params).eigenbases["m"][0]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_precondition_dim": 0}, "Invalid max_precondition_dim: 0"),
        ({"precondition_frequency": 0}, "Invalid precondition_frequency"),
        ({"precondition_frequency": 2.5}, "Invalid precondition_frequency"),
        ({"shampoo_beta": 1.0}, "Invalid shampoo_beta"),
        ({"b2": -0.1}, "Invalid b2"),
        ({"data_format": "nhwc"}, "Invalid data_format"),
    ],
)
def test_invalid_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        modopt.scale_by_soap(**kwargs)
    with pytest.raises(ValueError, match=message):
        modopt.soap(1e-3, **kwargs)


MESH = AbstractMesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def test_state_specs():
    """Parameters of one kind stack their state; every stack (moments, statistics, bases) lies
    on its owners (`OWNED`: each parameter's state whole on one device, the stack split over
    the mesh axes that divide its length, never split further by ZeRO-1), except the Adam
    moments of a stack that padding to the 8 devices would at least double (here all three:
    2, 1 and 4 units), which are split over every device (`OWNED_ELEMENTWISE`); a matrix taller
    than wide stacks as its transpose, with the wide ones of its shape; the count is replicated."""
    shapes = {"b": (8,), "c": (8,), "conv": (2, 4, 3, 3), "u": (8, 12), "v": (12, 8), "w": (8, 12), "x": (12, 8)}
    params = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()}
    specs = {"b": P("model"), "c": P(), "conv": P("data", "model"), "u": P(None, "model"), "v": P("model"),
             "w": P("data"), "x": P()}
    tx = modopt.scale_by_soap(max_precondition_dim=10, merge_dims=True)
    state_specs = tx.state_specs(params, specs)
    owned, spread = modopt.sharding.OWNED, modopt.sharding.OWNED_ELEMENTWISE
    # Stacks in the order of their first parameter (JAX's sorted dict keys): the vectors b and
    # c (not rotated), conv (merged to (8, 9)), and u, v, w, x as (8, 12) (12 > 10: not rotated).
    assert state_specs.mu == state_specs.nu == (spread, spread, spread)
    assert state_specs.statistics == state_specs.eigenbases == ((None,), (owned, owned), (owned, None))
    assert state_specs.count == P()
    state = jax.eval_shape(tx.init, params)
    assert [m.shape for m in state.mu] == [(2, 8), (1, 8, 9), (4, 8, 12)]
    assert [[None if s is None else s.shape for s in stack] for stack in state.statistics] == [
        [None], [(1, 8, 8), (1, 9, 9)], [(4, 8, 8), None]
    ]
    per_parameter = jax.eval_shape(lambda p: tx.unstacked(tx.init(p), p), params)
    assert jax.tree.map(lambda x: x.shape, per_parameter.mu) == shapes
    assert [None if s is None else s.shape for s in per_parameter.statistics["v"]] == [None, (8, 8)]
    assert [None if s is None else s.shape for s in per_parameter.statistics["conv"]] == [(8, 8), (9, 9)]
    optimizer = eqx.filter_eval_shape(modopt.Optimizer, modopt.soap(1e-3, max_precondition_dim=10, merge_dims=True), params)
    placed = modopt.sharding.shardings(optimizer, specs, mesh=MESH, zero_axis="data").state[0]
    # Stacks of 2, 1 and 4 units on 8 devices: each device holds one unit of each statistic
    # and basis, whole; the moments are stored unpadded, their largest unit dimension that 8
    # divides (8 in each) split over the 8 devices.
    for field in ("statistics", "eigenbases"):
        for x, y in zip(jax.tree.leaves(getattr(placed, field)), jax.tree.leaves(getattr(state, field))):
            assert x.shard_shape(y.shape) == (1, *y.shape[1:]), (field, y.shape, x.spec)
    for field in ("mu", "nu"):
        shards = [x.shard_shape(y.shape) for x, y in zip(getattr(placed, field), getattr(state, field))]
        assert shards == [(2, 1), (1, 1, 9), (4, 1, 12)], (field, shards)


def test_state_bytes_per_parameter():
    """Default settings on a (1024, 1024) float32 matrix: two moments (8 bytes per parameter),
    two (1024, 1024) statistics and two bases (16 bytes per parameter): 24, plus the count."""
    params = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}
    state = jax.eval_shape(modopt.soap(3e-3).init, params)
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    assert total // (1024 * 1024) == 24


def test_complex_parameters_rejected():
    with pytest.raises(TypeError, match=r"real parameters; the parameter at \['z'\] is complex64"):
        modopt.soap(1e-3).init({"z": jnp.ones((2, 2), jnp.complex64)})


def test_masked_equals_alone():
    """Inside `masked` (masked-out leaves are empty nodes in the state), the selected leaf gets
    what `scale_by_soap` gives it alone, and the other passes through."""
    params, grads = make({"w": (3, 3), "b": (3,)}, seed=7, steps=4)
    masked = modopt.masked(modopt.scale_by_soap(precondition_frequency=2), {"w": True, "b": False})
    alone = modopt.scale_by_soap(precondition_frequency=2)
    state, alone_state = masked.init(params), alone.init({"w": params["w"]})
    # Jitted: eagerly, every step traced and compiled SOAP's branches again (most of the time).
    masked_update, alone_update = jax.jit(masked.update), jax.jit(alone.update)
    for g in grads:
        u, state = masked_update(g, state, params)
        expected, alone_state = alone_update({"w": g["w"]}, alone_state)
        assert_close(u["w"], expected["w"], "w", 1e-6)
        np.testing.assert_array_equal(u["b"], g["b"])


def test_stacked_leaves_equal_each_alone():
    """A (6, 4) and a (4, 6) matrix share a stack (the taller as its transpose), as do two
    vectors; each gets what `scale_by_soap` gives it alone, its state per parameter in its own
    shape. A leaf without elements gets an empty update and stores nothing."""
    shapes = {"tall": (6, 4), "wide": (4, 6), "v1": (5,), "v2": (5,), "empty": (0, 3)}
    params, grads = make(shapes, seed=8, steps=5)
    tx = modopt.scale_by_soap(precondition_frequency=2)
    state = tx.init(jax.tree.map(jnp.asarray, params))
    assert [m.shape for m in state.mu] == [(2, 4, 6), (2, 5)]  # sorted keys: empty, tall, v1, v2, wide
    updates, states = jax_run(tx, params, grads)
    for k in ("tall", "wide", "v1"):
        alone_updates, alone_states = jax_run(tx, {k: params[k]}, [{k: g[k]} for g in grads])
        for step in range(len(grads)):
            assert_close(updates[step][k], alone_updates[step][k], f"update of {k} at step {step}", 1e-6)
            for field in ("mu", "nu", "statistics", "eigenbases"):
                a, b = getattr(states[step], field)[k], getattr(alone_states[step], field)[k]
                assert jax.tree.structure(a) == jax.tree.structure(b), (k, field)
                for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
                    assert_close(x, y, f"{field} of {k} at step {step}", 1e-6)
    assert updates[-1]["empty"].shape == (0, 3) and updates[-1]["empty"].dtype == jnp.float32
    assert states[-1].statistics["empty"] == (None, None) and states[-1].mu["empty"].shape == (0, 3)


def test_state_of_other_parameters_rejected():
    tx = modopt.scale_by_soap()
    state = tx.init({"w": jnp.ones((3, 4))})
    with pytest.raises(ValueError, match="the state was made for other parameters"):
        tx.update({"w": jnp.ones((4, 5))}, state)
