"""Adam-mini, MARS, LaProp, cautious updates and cautious weight decay against their references.

optax 0.2.8 lacks them. Each is compared step by step with the authors' or a maintained PyTorch
implementation (adam-mini 1.1.1, pytorch-optimizer 4.1.0, heavyball 3.2.1) configured to the same
hyperparameters, in float32 on both sides (tolerance 2e-5 relative: a few steps of float32
rounding through a square root and a division), and with NumPy written from the papers where
modopt follows the paper and a reference departs from it.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import modopt

torch = pytest.importorskip("torch")
pytorch_optimizer = pytest.importorskip("pytorch_optimizer")

RTOL, ATOL = 2e-5, 1e-6
SHAPES = {"w": (6, 4), "b": (5,), "t": (3, 4, 2)}


def make_params(shapes=SHAPES, seed=0):
    rng = np.random.RandomState(seed)
    return {k: rng.randn(*s).astype(np.float32) for k, s in shapes.items()}


def make_grads(shapes=SHAPES, steps=6, seed=1, scale=None):
    """Gradients of each step; `scale` (by name) shrinks some, e.g. below a clipping norm."""
    rng = np.random.RandomState(seed)
    scale = scale or {}
    return [{k: (rng.randn(*s) * scale.get(k, 1.0)).astype(np.float32) for k, s in shapes.items()} for _ in range(steps)]


def torch_run(make_optimizer, params, grads, named=False):
    """The parameters after each step of a PyTorch optimizer, as NumPy."""
    tensors = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()}
    optimizer = make_optimizer(list(tensors.items()) if named else list(tensors.values()))
    trajectory = []
    for g in grads:
        for k, t in tensors.items():
            t.grad = torch.tensor(g[k])
        optimizer.step()
        trajectory.append({k: t.detach().numpy().copy() for k, t in tensors.items()})
    return trajectory


def modopt_run(tx, params, grads):
    """The parameters after each step of a modopt transform (jitted once)."""

    @jax.jit
    def step(g, state, p):
        updates, state = tx.update(g, state, p)
        return modopt.apply_updates(p, updates), state

    p = jax.tree.map(jnp.asarray, params)
    state = tx.init(p)
    trajectory = []
    for g in grads:
        p, state = step(jax.tree.map(jnp.asarray, g), state, p)
        trajectory.append(jax.tree.map(np.asarray, p))
    return trajectory


def assert_trajectories_close(ours, theirs, rtol=RTOL, atol=ATOL):
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=f"step {step}, {k}")


# ----------------------------------------------------------------------------------------------
# LaProp


def test_laprop_matches_pytorch_optimizer():
    params, grads = make_params(), make_grads()
    theirs = torch_run(lambda p: pytorch_optimizer.LaProp(p, lr=0.01, betas=(0.8, 0.99)), params, grads)
    ours = modopt_run(modopt.laprop(0.01, b1=0.8, b2=0.99), params, grads)
    assert_trajectories_close(ours, theirs)


def test_laprop_matches_heavyball():
    heavyball = pytest.importorskip("heavyball")
    heavyball.utils.compile_mode = None  # eager: the same numbers, without torch.compile's minutes
    params, grads = make_params(), make_grads()
    theirs = torch_run(lambda p: heavyball.LaProp(p, lr=0.01, betas=(0.9, 0.99), eps=1e-8), params, grads)
    ours = modopt_run(modopt.laprop(0.01, b2=0.99, eps=1e-8), params, grads)
    assert_trajectories_close(ours, theirs)


def laprop_numpy(params, grads, lrs, b1, b2, eps, wd=0.0):
    """The paper's Algorithm 1, learning rate outside the momentum, decoupled weight decay."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    out = []
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        for k in p:
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            m[k] = b1 * m[k] + (1 - b1) * g[k] / (np.sqrt(v[k] / (1 - b2**t)) + eps)
            p[k] = p[k] - lr * (m[k] / (1 - b1**t) + wd * p[k])
        out.append({k: x.copy() for k, x in p.items()})
    return out


