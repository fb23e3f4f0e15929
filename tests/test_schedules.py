"""Schedules: parity with optax, jit, no retrace on new numbers, and invalid values.

optax is the oracle: every modopt schedule must give the numbers of optax's schedule of the
same name at every count (inside the schedule, at its boundaries and beyond its end), for
counts given as Python ints and as int32 arrays, eagerly and under `jax.jit`.
"""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt

RTOL = 1e-6
ATOL = 1e-7

# (name, kwargs, last count to check): each case is built by modopt and optax with the same
# keyword arguments; counts run from 0 to well beyond the end of the schedule.
CASES = [
    ("constant_schedule", dict(value=0.3), 12),
    ("constant_schedule", dict(value=-2.0), 3),
    ("polynomial_schedule", dict(init_value=1.0, end_value=0.01, power=2, transition_steps=10), 16),
    (
        "polynomial_schedule",
        dict(init_value=1.0, end_value=0.01, power=2, transition_steps=10, transition_begin=5),
        20,
    ),
    ("polynomial_schedule", dict(init_value=0.5, end_value=2.0, power=0.5, transition_steps=7), 12),
    ("polynomial_schedule", dict(init_value=0.5, end_value=2.0, power=3, transition_steps=0), 6),
    ("polynomial_schedule", dict(init_value=0.5, end_value=2.0, power=3, transition_steps=-4), 6),
    (
        "polynomial_schedule",
        dict(init_value=1.0, end_value=0.0, power=1.5, transition_steps=8, transition_begin=-3),
        12,
    ),
    ("linear_schedule", dict(init_value=1.0, end_value=0.1, transition_steps=9), 14),
    ("linear_schedule", dict(init_value=0.0, end_value=3.0, transition_steps=6, transition_begin=4), 14),
    ("linear_schedule", dict(init_value=0.7, end_value=0.1, transition_steps=0), 5),
    ("linear_schedule", dict(init_value=0.7, end_value=0.1, transition_steps=5, transition_begin=-2), 9),
    ("cosine_decay_schedule", dict(init_value=0.1, decay_steps=10), 15),
    ("cosine_decay_schedule", dict(init_value=0.1, decay_steps=10, alpha=0.2), 15),
    ("cosine_decay_schedule", dict(init_value=2.0, decay_steps=7, alpha=0.1, exponent=2.0), 12),
    ("cosine_decay_schedule", dict(init_value=1.0, decay_steps=9, exponent=0.5), 12),
    (
        "warmup_cosine_decay_schedule",
        dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=15),
        22,
    ),
    (
        "warmup_cosine_decay_schedule",
        dict(init_value=0.1, peak_value=1.0, warmup_steps=4, decay_steps=12, end_value=0.05),
        18,
    ),
    (
        "warmup_cosine_decay_schedule",
        dict(init_value=0.1, peak_value=0.5, warmup_steps=3, decay_steps=11, end_value=0.2, exponent=2.0),
        16,
    ),
    (
        "warmup_cosine_decay_schedule",
        dict(init_value=0.2, peak_value=0.0, warmup_steps=3, decay_steps=9, end_value=0.1),
        12,
    ),
    ("warmup_cosine_decay_schedule", dict(init_value=0.5, peak_value=1.0, warmup_steps=0, decay_steps=6), 9),
    # Exponential decay: continuous and staircase, decreasing (end_value a floor) and increasing
    # (end_value a ceiling), with a late and a negative transition_begin.
    ("exponential_decay", dict(init_value=1.0, transition_steps=5, decay_rate=0.5), 18),
    ("exponential_decay", dict(init_value=2.0, transition_steps=3, decay_rate=0.7, transition_begin=4), 14),
    (
        "exponential_decay",
        dict(
            init_value=1.0,
            transition_steps=4,
            decay_rate=0.5,
            transition_begin=3,
            staircase=True,
            end_value=0.1,
        ),
        24,
    ),
    ("exponential_decay", dict(init_value=1.0, transition_steps=4, decay_rate=2.0, end_value=3.0), 12),
    (
        "exponential_decay",
        dict(init_value=0.5, transition_steps=2, decay_rate=1.5, staircase=True, end_value=2.0),
        12,
    ),
    ("exponential_decay", dict(init_value=1.0, transition_steps=3, decay_rate=1.2), 10),
    ("exponential_decay", dict(init_value=1.0, transition_steps=3, decay_rate=0.5, transition_begin=-4), 10),
    ("exponential_decay", dict(init_value=1.0, transition_steps=3, decay_rate=0.5, end_value=2.0), 5),
    ("exponential_decay", dict(init_value=1.0, transition_steps=3, decay_rate=1.0, end_value=0.5), 5),
    # Warmup then exponential decay.
    (
        "warmup_exponential_decay_schedule",
        dict(init_value=0.0, peak_value=1.0, warmup_steps=4, transition_steps=3, decay_rate=0.5),
        16,
    ),
    (
        "warmup_exponential_decay_schedule",
        dict(
            init_value=0.1,
            peak_value=1.0,
            warmup_steps=3,
            transition_steps=2,
            decay_rate=0.5,
            transition_begin=2,
            staircase=True,
            end_value=0.2,
        ),
        16,
    ),
    (
        "warmup_exponential_decay_schedule",
        dict(
            init_value=0.5,
            peak_value=1.0,
            warmup_steps=0,
            transition_steps=2,
            decay_rate=0.8,
            transition_begin=-3,
        ),
        8,
    ),
    (
        "warmup_exponential_decay_schedule",
        dict(
            init_value=0.0, peak_value=0.5, warmup_steps=2, transition_steps=2, decay_rate=2.0, end_value=1.5
        ),
        10,
    ),
    # Piecewise constant: before, at and after each boundary; unsorted keys; a boundary at 0; a
    # negative boundary; a zero scale; growing scales; no boundaries.
    ("piecewise_constant_schedule", dict(init_value=1.0, boundaries_and_scales={3: 0.5, 7: 0.1}), 10),
    ("piecewise_constant_schedule", dict(init_value=0.1, boundaries_and_scales={9: 0.0, 2: 3.0, 5: 2.0}), 12),
    ("piecewise_constant_schedule", dict(init_value=1.0, boundaries_and_scales={0: 0.5, 4: 2.0}), 6),
    ("piecewise_constant_schedule", dict(init_value=2, boundaries_and_scales={-2: 0.5, 3: 4}), 5),
    ("piecewise_constant_schedule", dict(init_value=0.3, boundaries_and_scales=None), 3),
    ("piecewise_constant_schedule", dict(init_value=0.3, boundaries_and_scales={}), 3),
    # Piecewise interpolation, linear and cosine.
    (
        "piecewise_interpolate_schedule",
        dict(interpolate_type="linear", init_value=1.0, boundaries_and_scales={4: 0.1, 8: 0.01}),
        11,
    ),
    (
        "piecewise_interpolate_schedule",
        dict(interpolate_type="cosine", init_value=1.0, boundaries_and_scales={10: 0.5, 3: 2.0, 6: 0.0}),
        13,
    ),
    (
        "piecewise_interpolate_schedule",
        dict(interpolate_type="linear", init_value=0.2, boundaries_and_scales={0: 5.0, 5: 0.5, 6: 3.0}),
        9,
    ),
    (
        "piecewise_interpolate_schedule",
        dict(interpolate_type="cosine", init_value=1.0, boundaries_and_scales={-3: 0.5, 4: 0.1}),
        7,
    ),
    (
        "piecewise_interpolate_schedule",
        dict(interpolate_type="linear", init_value=0.7, boundaries_and_scales=None),
        3,
    ),
    # One-cycle schedules. pct * steps is rounded down in double precision, as optax does:
    # 0.58 * 50 = 28.999999999999996 gives step 28 (in float32 it would be 29), 0.53 * 100 gives 53
    # (in float32, 52).
    ("cosine_onecycle_schedule", dict(transition_steps=10, peak_value=1.0), 13),
    (
        "cosine_onecycle_schedule",
        dict(transition_steps=20, peak_value=0.5, pct_start=0.25, div_factor=10.0, final_div_factor=100.0),
        24,
    ),
    ("cosine_onecycle_schedule", dict(transition_steps=50, peak_value=1.0, pct_start=0.58), 53),
    ("cosine_onecycle_schedule", dict(transition_steps=6, peak_value=1.0, pct_start=0.0), 8),
    ("cosine_onecycle_schedule", dict(transition_steps=6, peak_value=1.0, pct_start=1.0), 8),
    ("cosine_onecycle_schedule", dict(transition_steps=1, peak_value=2.0), 3),
    ("linear_onecycle_schedule", dict(transition_steps=10, peak_value=1.0), 13),
    (
        "linear_onecycle_schedule",
        dict(
            transition_steps=20,
            peak_value=2.0,
            pct_start=0.2,
            pct_final=0.6,
            div_factor=5.0,
            final_div_factor=50.0,
        ),
        24,
    ),
    (
        "linear_onecycle_schedule",
        dict(transition_steps=100, peak_value=1.0, pct_start=0.29, pct_final=0.53),
        104,
    ),
    ("linear_onecycle_schedule", dict(transition_steps=10, peak_value=1.0, pct_start=0.6, pct_final=0.3), 13),
    ("linear_onecycle_schedule", dict(transition_steps=8, peak_value=1.0, pct_final=1.0), 10),
    ("linear_onecycle_schedule", dict(transition_steps=2, peak_value=1.0), 4),
    ("linear_onecycle_schedule", dict(transition_steps=1, peak_value=1.0), 3),
    # SGDR: one cycle, and cycles of different shapes (restarts before, at and after each end).
    (
        "sgdr_schedule",
        dict(cosine_kwargs=[dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=6)]),
        9,
    ),
    (
        "sgdr_schedule",
        dict(
            cosine_kwargs=[
                dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=6, end_value=0.1),
                dict(init_value=0.5, peak_value=0.8, warmup_steps=0, decay_steps=4),
                dict(
                    init_value=0.1,
                    peak_value=0.4,
                    warmup_steps=3,
                    decay_steps=8,
                    end_value=0.05,
                    exponent=2.0,
                ),
            ]
        ),
        22,
    ),
]


