"""NorMuon and AdaMuon against pytorch_optimizer 4.1.0 (`NorMuon`, `AdaMuon`) step by step, the
paper's sign-stabilized AdaMuon against NumPy, properties of the first step, the per-neuron
state's sharding rule, and bad input.

The references run their Newton-Schulz in bfloat16; here it is patched to float32 (the same
function, `dtype=torch.float32`), so both sides compute in float32. They differ by rounding
(different matrix-product orders) and by Newton-Schulz's scaling (`X / max(||X||, 1e-7)` there,
`X / (||X|| + eps)` here): about 1e-6 relative after 6 steps, so 2e-5 is the tolerance.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import modopt
from modopt.contrib import MuonDimensionNumbers as D

torch = pytest.importorskip("torch")
pytorch_optimizer = pytest.importorskip("pytorch_optimizer")

STEPS = 6
RTOL, ATOL = 2e-5, 1e-6
# PyTorch's layout: (out, in) and (out, in, k); the neurons are the rows.
SHAPES = {"w": (6, 4), "tall": (3, 7), "k": (3, 4, 2), "b": (5,)}
TORCH_DIMS = {"w": D(1, 0), "tall": D(1, 0), "k": D((1, 2), 0), "b": None}
MATRICES = ("w", "tall", "k")


def arrays(seed, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


INIT = arrays(0)
GRADS = [arrays(1 + i) for i in range(STEPS)]


@pytest.fixture
def float32_newton_schulz(monkeypatch):
    """The references' Newton-Schulz in float32 (their default is bfloat16)."""
    from pytorch_optimizer.optimizer.muon import adamuon, normuon
    from pytorch_optimizer.optimizer.utils import matrix

    patched = functools.partial(matrix.zero_power_via_newton_schulz_5, dtype=torch.float32)
    for module in (adamuon, normuon):
        monkeypatch.setattr(module, "zero_power_via_newton_schulz_5", patched)


def torch_steps(cls, init=INIT, grads=GRADS, **kwargs):
    """The reference after each step: (params, the state of each matrix), as NumPy. The rank-1
    `b` is in an AdamW group, the others are orthogonalized."""
    params = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    matrices = [k for k in params if params[k].ndim > 1]
    groups = [
        dict(params=[params[k] for k in matrices], use_muon=True),
        dict(params=[params["b"]], use_muon=False),
    ]
    optimizer = cls(groups, foreach=False, **kwargs)
    history = []
    for step_grads in grads:
        for k, p in params.items():
            p.grad = torch.tensor(step_grads[k])
        optimizer.step()
        state = {
            k: {name: x.numpy().copy() for name, x in optimizer.state[params[k]].items()} for k in matrices
        }
        history.append(({k: p.detach().numpy().copy() for k, p in params.items()}, state))
    return history


def our_steps(tx, init=INIT, grads=GRADS, layout=lambda x: x, compiler_options=None):
    """modopt after each step: (params, the matrices' scale-by state), params in `layout`."""
    params = {k: jnp.asarray(layout(v)) for k, v in init.items()}
    state = tx.init(params)
    update = jax.jit(tx.update, compiler_options=compiler_options)
    history = []
    for step_grads in grads:
        updates, state = update({k: jnp.asarray(layout(v)) for k, v in step_grads.items()}, state, params)
        params = modopt.apply_updates(params, updates)
        history.append((params, state.inner_states["muon"].inner_state[0]))
    return history


def assert_close(ours, theirs, what):
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=RTOL, atol=ATOL, err_msg=what)


