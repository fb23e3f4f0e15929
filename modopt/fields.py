"""Field declarations for transforms and schedules: `from modopt import fields`.

The kinds of field (`hyperparameter`, `rate`, `static`, `choice`, `prng_key`,
`scalar_or_schedule`) with their checks, and factories for the hyperparameters many transforms
share, so the checks and conversions of a concept live in one place. A transform and the named
optimizers built on it declare `learning_rate`, `b1`, `eps`, `weight_decay`, masks and dtypes
with these:

    class Adam(AbstractComposite):
        learning_rate: ScalarOrSchedule = fields.learning_rate()
        b1: Scalar = fields.decay_rate(0.9)
        eps: Scalar = fields.eps(1e-8)

A field's annotation names what it accepts: `Scalar` (a number), `ScalarOrSchedule`, `Schedule`,
`jax.typing.DTypeLike | None` (a dtype field).
"""

from __future__ import annotations

import dataclasses
from typing import Any


from ._fields import FINITE as FINITE
from ._fields import NONNEGATIVE as NONNEGATIVE
from ._fields import NONNEGATIVE_INTEGER as NONNEGATIVE_INTEGER
from ._fields import POSITIVE as POSITIVE
from ._fields import POSITIVE_INTEGER as POSITIVE_INTEGER
from ._fields import PROBABILITY_EXCLUSIVE as PROBABILITY_EXCLUSIVE
from ._fields import FINITE_NONNEGATIVE as FINITE_NONNEGATIVE
from ._fields import UNIT as UNIT
from ._fields import Check as Check
from ._fields import Scalar as Scalar
from ._fields import as_static_tree, canonical_dtype
from ._fields import choice as choice
from ._fields import hyperparameter as hyperparameter
from ._fields import interval as interval
from ._fields import prng_key as prng_key
from ._fields import rate as rate
from ._fields import static as static
from .schedules._base import ScalarOrSchedule as ScalarOrSchedule
from .schedules._base import Schedule as Schedule
from .schedules._base import scalar_or_schedule as scalar_or_schedule

MISSING: Any = dataclasses.MISSING


def learning_rate(default: Any = MISSING, **kwargs: Any):
    """A learning rate: a finite number >= 0, or a schedule.

    Args:
        default: the field's default; leave it out for a required field.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return scalar_or_schedule(default, check=FINITE_NONNEGATIVE, **kwargs)


def decay_rate(default: Any = MISSING, *, check: Check = PROBABILITY_EXCLUSIVE, **kwargs: Any):
    """The decay rate of a moving average (`b1`, `b2`, `rho`...), in [0, 1) by default.

    Args:
        default: the field's default; leave it out for a required field.
        check: the `Check` the rate must pass at construction.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return rate(default, check=check, **kwargs)


def momentum(default: Any = MISSING, **kwargs: Any):
    """A momentum coefficient in [0, 1], or `None` for no momentum where that is the default.

    Args:
        default: the field's default; leave it out for a required field.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return hyperparameter(default, check=UNIT, **kwargs)


def eps(default: Any = MISSING, **kwargs: Any):
    """A small constant >= 0 for numerical stability.

    Args:
        default: the field's default; leave it out for a required field.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return hyperparameter(default, check=NONNEGATIVE, **kwargs)


def weight_decay(default: Any = MISSING, **kwargs: Any):
    """A weight-decay strength, or a schedule. Any sign: some optimizers decay by a negative rate.

    Args:
        default: the field's default; leave it out for a required field.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return scalar_or_schedule(default, **kwargs)


def mask(default: Any = None, **kwargs: Any):
    """A mask: a pytree of bools shaped like (a prefix of) the params, or a function of them.

    Args:
        default: the default mask; `None` for no mask (everything selected).
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return static(default, converter=as_static_tree, **kwargs)


def dtype(default: Any = None, **kwargs: Any):
    """A dtype for an accumulator (`None`: that of the params).

    Args:
        default: the default dtype; `None` for the params' dtype.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return static(default, converter=canonical_dtype, **kwargs)
