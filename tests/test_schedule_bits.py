"""Every schedule of modopt against optax 0.2.8's, bit for bit, at every step from 0 to 299.

Each configuration is evaluated six ways in both libraries and compared as float32 bits:
eagerly (vmapped over the counts, and count by count at every third step), and under `jit` with a scalar count
(one call per step, as a training step calls it) and vmapped, with the modopt schedule both
an argument of the jitted function (its numbers traced, as in `Optimizer.step`) and closed
over (its numbers constants, as optax's are). optax's jitted values depend on how XLA folds
its constants, so modopt writes its traced formulas in the folded form (see
`modopt/schedules/_exact.py`); these tests are what checks that.

The two places where modopt's values are not optax's, each checked precisely:

- From the end of a polynomial transition on, optax's jitted `1 - t * (1 / steps)` rounds to
  +-1e-7, so its value is a rounding off `end_value` (below 0 for a decay to 0, NaN for a
  fractional power): modopt's value there is `end_value` exactly (optax's eager value).
- `piecewise_interpolate_schedule("linear", ...)` and `linear_onecycle_schedule`: optax's own
  jitted values differ between a scalar count and a vmapped one (XLA folds the constant
  `(end - start) / length` for the first only). modopt follows the scalar count, a training
  step's: its vmapped jitted values are optax's scalar ones.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt

# Compiled as users' programs are, at XLA's default optimization level: the suite's other
# programs compile without LLVM's optimizations (see conftest.py), which changes how some of
# these values round.
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 3})

STEPS = 300
COUNTS = jnp.arange(STEPS, dtype=jnp.int32)

# (id, builder taking the library, for a polynomial: (end_value, the step its transition ends))
CONFIGS = [
    ("constant", lambda lib: lib.constant_schedule(0.1), None),
    ("linear_up", lambda lib: lib.linear_schedule(0.001, 0.1, 100), (0.1, 100)),
    ("linear_down_begin", lambda lib: lib.linear_schedule(0.1, 0.001, 250, 7), (0.001, 257)),
    ("linear_to_zero", lambda lib: lib.linear_schedule(3e-4, 0.0, 130, 11), (0.0, 141)),
    ("polynomial_int2", lambda lib: lib.polynomial_schedule(0.3, 0.01, 2, 100, 5), (0.01, 105)),
    ("polynomial_int7", lambda lib: lib.polynomial_schedule(0.3, 0.01, 7, 100, 5), (0.01, 105)),
    ("polynomial_float2", lambda lib: lib.polynomial_schedule(0.3, 0.01, 2.0, 100), (0.01, 100)),
    ("polynomial_sqrt", lambda lib: lib.polynomial_schedule(0.5, 2.0, 0.5, 7), (2.0, 7)),
    ("polynomial_frac", lambda lib: lib.polynomial_schedule(0.3, 0.01, 1.5, 100, 5), (0.01, 105)),
    ("cosine", lambda lib: lib.cosine_decay_schedule(0.1, 250), None),
    ("cosine_alpha_exp2", lambda lib: lib.cosine_decay_schedule(0.1, 250, 0.01, 2.0), None),
    ("cosine_sqrt", lambda lib: lib.cosine_decay_schedule(0.3, 77, 0.123, 0.5), None),
    ("warmup_cosine", lambda lib: lib.warmup_cosine_decay_schedule(0.0, 0.05, 3, 50, end_value=0.001), None),
    ("warmup_cosine_small", lambda lib: lib.warmup_cosine_decay_schedule(1e-4, 3e-3, 37, 280, 1e-5), None),
    ("warmup_cosine_exp2", lambda lib: lib.warmup_cosine_decay_schedule(0.1, 1.0, 10, 200, 0.0, 2.0), None),
    (
        "warmup_cosine_no_warmup",
        lambda lib: lib.warmup_cosine_decay_schedule(0.1, 0.7, 0, 200, 0.03, 3.0),
        None,
    ),
    ("warmup_constant", lambda lib: lib.warmup_constant_schedule(1e-5, 3e-4, 50), (3e-4, 50)),
    ("exponential", lambda lib: lib.exponential_decay(0.1, 10, 0.9), None),
    ("exponential_staircase", lambda lib: lib.exponential_decay(0.1, 10, 0.9, 5, True, 0.01), None),
    ("exponential_growth", lambda lib: lib.exponential_decay(0.1, 7, 1.1, 0, False, 0.5), None),
    ("warmup_exponential", lambda lib: lib.warmup_exponential_decay_schedule(0.0, 0.1, 10, 20, 0.5, 5), None),
    (
        "warmup_exponential_staircase",
        lambda lib: lib.warmup_exponential_decay_schedule(1e-3, 0.3, 17, 20, 0.97, 5, True, 1e-3),
        None,
    ),
    (
        "piecewise_constant",
        lambda lib: lib.piecewise_constant_schedule(0.1, {50: 0.5, 100: 0.1, 200: 3.0}),
        None,
    ),
    (
        "piecewise_interpolate_cosine",
        lambda lib: lib.piecewise_interpolate_schedule("cosine", 0.1, {50: 0.5, 100: 0.1, 200: 3.0}),
        None,
    ),
    (
        "piecewise_interpolate_linear",
        lambda lib: lib.piecewise_interpolate_schedule("linear", 0.1, {50: 0.5, 100: 0.1, 200: 3.0}),
        None,
    ),
    ("linear_onecycle", lambda lib: lib.linear_onecycle_schedule(280, 0.1), None),
    ("cosine_onecycle", lambda lib: lib.cosine_onecycle_schedule(280, 0.1), None),
    (
        "sgdr",
        lambda lib: lib.sgdr_schedule(
            [dict(init_value=0.0, peak_value=0.1, warmup_steps=10, decay_steps=100, end_value=1e-3)] * 3
        ),
        None,
    ),
    (
        "join",
        lambda lib: lib.join_schedules(
            [lib.constant_schedule(0.1), lib.linear_schedule(0.1, 0.01, 50)], [30]
        ),
        (0.01, 80),  # its linear piece ends at step 30 + 50
    ),
]
# optax's vmapped jitted values differ from its scalar ones here (see the module docstring).
VMAP_FOLLOWS_SCALAR = {"piecewise_interpolate_linear", "linear_onecycle"}

_jit_arg = jit(lambda schedule, count: schedule(count))
_jit_arg_vmapped = jit(lambda schedule, counts: jax.vmap(schedule)(counts))


def bits(values) -> np.ndarray:
    return np.asarray(
        jnp.stack([jnp.asarray(v, jnp.float32) for v in values]) if isinstance(values, list) else values,
        np.float32,
    ).view(np.int32)


def per_step(fn, stride: int = 1) -> np.ndarray:
    return bits([fn(jnp.asarray(c, jnp.int32)) for c in range(0, STEPS, stride)])


def clamped(theirs: np.ndarray, ends: tuple[float, float] | None) -> np.ndarray:
    """optax's values with those off `end_value` by a rounding at the end of a polynomial
    transition (after its last step) replaced by `end_value`: modopt's there."""
    if ends is None:
        return theirs
    end, last = np.float32(ends[0]), ends[1]
    values = theirs.view(np.float32)
    after = np.arange(values.size) >= last
    off = after & (values != end)
    scale = np.max(np.abs(values[np.isfinite(values)]))  # a rounding is relative to the values' size
    assert np.all(~np.isfinite(values[off]) | (np.abs(values[off] - end) <= 1e-6 * scale))
    return np.where(off, np.asarray(end, np.float32).view(np.int32), theirs)