def _case_id(case):
    name, kwargs, _ = case
    return name + "(" + ",".join(f"{k}={v}" for k, v in kwargs.items()) + ")"


def _build(name, kwargs):
    return getattr(modopt, name)(**kwargs), getattr(optax, name)(**kwargs)


def _join_pair():
    """The same three-piece join built in both libraries (boundaries inside and at the ends)."""
    ours = modopt.join_schedules(
        [
            modopt.linear_schedule(0.0, 1.0, 5),
            modopt.cosine_decay_schedule(1.0, 8, alpha=0.1),
            modopt.constant_schedule(0.05),
        ],
        [5, 13],
    )
    theirs = optax.join_schedules(
        [
            optax.linear_schedule(0.0, 1.0, 5),
            optax.cosine_decay_schedule(1.0, 8, alpha=0.1),
            optax.constant_schedule(0.05),
        ],
        [5, 13],
    )
    return ours, theirs


def _assert_close(ours, theirs, where):
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=RTOL, atol=ATOL, err_msg=where)


# --------------------------------------------------------------------------------------------
# Parity with optax
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_parity_python_int_counts(case):
    name, kwargs, last = case
    ours, theirs = _build(name, kwargs)
    for count in range(last + 1):
        _assert_close(ours(count), theirs(count), f"{name} at count={count} (Python int)")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_parity_int32_array_counts(case):
    name, kwargs, last = case
    ours, theirs = _build(name, kwargs)
    for count in range(last + 1):
        c = jnp.asarray(count, jnp.int32)
        got, want = ours(c), theirs(c)
        _assert_close(got, want, f"{name} at count={count} (int32 array)")
        assert jnp.asarray(got).dtype == jnp.asarray(want).dtype, (name, count)
    # Far beyond the end of the schedule, the value has settled where optax's has.
    far = jnp.asarray(1_000_000, jnp.int32)
    _assert_close(ours(far), theirs(far), f"{name} at count=1e6")