@pytest.mark.parametrize("update_scale", ["match_rms", "preserve_norm"])
def test_normuon_matches_pytorch_optimizer(float32_newton_schulz, update_scale):
    """Params, momenta and the neurons' second moments after each of 6 steps (Nesterov, weight
    decay, and the AdamW part for the vector); "match_rms" is `consistent_rms=0.2`,
    "preserve_norm" (with Jordan's shape factor) is `consistent_rms=None`."""
    theirs = torch_steps(
        pytorch_optimizer.NorMuon,
        lr=0.05,
        momentum=0.9,
        beta2=0.8,
        weight_decay=0.1,
        nesterov=True,
        update_scale=update_scale,
        adamw_lr=0.01,
        adamw_betas=(0.8, 0.99),
        adamw_wd=0.05,
        adamw_eps=1e-8,
        eps=1e-8,
    )
    tx = modopt.normuon(
        0.05,
        beta=0.9,
        b2=0.8,
        eps=1e-8,
        weight_decay=0.1,
        consistent_rms=0.2 if update_scale == "match_rms" else None,
        adam_learning_rate=0.01,
        adam_b1=0.8,
        adam_b2=0.99,
        adam_weight_decay=0.05,
        muon_weight_dimension_numbers=TORCH_DIMS,
    )
    for step, ((params, state), (their_params, their_state)) in enumerate(zip(our_steps(tx), theirs)):
        for k in SHAPES:
            assert_close(params[k], their_params[k], f"{k} at step {step}")
        for k in MATRICES:
            assert_close(state.mu[k], their_state[k]["momentum_buffer"], f"mu[{k}] at step {step}")
            nu = np.asarray(state.nu[k])
            assert nu.shape == SHAPES[k][:1] + (1,) * (len(SHAPES[k]) - 1)  # one per neuron (row)
            assert_close(
                nu.reshape(-1, 1), their_state[k]["second_momentum_buffer"], f"nu[{k}] at step {step}"
            )


def test_normuon_neurons_are_the_output_axis_in_jax_layout(float32_newton_schulz):
    """The same weights stored as `x @ W` weights, (in, out), with the default dimension numbers:
    the neurons are the columns, and every number is the transpose of PyTorch's."""
    init = {k: INIT[k] for k in ("w", "tall", "b")}
    grads = [{k: g[k] for k in init} for g in GRADS]
    theirs = torch_steps(
        pytorch_optimizer.NorMuon,
        init,
        grads,
        lr=0.05,
        momentum=0.9,
        beta2=0.8,
        eps=1e-8,
        adamw_eps=1e-8,
        update_scale="match_rms",
    )
    tx = modopt.normuon(0.05, beta=0.9, b2=0.8, eps=1e-8, adam_b2=0.95, adam_learning_rate=3e-4)
    ours = our_steps(tx, init, grads, layout=np.transpose)
    (params, state), (their_params, their_state) = ours[-1], theirs[-1]
    for k in ("w", "tall"):
        assert_close(params[k], their_params[k].T, k)
        assert state.nu[k].shape == (1, SHAPES[k][0])
        assert_close(state.nu[k], their_state[k]["second_momentum_buffer"].T, f"nu[{k}]")
    assert_close(params["b"], their_params["b"], "b")


def test_adamuon_matches_pytorch_optimizer(float32_newton_schulz):
    """Params, momenta and element-wise second moments after each of 6 steps, without the sign
    and with a plain momentum (as the reference), with weight decay and the AdamW part."""
    theirs = torch_steps(
        pytorch_optimizer.AdaMuon,
        lr=0.05,
        betas=(0.9, 0.8),
        weight_decay=0.1,
        adamw_lr=0.01,
        adamw_betas=(0.9, 0.99),
        adamw_wd=0.05,
        eps=1e-8,
    )
    tx = modopt.adamuon(
        0.05,
        beta=0.9,
        b2=0.8,
        eps=1e-8,
        weight_decay=0.1,
        nesterov=False,
        sign_stabilization=False,
        adam_learning_rate=0.01,
        adam_b2=0.99,
        adam_weight_decay=0.05,
        muon_weight_dimension_numbers=TORCH_DIMS,
    )
    # Compiled at XLA's default optimization level, not the suite's level 0 (`tests/conftest.py`):
    # the Newton-Schulz iterations amplify the difference in rounding past the tolerance
    # (the second moment, 7e-5 relative at level 0).
    ours = our_steps(tx, compiler_options={"xla_backend_optimization_level": 3})
    for step, ((params, state), (their_params, their_state)) in enumerate(zip(ours, theirs)):
        for k in SHAPES:
            assert_close(params[k], their_params[k], f"{k} at step {step}")
        for k in MATRICES:
            assert_close(state.mu[k], their_state[k]["m"], f"mu[{k}] at step {step}")
            assert_close(np.ravel(state.nu[k]), their_state[k]["v"], f"nu[{k}] at step {step}")


