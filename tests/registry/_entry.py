"""`Entry`: how to build one transform, its oracle, and what it supports."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

# The registry's parameters are a dict with these leaves (see `test_registry.make_params`);
# masks and labels of the entries refer to them.
MASK = {"matrix": True, "vector": False, "scalar": False, "cube": True, "big": True}
LABELS = {"matrix": "a", "vector": "b", "scalar": "b", "cube": "a", "big": "c"}


def schedule():
    """The schedule entries share: warmup to 0.05 in 3 steps, cosine decay to 0.001 at 50."""
    import modopt

    return modopt.warmup_cosine_decay_schedule(0.0, 0.05, 3, 50, end_value=0.001)


def optax_schedule():
    """`schedule()` in optax."""
    import optax

    return optax.warmup_cosine_decay_schedule(0.0, 0.05, 3, 50, end_value=0.001)


@dataclasses.dataclass(frozen=True)
class Entry:
    """How to build a transform, its oracle, and what it supports.

    make: builds the modopt transform from hyperparameter overrides (`make(**change)`).
    oracle: builds the reference optax transform with the same configuration; None where optax
        lacks the algorithm: then `reference` names the test file that compares the transform
        step by step with an independent reference (a PyPI package or NumPy from the paper).
    change: a hyperparameter name and new value that must not retrace (None: it has none).
    descent: True if the transform is a complete optimizer (it descends by itself); else the
        convergence check appends `scale(-descent_lr)`.
    converges: whether it reaches the minimum of a quadratic (False for e.g. set_to_zero).
    tolerance: parity tolerance (relative and absolute), 1e-6 as in optax's own tests. An
        entry that needs more says why next to its value.
    extra_args: `extra_args(loss, params) -> dict` of the extra arguments `update` needs at a
        step, given the loss and params there (e.g. `{"value": loss}`); None: none.
    own_rule: the transform declares its own sharding rule (reduced or factored state, or a
        combinator delegating to its parts): it also runs on 8 real (simulated) devices.
    eager: whether the parity check also runs the first step eagerly, op by op (False for a
        configuration variant of a matrix optimizer whose default entry runs it: its eager step
        compiles every operation on its own, tens of seconds, and tests no other code).
    partial_state_dtypes: why the transform's state dtypes (`mu_dtype`, ...) set only part of
        its state (a wrapper whose inner transform has dtypes of its own); None: they set all of
        its floating state, or it has none (`test_state_dtypes.py`).
    """

    name: str
    make: Callable[..., Any]
    oracle: Callable[[], Any] | None
    change: tuple[str, Any] | None = None
    descent: bool = False
    descent_lr: float = 0.1
    converges: bool = True
    steps_to_converge: int = 300
    tolerance: float = 1e-6
    extra_args: Callable[[Any, Any], dict] | None = None
    own_rule: bool = False
    reference: str | None = None
    partial_state_dtypes: str | None = None
    eager: bool = True

    def __post_init__(self):
        if self.oracle is None and self.reference is None:
            raise ValueError(f"{self.name}: an entry without an optax oracle names its reference test file")

    def __str__(self):
        return self.name

    def args(self, loss: Any, params: Any) -> dict:
        """The extra arguments of `update` at a step."""
        return {} if self.extra_args is None else self.extra_args(loss, params)
