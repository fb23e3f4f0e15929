"""Schedules: parity with optax, jit, no retrace on new numbers, and invalid values.

optax is the oracle: every modopt schedule must give the numbers of optax's schedule of the
same name at every count (inside the schedule, at its boundaries and beyond its end), for
counts given as Python ints and as int32 arrays, eagerly and under `jax.jit`.
"""

from __future__ import annotations

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
    ("warmup_cosine_decay_schedule", dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=15), 22),
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


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_parity_under_jit(case):
    name, kwargs, last = case
    ours, theirs = _build(name, kwargs)
    counts = jnp.arange(last + 1, dtype=jnp.int32)
    # The schedule is an argument of the jitted function (a pytree of array leaves).
    got = jax.jit(lambda schedule, c: jax.vmap(schedule)(c))(ours, counts)
    # Compared with optax evaluated eagerly, count by count: a vectorized jitted optax can
    # give NaN at the end of a fractional-power polynomial (see
    # `test_polynomial_fractional_power_settles_under_jit`).
    want = jnp.stack([jnp.asarray(theirs(count), jnp.float32) for count in range(last + 1)])
    _assert_close(got, want, f"{name} under jit")
    # Scalar counts under jit, one compile for all of them.
    scalar = jax.jit(lambda schedule, c: schedule(c))
    for count in range(last + 1):
        c = jnp.asarray(count, jnp.int32)
        _assert_close(scalar(ours, c), theirs(count), f"{name} under jit at count={count}")


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
    np.testing.assert_allclose(np.asarray(got)[:7], jax.vmap(optax.polynomial_schedule(0.5, 2.0, 0.5, 7))(counts[:7]), rtol=1e-6)


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