def test_laprop_with_a_schedule_and_weight_decay_follows_the_paper():
    """The learning rate multiplies the bias-corrected momentum at each step (the paper's
    Algorithm 1); the references fold it into the momentum, which only a changing rate shows."""
    params, grads = make_params(), make_grads()
    schedule = modopt.linear_schedule(0.02, 0.002, len(grads))
    ours = modopt_run(modopt.laprop(schedule, b2=0.99, eps=1e-6, weight_decay=0.1), params, grads)
    lrs = [float(schedule(i)) for i in range(len(grads))]
    assert_trajectories_close(ours, laprop_numpy(params, grads, lrs, 0.9, 0.99, 1e-6, wd=0.1))


def test_laprop_weight_decay_departs_from_pytorch_optimizer_by_the_cross_term():
    """One step from the same point: pytorch_optimizer decays the stepped parameters,
    `(p - lr * u) * (1 - lr * wd)`, modopt the parameters before the step, `p - lr * (u + wd * p)`."""
    params, grads, lr, wd = make_params(), make_grads(steps=1), 0.05, 0.2
    (theirs,) = torch_run(lambda p: pytorch_optimizer.LaProp(p, lr=lr, weight_decay=wd), params, grads)
    (ours,) = modopt_run(modopt.laprop(lr, weight_decay=wd), params, grads)
    (undecayed,) = modopt_run(modopt.laprop(lr), params, grads)
    for k in params:
        step = params[k] - undecayed[k]  # lr * u
        np.testing.assert_allclose(ours[k], params[k] - step - lr * wd * params[k], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(theirs[k], (params[k] - step) * (1 - lr * wd), rtol=RTOL, atol=ATOL)
        assert np.abs(theirs[k] - ours[k]).max() > 1e-5  # lr * wd * lr * u: visible


# ----------------------------------------------------------------------------------------------
# MARS

MARS_SHAPES = {"w": (6, 4), "small": (4, 3), "b": (5,)}


def test_mars_matches_pytorch_optimizer():
    """MARS on the matrices (one clipped at every step, one never: its gradients are small) and
    AdamW with the 1-D hyperparameters on the vector."""
    params = make_params(MARS_SHAPES)
    grads = make_grads(MARS_SHAPES, scale={"small": 0.05})
    reference = lambda p: pytorch_optimizer.MARS(  # noqa: E731
        p, lr=0.01, betas=(0.95, 0.99), gamma=0.05, weight_decay=0.1, lr_1d=0.003, betas_1d=(0.9, 0.95),
        weight_decay_1d=0.2,
    )
    tx = modopt.mars(
        0.01, gamma=0.05, weight_decay=0.1, adam_learning_rate=0.003, adam_weight_decay=0.2
    )
    assert_trajectories_close(modopt_run(tx, params, grads), torch_run(reference, params, grads))


def test_mars_optimize_1d_matches_pytorch_optimizer():
    params, grads = make_params(MARS_SHAPES), make_grads(MARS_SHAPES)
    reference = lambda p: pytorch_optimizer.MARS(p, lr=0.01, optimize_1d=True, weight_decay=0.05)  # noqa: E731
    tx = modopt.mars(0.01, weight_decay=0.05, optimize_1d=True)
    assert_trajectories_close(modopt_run(tx, params, grads), torch_run(reference, params, grads))


def mars_numpy(params, grads, lr, b1, b2, gamma, eps, max_norm):
    """MARS-AdamW as the paper's code computes it: `eps` added to `sqrt(v_hat)`."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m, v, last = ({k: np.zeros_like(x) for k, x in p.items()} for _ in range(3))
    out = []
    for t, g in enumerate(grads, start=1):
        for k in p:
            c = g[k] + gamma * b1 / (1 - b1) * (g[k] - last[k])
            norm = np.linalg.norm(c)
            if max_norm is not None and norm > max_norm:
                c = c / norm * max_norm
            m[k] = b1 * m[k] + (1 - b1) * c
            v[k] = b2 * v[k] + (1 - b2) * c**2
            denom = np.sqrt(v[k]) / np.sqrt(1 - b2**t) + eps
            p[k] = p[k] - lr * m[k] / (1 - b1**t) / denom
            last[k] = g[k]
        out.append({k: x.copy() for k, x in p.items()})
    return out


@pytest.mark.parametrize("max_norm", [1.0, 2.5, None])
def test_scale_by_mars_follows_the_papers_code(max_norm):
    """A large `eps` shows where it is added; `max_norm` other than 1 and `None` (no clipping)."""
    params, grads = make_params(), make_grads(scale={"b": 0.3})
    tx = modopt.chain(modopt.scale_by_mars(gamma=0.1, eps=0.1, max_norm=max_norm), modopt.scale(-0.01))
    expected = mars_numpy(params, grads, 0.01, 0.95, 0.99, 0.1, 0.1, max_norm)
    assert_trajectories_close(modopt_run(tx, params, grads), expected)


def test_mars_gives_tensors_of_rank_3_to_adamw_like_the_papers_code():
    """The paper's code gives MARS the parameters of rank 2 only (pytorch_optimizer: rank >= 2)."""
    params, grads = make_params({"t": (3, 4, 2), "w": (6, 4)}), make_grads({"t": (3, 4, 2), "w": (6, 4)})
    ours = modopt_run(modopt.mars(0.01, adam_learning_rate=0.02), params, grads)
    adamw = optax.adamw(0.02, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1)
    expected = modopt_run(optax.masked(adamw, {"t": True, "w": False}), {"t": params["t"], "w": params["w"]}, grads)
    for a, b in zip(ours, expected):
        np.testing.assert_allclose(a["t"], b["t"], rtol=RTOL, atol=ATOL)
    assert not np.allclose(ours[-1]["w"], params["w"])


# ----------------------------------------------------------------------------------------------
# Adam-mini

DIM, HEADS = 8, 2
# A small Transformer's parameters, named as the reference's partition recognizes them, with the
# rule that reproduces its choice: per token, per head, per output neuron, Adam, per leaf.
ADAM_MINI_LAYOUT = {
    "embed.weight": ((10, DIM), 0),
    "layers.0.self_attn.q_proj.weight": ((DIM, DIM), modopt.AdamMiniHeads(HEADS)),
    "layers.0.self_attn.k_proj.weight": ((DIM, DIM), modopt.AdamMiniHeads(HEADS)),
    "layers.0.self_attn.v_proj.weight": ((DIM, DIM), 0),
    "layers.0.self_attn.o_proj.weight": ((DIM, DIM), 0),
    "layers.0.mlp.up.weight": ((16, DIM), 0),
    "layers.0.mlp.up.bias": ((16,), "element"),
    "norm.weight": ((DIM,), "leaf"),
    "lm_head.weight": ((10, DIM), 0),
}


def test_adam_mini_matches_the_reference_package():
    adam_mini = pytest.importorskip("adam_mini")
    shapes = {k: s for k, (s, _) in ADAM_MINI_LAYOUT.items()}
    partition = {k: rule for k, (_, rule) in ADAM_MINI_LAYOUT.items()}
    params, grads = make_params(shapes), make_grads(shapes)
    reference = lambda named: adam_mini.Adam_mini(  # noqa: E731
        named, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, dim=DIM, n_heads=HEADS, verbose=False
    )
    no_decay = {k: not ("norm" in k or "ln" in k or "bias" in k) for k in shapes}  # the reference's rule
    tx = modopt.adam_mini(0.01, b2=0.95, weight_decay=0.1, mask=no_decay, partition=partition)
    ours = modopt_run(tx, params, grads)
    assert_trajectories_close(ours, torch_run(reference, params, grads, named=True))
    state = tx.init(params)[0]
    assert state.nu["layers.0.self_attn.q_proj.weight"].shape == (HEADS,)
    assert state.nu["embed.weight"].shape == (10,) and state.nu["norm.weight"].shape == ()


def test_adam_mini_matches_pytorch_optimizer():
    """pytorch_optimizer's partition: embeddings and output by element (Adam), queries and keys
    per head, every other parameter per leaf."""
    shapes = {k: s for k, (s, _) in ADAM_MINI_LAYOUT.items()}
    heads = modopt.AdamMiniHeads(HEADS)
    partition = {k: heads if ("q_proj" in k or "k_proj" in k) else "element" if ("embed" in k or "lm_head" in k) else "leaf" for k in shapes}
    params, grads = make_params(shapes), make_grads(shapes)

    class Model(torch.nn.Module):
        """Parameters under the dotted names it reads (a module's own names cannot hold dots)."""

        def __init__(self, named):
            super().__init__()
            self.named = named
            for i, (_, t) in enumerate(named):
                self.register_parameter(f"p{i}", t)

        def named_parameters(self, *args, **kwargs):
            return iter(self.named)

    def reference(named):
        model = Model(named)
        return pytorch_optimizer.AdamMini(model, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, num_embeds=DIM, num_heads=HEADS)

    no_decay = {k: not ("norm" in k or "ln_f" in k) for k in shapes}
    tx = modopt.adam_mini(0.01, b2=0.95, weight_decay=0.1, mask=no_decay, partition=partition)
    assert_trajectories_close(modopt_run(tx, params, grads), torch_run(reference, params, grads, named=True))


def test_adam_mini_with_every_element_its_own_block_is_adam():
    params, grads = make_params(), make_grads()
    ours = modopt_run(modopt.adam_mini(0.01, partition="element"), params, grads)
    assert_trajectories_close(ours, modopt_run(optax.adamw(0.01, weight_decay=0.0), params, grads))
    assert modopt.scale_by_adam_mini(partition="element").acts_elementwise()
    assert not modopt.scale_by_adam_mini().acts_elementwise()


def test_adam_mini_heads_along_an_axis_equal_the_heads_axis_of_a_reshaped_weight():
    """`AdamMiniHeads(h, axis=1)` of a `(4, 6)` weight is the integer rule 1 on it seen as
    `(4, h, 6 // h)`."""
    params, grads = make_params({"w": (4, 6)}), make_grads({"w": (4, 6)})
    ours = modopt_run(modopt.adam_mini(0.01, partition=modopt.AdamMiniHeads(3, axis=1)), params, grads)
    reshape = lambda tree: {"w": tree["w"].reshape(4, 3, 2)}  # noqa: E731
    theirs = modopt_run(modopt.adam_mini(0.01, partition=1), reshape(params), [reshape(g) for g in grads])
    assert_trajectories_close(ours, [{"w": t["w"].reshape(4, 6)} for t in theirs])


def test_adam_mini_block_moments_by_numpy():
    """Second moments of one step: the mean of g**2 over each block (per column, per head)."""
    params = make_params({"w": (4, 6), "h": (6, 3)})
    (grads,) = make_grads({"w": (4, 6), "h": (6, 3)}, steps=1)
    tx = modopt.scale_by_adam_mini(b2=0.9, partition={"w": -1, "h": modopt.AdamMiniHeads(2)})
    _, state = jax.jit(tx.update)(grads, tx.init(params), params)
    np.testing.assert_allclose(state.nu["w"], 0.1 * (grads["w"] ** 2).mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(state.nu["h"], 0.1 * (grads["h"] ** 2).reshape(2, 9).mean(axis=1), rtol=1e-6)


def test_adam_mini_state_specs_follow_the_split_axis():
    params = {
        "w": jax.ShapeDtypeStruct((8, 6), jnp.float32),
        "v": jax.ShapeDtypeStruct((6, 8), jnp.float32),
        "h": jax.ShapeDtypeStruct((8, 4), jnp.float32),
        "s": jax.ShapeDtypeStruct((8,), jnp.float32),
        "e": jax.ShapeDtypeStruct((4, 8), jnp.float32),
    }
    specs = {"w": P("model", None), "v": P(None, "model"), "h": P("model", None), "s": P("model"), "e": P(None, "model")}
    partition = {"w": 0, "v": 0, "h": modopt.AdamMiniHeads(2), "s": "leaf", "e": "element"}
    state_specs = modopt.scale_by_adam_mini(partition=partition).state_specs(params, specs)
    assert state_specs.count == P() and state_specs.mu == specs
    assert state_specs.nu == {"w": P("model"), "v": P(None), "h": P(), "s": P(), "e": P(None, "model")}


@pytest.mark.parametrize(
    "partition, message",
    [
        ({"w": 2, "s": "leaf"}, "axis 2 is out of range for 2 dimensions"),
        ({"w": 0, "s": 0}, "axis 0 is out of range for 0 dimensions"),
        ({"w": modopt.AdamMiniHeads(4), "s": "leaf"}, "4 heads do not divide 6"),
        (lambda params: {"w": "rows", "s": "leaf"}, "unknown rule"),
        (lambda params: {"w": 1.5, "s": "leaf"}, "not a block rule"),
    ],
)
def test_adam_mini_bad_partition_names_the_parameter(partition, message):
    params = {"w": jnp.zeros((6, 3)), "s": jnp.zeros(())}
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        modopt.scale_by_adam_mini(partition=partition).init(params)
    assert "['w']" in str(error.value) or "['s']" in str(error.value)


@pytest.mark.parametrize("rule", ["rows", 1.5, True])
def test_adam_mini_bad_rule_fails_at_construction(rule):
    with pytest.raises(ValueError, match=re.escape(f"Invalid partition: {rule!r} at ['w'] (must be 'leaf'")):
        modopt.adam_mini(1e-3, partition={"w": rule, "b": "leaf"})


def test_adam_mini_partition_structure_is_checked():
    with pytest.raises(ValueError, match="the partition and the parameters differ in structure"):
        modopt.scale_by_adam_mini(partition={"x": 0}).init({"w": jnp.zeros((2, 2))})


def test_adam_mini_heads_checks_its_arguments():
    with pytest.raises(ValueError, match=re.escape("Invalid num_heads: 0 (must be an integer >= 1) in AdamMiniHeads.")):
        modopt.AdamMiniHeads(0)


# ----------------------------------------------------------------------------------------------
# cautious


def one_leaf_problems(shapes=SHAPES, steps=5):
    """Each parameter alone, with its gradients: the references rescale by `numel / (count + 1)`,
    which is the paper's `1 / (mean + eps)` with `eps = 1 / numel`, one leaf at a time."""
    params, grads = make_params(shapes), make_grads(shapes, steps=steps)
    for k, shape in shapes.items():
        yield k, int(np.prod(shape)), {k: params[k]}, [{k: g[k]} for g in grads]


def test_cautious_lion_matches_pytorch_optimizer():
    for _, n, params, grads in one_leaf_problems():
        theirs = torch_run(lambda p: pytorch_optimizer.Lion(p, lr=0.01, cautious=True), params, grads)
        ours = modopt_run(modopt.cautious(modopt.lion(0.01, weight_decay=0.0), eps=1.0 / n), params, grads)
        assert_trajectories_close(ours, theirs)


def test_cautious_lion_direction_with_unmasked_decay_matches_pytorch_optimizer():
    """Masking the direction and decaying unmasked, as the paper's cautious optimizers do."""
    for _, n, params, grads in one_leaf_problems():
        theirs = torch_run(lambda p: pytorch_optimizer.Lion(p, lr=0.01, weight_decay=0.5, cautious=True), params, grads)
        tx = modopt.chain(
            modopt.cautious(modopt.scale_by_lion(), eps=1.0 / n, negated=False),
            modopt.add_decayed_weights(0.5),
            modopt.scale_by_learning_rate(0.01),
        )
        assert_trajectories_close(modopt_run(tx, params, grads), theirs)


def test_cautious_laprop_matches_pytorch_optimizer():
    for _, n, params, grads in one_leaf_problems():
        theirs = torch_run(lambda p: pytorch_optimizer.LaProp(p, lr=0.01, cautious=True), params, grads)
        ours = modopt_run(modopt.cautious(modopt.laprop(0.01), eps=1.0 / n), params, grads)
        assert_trajectories_close(ours, theirs)


def cautious_numpy(u, g, eps, negated):
    """The paper's Algorithm 1 per parameter: `u * m / (mean(m) + eps)`, `m = (u * g > 0)` for a
    direction (negated: the step `-u` agrees with `-g`)."""
    agree = (u * g < 0) if negated else (u * g > 0)
    return u * agree / (agree.mean() + eps)


@pytest.mark.parametrize("negated", [True, False])
def test_cautious_masks_each_parameter_by_numpy(negated):
    """The mask's mean is per parameter; its updates by NumPy, around Adam's direction or step."""
    params, grads = make_params(), make_grads(steps=3)
    inner = modopt.adam(0.1) if negated else modopt.scale_by_adam()
    tx = modopt.cautious(inner, eps=1e-3, negated=negated)
    state, inner_state = tx.init(params), inner.init(params)
    update, inner_update = jax.jit(tx.update), jax.jit(inner.update)
    for g in grads:
        updates, state = update(g, state, params)
        raw, inner_state = inner_update(g, inner_state, params)
        for k in params:
            expected = cautious_numpy(np.asarray(raw[k], np.float64), g[k], 1e-3, negated)
            np.testing.assert_allclose(updates[k], expected, rtol=1e-6, atol=1e-7)


def test_cautious_of_a_step_against_every_gradient_component_is_zero():
    tx = modopt.cautious(modopt.scale(0.1))  # ascent: every component disagrees
    updates, _ = tx.update({"w": jnp.array([1.0, -2.0])}, tx.init({"w": jnp.zeros(2)}))
    np.testing.assert_array_equal(updates["w"], [0.0, 0.0])


def test_cautious_reports_and_sets_the_inner_learning_rate():
    optimizer = modopt.Optimizer(modopt.cautious(modopt.adamw(0.05)), {"w": jnp.ones(3)})
    assert float(optimizer.learning_rate) == pytest.approx(0.05)
    assert float(optimizer.set(learning_rate=0.01).learning_rate) == pytest.approx(0.01)


def test_cautious_rejects_a_nonpositive_eps():
    with pytest.raises(ValueError, match=re.escape("Invalid eps: 0.0 (must be > 0) in Cautious.")):
        modopt.cautious(modopt.sgd(0.1), eps=0.0)


# ----------------------------------------------------------------------------------------------
# cautious weight decay


def test_add_cautious_decayed_weights_by_the_papers_rule():
    """`u + wd * (u * x >= 0) * x`: equal signs decay, opposite signs do not, and a zero update
    decays a parameter of either sign."""
    u = jnp.array([0.5, 0.5, -0.5, -0.5, 0.0, 0.0, 0.3])
    x = jnp.array([2.0, -2.0, 2.0, -2.0, 2.0, -2.0, 0.0])
    tx = modopt.add_cautious_decayed_weights(0.1)
    updates, _ = tx.update({"x": u}, tx.init({"x": x}), {"x": x})
    np.testing.assert_allclose(updates["x"], [0.7, 0.5, -0.5, -0.7, 0.2, -0.2, 0.3], rtol=1e-6)


def test_add_cautious_decayed_weights_scheduled_and_masked():
    schedule = modopt.linear_schedule(0.1, 0.0, 4)
    tx = modopt.add_cautious_decayed_weights(schedule, mask={"a": True, "b": False})
    params = {"a": jnp.array([1.0, -1.0]), "b": jnp.array([1.0, -1.0])}
    state = tx.init(params)
    for step in range(3):
        u = {"a": jnp.array([1.0, 1.0]), "b": jnp.array([1.0, 1.0])}
        updates, state = tx.update(u, state, params)
        decay = 0.1 * (1 - step / 4)
        np.testing.assert_allclose(updates["a"], [1.0 + decay, 1.0], rtol=1e-6)
        np.testing.assert_array_equal(updates["b"], [1.0, 1.0])


def test_laprop_with_cautious_weight_decay_matches_heavyball():
    heavyball = pytest.importorskip("heavyball")
    heavyball.utils.compile_mode = None
    params, grads = make_params(), make_grads()
    reference = lambda p: heavyball.LaProp(  # noqa: E731
        p, lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.5, cautious_weight_decay=True
    )
    tx = modopt.chain(
        modopt.scale_by_laprop(b2=0.99, eps=1e-8),
        modopt.add_cautious_decayed_weights(0.5),
        modopt.scale_by_learning_rate(0.01),
    )
    ours = modopt_run(tx, params, grads)
    assert_trajectories_close(ours, torch_run(reference, params, grads))
    plain = modopt_run(modopt.laprop(0.01, b2=0.99, eps=1e-8, weight_decay=0.5), params, grads)
    assert not np.allclose(ours[-1]["w"], plain[-1]["w"])  # the mask matters here
