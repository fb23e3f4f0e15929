"""trax's `SM3`: SM3's sketched accumulators with optional AdaGrad grafting, weight decay and
three kinds of momentum."""

from __future__ import annotations

import enum
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._core.base import AbstractTransform, EmptyState
from .._core.fields import FINITE, UNIT, choice, hyperparameter, static
from .._util.trees import cast_like, is_none
from ..combinators import Chain
from ..transforms import AddDecayedWeights, Ema, EmaState, ScaleByLearningRate, Trace, TraceState
from ..transforms._real_only import reject_complex
from ..transforms._sm3 import _accumulator_specs, _along, _reduce_to_accumulators, _zero_accumulators
from ._base import Optimizer, TraxSide, learning_rate_field
from .._core.fields import Scalar
from .. import fields
from .._state.moments import in_update_dtype, store, widen
from jax.typing import DTypeLike


class MomentumType(enum.IntEnum):
    """The momentum of trax's `SM3`, applied to the preconditioned gradient `pg`.

    - `EMA`: `m <- (1 - beta1) pg + beta1 m`; the step is `m`.
    - `HEAVY_BALL`: `m <- pg + beta1 m`; the step is `m`.
    - `NESTEROV`: `m <- pg + beta1 m`; the step is `pg + beta1 m`.
    """

    EMA = 1
    HEAVY_BALL = 2
    NESTEROV = 3


class TraxSM3State(NamedTuple):
    """trax SM3's accumulators, per parameter."""

    v1: Any  # per parameter: a list of vectors, one per dimension (a scalar: one of shape ()), in `nu_dtype` if set
    v2: Any  # per parameter: the grafted AdaGrad accumulators, laid out as v1; [] without grafting


def _preconditioner(acc: jax.Array) -> jax.Array:
    """`1 / (sqrt(acc) + 1e-16)` where `acc > 0`, else 0."""
    return jnp.where(acc > 0, 1.0 / (jnp.sqrt(acc) + 1e-16), jnp.zeros_like(acc))


def _sketch(accumulators: list[jax.Array], ndim: int) -> jax.Array:
    """The tightest accumulator bound of each element: the minimum over the dimensions."""
    if ndim == 0:
        return accumulators[0]
    return functools.reduce(
        jnp.minimum, [jnp.reshape(a, _along(ndim, i, a.shape[0])) for i, a in enumerate(accumulators)]
    )


def _norm(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(x * x))


