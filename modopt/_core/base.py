"""The transform base class and the optax-compatible protocol.

A transform is an `equinox.Module` whose fields are its hyperparameters, with two pure
methods: `init(params) -> state` and `update(updates, state, params=None, **extra_args)
-> (updates, state)`. That is exactly optax's `GradientTransformation` protocol, so a modopt
transform can be used wherever optax expects one (`optax.chain`, Flax's `TrainState`).
"""

from __future__ import annotations

import abc
import functools
import inspect
import operator
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .extra_args import ExtraArg
from .fields import pretty, static, tree_hash, validate_hyperparameters
from .module import Module
from .specs import follow_params
from .types import OptState, Params, PyTree, Updates

TransformInitFn = Callable[[Params], OptState]
"""`init(params) -> state`."""
TransformUpdateFn = Callable[..., tuple[Updates, OptState]]
"""`update(updates, state, params=None) -> (updates, state)`."""
TransformUpdateExtraArgsFn = Callable[..., tuple[Updates, OptState]]
"""`update(updates, state, params=None, **extra_args) -> (updates, state)`."""


@runtime_checkable
class GradientTransformation(Protocol):
    """Anything with pure `init(params)` and `update(updates, state, params=None)`.

    Both modopt transforms and optax's `GradientTransformation` satisfy this protocol.
    """

    def init(self, params: Params) -> OptState: ...

    def update(
        self, updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[Updates, OptState]: ...


@runtime_checkable
class GradientTransformationExtraArgs(GradientTransformation, Protocol):
    """A `GradientTransformation` whose `update` also accepts keyword `**extra_args`.

    Every modopt transform is one: transforms that need no extra arguments ignore them.
    """

    def update(
        self, updates: Updates, state: OptState, params: Params | None = None, **extra_args: Any
    ) -> tuple[Updates, OptState]: ...


class EmptyState(NamedTuple):
    """The state of a stateless transform."""


class Part(NamedTuple):
    """A transform inside another one, and where its state lies in the outer state."""

    name: str  # a path suffix naming it, e.g. "[0]" in a chain; "" for a wrapper's one part
    transform: AbstractTransform
    state: Callable[[OptState], OptState]  # the part's state, from the outer state


class AbstractTransform(Module):
    """Base class of every modopt transform.

    Subclasses declare their hyperparameters as fields (see `modopt.fields`) and implement
    `init` and `update`. Concrete subclasses are final: compose transforms, don't inherit.

    A transform whose `update` reads extra keyword arguments (the loss `value`, ...) lists
    them in `extra_args_spec`; compositions merge them (see `ExtraArg` and
    `declared_extra_args`). Like optax's `GradientTransformation` pair, a transform unpacks:
    `init, update = tx`.

    A transform whose `update` takes per-example updates (every leaf with a leading batch
    axis) and reduces that axis sets `per_example_updates = True`; see
    `takes_per_example_updates`. One that acts element by element sets
    `elementwise_updates = True`; see `acts_elementwise`.
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = ()
    per_example_updates: ClassVar[bool] = False
    elementwise_updates: ClassVar[bool] = False

    @abc.abstractmethod
    def init(self, params: Params) -> OptState:
        """Returns the initial state for `params`."""

    @abc.abstractmethod
    def update(
        self, updates: Updates, state: OptState, params: Params | None = None, **extra_args: Any
    ) -> tuple[Updates, OptState]:
        """Transforms `updates` (usually gradients); returns `(new_updates, new_state)`."""

    def state_specs(self, params: Params, param_specs: PyTree) -> PyTree:
        """The `PartitionSpec` of every array leaf of `self.init(params)`.

        `params` may be abstract (`jax.ShapeDtypeStruct` leaves, `None` where frozen) and
        `param_specs` holds a `PartitionSpec` per parameter. The default rule goes by shape:
        state shaped like the parameters follows them and scalars are replicated (see
        `modopt.sharding.follow_params`). Transforms whose state is reduced or factored override
        it; combinators ask their parts. `modopt.sharding` puts the result on a mesh.
        """
        return follow_params(jax.eval_shape(self.init, params), params, param_specs, type(self).__name__)

    def takes_per_example_updates(self) -> bool:
        """Whether `update` takes per-example updates: every leaf the parameter's shape after
        one leading batch axis (e.g. from `jax.vmap(jax.grad(loss), in_axes=(None, 0))`).

        True for a transform whose class sets `per_example_updates` (it reduces the batch axis,
        as `differentially_private_aggregate` does). Any other transform answers as its first
        part does, so a chain takes them when its first transform does, and a composite
        (`dpsgd`) or a wrapper when what it applies does. `Optimizer.step` checks the gradients'
        shapes by this answer.
        """
        if type(self).per_example_updates:
            return True
        parts = self.parts()
        return bool(parts) and parts[0].transform.takes_per_example_updates()

    def acts_elementwise(self) -> bool:
        """Whether every element of the new updates and state depends only on the same element
        of the updates, parameters and state, and on scalars (step counts, hyperparameters).

        Such a transform gives the same numbers on any regrouping of the elements into leaves,
        so `Optimizer` may step many small leaves as a few flat buffers (`group_small_leaves`).
        True for a transform whose class sets `elementwise_updates` (Adam's moments, a
        learning rate); chains and composites answer for their parts. A check over all the
        elements that no regrouping changes (`apply_if_finite`) keeps a transform elementwise;
        a norm per leaf, a mask by leaf or a random key split per leaf does not.
        """
        return type(self).elementwise_updates

    def parts(self) -> tuple[Part, ...]:
        """The transforms this one applies, with where each one's state lies in this state.

        Empty for a transform that applies no other; combinators, wrappers and composites
        list theirs, so that what lives in states (learning rates, injected
        hyperparameters) can be found through any composition.
        """
        return ()

    def skipped_last_step(self, state: OptState) -> jax.Array:
        """Whether the update that produced `state` was skipped (a boolean scalar).

        A wrapper that skips steps (a non-finite gradient) or holds them back (gradient
        accumulation) says so from its state; by default a transform skips when one of its
        parts did.
        """
        skipped = [part.transform.skipped_last_step(part.state(state)) for part in self.parts()]
        return functools.reduce(jnp.logical_or, skipped, jnp.zeros([], bool))

    def hyperparameters_in_state(self) -> dict[str, Callable[[OptState], Any]]:
        """Hyperparameters whose live value is in the state (not in a field), with their getters.

        Empty for modopt's transforms, whose hyperparameters are fields; `inject_hyperparams`
        keeps them in its state, where `Optimizer.set` then writes them.
        """
        return {}

    def learning_rates(self, state: OptState) -> dict[str, Any]:
        """The learning rates the next `update` will apply, read from `state`, by name.

        A transform that scales by a learning rate reports it (a schedule evaluated at its
        own step count). By default a transform reports its parts' rates, each read from
        its part of the state, so a wrapper that skips or accumulates steps reports the
        rate its inner transform will really use. Names are unique: where two parts' names
        clash, each gets its part's name as a prefix (e.g. `['adam'].learning_rate`).
        """
        return merge_named((part.name, part.transform.learning_rates(part.state(state))) for part in self.parts())

    def __check_init__(self):
        validate_hyperparameters(self)
        self._check_parts()

    def _check_parts(self) -> None:
        """Checks that need the transform's parts, after its own fields are validated (Equinox
        runs each class's `__check_init__` once, so composites hook in here)."""

    # Flax's linen `TrainState` keeps `tx` as a static field, which JAX hashes.
    __hash__ = tree_hash
    __eq__ = eqx.Module.__eq__

    # optax's transforms are `(init, update)` pairs; code unpacking them works on ours.
    def __iter__(self):
        return iter((self.init, self.update))

    def __getitem__(self, index: int):
        return (self.init, self.update)[index]

    def __repr__(self):
        return pretty(self)


class AbstractComposite(AbstractTransform):
    """A transform defined as a composition of other transforms, built from its own fields.

    Named optimizers are composites: `Adam` holds `learning_rate, b1, b2, ...` as readable,
    settable fields, and `build()` returns the chain of transforms that does the math.
    """

    @abc.abstractmethod
    def build(self) -> AbstractTransform:
        """The composition this transform stands for."""

    def _check_parts(self) -> None:
        # After its own fields (errors name them as the caller wrote them), building validates
        # the parts, so a check across fields (say `min <= max`) that a part makes is written
        # once, there, and still fails at construction.
        self.build()

    def init(self, params):
        return self.build().init(params)

    def update(self, updates, state, params=None, **extra_args):
        return self.build().update(updates, state, params, **extra_args)

    def state_specs(self, params, param_specs):
        return self.build().state_specs(params, param_specs)

    def parts(self):
        return (Part("", self.build(), _same),)

    def acts_elementwise(self) -> bool:
        return parts_act_elementwise(self)


class AbstractWrapper(AbstractTransform):
    """A transform around one `inner` transform, whose state keeps the inner state in a field.

    Subclasses declare `inner` with `inner_transform()` and a state NamedTuple holding the
    inner state in the field named `inner_state_field`. Extra arguments reach the inner
    transform by the wrapper's own `update`, and are declared by it (see `ExtraArg`).
    The default sharding rule places the wrapper's own state by shape (`follow_params`) and
    the inner state by the inner transform's rule, on `inner_view` of the parameters.
    """

    inner: eqx.AbstractVar[AbstractTransform]
    inner_state_field: ClassVar[str] = "inner_state"

    def inner_view(self, tree: PyTree, params: Params) -> PyTree:
        """What the inner transform sees of a params-shaped `tree` (all of it, unless masked)."""
        del params
        return tree

    def state_specs(self, params, param_specs):
        own = follow_params(jax.eval_shape(self.init, params), params, param_specs, type(self).__name__)
        inner = self.inner.state_specs(self.inner_view(params, params), self.inner_view(param_specs, params))
        return own._replace(**{self.inner_state_field: inner})

    def parts(self):
        return (Part("", self.inner, operator.attrgetter(self.inner_state_field)),)


def parts_act_elementwise(tx: AbstractTransform) -> bool:
    """Whether `tx` applies transforms and every one of them acts elementwise."""
    parts = tx.parts()
    return bool(parts) and all(part.transform.acts_elementwise() for part in parts)


def _same(state: OptState) -> OptState:
    return state


def merge_named(parts: Any) -> dict[str, Any]:
    """`(prefix, {name: value})` pairs merged into one dict; a name two parts share gets each
    part's prefix (`"[0]" + ".learning_rate"`), a name one part has stays as it is."""
    parts = list(parts)
    counts: dict[str, int] = {}
    for _, named in parts:
        for name in named:
            counts[name] = counts.get(name, 0) + 1
    return {
        (name if counts[name] == 1 or not prefix else f"{prefix}.{name}"): value
        for prefix, named in parts
        for name, value in named.items()
    }


def single_learning_rate(tx: AbstractTransform, state: Any) -> jax.Array:
    """The one learning rate `tx` applies at its next update, read from `state`.

    Several rates with the same concrete value count as one. An `AttributeError` says when
    there is none, or several (naming each, with its value).
    """
    rates = tx.learning_rates(state)
    if not rates:
        raise AttributeError(f"{type(tx).__name__} applies no learning rate (no transform of it scales by one).")
    values = list(rates.values())
    first = values[0]
    if len(values) == 1 or all(_same_concrete(first, value) for value in values[1:]):
        return first
    shown = ", ".join(f"{name} = {_shown(value)}" for name, value in rates.items())
    raise AttributeError(
        f"{type(tx).__name__} applies several learning rates, not one: {shown}. Read them all with "
        "`learning_rates`."
    )


def _same_concrete(a: Any, b: Any) -> bool:
    if isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer):
        return False
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _shown(value: Any) -> str:
    return "traced" if isinstance(value, jax.core.Tracer) else str(np.asarray(value))


