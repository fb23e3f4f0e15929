"""PSGD Kron (`scale_by_kron`, `kron`, `precond_update_prob_schedule`) against independent references.

- kron_torch 0.3.3's `Kron`, 8 steps, fed the same probes: `torch.randn_like` (where the
  reference draws `V`) is patched to return the probes modopt draws from its key (read off the
  state with the transform's own `step_draws` and `kron_probes`), so everything but the drawing
  is compared. The update probability is 1 (both update every step) and balancing is forced
  on or off in both. kron_torch adds the damping to its debiased momentum in place, so its
  preconditioned step sees the damped momentum; the parity runs wrap its `_update_precond`
  to work on a copy, and `test_kron_torch_preconditions_the_damped_momentum` checks that this
  is the only difference, against NumPy.
- A NumPy float64 implementation of the preconditioner update written from Li's papers.
- Properties: the fitted preconditioner whitens gradients (`P E[g g^T] P = I`); the coin flips
  fire at the asked rate and are reproducible from the key; a skipped update leaves the factors
  as they were; jitted steps equal eager ones; the sharding rule of the factors.

float32 everywhere against float32 torch: each step's triangular solves and matrix products
round differently (about 1e-7 relative), which 8 steps of `Q -= 0.1 * ... @ Q` carry to about
1e-5; the tolerance is 1e-4.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import modopt
import modopt.transforms._kron as kron_module
from modopt.transforms._kron import DAMPING, kron_layout, kron_probes, step_draws
from modopt.transforms._kron_numerics import normal_at, threefry2x32

torch = pytest.importorskip("torch")
kron_torch = pytest.importorskip("kron_torch.kron")

SHAPES = {"a_matrix": (6, 4), "b_vector": (5,), "c_cube": (3, 4, 2), "d_wide": (2, 7), "e_scalar": ()}
STEPS = 8
TOLERANCE = 1e-4


@pytest.fixture
def eager_torch():
    """kron_torch's functions are `torch.compile`d; run them eagerly (same math, no C++ build)."""
    previous = torch._dynamo.config.disable
    torch._dynamo.config.disable = True
    yield
    torch._dynamo.config.disable = previous


