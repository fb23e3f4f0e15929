"""trax's base `Optimizer`: its per-weight and whole-tree API on top of a modopt transform.

A trax optimizer here is at once:

- a modopt transform (an `AbstractComposite`): `init(params) -> state` and
  `update(updates, state, params) -> (updates, state)`, so `modopt.Optimizer`, `optax.chain`,
  the Flax adapters, `modopt.sharding` and Orbax take it like any other; and
- trax's object API: `weight_init(weights)` and `weight_update(step, grads, weights, slots,
  opt_params)` per weight array (trax's `init` and `update`), `tree_init(weight_tree)`,
  `tree_update(step, grad_tree, weight_tree, slots, opt_params, store_slots=True)`, and the
  `slots` and `opt_params` properties.

Both run the same composition of transforms (`step_transform()`). trax's API rebuilds that
composition with the values of `opt_params` at every call and feeds it the caller's `step`;
the modopt path uses the optimizer's fields and the step count of its own state.
"""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._core.base import AbstractComposite, AbstractTransform
from .._core.fields import as_hyperparameter, hyperparameter, validate_hyperparameters
from ..fields import FINITE_NONNEGATIVE
from .._state.updates import apply_updates
from ..combinators import Chain
from ..transforms import AddDecayedWeights, ClipByGlobalNorm
from ._tree import clip_leaves, flatten, l2_norm_of_leaves, unflatten


class TraxSide:
    """The mutable part of a trax optimizer: the `slots` and `opt_params` trax keeps on it.

    Equinox modules are frozen, while trax's optimizer is a mutable object that stores the
    slots of its last `tree_init`/`tree_update` and the dict of its default hyperparameters.
    This holder, a static field, keeps them. It takes no part in equality or hashing, so two
    optimizers of the same configuration compare equal and share compiled code. Copies made
    from an optimizer (`jax.tree_util.tree_map`, `eqx.tree_at`, `modopt.set_hyperparameters`)
    share its holder.
    """

    __slots__ = ("opt_params", "slots")

    def __init__(self):
        self.slots: Any = None
        self.opt_params: dict[str, Any] | None = None

    def __eq__(self, other):
        return isinstance(other, TraxSide)

    def __hash__(self):
        return 0

    def __repr__(self):
        return "TraxSide()"