def inner_transform(**kwargs: Any):
    """The field of a wrapper's inner transform: a modopt transform, or an optax one wrapped."""
    return eqx.field(converter=lambda tx: as_transform(tx, "the wrapped transform"), **kwargs)


def require_params(params: Params, transform: Any) -> None:
    """Raises a clear error when a transform that needs the parameters is called without them."""
    if params is None:
        raise ValueError(
            f"{type(transform).__name__}.update needs the current parameters: call "
            "`update(updates, state, params)`."
        )


def init_empty_state(params: Params) -> EmptyState:
    """The init function of a stateless transform.

    Args:
        params: the parameters (unused).
    """
    del params
    return EmptyState()


class FromOptax(AbstractTransform):
    """Any object with `init`/`update` (an optax transform, a pair of functions) as modopt's.

    Its functions are code and therefore static: its hyperparameters live in their closures,
    so changing them retraces. Prefer the native modopt transform where one exists.

    Args:
        tx: the object with `init` and `update`, such as an optax `GradientTransformation` (static:
            code).
        accepted_extra_args: the names of the extra arguments of `update` passed on to `tx.update`,
            or `None` to pass all of them (an `update` taking `**kwargs`); `from_optax` reads them
            off `tx.update`'s signature (static).
    """

    tx: Any = static()
    accepted_extra_args: tuple[str, ...] | None = static(default=None)  # None: any (`**kwargs`)

    def init(self, params):
        return self.tx.init(params)

    def update(self, updates, state, params=None, **extra_args):
        if self.accepted_extra_args is not None:
            extra_args = {k: v for k, v in extra_args.items() if k in self.accepted_extra_args}
        return self.tx.update(updates, state, params, **extra_args)