def make_params(shapes=SHAPES, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def make_grads(step, shapes=SHAPES):
    rng = np.random.default_rng(100 + step)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def run_modopt(tx, params, steps, jit=True):
    """Steps of `tx`; returns the params after each step, the probes of each step, the last state."""
    params = jax.tree.map(jnp.asarray, params)
    tx_layout = tx.build().transforms[0] if isinstance(tx, modopt.Kron) else tx
    shapes = [tx_layout.layout(p.shape).shape for p in jax.tree.leaves(params)]
    state = tx.init(params)
    update = jax.jit(tx.update) if jit else tx.update
    trajectory, probes = [], []
    for step in range(steps):
        kron_state = state[0] if isinstance(tx, modopt.Kron) else state
        probes.append([np.asarray(v) for v in kron_probes(step_draws(kron_state.key)[3], shapes, jnp.float32)])
        grads = {n: g for n, g in make_grads(step).items() if n in params}
        updates, state = update(jax.tree.map(jnp.asarray, grads), state, params)
        params = modopt.apply_updates(params, updates)
        trajectory.append(jax.tree.map(np.asarray, params))
    return trajectory, probes, state


def run_kron_torch(params, probes, steps, *, balance, clone_damped=True, **kwargs):
    """kron_torch's `Kron` with `torch.randn_like` returning `probes` (step by step, parameter by
    parameter in the sorted order of JAX's dict leaves); a scalar is a (1,) parameter there (the
    reference cannot take 0-d ones)."""
    names = sorted(params)
    tensors = [torch.nn.Parameter(torch.tensor(params[n]).reshape(params[n].shape or (1,))) for n in names]
    optimizer = kron_torch.Kron(tensors, preconditioner_update_probability=1.0, **kwargs)
    optimizer.rng = type("Coin", (), {"random": staticmethod(lambda: 0.0 if balance else 1.0)})()
    queue = [v for step_probes in probes for v in step_probes]

    def randn_like(g):
        v = queue.pop(0)
        assert tuple(g.shape) == v.shape, (tuple(g.shape), v.shape)
        return torch.tensor(v)

    original = kron_torch._update_precond
    patches = [(torch, "randn_like", randn_like)]
    if clone_damped:
        patches.append((kron_torch, "_update_precond", lambda Q, exprs, G, lr, tiny: original(Q, exprs, G.clone(), lr, tiny)))
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    trajectory = []
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        for step in range(steps):
            grads = make_grads(step)
            for name, tensor in zip(names, tensors):
                tensor.grad = torch.tensor(grads[name]).reshape(tensor.shape)
            optimizer.step()
            trajectory.append({n: t.detach().numpy().reshape(params[n].shape).copy() for n, t in zip(names, tensors)})
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    assert not queue, "every probe was used"
    return trajectory, optimizer, tensors


CONFIGS = {
    "defaults": (dict(), dict()),
    "balanced_one_diag_decay": (
        dict(memory_save_mode="one_diag", weight_decay=0.1, b1=0.5, precond_lr=0.3, precond_init_scale=2.0),
        dict(memory_save_mode="one_diag", weight_decay=0.1, b1=0.5, precond_lr=0.3, precond_init_scale=2.0),
    ),
    "gradient_into_update_unmerged": (
        dict(momentum_into_precond_update=False, merge_dims=False, max_size_triangular=5),
        dict(momentum_into_precond_update=False, merge_dims=False, max_size_triangular=5),
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_parity_with_kron_torch(config, eager_torch):
    ours_kwargs, theirs_kwargs = CONFIGS[config]
    balance = config.startswith("balanced")
    params = make_params()
    tx = modopt.kron(0.05, preconditioner_update_probability=1.0, balance_prob=float(balance), **ours_kwargs)
    ours, probes, state = run_modopt(tx, params, STEPS)
    theirs, optimizer, tensors = run_kron_torch(params, probes, STEPS, balance=balance, lr=0.05, **theirs_kwargs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for name in SHAPES:
            np.testing.assert_allclose(a[name], b[name], rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"{config}: {name}, step {step}")
    kron_state = state[0]
    kron_factors = tx.build().transforms[0].unstacked(kron_state).Qs
    for name, tensor in zip(sorted(params), tensors):
        reference = optimizer.state[tensor]
        np.testing.assert_allclose(
            kron_state.momentum[name].reshape(-1), reference["momentum_buffer"].numpy().reshape(-1), rtol=1e-6, atol=1e-6
        )
        ours_q, theirs_q = kron_factors[name], reference["Q"]
        assert [q.shape for q in ours_q] == [tuple(q.shape) for q in theirs_q], name
        for q, r in zip(ours_q, theirs_q):
            np.testing.assert_allclose(q, r.numpy(), rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"{config}: Q of {name}")


def numpy_kron_step(Qs, m_hat, v, lr):
    """One PSGD Kron step from the papers, in float64, for a matrix (two triangular factors) or a
    vector (one diagonal factor): fit the factors to the pair (v, m_hat + damping * v), then
    precondition m_hat and cap its RMS at 1.1.

    For `P = Q2^T Q2 ⊗ Q1^T Q1` acting on a matrix G as `Q1^T Q1 G Q2^T Q2`: `A = Q1 G Q2^T`,
    `B = Q1^{-T} V Q2^{-1}`; each factor descends the criterion on its Lie group,
    `Q <- Q - lr / ||A A^T + B B^T|| * triu(A A^T - B B^T) Q` (Li 2018, eq. for the triangular
    group), with the norm estimated by a lower bound from the largest column.
    """
    g = m_hat + DAMPING * np.mean(np.abs(m_hat)) * v
    if len(Qs) == 1:
        (q,) = Qs
        a, b = q * g, v / q
        t1, t2 = a * a, b * b
        q = q - lr * (t1 - t2) * q / np.max(np.abs(t1 + t2))
        pre = q * q * m_hat
        new = (q,)
    else:
        q1, q2 = Qs
        a = q1 @ g @ q2.T
        b = np.linalg.solve(q1.T, v) @ np.linalg.inv(q2)

        def lower_bound(s):
            column = s[:, np.argmax(np.sum(s * s, axis=0))]
            x = column @ s
            return np.linalg.norm(s @ (x / np.linalg.norm(x)))

        new = []
        for q, (t1, t2) in zip((q1, q2), ((a @ a.T, b @ b.T), (a.T @ a, b.T @ b))):
            new.append(q - lr * np.triu(t1 - t2) @ q / lower_bound(t1 + t2))
        q1, q2 = new
        pre = q1.T @ q1 @ m_hat @ q2.T @ q2
    rms = np.sqrt(np.mean(pre**2))
    return tuple(new), pre * min(1.0, 1.1 / (rms + 1e-12))


def _matches_numpy(steps: int, scale: float = 1.0, shapes: dict | None = None, loops: int | None = None) -> None:
    """`steps` steps of `scale_by_kron` (b1 = 0: m_hat is the gradient) on gradients times
    `scale`, against NumPy float64 fed the same probes: by default a 6x4 matrix (two triangular
    factors) and a vector (a diagonal factor); `loops`: the step's number of loops (its
    triangular solves), where given."""
    shapes = shapes or {"a_matrix": (6, 4), "b_vector": (5,)}
    tx = modopt.scale_by_kron(0.0, preconditioner_update_probability=1.0, precond_lr=0.2, balance_prob=0.0)
    state = tx.init({n: jnp.zeros(s) for n, s in shapes.items()})
    update = jax.jit(tx.update)
    if loops is not None:
        assert update.lower(jax.tree.map(jnp.asarray, make_grads(0, shapes)), state).as_text().count("stablehlo.while") == loops
    numpy_qs = {n: tuple(np.asarray(q, np.float64) for q in tx.unstacked(state).Qs[n]) for n in shapes}
    for step in range(steps):
        grads = {n: g * np.float32(scale) for n, g in make_grads(step, shapes).items()}
        probes = kron_probes(step_draws(state.key)[3], list(shapes.values()), jnp.float32)
        updates, state = update(jax.tree.map(jnp.asarray, grads), state)
        for (name, g), v in zip(sorted(grads.items()), probes):
            numpy_qs[name], expected = numpy_kron_step(numpy_qs[name], g.astype(np.float64), np.asarray(v, np.float64), 0.2)
            np.testing.assert_allclose(updates[name], expected, rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"{name}, step {step}")
            for q, r in zip(tx.unstacked(state).Qs[name], numpy_qs[name]):
                np.testing.assert_allclose(q, r, rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"Q of {name}, step {step}")


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "per_layout"])
def test_steps_match_numpy_from_the_paper(padded, monkeypatch):
    """Both ways of running the step on matrices of three layouts (one turned) and a vector:
    every small matrix in one padded program (any padding allowed: its two solves row by row,
    two loops), and one program per layout, the vector's too (none padded: each layout's loop
    of its factors' diagonal blocks' inverses)."""
    if padded:
        monkeypatch.setattr(kron_module, "PADDING_BUDGET", float("inf"))
    else:
        monkeypatch.setattr(kron_module, "PADDED_MAX", 0)
    shapes = {"a_matrix": (6, 4), "b_vector": (5,), "c_matrix": (3, 5), "d_square": (2, 2)}
    _matches_numpy(STEPS, shapes=shapes, loops=2 if padded else 3)


def test_small_layouts_are_padded_together_only_where_that_adds_little_work():
    """The padded groups of the digits networks' layouts, and of random sets of layouts the
    work they add (per unit of an `(m, n)` layout: `5.5 m n (m + n) + m^3 + n^3`, the
    documented estimate) within a tenth of the whole, no axis above 192 in any of them."""

    def work(shape):
        return sum(5.5 * np.prod(shape) * d + d**3 for d in shape)

    def layout(*shape):
        return (shape, (False,) * len(shape))

    mlp = {layout(64, 128): 1, layout(128, 128): 1, layout(10, 128): 1, layout(128): 2, layout(10): 1}
    assert kron_module._padded_groups(mlp) == []  # padded together: about twice the arithmetic
    cnn = {layout(9, 16): 1, layout(32, 144): 1, layout(64, 2048): 1, layout(10, 64): 1, layout(16): 1, layout(32): 1}
    assert [sorted(group) for group in kron_module._padded_groups(cnn)] == [[layout(9, 16), layout(10, 64), layout(32, 144)]]
    rng = np.random.default_rng(0)
    for _ in range(50):
        units = {layout(*rng.integers(1, 260, size=int(rng.integers(1, 3)))): int(rng.integers(1, 4)) for _ in range(8)}
        groups = kron_module._padded_groups(units)
        added = 0.0
        for group in groups:
            assert len(group) > 1 and all(len(shape) == 2 and max(shape) <= 192 for shape, _ in group)
            padded = tuple(max(shape[axis] for shape, _ in group) for axis in (0, 1))
            added += sum(units[kind] * (work(padded) - work(kind[0])) for kind in group)
        assert added <= 0.1 * sum(count * work(kind[0]) for kind, count in units.items()) * (1 + 1e-9)
        grouped = [kind for group in groups for kind in group]
        assert len(grouped) == len(set(grouped))


def test_huge_gradients_match_numpy():
    """Gradients of `2**100` (about 1.3e30: their squares overflow float32) against NumPy in
    float64, where they do not: 4 steps. The Gram matrices are formed from a copy scaled by a
    power of two, the RMS likewise."""
    _matches_numpy(4, 2.0**100)


def test_kron_torch_preconditions_the_damped_momentum(eager_torch):
    """The one departure in the math: unpatched, kron_torch's first step preconditions
    `m_hat + damping * V` (its `G +=` writes into the debiased momentum); modopt's, `m_hat`.
    Both checked against NumPy; the difference is far above the parity tolerance."""
    shapes = {"a_matrix": (6, 4)}
    params = make_params(shapes)
    tx = modopt.kron(1.0, b1=0.0, preconditioner_update_probability=1.0, balance_prob=0.0)
    ours, probes, _ = run_modopt(tx, params, 1)
    theirs, _, _ = run_kron_torch(params, probes, 1, balance=False, clone_damped=False, lr=1.0, b1=0.0)
    g, v = make_grads(0)["a_matrix"].astype(np.float64), probes[0][0].astype(np.float64)
    eye = (np.eye(6), np.eye(4))
    (q1, q2), undamped = numpy_kron_step(eye, g, v, 0.1)
    damped = q1.T @ q1 @ (g + DAMPING * np.mean(np.abs(g)) * v) @ q2.T @ q2
    damped *= min(1.0, 1.1 / (np.sqrt(np.mean(damped**2)) + 1e-12))
    np.testing.assert_allclose(params["a_matrix"] - ours[0]["a_matrix"], undamped, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(params["a_matrix"] - theirs[0]["a_matrix"], damped, rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(damped - undamped)) > 20 * 1e-5


def test_preconditioner_whitens_the_gradients():
    """PSGD's fixed point with pairs (v, g): `P E[g g^T] P = I`. Gradients drawn from a matrix
    normal with row and column covariances `C1`, `C2` (`g = L1 z L2^T`): the Kronecker factors
    fitted over 8000 steps (`precond_lr` annealed 0.05, 0.01, 0.002: the fit's noise scales with
    it) give `P = (Q1^T Q1) ⊗ (Q2^T Q2)` with `P (C1 ⊗ C2) P` within 0.15 of the identity (from
    a distance of about 10 at the start)."""
    rng = np.random.default_rng(0)
    m1, m2 = rng.standard_normal((4, 4)), rng.standard_normal((3, 3))
    c1, c2 = m1 @ m1.T + 0.5 * np.eye(4), m2 @ m2.T + 0.5 * np.eye(3)
    l1, l2 = (jnp.asarray(np.linalg.cholesky(c), jnp.float32) for c in (c1, c2))

    @eqx.filter_jit
    def fit(tx, state, z):
        return jax.lax.scan(lambda s, z: (tx.update(l1 @ z @ l2.T, s)[1], None), state, z)[0]

    def distance(state):
        q1, q2 = (np.asarray(q, np.float64) for q in tx.unstacked(state).Qs)
        p = np.kron(q1.T @ q1, q2.T @ q2)
        return np.linalg.norm(p @ np.kron(c1, c2) @ p - np.eye(12), 2)

    tx = modopt.scale_by_kron(0.0, preconditioner_update_probability=1.0, momentum_into_precond_update=False, key=1)
    state = tx.init(jnp.zeros((4, 3)))
    assert distance(state) > 5
    for phase, (precond_lr, steps) in enumerate([(0.05, 2000), (0.01, 3000), (0.002, 3000)]):
        z = jax.random.normal(jax.random.key(phase), (steps, 4, 3))
        # In scans of 1000 steps, one after the other: the same steps, one compiled scan for all.
        for chunk in np.split(np.asarray(z), steps // 1000):
            state = fit(eqx.tree_at(lambda t: t.precond_lr, tx, jnp.asarray(precond_lr)), state, chunk)
    assert distance(state) < 0.15


def test_update_probability_is_a_seeded_coin():
    """With probability 0.3 the factors change at about 30% of 1000 steps, at the same steps for
    the same key and at others for another key; with 0 never, with 1 always."""
    grads = jax.random.normal(jax.random.key(5), (1000, 3, 2))

    @eqx.filter_jit
    def changed(tx):
        def body(state, g):
            new = tx.update(g, state)[1]
            return new, jnp.any(new.Qs[0][0] != state.Qs[0][0])  # the first factor

        return jax.lax.scan(body, tx.init(jnp.zeros((3, 2))), grads)[1]

    def run(probability, key):
        return np.asarray(changed(modopt.scale_by_kron(preconditioner_update_probability=jnp.asarray(probability), key=key)))

    first, again, other = run(0.3, 0), run(0.3, 0), run(0.3, 1)
    assert abs(first.mean() - 0.3) < 0.05  # binomial: sd 0.0145
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    assert not run(0.0, 0).any()
    assert run(1.0, 0).all()


def test_jitted_steps_equal_eager_steps():
    """`lax.cond` takes both branches over 3 steps at probability 0.5; jit and eager agree."""
    params = {name: p for name, p in make_params().items() if name in ("c_cube", "e_scalar")}
    tx = modopt.kron(0.05, preconditioner_update_probability=0.5, weight_decay=0.01, key=3)
    eager, _, eager_state = run_modopt(tx, params, 3, jit=False)
    jitted, _, jitted_state = run_modopt(tx, params, 3, jit=True)
    coins, key = [], jax.random.key(3)
    for _ in range(3):
        key, coin, _, _ = step_draws(key)
        coins.append(bool(coin < 0.5))
    assert True in coins and False in coins
    for a, b in zip(eager, jitted):
        for name in params:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6)
    assert np.array_equal(jax.random.key_data(eager_state[0].key), jax.random.key_data(jitted_state[0].key))


def test_schedule_matches_kron_torch():
    steps = np.arange(0, 6000, 7)
    reference = kron_torch.precond_update_prob_schedule(max_prob=0.9, min_prob=0.05, decay=0.002, flat_start=250)
    reference._compiled = False  # its torch.compile is the same function
    expected = np.array([reference(torch.tensor(float(n))).item() for n in steps])
    ours = jax.vmap(modopt.precond_update_prob_schedule(0.9, 0.05, 0.002, 250))(jnp.asarray(steps))
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
    default = modopt.scale_by_kron().preconditioner_update_probability
    assert isinstance(default, modopt.PrecondUpdateProbSchedule)
    assert float(default(0)) == 1.0 and float(default(10**6)) == pytest.approx(0.03)


@pytest.mark.parametrize(
    "shape, kwargs, expected",
    [
        ((6, 4), {}, ((6, 4), (False, False))),
        ((5,), {}, ((5,), (True,))),
        ((), {}, ((1,), (True,))),
        ((3, 4, 2), {}, ((12, 2), (False, False))),
        ((2, 3, 4), {}, ((6, 4), (False, False))),
        ((40, 3, 2, 5), {}, ((240, 5), (False, False))),
        ((2, 3, 9000), {}, ((6, 9000), (False, True))),
        ((3, 4, 2), {"merge_dims": False}, ((3, 4, 2), (False, False, False))),
        ((6, 4), {"memory_save_mode": "one_diag"}, ((6, 4), (True, False))),
        ((4, 4), {"memory_save_mode": "one_diag"}, ((4, 4), (False, True))),  # ties: the last largest
        ((4, 4), {"memory_save_mode": "smart_one_diag"}, ((4, 4), (False, False))),
        ((6, 4), {"memory_save_mode": "all_diag"}, ((6, 4), (True, True))),
        ((6, 1), {}, ((6, 1), (False, True))),
        ((6, 4), {"max_size_triangular": 5}, ((6, 4), (True, False))),
        ((6, 4), {"min_ndim_triangular": 3}, ((6, 4), (True, True))),
    ],
)
def test_layout_follows_the_reference(shape, kwargs, expected, eager_torch):
    layout = kron_layout(shape, **kwargs)
    assert (layout.shape, layout.diagonal) == expected
    if shape:  # kron_torch's factors for the same parameter
        grad = torch.zeros(shape)
        if len(shape) > 2 and kwargs.get("merge_dims", True):
            grad = grad.reshape(layout.shape)
        Q, _ = kron_torch._init_Q_exprs(
            grad, 1.0, kwargs.get("max_size_triangular", 8192), kwargs.get("min_ndim_triangular", 2), kwargs.get("memory_save_mode")
        )
        assert tuple(q.dim() == 1 for q in Q) == layout.diagonal


def test_factor_sharding_rule():
    """Parameters of one layout stack their factors; every stack lies on its owners (each
    parameter's factors whole on one device, the stack split over the mesh axes that divide
    its length); the momentum follows the parameters."""
    params = {"m": jax.ShapeDtypeStruct((8, 6), jnp.float32), "n": jax.ShapeDtypeStruct((8, 6), jnp.float32),
              "c": jax.ShapeDtypeStruct((4, 3, 2), jnp.float32), "v": jax.ShapeDtypeStruct((8,), jnp.float32)}
    specs = {"m": P("model", "data"), "n": P("model"), "c": P("model"), "v": P("model")}
    tx = modopt.scale_by_kron()
    state = tx.state_specs(params, specs)
    owned = modopt.sharding.OWNED
    # Stacks in the order of their first parameter (JAX's sorted dict keys): c (12, 2), m and n
    # (8, 6), v (8,); a matrix taller than wide stacks as its transpose, its factors swapped.
    assert state.Qs == ((owned, owned), (owned, owned), (owned,))
    shapes = jax.eval_shape(tx.init, params).Qs
    assert [[q.shape for q in stack] for stack in shapes] == [[(1, 2, 2), (1, 12, 12)], [(2, 6, 6), (2, 8, 8)], [(1, 8)]]
    assert [q.shape for q in jax.eval_shape(lambda p: tx.unstacked(tx.init(p)).Qs, params)["c"]] == [(12, 12), (2, 2)]
    assert state.momentum == specs and state.count == P() and state.key == P()
    mesh = jax.sharding.AbstractMesh((2, 4), ("data", "model"))
    assert modopt.sharding.owner_spec(2, mesh) == P("data")
    assert modopt.sharding.owner_spec(8, mesh) == P(("data", "model"))
    assert modopt.sharding.owner_spec(1, mesh) == P()


def test_state_bytes_for_a_1024_matrix():
    """Momentum (4 MiB) and two 1024x1024 float32 factors (8 MiB): 12 bytes per parameter."""
    state = jax.eval_shape(modopt.kron().init, jax.ShapeDtypeStruct((1024, 1024), jnp.float32))
    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state) if not jnp.issubdtype(x.dtype, jax.dtypes.prng_key))
    assert 12 * 1024 * 1024 <= nbytes <= 12 * 1024 * 1024 + 64


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"precond_lr": 1.5}, "Invalid precond_lr: 1.5 (must be in [0, 1])"),
        ({"preconditioner_update_probability": 1.2}, "Invalid preconditioner_update_probability"),
        ({"precond_init_scale": 0.0}, "Invalid precond_init_scale"),
        ({"memory_save_mode": "some_diag"}, "memory_save_mode"),
        ({"b1": 1.0}, "Invalid b1"),
        ({"max_size_triangular": -1}, "Invalid max_size_triangular"),
    ],
)
def test_bad_hyperparameters(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        modopt.kron(**kwargs)


def test_complex_parameters_are_refused_with_their_path():
    with pytest.raises(TypeError, match=r"\['w'\] is complex"):
        modopt.kron().init({"w": jnp.ones((2, 2), jnp.complex64)})


def test_step_draws_are_jax_randoms_numbers():
    """A step's draws are `jax.random.split` and `jax.random.bits` of the state's key, bit for
    bit (computed by the straight-line Threefry for a Threefry key, jitted or not; through
    `jax.random` for another generator), and the compiled draws hold no loop."""
    for seed in (0, 3, 2**31 - 1):
        key = jax.random.key(seed)
        for _ in range(3):
            next_key, sub = jax.random.split(key)
            words = np.asarray(jax.random.bits(sub, (4,), jnp.uint32))
            coins = (words[:2] >> 9 | 0x3F800000).view(np.float32) - 1.0
            for ours in (step_draws(key), jax.jit(step_draws)(key)):
                np.testing.assert_array_equal(jax.random.key_data(ours[0]), jax.random.key_data(next_key))
                np.testing.assert_array_equal(np.asarray([ours[1], ours[2]]), coins)
                np.testing.assert_array_equal(np.asarray(ours[3]), words[2:])
            key = next_key
    assert "stablehlo.while" not in jax.jit(step_draws).lower(jax.random.key(0)).as_text()
    other = jax.random.key(1, impl="rbg")
    np.testing.assert_array_equal(jax.random.key_data(step_draws(other)[0]), jax.random.key_data(jax.random.split(other)[0]))


def test_threefry_matches_jax():
    """The probes' generator is Threefry-2x32 (20 rounds): jax's own primitive as the oracle."""
    from jax.extend.random import threefry2x32_p

    seed = jnp.asarray([0x13198A2E, 0x03707344], jnp.uint32)
    hi, lo = (jnp.asarray(np.random.default_rng(k).integers(0, 2**32, 1000, dtype=np.uint64), jnp.uint32) for k in (1, 2))
    ours = threefry2x32(seed, hi, lo)
    theirs = threefry2x32_p.bind(jnp.broadcast_to(seed[0], hi.shape), jnp.broadcast_to(seed[1], hi.shape), hi, lo)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # On NumPy arrays (a constant computed when a program is traced), the same words.
    for a, b in zip(threefry2x32(np.asarray(seed), np.asarray(hi), np.asarray(lo)), theirs):
        assert isinstance(a, np.ndarray)
        np.testing.assert_array_equal(a, np.asarray(b))


def test_probes_are_standard_normal_and_numbered_by_entry():
    """200,000 probes: mean, variance, tails and quantiles of N(0, 1), no correlation between
    neighbours; the probes of several parameters are the numbers of one array of all their
    entries, cut (however the parameters are shaped)."""
    from scipy import stats

    seed = jnp.asarray([7, 11], jnp.uint32)
    (flat,) = kron_probes(seed, [(200_000,)], jnp.float32)
    z = np.asarray(flat, np.float64)
    assert abs(z.mean()) < 0.01 and abs(z.var() - 1) < 0.015
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 0.01
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(np.mean(np.abs(z) > 3) - 2 * stats.norm.sf(3)) < 1e-3
    shapes = [(3, 4), (5,), (1,), (2, 3, 4)]
    parts = kron_probes(seed, shapes, jnp.float32)
    np.testing.assert_array_equal(np.concatenate([np.ravel(p) for p in parts]), z[:42].astype(np.float32))
    assert np.all(np.isfinite(np.asarray(normal_at(seed, jnp.zeros(4, jnp.uint32), jnp.asarray([0, 1, 2**32 - 1, 2**31], jnp.uint32)))))


def test_one_program_per_layout_and_one_draw_of_probes():
    """Parameters of one layout, a matrix and its transpose included, share one stack (its loop
    of the factors' diagonal blocks' inverses once), short vectors one padded program (no
    loop), and the probes of every stack are drawn by one copy of the normal numbers' code,
    however many layouts."""

    def counts(shapes):
        params = {f"p{i}": jnp.zeros(shape) for i, shape in enumerate(shapes)}
        tx = modopt.scale_by_kron()
        text = jax.jit(tx.update).lower(params, tx.init(params), params).as_text()
        return text.count("stablehlo.while"), text.count("erf_inv")

    one = counts([(6, 4)])
    assert one == (1, 1)
    assert counts([(6, 4), (4, 6)]) == one
    assert counts([(5,), (4,), ()]) == (0, 1)
    loops = sum(counts([shape])[0] for shape in [(6, 4), (3, 7), (2, 2)])
    assert counts([(6, 4), (5,), (3, 7), (7, 3), (2, 2), (4,), ()]) == (loops, 1)


def test_the_compiled_step_runs_the_probes_rounds_once():
    """In the optimized program, Threefry's rounds of the probes are in one fused computation,
    however many stacks and layouts read the probes: XLA copies cheap elementwise work into
    each reader otherwise (each part of `erfinv`, each stack's solve, its damping), and each
    copy runs again. The step's coins (computations of scalars and key words) may be copied."""
    import re

    def fusions_with_rounds(shapes):
        params = {f"p{i}": jnp.ones(shape) for i, shape in enumerate(shapes)}
        tx = modopt.scale_by_kron()
        text = jax.jit(tx.update).lower(params, tx.init(params), params).compile().as_text()
        heads = [c.split("\n")[0] for c in text.split("\n\n") if c.count("shift-left(") >= 20]
        # Any array other than a scalar or a key's two words: the probes' entry numbers or values.
        return [h for h in heads if re.search(r"\[(?!2?\])[\d,]+\]", h)]

    for shapes in ([(6, 4)], [(6, 4), (5,), (3, 7), (7, 3), (2, 2), (4,), ()], [(6, 4), (3, 7), (40, 30)]):
        found = fusions_with_rounds(shapes)
        assert len(found) == 1, (shapes, found)


@pytest.mark.parametrize("size", [1, 7, 16, 17, 40, 64])
def test_solves_by_blocks_on_cpu_by_the_backend_elsewhere(size):
    """The probe's side of the update, `Q1^{-T} V Q2^{-1}`: on CPU by blocks of products (a
    factor below, at and above the block size and not a multiple of it, beside a 5 x 5 one),
    equal to NumPy's solves in float64, with one loop for every diagonal block's inverse and one
    per factor of several blocks; by the backend's triangular solves where lowered for a GPU."""
    from modopt.transforms._kron_numerics import SOLVE_BLOCK, conjugate

    rng = np.random.default_rng(size)
    q1 = np.triu(rng.standard_normal((size, size))) + 4 * np.eye(size)
    q2 = np.triu(rng.standard_normal((5, 5))) + 4 * np.eye(5)
    v = rng.standard_normal((size, 5))
    expected = np.linalg.solve(q1.T, v) @ np.linalg.inv(q2)
    args = ((jnp.asarray(q1, jnp.float32), jnp.asarray(q2, jnp.float32)), jnp.asarray(v, jnp.float32))
    np.testing.assert_allclose(jax.jit(conjugate)(*args), expected, rtol=1e-5, atol=1e-5)
    cpu = jax.jit(conjugate).trace(*args).lower(lowering_platforms=("cpu",)).as_text()
    gpu = jax.jit(conjugate).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert cpu.count("stablehlo.while") == 1 + (size > SOLVE_BLOCK) and "trsm" not in cpu
    assert "stablehlo.while" not in gpu and ("triangular_solve" in gpu or "trsm" in gpu)