class Optimizer(AbstractComposite):
    r"""Base class of the trax optimizers (`SGD`, `Momentum`, `RMSProp`, `Adam`, `Adafactor`, `SM3`).

    Like trax's `trax.optimizers.base.Optimizer`, it is not used on its own: each subclass
    defines the math of one weight. Subclasses here do so by composing modopt transforms
    (`step_transform`) and saying how trax's slots of one weight map to that composition's
    state (`slot_to_state`, `state_to_slot`).

    trax's API, and where it differs from trax 1.4.1:

    - `opt_params`: the dict of hyperparameters, `{name: jnp.array(value)}` in trax's order
      (`learning_rate` last), the live object (mutating it changes the defaults, as in trax).
      It is made from the fields on first use. `clip_grad_norm` is not in it: it is fixed.
    - `tree_init(weight_tree) -> (slots, opt_params)`: `slots` is a tuple with one entry per
      weight, in trax's flatten order (dicts by insertion order); it is also stored in `slots`.
    - `tree_update(step, grad_tree, weight_tree, slots, opt_params, store_slots=True) ->
      (new_weights, new_slots, metrics)` with `metrics = {"gradients_l2", "weights_l2"}`, the
      norms of the gradients (before clipping) and of the weights. The step comes from the
      caller and the formulas take it as 0-based (`t = step + 1`), as trax's do; trax's
      training loop passes 1, 2, ... With `store_slots=False` the call is pure: that is how to
      call it inside `jax.jit` (storing traced slots is refused with an error).
    - trax's per-weight `init(weights)` and `update(step, grads, weights, slots, opt_params)`
      are `weight_init` and `weight_update`: `init` and `update` are modopt's protocol. (An
      `init` cannot tell one weight from a model made of one array.)
    - Dicts flatten in insertion order (trax's rule), but `jax.jit` hands a function its
      dicts with sorted keys: a dict whose keys are not sorted flattens in another order
      inside `jit` than outside. As trax layers do, nest weights in lists and tuples, or make
      the slots with `tree_init` on a tree in the order `tree_update` will see.
    - Slots keep their dtypes from step to step (trax's unfactored Adafactor slot of a bf16
      weight turns float32 after one step).

    As a modopt transform (`modopt.Optimizer(modopt.trax.Adam(), model)`), the step count
    comes from the state and starts at 0, like optax's and like trax's formulas called with
    `step0 = 0`: the first update is bias-corrected with `t = 1`. The hyperparameters are
    the fields (array leaves, named as trax's `opt_params`), read and set with
    `Optimizer.hyperparameters` and `Optimizer.set` without retracing.
    """

    trax_side: TraxSide = eqx.field(static=True, init=False, default_factory=TraxSide, repr=False)

    @property
    @abc.abstractmethod
    def opt_param_names(self) -> tuple[str, ...]:
        """The names of `opt_params`, in trax's order (`learning_rate` last)."""

    def read_opt_params(self) -> tuple[str, ...]:
        """The names of `opt_params` the math reads (all of them, but for `SGD`'s extras)."""
        return self.opt_param_names

    @abc.abstractmethod
    def step_transform(self) -> AbstractTransform:
        """The composition of transforms that updates the weights, without trax's global-norm
        clipping (`clip_grad_norm`), which trax applies to the whole tree before the per-weight
        updates."""

    @abc.abstractmethod
    def slot_to_state(self, step: jax.Array, slot: Any) -> Any:
        """The state of `step_transform()` for one weight array, from trax's `slot` of it and
        the caller's `step` (an int32 scalar; states that count steps get it as their count)."""

    @abc.abstractmethod
    def state_to_slot(self, state: Any) -> Any:
        """trax's slot of one weight array, from the state of `step_transform()` for it."""

    def build(self) -> AbstractTransform:
        clip = getattr(self, "clip_grad_norm", None)
        core = self.step_transform()
        return core if clip is None else Chain(ClipByGlobalNorm(clip), core)

    def update(self, updates, state, params=None, *trax_args, **extra_args):
        if trax_args:
            raise TypeError(
                f"{type(self).__name__}.update is modopt's `update(updates, state, params)`. trax's "
                "per-weight `update(step, grads, weights, slots, opt_params)` is `weight_update`; for "
                "a whole tree call `tree_update`."
            )
        return super().update(updates, state, params, **extra_args)

    # ---- trax's API ------------------------------------------------------------------

    @property
    def opt_params(self) -> dict[str, Any]:
        """The hyperparameters by trax's names, `learning_rate` last (the live dict, as in trax)."""
        side = self.trax_side
        if side.opt_params is None:
            side.opt_params = {name: jnp.array(getattr_path(self, name)) for name in self.opt_param_names}
        return side.opt_params

    @property
    def slots(self) -> Any:
        """The slots of the last `tree_init` or `tree_update` (with `store_slots`); `None` before."""
        return self.trax_side.slots

    def __setattr__(self, name, value):
        # trax's `slots` and `opt_params` have setters; everything else stays frozen.
        if name == "slots":
            self.trax_side.slots = value
        elif name == "opt_params":
            self.trax_side.opt_params = value
        else:
            super().__setattr__(name, value)

    def with_opt_params(self, opt_params: dict[str, Any]) -> Optimizer:
        """A copy whose hyperparameters are the values in `opt_params` (trax's names).

        Only the names the math reads are taken; a missing one is a `KeyError`, other keys are
        ignored (as in trax). Concrete values are validated like the constructor's arguments.
        """
        names = self.read_opt_params()
        missing = [name for name in names if name not in opt_params]
        if missing:
            raise KeyError(
                f"{type(self).__name__}: opt_params lacks {missing[0]!r}; its opt_params are "
                f"{list(self.opt_param_names)} (see `opt_params`)."
            )
        values = [as_hyperparameter(opt_params[name]) for name in names]
        new = eqx.tree_at(lambda t: [getattr_path(t, name) for name in names], self, values)
        validate_hyperparameters(new)
        return new

    def weight_init(self, weights: Any) -> Any:
        """trax's `init`: the slots of one weight array."""
        return self.state_to_slot(self.step_transform().init(_as_array(weights, "weights")))

    def weight_update(self, step: Any, grads: Any, weights: Any, slots: Any, opt_params: dict[str, Any]) -> tuple[Any, Any]:
        """trax's `update`: one weight array's `(new_weights, new_slots)` at `step` (0-based)."""
        tx = self.with_opt_params(opt_params).step_transform()
        return self._weight_step(tx, _as_step(step), grads, weights, slots, "")

    def tree_init(self, weight_tree: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """trax's `tree_init`: `(slots, opt_params)`, with one slot per weight in trax's order.

        The slots are also stored (`slots`); `opt_params` is the live dict of `opt_params`.
        """
        slots = tuple(self.weight_init(w) for w in flatten(weight_tree))
        self.trax_side.slots = slots
        return slots, self.opt_params

    def tree_update(
        self,
        step: Any,
        grad_tree: Any,
        weight_tree: Any,
        slots: Any,
        opt_params: dict[str, Any],
        store_slots: bool = True,
    ) -> tuple[Any, tuple[Any, ...], dict[str, jax.Array]]:
        """trax's `tree_update`: `(new_weights, new_slots, metrics)` for the whole tree.

        The gradients' global norm (`metrics["gradients_l2"]`) is measured before clipping
        them to `clip_grad_norm` (kept where the norm is strictly below it); then each weight
        is updated on its own. `new_weights` has the structure of `weight_tree`.
        """
        grads = [jnp.asarray(g) for g in flatten(grad_tree)]
        weights = flatten(weight_tree)
        slots = tuple(slots)
        if len(grads) != len(weights) or len(slots) != len(weights):
            raise ValueError(
                f"{type(self).__name__}.tree_update got {len(grads)} gradients and {len(slots)} slots "
                f"for {len(weights)} weights (in trax's flatten order); they must match one to one."
            )
        grads_norm = l2_norm_of_leaves(grads)
        clip = getattr(self, "clip_grad_norm", None)
        if clip is not None:
            grads = clip_leaves(grads, clip, grads_norm)
        weights_norm = l2_norm_of_leaves([jnp.asarray(w) for w in weights])
        tx = self.with_opt_params(opt_params).step_transform()
        step = _as_step(step)
        pairs = [
            self._weight_step(tx, step, g, w, s, f" (weight {i} in trax's flatten order)")
            for i, (g, w, s) in enumerate(zip(grads, weights, slots))
        ]
        new_weights = unflatten([w for w, _ in pairs], weight_tree)
        new_slots = tuple(s for _, s in pairs)
        if store_slots:
            if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(new_slots)):
                raise ValueError(
                    f"{type(self).__name__}.tree_update(..., store_slots=True) was traced (inside jax.jit?): "
                    "storing traced slots on the optimizer would leak them. Pass store_slots=False and keep "
                    "the returned slots, as trax's Trainer does."
                )
            self.trax_side.slots = new_slots
        return new_weights, new_slots, {"gradients_l2": grads_norm, "weights_l2": weights_norm}

    def _weight_step(self, tx, step, grads, weights, slot, where):
        w = _as_array(weights, "weights" + where)
        g = jnp.asarray(grads)
        if g.shape != w.shape:
            raise ValueError(
                f"{type(self).__name__}: the gradient has shape {g.shape} but its weight has shape "
                f"{w.shape}{where}."
            )
        updates, state = tx.update(g, self.slot_to_state(step, slot), w)
        return apply_updates(w, updates), self.state_to_slot(state)