def from_optax(tx: GradientTransformation) -> AbstractTransform:
    """Wraps an optax transform (or anything with `init`/`update`) into a modopt transform.

    Args:
        tx: the optax transform, or any object with `init` and `update`.

    Example:
        >>> import optax, modopt
        >>> tx = modopt.chain(modopt.from_optax(optax.scale_by_adam()), modopt.scale(-1e-3))
    """
    if isinstance(tx, AbstractTransform):
        return tx
    if not isinstance(tx, GradientTransformation):
        raise TypeError(
            f"Expected an object with `init` and `update` methods, got {type(tx).__name__}."
        )
    return FromOptax(tx, accepted_extra_args=_accepted_extra_args(tx))


def _accepted_extra_args(tx: Any) -> tuple[str, ...] | None:
    """The keywords `tx.update` takes beyond `(updates, state, params)`; `None` if it takes `**kwargs`."""
    try:
        parameters = inspect.signature(tx.update).parameters.values()
    except (TypeError, ValueError):
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def owned_transform(tx: Any, where: str) -> AbstractTransform:
    """`tx` as a modopt transform holding its own copies of the hyperparameters.

    Optimizers and train states are donated to jitted steps; copying keeps the caller's `tx`
    usable afterwards.
    """
    return jax.tree_util.tree_map(jnp.copy, as_transform(tx, where))