# Shared by every case, so a compilation is reused by every schedule of the same structure.
_JIT_VMAPPED = jax.jit(lambda schedule, c: jax.vmap(schedule)(c))
_JIT_SCALAR = jax.jit(lambda schedule, c: schedule(c))
_COUNTS = jnp.arange(128, dtype=jnp.int32)  # one length for every case


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_parity_under_jit(case):
    name, kwargs, last = case
    ours, theirs = _build(name, kwargs)
    assert last < _COUNTS.shape[0]
    # The schedule is an argument of the jitted function (a pytree of array leaves).
    got = _JIT_VMAPPED(ours, _COUNTS)[: last + 1]
    # Compared with optax evaluated eagerly, count by count: a vectorized jitted optax can
    # give NaN at the end of a fractional-power polynomial (see
    # `test_polynomial_fractional_power_settles_under_jit`).
    want = jnp.stack([jnp.asarray(theirs(count), jnp.float32) for count in range(last + 1)])
    _assert_close(got, want, f"{name} under jit")
    # Scalar counts under jit.
    for count in range(last + 1):
        c = jnp.asarray(count, jnp.int32)
        _assert_close(_JIT_SCALAR(ours, c), want[count], f"{name} under jit at count={count}")


# The first case of each schedule (one compilation each).
_FIRST_CASES = list({case[0]: case for case in reversed(CASES)}.values())


@pytest.mark.parametrize("case", _FIRST_CASES, ids=_case_id)
def test_jit_of_the_schedule_itself(case):
    # The schedule as the jitted function: it hashes by its values.
    name, kwargs, last = case
    ours, theirs = _build(name, kwargs)
    direct = jax.jit(ours)
    for count in range(last + 1):
        _assert_close(
            direct(jnp.asarray(count, jnp.int32)), theirs(count), f"jax.jit({name}) at count={count}"
        )
    assert hash(ours) == hash(_build(name, kwargs)[0])  # an equal schedule reuses the compilation


_AT_10_BILLION = jax.jit(lambda schedule: schedule(10**10))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_counts_beyond_int32(case):
    # 10**10 does not fit int32: as a Python int it is taken as a float. Far past its end,
    # every schedule has settled where optax's has at 10**9.
    name, kwargs, _ = case
    ours, theirs = _build(name, kwargs)
    _assert_close(_AT_10_BILLION(ours), theirs(jnp.asarray(10**9, jnp.int32)), f"{name} at count=10**10")


def test_join_schedules_parity():
    ours, theirs = _join_pair()
    for count in range(20):
        _assert_close(ours(count), theirs(count), f"join at {count}")
        c = jnp.asarray(count, jnp.int32)
        _assert_close(ours(c), theirs(c), f"join at int32 {count}")
    counts = jnp.arange(20, dtype=jnp.int32)
    got = jax.jit(lambda s, c: jax.vmap(s)(c))(ours, counts)
    _assert_close(got, jax.vmap(theirs)(counts), "join under jit")


def test_join_schedules_accepts_plain_callables():
    # An arbitrary function of the count is a valid piece, as in optax.
    piece = lambda count: 0.5 * jnp.asarray(count, jnp.float32)  # noqa: E731
    ours = modopt.join_schedules([modopt.constant_schedule(1.0), piece], [4])
    theirs = optax.join_schedules([optax.constant_schedule(1.0), piece], [4])
    for count in range(10):
        _assert_close(ours(count), theirs(count), f"join with a function at {count}")


def test_join_schedules_nested():
    ours_inner, theirs_inner = _join_pair()
    ours = modopt.join_schedules([modopt.constant_schedule(2.0), ours_inner], [3])
    theirs = optax.join_schedules([optax.constant_schedule(2.0), theirs_inner], [3])
    counts = jnp.arange(25, dtype=jnp.int32)
    _assert_close(jax.jit(jax.vmap(ours))(counts), jax.vmap(theirs)(counts), "nested join")


def test_join_schedules_needs_one_more_schedule_than_boundaries():
    with pytest.raises(ValueError, match="one more schedule than boundaries"):
        modopt.join_schedules([modopt.constant_schedule(1.0), modopt.constant_schedule(2.0)], [1, 2])


def test_polynomial_fractional_power_settles_under_jit():
    # Past the end of the transition the value is `end_value`, also for a fractional power in
    # a vectorized jitted evaluation (where XLA computes `t / steps` as `t * (1 / steps)`, and
    # `1 - t / steps` can come out as -4e-8: a negative base for `** 0.5`, i.e. NaN).
    schedule = modopt.polynomial_schedule(init_value=0.5, end_value=2.0, power=0.5, transition_steps=7)
    counts = jnp.arange(13, dtype=jnp.int32)
    got = jax.jit(lambda s, c: jax.vmap(s)(c))(schedule, counts)
    assert np.all(np.isfinite(np.asarray(got))), got
    np.testing.assert_allclose(np.asarray(got)[7:], 2.0, rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(got)[:7], jax.vmap(optax.polynomial_schedule(0.5, 2.0, 0.5, 7))(counts[:7]), rtol=1e-6
    )