def getattr_path(module: Any, name: str) -> Any:
    """A hyperparameter of a trax optimizer by its `opt_params` name (`SGD`'s extras live in a dict)."""
    extra = getattr(module, "init_opt_params", None)
    if isinstance(extra, dict) and name in extra:
        return extra[name]
    return getattr(module, name)


def _as_step(step: Any) -> jax.Array:
    """The caller's step as an int32 scalar (trax steps are integers)."""
    step = jnp.asarray(step)
    if step.ndim != 0:
        raise ValueError(f"The step must be a scalar, got an array of shape {step.shape}.")
    return step.astype(jnp.int32)


def _as_array(x: Any, what: str) -> jax.Array:
    if x is None:
        raise TypeError(f"Expected an array for the {what}, got None.")
    return jnp.asarray(x)


def weight_decay_after_learning_rate(weight_decay_rate: Any) -> AbstractTransform:
    """trax's decoupled weight decay, not scaled by the learning rate: `w <- (1 - wd) w - step`.

    Placed after the learning rate in a chain, `add_decayed_weights(-wd)` adds `-wd * w` to
    the (already scaled, negative) step: the same math as trax's, so it is reused as it is.

    Args:
        weight_decay_rate: the fraction of each weight removed per step.
    """
    return AddDecayedWeights(-weight_decay_rate)


def learning_rate_field(default: Any):
    """A trax learning rate: a finite number >= 0 (trax's schedules set it through `opt_params`)."""
    return hyperparameter(default, check=FINITE_NONNEGATIVE)
