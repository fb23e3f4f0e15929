"""8-bit block-wise quantized state (`quantized_state`, `quantize_blockwise`) against bitsandbytes.

bitsandbytes 0.50.2 (CPU) is the reference, checked the way it tests itself
(`tests/test_optim.py::test_optimizer8bit`): 50 steps of 8-bit Adam against float32 Adam
(`torch.optim.Adam`), the float32 reference re-synchronized to the 8-bit run after every step,
so each step's error is that of one quantization; and the tables and block-wise codes against
its `create_dynamic_map`, `create_linear_map` and `quantize_blockwise`.

Two bitsandbytes kernels quantize on CPU. Its portable kernel (the "default" backend, reached
by dispatching the operator to CompositeExplicitAutograd) codes each value as the nearest table
entry, as its CUDA kernel does: our codes equal its codes. Its native CPU kernel (what
`Adam8bit` runs here) searches the table approximately: about 2% of the codes of small values
in unsigned blocks land a few entries away. Against it we check that our codes are never
farther from the value than its codes, and that our 8-bit Adam tracks float32 Adam at least
as closely as its `Adam8bit` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modopt

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")
F = bnb.functional

BLOCK = 256


def worst_error(signed):
    """The farthest a value in [-1, 1] ([0, 1] unsigned) lies from its nearest entry of
    bitsandbytes' dynamic table: half the widest gap between entries (0.9 / 64 / 2 between
    the top entries of the signed table, 0.9 / 128 / 2 unsigned), or -1's distance to the
    lowest entry (the signed table stops at -0.99297)."""
    table = F.create_dynamic_map(signed=signed).numpy().astype(np.float64)
    return max(np.diff(table).max() / 2, table[0] + 1 if signed else 0.0)


# The error of block-wise quantization as a fraction of the block's largest magnitude.
HALF_GAP = {signed: worst_error(signed) * (1 + 1e-5) for signed in (True, False)}


def portable_quantize(x, code):
    """bitsandbytes' portable block-wise quantization (nearest entry), on CPU tensors."""
    op = torch.ops.bitsandbytes.quantize_blockwise.default
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    codes, absmax = op.redispatch(keys, torch.from_numpy(x), code, BLOCK)
    return codes.numpy(), absmax.numpy()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """bitsandbytes' CPU kernels in one thread: with two on this 2-core machine, shared with the
    XLA process beside them, a step of `Adam8bit` took 150 times longer (thread contention)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def data(kind, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if kind == "wide":  # six decades of magnitude in every block: the dynamic table's range
        x = x * 10.0 ** rng.uniform(-6, 0, shape)
    if kind == "nonnegative":
        x = x**2
    return x.astype(np.float32)


def test_tables_equal_bitsandbytes_maps():
    from modopt._state.quantization import dynamic_map, linear_map

    for signed in (True, False):
        # bitsandbytes builds its table in float32 steps; ours is float64 rounded once: one
        # rounding apart at most.
        theirs = F.create_dynamic_map(signed=signed).numpy()
        np.testing.assert_allclose(dynamic_map(signed), theirs, rtol=2.5e-7, atol=0)
        theirs = F.create_linear_map(signed=signed).numpy()
        np.testing.assert_allclose(linear_map(signed), theirs, rtol=2.5e-7, atol=1e-8)


@pytest.mark.parametrize("kind", ["signed", "nonnegative", "wide"])
@pytest.mark.parametrize("shape", [(5000,), (6, 1024)], ids=["ragged_vector", "matrix"])
def test_codes_equal_bitsandbytes_blockwise(kind, shape):
    """Same blocks (the last of the vector holds 136 values), same absmax, same codes; and
    bitsandbytes dequantizes our codes to our values."""
    x = data(kind, shape, seed=len(kind) + len(shape))
    signed = bool((x < 0).any())
    code = F.create_dynamic_map(signed=signed)
    ours = modopt.quantize_blockwise(jnp.asarray(x), BLOCK)
    their_codes, their_absmax = portable_quantize(x, code)
    np.testing.assert_array_equal(np.abs(np.asarray(ours.scales)).reshape(-1), their_absmax)
    # Every block holds a negative value (signed data) or none: one table for all of them.
    assert bool(np.all((np.asarray(ours.scales) < 0) == signed))
    codes = np.asarray(ours.codes).astype(int)
    differ = codes != their_codes.astype(int)
    # The tables are one rounding apart, so a value on a midpoint could go either way.
    assert differ.sum() <= 2 and np.all(np.abs(codes - their_codes.astype(int)) <= 1), differ.sum()
    dequantized = F.dequantize_blockwise(
        torch.from_numpy(codes.astype(np.uint8)), absmax=torch.from_numpy(their_absmax), code=code, blocksize=BLOCK
    ).numpy()
    np.testing.assert_allclose(np.asarray(ours.dequantize()), dequantized, rtol=2.5e-7, atol=0)
    # The error bound of block-wise quantization: half the widest gap of the table.
    absmax = np.repeat(their_absmax, BLOCK)[: x.size].reshape(x.shape)
    assert np.all(np.abs(np.asarray(ours.dequantize()) - x) <= HALF_GAP[signed] * absmax)


def test_codes_never_farther_than_bitsandbytes_cpu_kernel():
    """bitsandbytes' native CPU kernel searches the table approximately; ours is the nearest."""
    for kind in ("signed", "nonnegative", "wide"):
        x = data(kind, (8, 1024), seed=7)
        ours = np.asarray(modopt.quantize_blockwise(jnp.asarray(x), BLOCK).dequantize())
        code = F.create_dynamic_map(signed=bool((x < 0).any()))  # our table for such blocks
        codes, state = F.quantize_blockwise(torch.from_numpy(x), code=code, blocksize=BLOCK)
        theirs = F.dequantize_blockwise(codes, state).numpy()
        # Up to the tables' rounding apart (2.5e-7 of the block's largest magnitude).
        slack = 2.5e-7 * np.repeat(state.absmax.numpy(), BLOCK).reshape(x.shape)
        assert np.all(np.abs(ours - x) <= np.abs(theirs - x) + slack), kind
        assert np.mean(np.abs(ours - x)) <= np.mean(np.abs(theirs - x)), kind