def numpy_newton_schulz(x, steps=5, coeffs=(3.4445, -4.7750, 2.0315), eps=1e-8):
    """Newton-Schulz written from its definition, in float64."""
    transposed = x.shape[0] > x.shape[1]
    x = x.T if transposed else x
    x = x / (np.linalg.norm(x) + eps)
    a, b, c = coeffs
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if transposed else x


def test_adamuon_sign_stabilized_matches_numpy_from_the_paper():
    """The paper's AdaMuon (sign of the Nesterov momentum orthogonalized, element-wise second
    moment, RMS 0.2), written in NumPy for a (in, out) matrix over 4 steps. The sign makes
    Newton-Schulz's input exact, so float32 and float64 agree to ~1e-6."""
    beta, b2, eps, rms = 0.9, 0.8, 1e-8, 0.2
    shape = (5, 3)
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(shape) for _ in range(4)]
    tx = modopt.scale_by_adamuon(beta=beta, b2=b2, eps=eps)
    state = tx.init(jnp.zeros(shape))
    update = jax.jit(tx.update)
    m, v = np.zeros(shape), np.zeros(shape)
    for t, g in enumerate(grads, start=1):
        m = beta * m + (1 - beta) * g
        o = numpy_newton_schulz(np.sign(beta * m + (1 - beta) * g), eps=eps)
        v = b2 * v + (1 - b2) * o**2
        o_hat = o / (np.sqrt(v / (1 - b2**t)) + eps)
        expected = rms * np.sqrt(o.size) * o_hat / (np.linalg.norm(o_hat) + eps)
        ours, state = update(jnp.asarray(g, jnp.float32), state)
        np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-4, atol=1e-6, err_msg=f"step {t}")
    np.testing.assert_allclose(np.asarray(state.nu), v, rtol=1e-4, atol=1e-7)


def test_first_steps_are_balanced():
    """At the first step the second moments are the squares themselves (times 1 - b2): AdaMuon's
    update is `0.2 * sign(O)` (every element of size 0.2), and NorMuon's has RMS 0.2 in every
    neuron (every column of a (in, out) weight), for a weight with a batch axis too."""
    rng = np.random.default_rng(4)
    grads = {
        "w": jnp.asarray(rng.standard_normal((7, 4)), jnp.float32),
        "heads": jnp.asarray(rng.standard_normal((2, 5, 3)), jnp.float32),
    }
    dims = {"w": None, "heads": D(1, 2)}
    tx = modopt.scale_by_adamuon(weight_dimension_numbers=dims)
    updates, _ = tx.update(grads, tx.init(grads))
    for k, u in updates.items():
        np.testing.assert_allclose(np.abs(np.asarray(u)), 0.2, rtol=1e-5, err_msg=k)
    tx = modopt.scale_by_normuon(weight_dimension_numbers=dims)
    updates, _ = tx.update(grads, tx.init(grads))
    np.testing.assert_allclose(np.sqrt(np.mean(np.asarray(updates["w"]) ** 2, axis=0)), 0.2, rtol=1e-5)
    np.testing.assert_allclose(np.sqrt(np.mean(np.asarray(updates["heads"]) ** 2, axis=1)), 0.2, rtol=1e-5)


def test_batch_axes_are_separate_matrices(float32_newton_schulz):
    """A (2, 6, 4) weight with a batch axis 0 gives, slice by slice, what the reference gives for
    two (6, 4) weights."""
    stacked = {"heads": np.stack([INIT["w"], 2 * INIT["w"][::-1]])}
    grads = [{"heads": np.stack([g["w"], g["w"][::-1] + 1])} for g in GRADS]
    tx = modopt.scale_by_normuon(beta=0.9, b2=0.8, eps=1e-8, weight_dimension_numbers=D(2, 1))
    params = {k: jnp.asarray(v) for k, v in stacked.items()}
    chain = modopt.chain(tx, modopt.scale(-0.05))
    state = chain.init(params)
    for g in grads:
        updates, state = jax.jit(chain.update)({k: jnp.asarray(v) for k, v in g.items()}, state, params)
        params = modopt.apply_updates(params, updates)
    slices = [torch.tensor(x, requires_grad=True) for x in stacked["heads"]]
    optimizer = pytorch_optimizer.NorMuon(
        [dict(params=slices, use_muon=True)],
        lr=0.05,
        momentum=0.9,
        beta2=0.8,
        eps=1e-8,
        update_scale="match_rms",
        foreach=False,
    )
    for g in grads:
        for i, p in enumerate(slices):
            p.grad = torch.tensor(g["heads"][i])
        optimizer.step()
    assert_close(params["heads"], np.stack([p.detach().numpy() for p in slices]), "heads")