def test_known_values():
    # Independent of optax: values from the closed-form formulas.
    cosine = modopt.cosine_decay_schedule(1.0, 10, alpha=0.0)
    np.testing.assert_allclose(cosine(0), 1.0, rtol=1e-6)
    np.testing.assert_allclose(cosine(5), 0.5, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(cosine(10), 0.0, atol=1e-7)
    np.testing.assert_allclose(cosine(50), 0.0, atol=1e-7)
    warm = modopt.warmup_cosine_decay_schedule(0.0, 2.0, 4, 14, end_value=0.2)
    np.testing.assert_allclose(warm(2), 1.0, rtol=1e-6)
    np.testing.assert_allclose(warm(4), 2.0, rtol=1e-6)
    np.testing.assert_allclose(warm(9), 0.2 + (2.0 - 0.2) * 0.5, rtol=1e-6)
    np.testing.assert_allclose(warm(14), 0.2, rtol=1e-6)
    np.testing.assert_allclose(warm(100), 0.2, rtol=1e-6)
    poly = modopt.polynomial_schedule(1.0, 0.0, 2, 10, transition_begin=2)
    np.testing.assert_allclose(poly(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(poly(7), 0.25, rtol=1e-6)
    np.testing.assert_allclose(poly(12), 0.0, atol=1e-7)


# --------------------------------------------------------------------------------------------
# Retracing: a schedule is an argument, new numbers reuse the compiled function
# --------------------------------------------------------------------------------------------


def _tracing_evaluator():
    traces = []

    @jax.jit
    def evaluate(schedule, counts):
        traces.append(None)  # runs only while tracing
        return jax.vmap(schedule)(counts)

    return evaluate, traces


RETRACE_CASES = [
    (
        "constant_schedule",
        dict(value=0.1),
        [dict(value=0.7), dict(value=-3.0)],
    ),
    (
        "polynomial_schedule",
        dict(init_value=1.0, end_value=0.0, power=2, transition_steps=10, transition_begin=0),
        [
            dict(init_value=0.3, end_value=0.2, power=3, transition_steps=4, transition_begin=2),
            dict(init_value=0.3, end_value=0.2, power=1, transition_steps=0, transition_begin=-2),
        ],
    ),
    (
        "linear_schedule",
        dict(init_value=1.0, end_value=0.0, transition_steps=10),
        [dict(init_value=5.0, end_value=1.0, transition_steps=3)],
    ),
    (
        "cosine_decay_schedule",
        dict(init_value=1.0, decay_steps=10, alpha=0.0, exponent=1.0),
        [
            dict(init_value=0.5, decay_steps=4, alpha=0.3, exponent=2.0),
            dict(init_value=3.0, decay_steps=17, alpha=0.1, exponent=1.0),
        ],
    ),
    (
        "warmup_cosine_decay_schedule",
        dict(init_value=0.0, peak_value=1.0, warmup_steps=3, decay_steps=12, end_value=0.0, exponent=1.0),
        [
            dict(init_value=0.1, peak_value=2.0, warmup_steps=5, decay_steps=9, end_value=0.3, exponent=2.0),
            dict(init_value=0.1, peak_value=0.0, warmup_steps=2, decay_steps=20, end_value=0.3, exponent=1.0),
        ],
    ),
]


RETRACE_CASES += [
    (
        "exponential_decay",
        dict(init_value=1.0, transition_steps=5, decay_rate=0.5, transition_begin=0, end_value=0.1),
        [
            dict(init_value=2.0, transition_steps=3, decay_rate=0.9, transition_begin=4, end_value=0.5),
            # A rate above 1: end_value becomes a ceiling, still without a retrace.
            dict(init_value=1.0, transition_steps=7, decay_rate=1.5, transition_begin=-2, end_value=3.0),
        ],
    ),
    (
        "exponential_decay",
        dict(init_value=1.0, transition_steps=2, decay_rate=0.5, staircase=True),
        [dict(init_value=0.3, transition_steps=6, decay_rate=0.8, staircase=True)],
    ),
    (
        "warmup_exponential_decay_schedule",
        dict(init_value=0.0, peak_value=1.0, warmup_steps=3, transition_steps=4, decay_rate=0.5),
        [
            dict(init_value=0.2, peak_value=2.0, warmup_steps=6, transition_steps=2, decay_rate=0.9),
            dict(init_value=0.2, peak_value=2.0, warmup_steps=0, transition_steps=9, decay_rate=1.1),
        ],
    ),
    (
        "piecewise_constant_schedule",
        dict(init_value=1.0, boundaries_and_scales={3: 0.5, 7: 0.1}),
        [
            dict(init_value=0.2, boundaries_and_scales={1: 2.0, 20: 0.3}),
            dict(init_value=3.0, boundaries_and_scales={0: 0.0, 4: 1.5}),
        ],
    ),
    (
        "piecewise_interpolate_schedule",
        dict(interpolate_type="linear", init_value=1.0, boundaries_and_scales={4: 0.1, 8: 0.01}),
        [
            dict(interpolate_type="linear", init_value=0.5, boundaries_and_scales={2: 3.0, 15: 0.2}),
            dict(interpolate_type="linear", init_value=0.5, boundaries_and_scales={0: 2.0, 1: 0.0}),
        ],
    ),
    (
        "piecewise_interpolate_schedule",
        dict(interpolate_type="cosine", init_value=1.0, boundaries_and_scales={4: 0.1, 8: 0.01}),
        [dict(interpolate_type="cosine", init_value=2.0, boundaries_and_scales={10: 0.5, 12: 4.0})],
    ),
    (
        "cosine_onecycle_schedule",
        dict(transition_steps=10, peak_value=1.0, pct_start=0.3, div_factor=25.0, final_div_factor=1e4),
        [
            dict(transition_steps=20, peak_value=0.3, pct_start=0.5, div_factor=10.0, final_div_factor=100.0),
            dict(transition_steps=7, peak_value=2.0, pct_start=0.1, div_factor=4.0, final_div_factor=10.0),
        ],
    ),
    (
        "linear_onecycle_schedule",
        dict(
            transition_steps=10,
            peak_value=1.0,
            pct_start=0.3,
            pct_final=0.85,
            div_factor=25.0,
            final_div_factor=1e4,
        ),
        [
            dict(
                transition_steps=20,
                peak_value=0.3,
                pct_start=0.2,
                pct_final=0.5,
                div_factor=10.0,
                final_div_factor=10.0,
            )
        ],
    ),
    (
        "sgdr_schedule",
        dict(
            cosine_kwargs=[
                dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=6, end_value=0.0),
                dict(init_value=0.0, peak_value=0.5, warmup_steps=1, decay_steps=8, end_value=0.0),
            ]
        ),
        [
            dict(
                cosine_kwargs=[
                    dict(init_value=0.1, peak_value=2.0, warmup_steps=4, decay_steps=10, end_value=0.2),
                    dict(init_value=0.3, peak_value=0.9, warmup_steps=0, decay_steps=3, end_value=0.1),
                ]
            )
        ],
    ),
]


@pytest.mark.parametrize("case", RETRACE_CASES, ids=lambda c: c[0])
def test_new_numbers_do_not_retrace(case):
    name, first, others = case
    evaluate, traces = _tracing_evaluator()
    counts = jnp.arange(25, dtype=jnp.int32)
    for kwargs in [first, *others]:
        ours, theirs = _build(name, kwargs)
        got = evaluate(ours, counts)
        # The compiled function really uses the new numbers.
        _assert_close(got, jax.vmap(theirs)(counts), f"{name}({kwargs}) in a reused compilation")
    assert len(traces) == 1, f"{name}: traced {len(traces)} times for {1 + len(others)} configurations"


def test_join_schedules_new_numbers_do_not_retrace():
    evaluate, traces = _tracing_evaluator()
    counts = jnp.arange(30, dtype=jnp.int32)
    for peak, boundary, steps in [(1.0, 5, 8), (0.3, 9, 15), (2.0, 2, 3)]:
        ours = modopt.join_schedules(
            [modopt.linear_schedule(0.0, peak, boundary), modopt.cosine_decay_schedule(peak, steps)],
            [boundary],
        )
        theirs = optax.join_schedules(
            [optax.linear_schedule(0.0, peak, boundary), optax.cosine_decay_schedule(peak, steps)],
            [boundary],
        )
        _assert_close(evaluate(ours, counts), jax.vmap(theirs)(counts), f"join {peak, boundary, steps}")
    assert len(traces) == 1


def test_join_schedules_boundaries_are_hyperparameters():
    pieces = [modopt.constant_schedule(1.0), modopt.linear_schedule(2.0, 0.0, 10)]
    tx = modopt.sgd(modopt.join_schedules(pieces, [5]))
    assert "boundaries" in modopt.hyperparameters(tx)
    moved = modopt.set_hyperparameters(tx, boundaries=[7])
    theirs = optax.join_schedules([optax.constant_schedule(1.0), optax.linear_schedule(2.0, 0.0, 10)], [7])
    counts = jnp.arange(20, dtype=jnp.int32)
    _assert_close(jax.vmap(moved.learning_rate)(counts), jax.vmap(theirs)(counts), "join with moved boundaries")
    with pytest.raises(ValueError, match="shape"):
        modopt.set_hyperparameters(tx, boundaries=[3, 7])


def test_schedule_inside_optimizer_does_not_retrace():
    # The schedule reaches the jitted step through the transform (a learning rate field).
    traces = []

    @jax.jit
    def step(tx, grads, state):
        traces.append(None)
        return tx.update(grads, state)

    grads = {"w": jnp.ones((2, 3)), "b": jnp.full((3,), 0.5)}
    for peak, decay_steps in [(1.0, 10), (0.2, 30)]:
        ours = modopt.sgd(modopt.warmup_cosine_decay_schedule(0.0, peak, 2, decay_steps))
        theirs = optax.sgd(optax.warmup_cosine_decay_schedule(0.0, peak, 2, decay_steps))
        state, ostate = ours.init(grads), theirs.init(grads)
        for _ in range(4):
            updates, state = step(ours, grads, state)
            oupdates, ostate = theirs.update(grads, ostate)
            jax.tree_util.tree_map(lambda a, b: _assert_close(a, b, "sgd with a schedule"), updates, oupdates)
    assert len(traces) == 1


# --------------------------------------------------------------------------------------------
# Invalid values
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decay_steps", [0, -3])
def test_cosine_decay_invalid_decay_steps(decay_steps):
    message = f"Invalid decay_steps: {decay_steps} (must be > 0)"
    with pytest.raises(ValueError, match=re.escape(message)):
        modopt.cosine_decay_schedule(1.0, decay_steps)
    # optax refuses the same values.
    with pytest.raises(ValueError):
        optax.cosine_decay_schedule(1.0, decay_steps)


@pytest.mark.parametrize("warmup_steps,decay_steps", [(10, 10), (10, 5), (0, 0), (3, -1)])
def test_warmup_cosine_decay_invalid_decay_steps(warmup_steps, decay_steps):
    # decay_steps counts the warmup: the cosine phase must have at least one step.
    pattern = re.escape(f"Invalid decay_steps: {decay_steps} (must be > ")
    with pytest.raises(ValueError, match=pattern):
        modopt.warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps, decay_steps)
    with pytest.raises(ValueError):
        optax.warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps, decay_steps)