class ScaleByTraxSM3(AbstractTransform):
    r"""Preconditions updates by trax's SM3 accumulators, optionally grafted onto AdaGrad's norm.

    A leaf of rank `k` keeps `k` accumulator vectors (one per dimension). With
    `b2 = second_moment_averaging`, `c = 1` if `b2 == 1` else `1 - b2`, and
    `P(a) = 1 / (sqrt(a) + 1e-16)` where `a > 0` (else 0):

        acc = b2 * min_i v1_i + c * g^2         (each v1_i laid along dimension i)
        pg  = P(acc) * g

    and each `v1_i` becomes the maximum of `acc` over the other dimensions. With `graft`, a
    second set of accumulators sums squared gradients (AdaGrad, no `b2`):
    `acc2 = min_i v2_i + g^2`, and `pg <- pg * ||P(acc2) g|| / (||pg|| + 1e-16)` (norms over
    the whole leaf). The output is `pg`.

    This differs from `modopt.scale_by_sm3` (optax's), which uses `1 / sqrt(acc + eps)`, has
    no grafting, and includes a momentum (here a separate transform). A scalar parameter keeps
    one accumulator of shape `()` (trax fails on scalars).

    State: `TraxSM3State`. Under sharding, `v1_i` (and `v2_i`) are split like dimension `i` of
    their parameter.

    Args:
        second_moment_averaging: `b2`, in [0, 1]; 1 sums squared gradients (AdaGrad-like).
        graft: rescale to the norm of the AdaGrad-preconditioned gradient (static).
        nu_dtype: the dtype of the accumulators (modopt's, keyword-only); `None` keeps the
            parameters' dtype. Set, they and the gradients are read in float32 at least and the
            accumulators are rounded only when stored (see `fields.dtype`).

    Reference: Anil et al., 2019, "Memory-Efficient Adaptive Optimization",
    https://arxiv.org/abs/1901.11150
    """

    second_moment_averaging: Scalar = hyperparameter(1.0, check=UNIT)
    graft: bool = static(default=False)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        reject_complex(params, self)
        zeros = functools.partial(_zero_accumulators, dtype=self.nu_dtype)
        v1 = jax.tree_util.tree_map(zeros, params)
        v2 = jax.tree_util.tree_map(zeros if self.graft else lambda p: [], params)
        return TraxSM3State(v1=v1, v2=v2)

    def update(self, updates, state, params=None, **extra_args):
        dtype, grads = self.nu_dtype, updates
        updates = widen(updates, dtype)  # with `nu_dtype`, in float32 at least
        leaves, treedef = jax.tree_util.tree_flatten(updates, is_leaf=is_none)
        v1s = treedef.flatten_up_to(widen(state.v1, dtype))
        v2s = treedef.flatten_up_to(widen(state.v2, dtype))
        results = [
            (None, v1, v2) if g is None else self._one(g, v1, v2) for g, v1, v2 in zip(leaves, v1s, v2s)
        ]
        new_updates = treedef.unflatten([pg for pg, _, _ in results])
        v1 = treedef.unflatten([v1 for _, v1, _ in results])
        v2 = treedef.unflatten([v2 for _, _, v2 in results])
        new_updates = in_update_dtype(new_updates, grads, dtype)
        if dtype is None:
            return new_updates, TraxSM3State(v1=cast_like(v1, state.v1), v2=cast_like(v2, state.v2))
        return new_updates, TraxSM3State(v1=store(v1, dtype), v2=store(v2, dtype))

    def _one(self, g, v1, v2):
        b2 = self.second_moment_averaging
        c = jnp.where(b2 == 1, 1.0, 1.0 - b2)
        acc = b2 * _sketch(v1, g.ndim) + c * g * g
        pg = _preconditioner(acc) * g
        if not self.graft:
            return pg, _reduce_to_accumulators(acc), v2
        acc2 = _sketch(v2, g.ndim) + g * g
        pg = pg * (_norm(_preconditioner(acc2) * g) / (_norm(pg) + 1e-16))
        return pg, _reduce_to_accumulators(acc), _reduce_to_accumulators(acc2)

    def state_specs(self, params, param_specs):
        treedef = jax.tree_util.tree_structure(params)
        pairs = list(zip(treedef.flatten_up_to(params), treedef.flatten_up_to(param_specs)))
        v1 = [_accumulator_specs(p.ndim, spec) for p, spec in pairs]
        v2 = [_accumulator_specs(p.ndim, spec) if self.graft else [] for p, spec in pairs]
        return TraxSM3State(v1=treedef.unflatten(v1), v2=treedef.unflatten(v2))


def _as_momentum_type(value: Any) -> Any:
    """An int or a `MomentumType` as a `MomentumType`; anything else is left for validation."""
    try:
        return MomentumType(value)
    except (ValueError, TypeError):
        return value


def _concrete_flag(value: Any, test: Any, name: str) -> bool:
    """`test(value)` for a concrete number; `False` for values validation will reject."""
    if isinstance(value, jax.core.Tracer):
        raise ValueError(
            f"SM3 chooses its code paths from {name} when it is made (as trax does), so {name} must "
            "be a concrete number, not a traced value."
        )
    try:
        return bool(test(np.asarray(value, np.float64)))
    except (TypeError, ValueError):
        return False


