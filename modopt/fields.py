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


from ._core.fields import FINITE as FINITE
from ._core.fields import NONNEGATIVE as NONNEGATIVE
from ._core.fields import NONNEGATIVE_INTEGER as NONNEGATIVE_INTEGER
from ._core.fields import POSITIVE as POSITIVE
from ._core.fields import POSITIVE_INTEGER as POSITIVE_INTEGER
from ._core.fields import PROBABILITY_EXCLUSIVE as PROBABILITY_EXCLUSIVE
from ._core.fields import FINITE_NONNEGATIVE as FINITE_NONNEGATIVE
from ._core.fields import UNIT as UNIT
from ._core.fields import Check as Check
from ._core.fields import Scalar as Scalar
from ._core.fields import _DTYPE, as_static_tree, canonical_dtype
from ._core.fields import choice as choice
from ._core.fields import hyperparameter as hyperparameter
from ._core.fields import interval as interval
from ._core.fields import prng_key as prng_key
from ._core.fields import rate as rate
from ._core.fields import static as static
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

    Its identity is 0: `eps=0.0` (or `0`) given as a number is compiled into the step as a
    constant (see `modopt.fields.hyperparameter`), so XLA drops the addition.

    Args:
        default: the field's default; leave it out for a required field.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return hyperparameter(default, check=NONNEGATIVE, identity=0.0, **kwargs)


def weight_decay(default: Any = MISSING, **kwargs: Any):
    """A weight-decay strength, or a schedule. Any sign: some optimizers decay by a negative rate.

    Its identity is 0: `weight_decay=0.0` (or `0`) given as a number is compiled into the step
    as a constant (see `modopt.fields.hyperparameter`), and the step skips the decay, as optax's
    does for a decay of 0.

    Args:
        default: the field's default; leave it out for a required field.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return scalar_or_schedule(default, identity=0.0, **kwargs)


def mask(default: Any = None, **kwargs: Any):
    """A mask: a pytree of bools shaped like (a prefix of) the params, or a function of them.

    Args:
        default: the default mask; `None` for no mask (everything selected).
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return static(default, converter=as_static_tree, **kwargs)


def dtype(default: Any = None, *, of: str = "state", **kwargs: Any):
    """The dtype in which a transform stores part of its state (`None`: optax's default).

    **State dtypes.** Every transform that keeps moments takes the dtypes of its state as
    static arguments, named by the role of the state they set, the same in every transform:

    - `mu_dtype`: first-order state, linear in the gradients: EMAs of gradients, momentum
      (optax's name; Adam's `mu`, Lion's and Muon's momentum, SM3's momentum `nu`).
    - `nu_dtype`: second-order state: EMAs or sums of squared gradients, their running maximum,
      factored or blocked statistics (Adam's `nu` and `nu_max`, Adagrad's sum of squares,
      Adafactor's row and column statistics, SM3's accumulators `mu`).
    - `accumulator_dtype`: the one accumulator of `trace`, `ema`, SGD's momentum and the
      wrappers that average (optax's name); Adafactor keeps optax's `dtype_momentum`.

    `None` keeps optax's behaviour exactly: the state takes the dtype of the parameters (or of
    what the arithmetic gives). With a dtype set, the stored state is read, widened to float32
    (or to a wider type where the gradients have one), updated in that precision, used for
    this step's update at that precision, and only then rounded to the state dtype for
    storage. So `nu_dtype=jnp.float32` on bfloat16 parameters gives float32 arithmetic, and
    `mu_dtype=jnp.bfloat16` on float32 parameters halves the memory of the first moment while
    each step still accumulates in float32. For complex parameters the state is complex with
    the precision the dtype names (`complex64` for `float32` or `bfloat16`; optax would drop the
    imaginary part). Dtypes must be floating (a complex one, which optax accepts too, makes the
    state complex); anything else is an error naming the argument and the transform.

    Args:
        default: the default dtype; `None` for the params' dtype.
        of: what the dtype sets: `"state"` (the default: a state dtype as above),
            `"hyperparameters"` (hyperparameters kept in the state, `inject_hyperparams`'
            `hyperparam_dtype`) or `"compute"` (state and the arithmetic on it, Kron's
            `precond_dtype`).
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> tx = modopt.adam(1e-3, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16)
        >>> state = tx.init({"w": jnp.zeros(3)})
        >>> state[0].mu["w"].dtype, state[0].nu["w"].dtype
        (dtype(bfloat16), dtype(bfloat16))
    """
    metadata = {**kwargs.pop("metadata", {}), _DTYPE: of}
    return static(default, converter=canonical_dtype, metadata=metadata, **kwargs)
