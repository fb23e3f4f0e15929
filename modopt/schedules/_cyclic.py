"""Cyclical schedules: one-cycle (up then down) and SGDR (cosine cycles with warm restarts).

Each is a composition of the general schedules: a one-cycle schedule is a
`PiecewiseInterpolateSchedule` and SGDR a `JoinSchedules` of warmup-cosine cycles, so their
numbers are array leaves of those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._core.fields import POSITIVE, Check, _shown, is_concrete
from ._piecewise import PiecewiseInterpolateSchedule, piecewise_interpolate_schedule
from ._schedules import JoinSchedules, WarmupCosineDecaySchedule
from .._core.fields import Scalar


def _check(name: str, value: Any, check: Check, where: str) -> None:
    if is_concrete(value) and not check.predicate(np.asarray(value)):
        raise ValueError(f"Invalid {name}: {_shown(value)} (must be {check.description}) in {where}.")


def _phase_end(fraction: Any, steps: Any) -> Any:
    """The step `int(fraction * steps)` that ends a phase, rounded toward zero as optax does.

    Computed in Python (double precision) for Python numbers, so the step is optax's also
    where `fraction * steps` is within rounding of an integer (`0.29 * 100 = 28.99...`: 28).
    """
    if is_concrete(fraction) and is_concrete(steps):
        return int(fraction * steps)
    return jnp.trunc(jnp.asarray(fraction) * steps).astype(int)


def _phases(
    interpolate_type: str, init_value: Any, pieces: list[tuple[Any, Any]]
) -> PiecewiseInterpolateSchedule:
    """The one-cycle phases as a piecewise interpolation through `(step, scale)` pieces.

    As in optax, a piece ending at the same step as an earlier one replaces it (a short cycle
    whose phases round to the same step has fewer pieces).
    """
    if all(is_concrete(step) for step, _ in pieces):
        return piecewise_interpolate_schedule(
            interpolate_type, init_value, {int(s): scale for s, scale in pieces}
        )
    steps, scales = zip(*pieces)
    return PiecewiseInterpolateSchedule(interpolate_type, init_value, steps, scales)


def cosine_onecycle_schedule(
    transition_steps: Scalar,
    peak_value: Scalar,
    pct_start: Scalar = 0.3,
    div_factor: Scalar = 25.0,
    final_div_factor: Scalar = 1e4,
) -> PiecewiseInterpolateSchedule:
    r"""The one-cycle schedule with cosine annealing: up to `peak_value`, then down to almost 0.

    With `T = transition_steps`, `p = int(pct_start * T)` and `v_0 = peak_value / div_factor`:
    a cosine interpolation from `v_0` to `peak_value` over `[0, p)`, then from `peak_value`
    to `v_0 / final_div_factor` over `[p, T)`, which holds from `T` on. It is
    `piecewise_interpolate_schedule("cosine", v_0, {p: div_factor, T: 1 / (div_factor *
    final_div_factor)})`.

    Args:
        transition_steps: the length of the cycle, > 0.
        peak_value: the value at step `p`, the top of the cycle.
        pct_start: the fraction of the cycle spent increasing.
        div_factor: the start value is `peak_value / div_factor`; > 0.
        final_div_factor: the end value is the start value divided by this; > 0.

    Reference: Smith & Topin, 2017, "Super-Convergence: Very Fast Training of Neural Networks
    Using Large Learning Rates", https://arxiv.org/abs/1708.07120
    """
    where = "cosine_onecycle_schedule"
    _check("transition_steps", transition_steps, POSITIVE, where)
    _check("div_factor", div_factor, POSITIVE, where)
    _check("final_div_factor", final_div_factor, POSITIVE, where)
    pieces = [
        (_phase_end(pct_start, transition_steps), div_factor),
        (transition_steps, 1.0 / (div_factor * final_div_factor)),
    ]
    return _phases("cosine", peak_value / div_factor, pieces)


def linear_onecycle_schedule(
    transition_steps: Scalar,
    peak_value: Scalar,
    pct_start: Scalar = 0.3,
    pct_final: Scalar = 0.85,
    div_factor: Scalar = 25.0,
    final_div_factor: Scalar = 1e4,
) -> PiecewiseInterpolateSchedule:
    r"""The one-cycle schedule in three linear phases: up, down to the start, then annealing.

    With `T = transition_steps`, `p = int(pct_start * T)`, `q = int(pct_final * T)` and
    `v_0 = peak_value / div_factor`: linear from `v_0` to `peak_value` over `[0, p)`, from
    `peak_value` back to `v_0` over `[p, q)`, from `v_0` to `v_0 / final_div_factor` over
    `[q, T)`, which holds from `T` on. It is `piecewise_interpolate_schedule("linear", v_0,
    {p: div_factor, q: 1 / div_factor, T: 1 / final_div_factor})`.

    Args:
        transition_steps: the length of the cycle, > 0.
        peak_value: the value at step `p`, the top of the cycle.
        pct_start: the fraction of the cycle spent increasing.
        pct_final: the fraction of the cycle after which the value is back at the start
            value and the final annealing begins.
        div_factor: the start value is `peak_value / div_factor`; > 0.
        final_div_factor: the end value is the start value divided by this; > 0.

    Reference: Smith & Topin, 2017, "Super-Convergence: Very Fast Training of Neural Networks
    Using Large Learning Rates", https://arxiv.org/abs/1708.07120
    """
    where = "linear_onecycle_schedule"
    _check("transition_steps", transition_steps, POSITIVE, where)
    _check("div_factor", div_factor, POSITIVE, where)
    _check("final_div_factor", final_div_factor, POSITIVE, where)
    pieces = [
        (_phase_end(pct_start, transition_steps), div_factor),
        (_phase_end(pct_final, transition_steps), 1.0 / div_factor),
        (transition_steps, 1.0 / final_div_factor),
    ]
    return _phases("linear", peak_value / div_factor, pieces)


def sgdr_schedule(cosine_kwargs: Iterable[Mapping[str, Any]]) -> JoinSchedules:
    r"""SGD with warm restarts: warmup-cosine cycles, one after the other.

    Cycle `k` is `warmup_cosine_decay_schedule(**cosine_kwargs[k])`, restarted at step
    `D_0 + ... + D_{k-1}` where `D_j` is cycle `j`'s `decay_steps` (which counts its warmup).
    After the last cycle the value stays at its `end_value`. It is `join_schedules` of the
    cycles at those steps.

    Args:
        cosine_kwargs: one dict of `warmup_cosine_decay_schedule` arguments per cycle
            (`init_value`, `peak_value`, `warmup_steps`, `decay_steps`, and optionally
            `end_value`, `exponent`).

    Example:
        >>> cycle = dict(init_value=0.0, peak_value=1.0, warmup_steps=10, decay_steps=100)
        >>> schedule = modopt.sgdr_schedule([cycle, cycle])  # restarts at step 100

    Reference: Loshchilov & Hutter, 2016, "SGDR: Stochastic Gradient Descent with Warm
    Restarts", https://arxiv.org/abs/1608.03983
    """
    cycles = [dict(kwargs) for kwargs in cosine_kwargs]
    if not cycles:
        raise ValueError("Invalid cosine_kwargs: no cycle (must hold at least one dict) in sgdr_schedule.")
    schedules, restarts, step = [], [], 0
    for k, kwargs in enumerate(cycles):
        try:
            schedules.append(WarmupCosineDecaySchedule(**kwargs))
        except (TypeError, ValueError) as error:
            raise type(error)(f"{error} (cycle {k} of sgdr_schedule)") from error
        step = step + kwargs["decay_steps"]
        restarts.append(step)
    return JoinSchedules(schedules, restarts[:-1])