class SM3(Optimizer):
    r"""trax's SM3, with momentum of three kinds, weight decay and AdaGrad grafting.

    Per weight, at any step (SM3 does not use it):

    1. `pg` from the SM3 accumulators (`ScaleByTraxSM3`), grafted onto AdaGrad's norm when
       `second_moment_averaging != 1`.
    2. `pg <- pg + weight_decay * w` (this decay goes through momentum and the learning rate).
    3. Momentum with `beta1 = momentum` (see `MomentumType`), when `momentum > 0`.
    4. `w <- w - learning_rate * step`.

    Slots per weight: the tuple `(m, v1s, v2s)`: `m` like the weight (`[]` without momentum),
    `v1s` one vector per dimension, `v2s` likewise when grafting (else `[]`).

    As in trax, whether there is momentum (`momentum > 0`) and whether to graft
    (`second_moment_averaging != 1`) are decided from the constructor's values and fixed:
    setting `momentum` to 0 later keeps the momentum path with `beta1 = 0`. A scalar weight
    gets one accumulator of shape `()` (trax fails on scalars).

    Built from transforms: `ScaleByTraxSM3`, modopt's `add_decayed_weights(weight_decay)`,
    `ema(momentum, debias=False)` (EMA) or `trace(momentum, nesterov)` (heavy ball, Nesterov),
    and `scale_by_learning_rate(learning_rate)`.

    Args:
        learning_rate: the step size, >= 0.
        momentum: `beta1`, in [0, 1]; 0 means no momentum (and no momentum slot).
        second_moment_averaging: the accumulators' decay, in [0, 1]; 1 (default) sums squared
            gradients, anything else also grafts.
        weight_decay: added to the preconditioned gradient, times the weight (any finite number).
        momentum_type: a `MomentumType` (or its int value), fixed at construction.
        mu_dtype: the dtype of the momentum slot `m` (modopt's, keyword-only); `None` keeps the
            weights' dtype (see `fields.dtype`: state dtypes are accumulated in float32 and
            stored in this dtype).
        nu_dtype: the dtype of the accumulators `v1s`, `v2s` (keyword-only); `None` keeps the
            weights' dtype.

    Reference: Anil et al., 2019, "Memory-Efficient Adaptive Optimization",
    https://arxiv.org/abs/1901.11150
    """

    learning_rate: Scalar = learning_rate_field(0.01)
    momentum: Scalar = hyperparameter(0.9, check=UNIT)
    second_moment_averaging: Scalar = hyperparameter(1.0, check=UNIT)
    weight_decay: Scalar = hyperparameter(0.0, check=FINITE)
    momentum_type: MomentumType = choice(MomentumType.EMA, tuple(MomentumType), converter=_as_momentum_type)
    has_momentum: bool = static(default=True)
    graft: bool = static(default=False)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __init__(
        self,
        learning_rate: Scalar = 0.01,
        momentum: Scalar = 0.9,
        second_moment_averaging: Scalar = 1.0,
        weight_decay: Scalar = 0.0,
        momentum_type: Any = MomentumType.EMA,
        *,
        mu_dtype: DTypeLike | None = None,
        nu_dtype: DTypeLike | None = None,
    ):
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.second_moment_averaging = second_moment_averaging
        self.weight_decay = weight_decay
        self.momentum_type = momentum_type
        self.has_momentum = _concrete_flag(momentum, lambda v: v > 0, "momentum")
        self.graft = _concrete_flag(second_moment_averaging, lambda v: v != 1.0, "second_moment_averaging")
        self.mu_dtype = mu_dtype
        self.nu_dtype = nu_dtype
        self.trax_side = TraxSide()

    @property
    def opt_param_names(self):
        return ("momentum", "second_moment_averaging", "weight_decay", "learning_rate")

    def _momentum_transform(self) -> AbstractTransform:
        if self.momentum_type == MomentumType.EMA:
            return Ema(self.momentum, debias=False, accumulator_dtype=self.mu_dtype)
        nesterov = self.momentum_type == MomentumType.NESTEROV
        return Trace(self.momentum, nesterov=nesterov, accumulator_dtype=self.mu_dtype)

    def step_transform(self):
        parts: list[AbstractTransform] = [
            ScaleByTraxSM3(self.second_moment_averaging, graft=self.graft, nu_dtype=self.nu_dtype),
            AddDecayedWeights(self.weight_decay),
        ]
        if self.has_momentum:
            parts.append(self._momentum_transform())
        parts.append(ScaleByLearningRate(self.learning_rate))
        return Chain(*parts)

    def slot_to_state(self, step, slot):
        m, v1, v2 = slot
        states: list[Any] = [TraxSM3State(v1=list(v1), v2=list(v2)), EmptyState()]
        if self.has_momentum:
            states.append(EmaState(count=step, ema=m) if self.momentum_type == MomentumType.EMA else TraceState(trace=m))
        return (*states, EmptyState())

    def state_to_slot(self, state):
        sketch = state[0]
        m: Any = []
        if self.has_momentum:
            m = state[2].ema if self.momentum_type == MomentumType.EMA else state[2].trace
        return (m, list(sketch.v1), list(sketch.v2))