def test_warmup_cosine_decay_message_names_warmup_steps():
    with pytest.raises(ValueError, match=re.escape("Invalid decay_steps: 5 (must be > warmup_steps = 10")):
        modopt.warmup_cosine_decay_schedule(0.0, 1.0, 10, 5)


def test_warmup_cosine_decay_negative_warmup_steps():
    with pytest.raises(ValueError, match=re.escape("Invalid warmup_steps: -1 (must be >= 0)")):
        modopt.warmup_cosine_decay_schedule(0.0, 1.0, -1, 5)


def test_exponential_decay_invalid_values():
    # optax documents transition_steps > 0 and decay_rate != 0 but then returns the constant
    # init_value; a negative rate gives NaN. modopt refuses all three at construction.
    for kwargs, message in [
        (dict(transition_steps=0), "Invalid transition_steps: 0 (must be > 0) in ExponentialDecaySchedule."),
        (
            dict(transition_steps=-3),
            "Invalid transition_steps: -3 (must be > 0) in ExponentialDecaySchedule.",
        ),
        (dict(decay_rate=0.0), "Invalid decay_rate: 0.0 (must be > 0) in ExponentialDecaySchedule."),
        (dict(decay_rate=-0.5), "Invalid decay_rate: -0.5 (must be > 0) in ExponentialDecaySchedule."),
    ]:
        arguments = dict(init_value=1.0, transition_steps=5, decay_rate=0.5) | kwargs
        with pytest.raises(ValueError, match=re.escape(message)):
            modopt.exponential_decay(**arguments)
    assert np.isnan(optax.exponential_decay(1.0, 5, -0.5)(3))