def adam_8bit_errors(shape, steps, step_8bit, state_of, tmp_path=None):
    """bitsandbytes' protocol: `steps` steps of an 8-bit Adam against `torch.optim.Adam` in
    float32, the float32 run re-synchronized to the 8-bit one after each step (parameters and
    dequantized moments). Returns, per step, the mean absolute and relative parameter error,
    and the worst and the mean error of the moments as a fraction of their block's largest
    magnitude."""
    rng = np.random.default_rng(0)
    start = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    reference = torch.nn.Parameter(torch.from_numpy(start.copy()))
    adam = torch.optim.Adam([reference], lr=1e-3)
    params = start
    errors, relative, state_errors, mean_state_errors = [], [], [], []
    for _ in range(steps):
        grads = (rng.standard_normal(shape) * 0.01).astype(np.float32)
        reference.grad = torch.from_numpy(grads.copy())
        adam.step()
        params = step_8bit(params, grads)
        expected = reference.detach().numpy()
        err = np.abs(expected - params)
        errors.append(err.mean())
        relative.append((err / (np.abs(expected) + 1e-9)).mean())
        fractions = []
        for name, ours in zip(("exp_avg", "exp_avg_sq"), state_of()):
            exact = adam.state[reference][name].numpy()
            absmax = np.repeat(np.abs(exact).reshape(-1, BLOCK).max(axis=1), BLOCK).reshape(shape)
            fractions.append(np.abs(ours - exact) / absmax)
            adam.state[reference][name].copy_(torch.from_numpy(ours.copy()))
        state_errors.append(max(f.max() for f in fractions))
        mean_state_errors.append(np.mean(fractions))
        with torch.no_grad():
            reference.copy_(torch.from_numpy(np.array(params)))
    return tuple(map(np.asarray, (errors, relative, state_errors, mean_state_errors)))


def test_adam_8bit_tracks_float32_adam_like_bitsandbytes(tmp_path):
    """50 steps (bitsandbytes' test, its float32 bounds): the dequantized moments within half
    a table step of float32 Adam's, and the parameters' mean error below 6e-5 (relative: 6e-4;
    the moments used by a step are float32, so only rounding reaches the parameters at once).
    The moments' mean error is no larger than that of bitsandbytes' `Adam8bit` on the same
    data. Halfway, the state goes through an Orbax checkpoint and comes back bit for bit."""
    from modopt.integrations.orbax import CheckpointManager

    shape = (64, 1024)
    tx = modopt.quantized_state(modopt.adam(1e-3))
    run = {"state": tx.init({"w": jnp.zeros(shape)}), "steps": 0}

    @jax.jit
    def step(params, grads, state):
        updates, state = tx.update(grads, state, params)
        return modopt.apply_updates(params, updates), state

    def ours(params, grads):
        new, run["state"] = step({"w": jnp.asarray(params)}, {"w": jnp.asarray(grads)}, run["state"])
        run["steps"] += 1
        if run["steps"] == 25:  # a round trip through Orbax changes nothing
            with CheckpointManager(tmp_path) as manager:
                manager.save(25, state=run["state"])
                restored = manager.restore(25, state=tx.init({"w": jnp.zeros(shape)}))["state"]
            for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(run["state"])):
                assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
            run["state"] = restored
        return np.asarray(new["w"])

    def our_moments():
        adam_state = modopt.dequantized(run["state"].inner_state)[0]
        return np.asarray(adam_state.mu["w"]), np.asarray(adam_state.nu["w"])

    errors, relative, state_errors, mean_state_errors = adam_8bit_errors(shape, 50, ours, our_moments)
    assert run["state"].inner_state[0].mu["w"].codes.dtype == jnp.uint8
    # One quantization per step: the signed table's half gap (mu), the unsigned one's (nu).
    assert state_errors.max() <= HALF_GAP[True] * 1.01, state_errors.max()
    assert errors.max() < 6e-5 and relative.max() < 6e-4, (errors.max(), relative.max())

    parameter = {}

    def theirs(params, grads):
        if "p" not in parameter:
            parameter["p"] = torch.nn.Parameter(torch.from_numpy(params.copy()))
            parameter["adam"] = bnb.optim.Adam8bit([parameter["p"]], lr=1e-3)
        p = parameter["p"]
        with torch.no_grad():
            p.copy_(torch.from_numpy(np.array(params)))
        p.grad = torch.from_numpy(grads.copy())
        parameter["adam"].step()
        return p.detach().numpy().copy()

    def their_moments():
        state = parameter["adam"].state[parameter["p"]]
        return tuple(
            F.dequantize_blockwise(state[f"state{i}"], absmax=state[f"absmax{i}"], code=state[f"qmap{i}"], blocksize=BLOCK).numpy()
            for i in (1, 2)
        )

    their_errors, their_relative, their_worst, their_mean = adam_8bit_errors(shape, 50, theirs, their_moments)
    assert parameter["adam"].state[parameter["p"]]["state1"].dtype == torch.uint8
    assert their_errors.max() < 6e-5 and their_relative.max() < 6e-4
    assert mean_state_errors.mean() <= their_mean.mean(), (mean_state_errors.mean(), their_mean.mean())
    assert state_errors.max() <= their_worst.max() * 1.01, (state_errors.max(), their_worst.max())