def test_normuon_second_moment_follows_the_output_axes_sharding():
    """The per-neuron second moment keeps the parameter's split of its output and batch axes and
    is whole along the reduction axes (size 1 there); the momentum follows the parameter."""
    params = {
        "w": jnp.zeros((8, 4)),
        "v": jnp.zeros((8, 4)),
        "heads": jnp.zeros((2, 8, 4)),
        "b": jnp.zeros((8,)),
    }
    specs = {"w": P("model", None), "v": P(None, "model"), "heads": P("data", None, "model"), "b": P("model")}
    dims = {"w": D(0, 1), "v": D(0, 1), "heads": D(1, 2), "b": None}
    state_specs = modopt.normuon(0.1, muon_weight_dimension_numbers=dims).state_specs(params, specs)
    ours = state_specs.inner_states["muon"].inner_state[0]
    assert ours.nu["w"] == P(None, None) and ours.nu["v"] == P(None, "model")
    assert ours.nu["heads"] == P("data", None, "model")
    assert ours.mu["w"] == P("model", None) and ours.count == P()
    state = modopt.normuon(0.1, muon_weight_dimension_numbers=dims).init(params)
    assert state.inner_states["muon"].inner_state[0].nu["heads"].shape == (2, 1, 4)


def test_bad_input_names_the_problem_and_the_path():
    with pytest.raises(
        ValueError, match=r"scale_by_normuon: the parameter at \['b'\] has shape \(3,\), not a matrix"
    ):
        modopt.scale_by_normuon().init({"b": jnp.zeros(3)})
    with pytest.raises(
        ValueError, match=r"adamuon: the weight dimension numbers and the parameters differ in structure"
    ):
        modopt.adamuon(0.1, muon_weight_dimension_numbers={"w": None}).init({"v": jnp.zeros((2, 2))})
    with pytest.raises(ValueError, match=r"Invalid b2: 1.0 \(must be in \[0, 1\)\) in ScaleByNorMuon"):
        modopt.scale_by_normuon(b2=1.0)
    with pytest.raises(ValueError, match=r"Invalid consistent_rms: -0.2"):
        modopt.adamuon(0.1, consistent_rms=-0.2)
    with pytest.raises(ValueError, match=r"Invalid consistent_rms: None"):
        modopt.scale_by_adamuon(consistent_rms=None)
    with pytest.raises(ValueError, match=r"5 rows of coefficients for ns_steps=3"):
        modopt.normuon(0.1, "dion", ns_steps=3)
    with pytest.raises(ValueError, match=r"Invalid preconditioning: 'svd'"):
        modopt.adamuon(0.1, preconditioning="svd")


def test_hyperparameters_set_by_name_equal_a_fresh_optimizer():
    """`Optimizer.set` changes NorMuon's b2 and AdaMuon's RMS without rebuilding: the step equals
    one of an optimizer built with those values."""
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones((3,))}
    grads = {"w": jnp.arange(12.0).reshape(4, 3) - 5, "b": jnp.ones(3)}
    for make, change in ((modopt.normuon, {"b2": 0.5}), (modopt.adamuon, {"consistent_rms": 0.3})):
        stepped = modopt.Optimizer(make(0.02), params).step(params, grads)[1]
        changed = stepped.set(**change).step(params, grads)[0]
        expected = (
            modopt.Optimizer(make(0.02, **change), params).step(params, grads)[1].step(params, grads)[0]
        )
        for k in params:
            np.testing.assert_allclose(np.asarray(changed[k]), np.asarray(expected[k]), rtol=1e-6, err_msg=k)
