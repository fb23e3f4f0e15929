"""Registry entries: `modopt.trax` (see `_entry.Entry`), as modopt transforms (step count from 0).

- `SGD`, `Momentum`, `RMSProp` and `Adam` have optax's math, so their oracles are optax
  compositions (`shared/TRAX.md`, section 3). trax's hyperparameters are float32 arrays and
  trax computes `1 - b` in float32: the oracles get the float32-rounded rates, so optax's
  double-precision `1 - b` is the same number.
- `Adafactor` and `SM3` have no optax counterpart: their oracle is the NumPy reference
  (`trax_reference.py`, float64) run per parameter with the step counted from 0, its slots
  packed into the state layout of modopt's composition (written out below, so the layout is
  checked too). Tolerance 1e-5: float32 against float64.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax

import modopt
from modopt.transforms import TraceState, WeightDecaySchedule
from modopt.trax import SGD, SM3, Adafactor, Adam, MomentumType, Momentum, RMSProp
from modopt.trax import StoredEmaState, TraxFactoredState, TraxSM3State

from trax_reference import Reference

from ._entry import Entry


def f32(x: float) -> float:
    """A Python float holding the float32 value trax stores."""
    return float(np.float32(x))


class ReferenceOracle:
    """The NumPy reference of a trax optimizer as an init/update pair over a dict of params.

    `pack(step, slots_by_name, params)` lays the reference's slots out as modopt's state and
    `unpack(state)` reads `(step, slots_by_name)` back; `update_dtype(param)` is the dtype of
    the updates modopt gives (it follows from the state's dtypes).
    """

    def __init__(self, reference, pack, unpack, update_dtype):
        self.reference, self.pack, self.unpack, self.update_dtype = reference, pack, unpack, update_dtype
        self.opt_params = {k: f32(v) for k, v in reference.opt_params.items()}

    def init(self, params):
        return self.pack(0, {k: self.reference.init(np.asarray(p, np.float64)) for k, p in params.items()}, params)

    def update(self, updates, state, params=None, **extra_args):
        step, slots = self.unpack(state)
        deltas, new_slots = {}, {}
        for k, p in params.items():
            w = np.asarray(p, np.float64)
            new_w, new_slots[k] = self.reference.update(step, updates[k], w, slots[k], self.opt_params)
            deltas[k] = jnp.asarray(new_w - w, self.update_dtype(p))
        return deltas, self.pack(step + 1, new_slots, params)


ADAFACTOR = {"do_momentum": True, "beta1": 0.5, "weight_decay_n_steps": 10}


def pack_adafactor(step, slots, params):
    count = jnp.asarray(step, jnp.int32)
    stats = {
        k: [jnp.asarray(x, jnp.float32 if np.ndim(params[k]) >= 2 else params[k].dtype) for x in s[:-1]]
        for k, s in slots.items()
    }
    ema = {k: jnp.asarray(s[-1], params[k].dtype) for k, s in slots.items()}
    empty = modopt.EmptyState()
    # factored rms, clip_by_block_rms, learning rate, parameter scale, momentum, decay, scale(-1)
    return (TraxFactoredState(count, stats), empty, empty, empty, StoredEmaState(ema), WeightDecaySchedule(count), empty)


def unpack_adafactor(state):
    return int(state[0].count), {k: [*v, state[4].ema[k]] for k, v in state[0].v.items()}


SM3_CONFIG = {
    "learning_rate": 0.05, "second_moment_averaging": 0.9, "momentum_type": MomentumType.NESTEROV, "weight_decay": 1e-3,
}  # fmt: skip


def pack_sm3(step, slots, params):
    arrays = lambda k, xs: [jnp.asarray(x, params[k].dtype) for x in xs]  # noqa: E731
    state = TraxSM3State(v1={k: arrays(k, s[1]) for k, s in slots.items()}, v2={k: arrays(k, s[2]) for k, s in slots.items()})
    empty = modopt.EmptyState()
    # SM3 accumulators, add_decayed_weights, Nesterov trace, learning rate
    return (state, empty, TraceState(trace={k: jnp.asarray(s[0], params[k].dtype) for k, s in slots.items()}), empty)


def unpack_sm3(state):
    # SM3 does not use the step.
    return 0, {k: (state[2].trace[k], v1, state[0].v2[k]) for k, v1 in state[0].v1.items()}


ENTRIES: list[Entry] = [
    Entry(
        "trax_sgd_clip",
        lambda: SGD(0.05, clip_grad_norm=100.0),
        lambda: optax.chain(optax.clip_by_global_norm(100.0), optax.scale(-0.05)),
        ("learning_rate", 0.02),
        descent=True,
    ),
    Entry(
        "trax_momentum",
        lambda: Momentum(0.02),
        lambda: optax.chain(optax.trace(0.9, nesterov=True), optax.scale(-0.02), optax.add_decayed_weights(-1e-5)),
        ("mass", 0.8),
        descent=True,
    ),
    Entry(
        "trax_rmsprop_clip",
        lambda: RMSProp(0.05, clip_grad_norm=100.0),
        lambda: optax.chain(
            optax.clip_by_global_norm(100.0),
            optax.chain(optax.scale_by_rms(f32(0.9), 1e-8, initial_scale=1.0, eps_in_sqrt=False), optax.scale(-0.05)),
        ),
        ("gamma", 0.95),
        descent=True,
    ),
    Entry(
        "trax_adam_clip",
        lambda: Adam(0.05, clip_grad_norm=100.0),
        lambda: optax.chain(
            optax.clip_by_global_norm(100.0),
            optax.chain(
                optax.scale_by_adam(f32(0.9), f32(0.999), 1e-5), optax.scale(-0.05), optax.add_decayed_weights(-1e-5)
            ),
        ),
        ("weight_decay_rate", 1e-4),
        descent=True,
    ),
    Entry(
        "trax_adafactor",
        lambda: Adafactor(**ADAFACTOR),
        lambda: ReferenceOracle(
            Reference("adafactor", **ADAFACTOR), pack_adafactor, unpack_adafactor,
            lambda p: jnp.promote_types(p.dtype, jnp.float32),  # the statistics' float32 promotes the updates
        ),
        ("weight_decay_n_steps", 20),
        descent=True,
        tolerance=1e-5,  # float32 against a float64 reference
        own_rule=True,  # row and column statistics drop an axis of the parameter's spec
    ),
    Entry(
        "trax_sm3_graft_nesterov",
        lambda: SM3(**SM3_CONFIG),
        lambda: ReferenceOracle(Reference("sm3", **SM3_CONFIG), pack_sm3, unpack_sm3, lambda p: p.dtype),
        ("momentum", 0.8),
        descent=True,
        tolerance=1e-5,  # float32 against a float64 reference
        own_rule=True,  # one accumulator vector per dimension, split like that dimension
    ),
]