def test_warmup_exponential_decay_invalid_values():
    base = dict(init_value=0.0, peak_value=1.0, warmup_steps=3, transition_steps=5, decay_rate=0.5)
    for kwargs, message in [
        (dict(warmup_steps=-1), "Invalid warmup_steps: -1 (must be >= 0)"),
        (dict(transition_steps=0), "Invalid transition_steps: 0 (must be > 0)"),
        (dict(decay_rate=0.0), "Invalid decay_rate: 0.0 (must be > 0)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message + " in WarmupExponentialDecaySchedule.")):
            modopt.warmup_exponential_decay_schedule(**(base | kwargs))


@pytest.mark.parametrize(
    "build",
    [
        lambda lib: lib.piecewise_constant_schedule(1.0, {3: 0.5, 6: -0.1}),
        lambda lib: lib.piecewise_interpolate_schedule("cosine", 1.0, {3: 0.5, 6: -0.1}),
    ],
    ids=["constant", "interpolate"],
)
def test_piecewise_negative_scale(build):
    with pytest.raises(
        ValueError, match=re.escape("Invalid boundaries_and_scales: scale -0.1 at boundary 6 (must be >= 0 and finite)")
    ):
        build(modopt)
    with pytest.raises(ValueError):  # optax refuses it too
        build(optax)


def test_piecewise_interpolate_invalid_type():
    message = "Invalid interpolate_type: 'quadratic' (must be one of 'linear', 'cosine') in PiecewiseInterpolateSchedule."
    with pytest.raises(ValueError, match=re.escape(message)):
        modopt.piecewise_interpolate_schedule("quadratic", 1.0, {3: 0.5})
    with pytest.raises(ValueError):
        optax.piecewise_interpolate_schedule("quadratic", 1.0, {3: 0.5})


def test_piecewise_classes_check_their_arrays():
    with pytest.raises(
        ValueError, match=re.escape("Invalid boundaries: [5 2] (must be in increasing order)")
    ):
        modopt.PiecewiseInterpolateSchedule("linear", 1.0, [5, 2], [0.5, 0.5])
    with pytest.raises(ValueError, match=re.escape("shapes (2,) and (1,)")):
        modopt.PiecewiseConstantSchedule(1.0, [5, 7], [0.5])
    with pytest.raises(ValueError, match=re.escape("Invalid scales: [ 0.5 -1. ] (must be >= 0 and finite)")):
        modopt.PiecewiseConstantSchedule(1.0, [5, 7], [0.5, -1.0])


@pytest.mark.parametrize("name", ["cosine_onecycle_schedule", "linear_onecycle_schedule"])
def test_onecycle_invalid_values(name):
    for kwargs, message in [
        (dict(transition_steps=0), "Invalid transition_steps: 0 (must be > 0)"),
        (dict(transition_steps=-5), "Invalid transition_steps: -5 (must be > 0)"),
        (dict(div_factor=0.0), "Invalid div_factor: 0.0 (must be > 0)"),
        (dict(div_factor=-2.0), "Invalid div_factor: -2.0 (must be > 0)"),
        (dict(final_div_factor=0.0), "Invalid final_div_factor: 0.0 (must be > 0)"),
    ]:
        arguments = dict(transition_steps=10, peak_value=1.0) | kwargs
        with pytest.raises(ValueError, match=re.escape(f"{message} in {name}.")):
            getattr(modopt, name)(**arguments)
        with pytest.raises((ValueError, ZeroDivisionError)):  # optax refuses them too
            getattr(optax, name)(**arguments)


def test_sgdr_invalid_values():
    with pytest.raises(ValueError, match=re.escape("Invalid cosine_kwargs: no cycle")):
        modopt.sgdr_schedule([])
    cycles = [
        dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=6),
        dict(init_value=0.0, peak_value=1.0, warmup_steps=6, decay_steps=6),
    ]
    with pytest.raises(
        ValueError,
        match=re.escape("Invalid decay_steps: 6 (must be > warmup_steps = 6") + ".*cycle 1 of sgdr_schedule",
    ):
        modopt.sgdr_schedule(cycles)


def test_sgdr_takes_any_iterable():
    cycle = dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=6)
    ours = modopt.sgdr_schedule(dict(cycle) for _ in range(3))
    theirs = optax.sgdr_schedule([cycle] * 3)
    _assert_close(jax.vmap(ours)(_COUNTS[:20]), jax.vmap(theirs)(_COUNTS[:20]), "sgdr from a generator")


# --------------------------------------------------------------------------------------------
# piecewise_linear_schedule (named in the seeds, absent from optax 0.2.8)
# --------------------------------------------------------------------------------------------

PIECEWISE_LINEAR_CASES = [
    (1.0, {4: 0.1, 8: 0.01}),
    (0.9, {10: 0.999 / 0.9}),  # b1 from 0.9 to 0.999, as in inject_hyperparams' example
    (0.5, {7: 4.0, 3: 0.5, 12: 0.0}),  # unsorted keys, up and down, down to 0
    (2.0, {0: 0.5, 1: 3.0, 5: 1.0}),  # a boundary at 0, a one-step piece, a flat piece
    (0.3, None),
]


def _numpy_piecewise_linear(init_value, boundaries_and_scales, count):
    """The definition, in float64: the line through consecutive points (0, v_0), (b_i, v_i)."""
    points = [(0, init_value)]
    for boundary, scale in sorted((boundaries_and_scales or {}).items()):
        points.append((boundary, points[-1][1] * scale))
    value = points[0][1]
    for (x0, v0), (x1, v1) in itertools.pairwise(points):
        if count >= x1:
            value = v1  # this piece is over (an empty piece at a shared step too)
        elif count >= x0:
            value = v0 + (v1 - v0) * (count - x0) / (x1 - x0)
    return value