def assert_bits(ours: np.ndarray, theirs: np.ndarray, where: str) -> None:
    differ = np.nonzero(ours != theirs)[0]
    assert differ.size == 0, (
        f"{where}: {differ.size} steps differ, first {differ[:5].tolist()}: modopt "
        f"{ours[differ[:3]].view(np.float32).tolist()} optax {theirs[differ[:3]].view(np.float32).tolist()}"
    )


@pytest.mark.parametrize("name, build, ends", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_schedule_bits_equal_optax(name, build, ends):
    ours, theirs = build(modopt), build(optax)

    # Eager: vmapped over every step, and count by count (every third step: op by op is slow).
    assert_bits(per_step(ours, 3), per_step(theirs, 3), f"{name} eager")
    assert_bits(bits(jax.vmap(ours)(COUNTS)), bits(jax.vmap(theirs)(COUNTS)), f"{name} eager vmap")

    # Under jit with a scalar count: optax's closure constants; modopt traced and closed over.
    their_scalar = per_step(jit(theirs))
    want = clamped(their_scalar, ends)
    assert np.all(np.isfinite(want.view(np.float32)))
    assert_bits(per_step(lambda c: _jit_arg(ours, c)), want, f"{name} jit, schedule traced")
    assert_bits(per_step(jit(ours)), want, f"{name} jit, schedule closed over")

    # Under jit, vmapped over the counts.
    their_vmapped = their_scalar if name in VMAP_FOLLOWS_SCALAR else bits(jit(jax.vmap(theirs))(COUNTS))
    want = clamped(their_vmapped, ends)
    assert_bits(bits(_jit_arg_vmapped(ours, COUNTS)), want, f"{name} jit vmap, schedule traced")
    assert_bits(bits(jit(jax.vmap(ours))(COUNTS)), want, f"{name} jit vmap, schedule closed over")


def test_the_exceptions_are_real():
    """The two departures above exist in optax 0.2.8 as described (else the exceptions would
    hide nothing and should go)."""
    # A linear decay to 0 whose jitted optax value goes below 0 after the transition.
    theirs = per_step(jit(optax.linear_schedule(3e-4, 0.0, 130, 11))).view(np.float32)
    assert np.any(theirs[141:] < 0)
    ours = per_step(lambda c: _jit_arg(modopt.linear_schedule(3e-4, 0.0, 130, 11), c)).view(np.float32)
    assert np.all(ours[141:] == 0.0)
    # A fractional power: NaN in optax's jitted schedule, `end_value` in modopt's.
    theirs = per_step(jit(optax.polynomial_schedule(0.5, 2.0, 0.5, 7))).view(np.float32)
    assert np.any(np.isnan(theirs[7:]))
    ours = per_step(lambda c: _jit_arg(modopt.polynomial_schedule(0.5, 2.0, 0.5, 7), c)).view(np.float32)
    np.testing.assert_array_equal(ours[7:], 2.0)
    # optax's scalar and vmapped jitted piecewise-linear values differ.
    schedule = optax.piecewise_interpolate_schedule("linear", 0.1, {50: 0.5, 100: 0.1, 200: 3.0})
    assert np.any(per_step(jit(schedule)) != bits(jit(jax.vmap(schedule))(COUNTS)))


def test_python_constants_are_derived_in_double_precision():
    """The difference that made `linear_schedule` one ulp off: optax computes
    `init_value - end_value` in Python; in float32 from the stored values it rounds twice."""
    init, end = 0.3, 0.01
    exact = np.float32(init - end)
    twice = np.float32(init) - np.float32(end)
    assert exact != twice  # the case in point
    schedule = modopt.linear_schedule(init, end, 100)
    assert np.asarray(schedule.span.value) == exact
    # A schedule built from float32 arrays computes the difference in float32, as optax does.
    from_arrays = modopt.linear_schedule(jnp.float32(init), jnp.float32(end), 100)
    assert np.asarray(from_arrays.span.value) == twice


def test_changed_hyperparameters_use_the_float32_formula():
    """After `set` changes a number, the constant derived from the old one is not used: the
    schedule follows the new number (within a rounding of a schedule built with it)."""
    tx = modopt.sgd(modopt.warmup_cosine_decay_schedule(0.0, 0.05, 3, 50, end_value=0.001))
    moved = modopt.set_hyperparameters(tx, peak_value=0.2)
    fresh = modopt.warmup_cosine_decay_schedule(0.0, 0.2, 3, 50, end_value=0.001)
    got = jit(jax.vmap(lambda c: moved.learning_rate(c)))(COUNTS[:60])
    want = optax.warmup_cosine_decay_schedule(0.0, 0.2, 3, 50, end_value=0.001)
    # Within a rounding of values of the size of `peak_value`.
    np.testing.assert_allclose(got, jax.vmap(want)(COUNTS[:60]), rtol=1e-6, atol=0.2 * 2e-7)
    np.testing.assert_allclose(got, jax.vmap(fresh)(COUNTS[:60]), rtol=1e-6, atol=0.2 * 2e-7)
    assert float(moved.learning_rate(3)) == pytest.approx(0.2)


def test_derived_constants_follow_the_hyperparameters_under_jit():
    """The check that a derived constant still belongs to its numbers runs inside `jit` too:
    the same compiled function gives each schedule its own values."""
    a = modopt.linear_schedule(0.001, 0.1, 100)
    b = modopt.set_hyperparameters(modopt.sgd(a), init_value=0.002).learning_rate
    got = _jit_arg_vmapped(b, COUNTS[:120])
    want = jax.vmap(optax.linear_schedule(0.002, 0.1, 100))(COUNTS[:120])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0.1 * 2e-7)  # a rounding of the span's size
    assert float(got[0]) == pytest.approx(0.002, rel=1e-5)