def owned_init(tx: AbstractTransform, params: Params) -> OptState:
    """`tx.init(params)` where no array is shared: a leaf that *is* an array of `params`, of
    `tx`, or an earlier leaf of the state (an optax init may put one array in two places) is
    copied.

    The state is donated to jitted steps alongside the params and the transform; a shared
    buffer would be donated twice (an error) or deleted under its other owner.
    """
    seen = {id(x) for x in jax.tree_util.tree_leaves((params, tx))}

    def own(x):
        if id(x) in seen:
            return jnp.copy(x)
        seen.add(id(x))
        return x

    return jax.tree_util.tree_map(own, tx.init(params))


def with_extra_args_support(tx: GradientTransformation) -> AbstractTransform:
    """Returns a transform whose `update` accepts (and ignores unneeded) `**extra_args`.

    modopt transforms already do, and are returned unchanged; others are wrapped.

    Args:
        tx: the transform: a modopt one, or an optax one without extra arguments.
    """
    return from_optax(tx)


def as_transform(tx: Any, where: str) -> AbstractTransform:
    """Accepts a modopt or optax transform as a component; anything else is an error."""
    if isinstance(tx, AbstractTransform):
        return tx
    if isinstance(tx, type) or (callable(tx) and not isinstance(tx, GradientTransformation)):
        # `modopt.adam` (a class) has `init` and `update` too: name the mistake, not the protocol.
        what = "the class" if isinstance(tx, type) else "the function"
        name = getattr(tx, "__name__", type(tx).__name__)
        raise TypeError(
            f"{where}: got {what} {name}, not a gradient transformation: call it to make one, "
            f"e.g. `{name}(learning_rate=1e-3)` for an optimizer."
        )
    if isinstance(tx, GradientTransformation):
        return from_optax(tx)
    raise TypeError(f"{where}: expected a gradient transformation, got {type(tx).__name__}.")