@pytest.mark.parametrize("case", PIECEWISE_LINEAR_CASES, ids=str)
def test_piecewise_linear_schedule(case):
    init_value, boundaries_and_scales = case
    ours = modopt.piecewise_linear_schedule(init_value, boundaries_and_scales)
    same = modopt.piecewise_interpolate_schedule("linear", init_value, boundaries_and_scales)
    theirs = optax.piecewise_interpolate_schedule("linear", init_value, boundaries_and_scales)
    last = max((boundaries_and_scales or {0: None}).keys()) + 3
    want = np.array([_numpy_piecewise_linear(init_value, boundaries_and_scales, c) for c in range(last + 1)])
    eager = np.array([ours(c) for c in range(last + 1)])
    np.testing.assert_allclose(eager, want, rtol=1e-6, atol=1e-7)
    counts = _COUNTS[: last + 1]
    jitted = _JIT_VMAPPED(ours, _COUNTS)[: last + 1]
    np.testing.assert_allclose(jitted, want, rtol=1e-6, atol=1e-7)
    # The same schedule as the linear piecewise interpolation (and so as optax's).
    np.testing.assert_array_equal(jitted, _JIT_VMAPPED(same, _COUNTS)[: last + 1])
    _assert_close(
        jitted, jax.vmap(theirs)(counts), "piecewise_linear_schedule vs optax's linear interpolation"
    )
    _assert_close(ours(10**10), want[-1], "piecewise_linear_schedule at 10**10")


def test_piecewise_linear_new_numbers_do_not_retrace():
    evaluate, traces = _tracing_evaluator()
    for init_value, boundaries_and_scales in [
        (1.0, {4: 0.1, 8: 0.01}),
        (0.2, {1: 5.0, 30: 0.5}),
        (3.0, {0: 1.0, 2: 0.0}),
    ]:
        schedule = modopt.piecewise_linear_schedule(init_value, boundaries_and_scales)
        want = [_numpy_piecewise_linear(init_value, boundaries_and_scales, c) for c in range(40)]
        np.testing.assert_allclose(evaluate(schedule, _COUNTS[:40]), want, rtol=1e-6, atol=1e-7)
    assert len(traces) == 1


def test_piecewise_linear_invalid_values():
    with pytest.raises(
        ValueError, match=re.escape("Invalid boundaries_and_scales: boundary -2 (must be >= 0")
    ):
        modopt.piecewise_linear_schedule(1.0, {-2: 0.5, 4: 0.1})
    with pytest.raises(
        ValueError, match=re.escape("Invalid boundaries_and_scales: scale -1.0 at boundary 4 (must be >= 0 and finite)")
    ):
        modopt.piecewise_linear_schedule(1.0, {4: -1.0})


# --------------------------------------------------------------------------------------------
# Steps beyond int32, closed forms
# --------------------------------------------------------------------------------------------


