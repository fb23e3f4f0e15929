"""Field factories for the hyperparameters many transforms share, declared once.

A transform and the named optimizers built on it declare `learning_rate`, `b1`, `eps`,
`weight_decay`, masks and dtypes with these, so the checks and conversions of a concept live
in one place:

    class Adam(AbstractComposite):
        learning_rate: Any = learning_rate()
        b1: Any = decay_rate(0.9)
        eps: Any = eps(1e-8)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._fields import (
    NONNEGATIVE,
    PROBABILITY_EXCLUSIVE,
    UNIT,
    Check,
    as_static_tree,
    canonical_dtype,
    hyperparameter,
    rate,
    static,
)
from .schedules._base import scalar_or_schedule

MISSING: Any = dataclasses.MISSING
STEP_SIZE = Check(">= 0 and finite", lambda v: bool(np.all((v >= 0) & np.isfinite(v))))


def learning_rate(default: Any = MISSING, **kwargs: Any):
    """A learning rate: a finite number >= 0, or a schedule."""
    return scalar_or_schedule(default, check=STEP_SIZE, **kwargs)


def decay_rate(default: Any = MISSING, *, check: Check = PROBABILITY_EXCLUSIVE, **kwargs: Any):
    """The decay rate of a moving average (`b1`, `b2`, `rho`...), in [0, 1) by default."""
    return rate(default, check=check, **kwargs)


def momentum(default: Any = MISSING, **kwargs: Any):
    """A momentum coefficient in [0, 1], or `None` for no momentum where that is the default."""
    return hyperparameter(default, check=UNIT, **kwargs)


def eps(default: Any = MISSING, **kwargs: Any):
    """A small constant >= 0 for numerical stability."""
    return hyperparameter(default, check=NONNEGATIVE, **kwargs)


def weight_decay(default: Any = MISSING, **kwargs: Any):
    """A weight-decay strength, or a schedule. Any sign: some optimizers decay by a negative rate."""
    return scalar_or_schedule(default, **kwargs)


def mask(default: Any = None, **kwargs: Any):
    """A mask: a pytree of bools shaped like (a prefix of) the params, or a function of them."""
    return static(default, converter=as_static_tree, **kwargs)


def dtype(default: Any = None, **kwargs: Any):
    """A dtype for an accumulator (`None`: that of the params)."""
    return static(default, converter=canonical_dtype, **kwargs)