def test_steps_beyond_int32():
    # Boundaries and lengths of 10**10 steps, counted as Python ints, against float64 values.
    big = 10**10
    checks = [
        (modopt.exponential_decay(1.0, big, 0.5), {0: 1.0, big // 2: 0.5**0.5, big: 0.5, 3 * big: 0.125}),
        (modopt.exponential_decay(1.0, big, 0.5, staircase=True), {big - 10**6: 1.0, 2 * big + 10**6: 0.25}),
        (
            modopt.piecewise_constant_schedule(1.0, {big: 0.1, 2 * big: 0.5}),
            {9 * 10**9: 1.0, big: 0.1, 3 * big: 0.05},
        ),
        (
            modopt.piecewise_interpolate_schedule("linear", 1.0, {big: 0.5}),
            {big // 2: 0.75, big: 0.5, 5 * big: 0.5},
        ),
        (modopt.linear_onecycle_schedule(big, 1.0), {0: 0.04, 3 * 10**9: 1.0, big: 0.04 / 1e4}),
        (
            modopt.warmup_exponential_decay_schedule(0.0, 1.0, big, big, 0.5),
            {big // 2: 0.5, big: 1.0, 2 * big: 0.5},
        ),
        (modopt.polynomial_schedule(1.0, 0.0, 2, big, transition_begin=big), {big: 1.0, 3 * big // 2: 0.25}),
        (
            modopt.sgdr_schedule(
                [dict(init_value=0.0, peak_value=1.0, warmup_steps=big, decay_steps=3 * big)] * 2
            ),
            {big // 2: 0.5, big: 1.0, 2 * big: 0.5, 3 * big + big // 2: 0.5, 7 * big: 0.0},
        ),
    ]
    for schedule, values in checks:
        for count, want in values.items():
            np.testing.assert_allclose(
                schedule(count), want, rtol=1e-6, atol=1e-9, err_msg=f"{schedule} at {count}"
            )
        # int32 counts compare exactly with the boundaries (stored as floats beyond int32).
        last = jnp.asarray(2**31 - 1, jnp.int32)
        np.testing.assert_allclose(_JIT_SCALAR(schedule, last), schedule(2**31 - 1), rtol=1e-6)


def test_known_values_of_new_schedules():
    # Independent of optax: values from the closed-form formulas.
    decay = modopt.exponential_decay(2.0, transition_steps=10, decay_rate=0.5, transition_begin=5)
    np.testing.assert_allclose(
        [decay(0), decay(5), decay(10), decay(25)], [2.0, 2.0, 2.0 * 0.5**0.5, 0.5], rtol=1e-6
    )
    stairs = modopt.exponential_decay(1.0, 4, 0.1, staircase=True, end_value=0.005)
    np.testing.assert_allclose(
        [stairs(3), stairs(4), stairs(11), stairs(12), stairs(99)], [1.0, 0.1, 0.01, 0.005, 0.005], rtol=1e-6
    )
    growth = modopt.exponential_decay(1.0, 2, 3.0, end_value=10.0)
    np.testing.assert_allclose([growth(2), growth(4), growth(6)], [3.0, 9.0, 10.0], rtol=1e-6)
    constant = modopt.piecewise_constant_schedule(1.0, {100: 0.1, 200: 0.5})
    np.testing.assert_allclose(
        [constant(99), constant(100), constant(199), constant(200)], [1.0, 0.1, 0.1, 0.05], rtol=1e-6
    )
    cosine = modopt.piecewise_interpolate_schedule("cosine", 1.0, {10: 0.0})
    np.testing.assert_allclose(
        [cosine(0), cosine(5), cosine(10), cosine(11)], [1.0, 0.5, 0.0, 0.0], rtol=1e-6, atol=1e-7
    )
    onecycle = modopt.cosine_onecycle_schedule(
        100, 1.0, pct_start=0.2, div_factor=10.0, final_div_factor=100.0
    )
    np.testing.assert_allclose(
        [onecycle(0), onecycle(10), onecycle(20), onecycle(60), onecycle(100), onecycle(500)],
        [0.1, 0.55, 1.0, (1.0 + 1e-3) / 2, 1e-3, 1e-3],
        rtol=1e-5,
    )
    linear = modopt.linear_onecycle_schedule(
        100, 1.0, pct_start=0.2, pct_final=0.8, div_factor=10.0, final_div_factor=10.0
    )
    np.testing.assert_allclose(
        [linear(0), linear(10), linear(20), linear(50), linear(80), linear(90), linear(100)],
        [0.1, 0.55, 1.0, 0.55, 0.1, 0.055, 0.01],
        rtol=1e-5,
    )
    warm = modopt.warmup_exponential_decay_schedule(0.0, 2.0, 4, 3, 0.5, transition_begin=2)
    np.testing.assert_allclose([warm(2), warm(4), warm(6), warm(9)], [1.0, 2.0, 2.0, 1.0], rtol=1e-6)


def test_new_schedules_drive_an_optimizer():
    # A schedule as a learning rate, and its numbers found by name.
    grads = {"w": jnp.ones((3,))}
    ours = modopt.sgd(modopt.exponential_decay(0.1, 2, 0.5, staircase=True))
    theirs = optax.sgd(optax.exponential_decay(0.1, 2, 0.5, staircase=True))
    state, ostate = ours.init(grads), theirs.init(grads)
    step = jax.jit(lambda tx, g, s: tx.update(g, s))
    for _ in range(5):
        updates, state = step(ours, grads, state)
        oupdates, ostate = theirs.update(grads, ostate)
        _assert_close(updates["w"], oupdates["w"], "sgd with exponential_decay")
    assert float(modopt.hyperparameters(ours)["decay_rate"]) == 0.5


# --- probe counts: where a learning-rate check looks at a schedule --------------------------------

PROBED = {
    "constant": modopt.constant_schedule(0.3),
    "linear_up_late": modopt.linear_schedule(0.0, 1.0, 50, transition_begin=20),
    "polynomial_square_root": modopt.polynomial_schedule(1.0, 0.1, power=0.5, transition_steps=80),
    "cosine_exponent": modopt.cosine_decay_schedule(1.0, 90, alpha=0.2, exponent=2.0),
    "cosine_alpha_above_one": modopt.cosine_decay_schedule(1.0, 90, alpha=1.5),
    "warmup_cosine": modopt.warmup_cosine_decay_schedule(0.1, 1.0, 15, 120, end_value=0.05),
    "exponential_floor": modopt.exponential_decay(1.0, 5, 0.5, transition_begin=10, end_value=0.2),
    "exponential_ceiling": modopt.exponential_decay(0.1, 5, 2.0, end_value=3.0),
    "exponential_staircase": modopt.exponential_decay(1.0, 7, 0.5, staircase=True),
    "warmup_exponential": modopt.warmup_exponential_decay_schedule(0.0, 1.0, 10, 5, 0.5, 3, end_value=0.1),
    "piecewise_constant": modopt.piecewise_constant_schedule(1.0, {30: 3.0, 60: 0.01}),
    "piecewise_cosine": modopt.piecewise_interpolate_schedule("cosine", 0.5, {40: 4.0, 100: 0.1}),
    "one_cycle": modopt.cosine_onecycle_schedule(150, 2.0),
    "sgdr": modopt.sgdr_schedule([dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=50)] * 3),
    "join": modopt.join_schedules([modopt.linear_schedule(1.0, 0.0, 40), modopt.constant_schedule(0.7)], [30]),
}


@pytest.mark.parametrize("name", list(PROBED))
def test_probe_counts_hold_the_extreme_values(name):
    """Every piece is monotone, so the least and greatest values over a dense run of steps (long
    enough to reach every end) are among the values at `probe_counts()`."""
    schedule = PROBED[name]
    dense = np.asarray(jax.vmap(schedule)(jnp.arange(0, 400)))
    probed = np.asarray([schedule(jnp.asarray(c)) for c in schedule.probe_counts()])
    assert probed.min() <= dense.min() + 1e-6 and probed.max() >= dense.max() - 1e-6, (probed, dense.min(), dense.max())


def test_a_learning_rate_schedule_is_checked_where_it_turns_negative_or_non_finite():
    # Valid everywhere: accepted, also a growth without bound (a learning-rate range test).
    modopt.adam(modopt.exponential_decay(1e-5, 10, 1.5))
    modopt.sgd(modopt.piecewise_constant_schedule(0.1, {10: 0.0}))
    # Negative only after a later boundary, or at the floor an exponential decay reaches.
    later = modopt.join_schedules([modopt.constant_schedule(0.1), modopt.linear_schedule(0.1, -0.2, 10)], [50])
    with pytest.raises(ValueError, match=re.escape("is -0.2 at step 60 (must be >= 0 and finite) in Adam.")):
        modopt.adam(later)
    floor = modopt.exponential_decay(0.1, 10, 2.0, end_value=-1.0)
    with pytest.raises(ValueError, match=re.escape("is -1.0 at step 0 (must be >= 0 and finite) in Sgd.")):
        modopt.sgd(floor)
    # A plain function is probed at step 0.
    with pytest.raises(ValueError, match=re.escape("is -0.1 at step 0")):
        modopt.adam(lambda count: -0.1 + 0 * count)
    # Weight decay takes any sign: its schedule is not checked.
    modopt.adamw(1e-3, weight_decay=modopt.constant_schedule(-1e-4))
