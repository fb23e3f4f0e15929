"""Flax adapters: a linen `TrainState` and an NNX optimizer whose hyperparameters are dynamic.

Flax's own `TrainState` keeps `tx` static and `nnx.Optimizer` rejects a `tx` holding arrays,
so there a learning-rate change means a retrace or `optax.inject_hyperparams`. Here the
modopt transform is data: its hyperparameters are traced like the parameters, and
`state.set(learning_rate=...)` between jitted steps does not retrace.

Flax's partitioning metadata gives the parameters' shardings (`param_shardings`), and
`state_shardings` derives the whole TrainState's from them, optimizer state included, with
the rule of every modopt transform (Adafactor's factored statistics too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

try:
    from flax import linen as nn
    from flax import nnx, struct
except ImportError as error:
    raise ImportError("modopt.integrations.flax needs flax: pip install 'modopt[flax]'") from error

import modopt
from modopt._core.base import owned_init, owned_transform, single_learning_rate
from modopt._core.checks import align_gradients, check_state
from modopt._core.declared import adapt_to_params, check_extra_args
from modopt._state.compensated import AbstractCompensation, make_compensation
from modopt._state.offload import check_memory_kind, to_device, to_host, with_memory_kind
from modopt._step.grouping import packed, plan_groups, update_in_layout
from modopt._step.hyperparameters import hyperparameters_with_state, set_hyperparameters_with_state
from modopt._step.layouts import with_model_layout
from modopt._step.optimizer import _check_reduced, _zeros
from modopt.sharding._shardings import params_layout

__all__ = ["Hyperparameter", "NnxOptimizer", "TrainState", "param_shardings", "state_shardings"]


class TrainState(struct.PyTreeNode):
    """A drop-in for `flax.training.train_state.TrainState` whose `tx` is a pytree.

    `create(apply_fn=..., params=..., tx=...)`, `apply_gradients(grads=...)`, `replace` and
    `step` behave as in Flax, and subclasses add fields the same way. The difference: `tx`
    (any modopt transform, or an optax one) is a pytree field, so its hyperparameters are
    traced under `jax.jit`. Read them with `state.hyperparameters`; change them with
    `state.set(learning_rate=1e-4)`, which does not retrace.

    Keyword arguments of `apply_gradients` that name a field of the state replace it (as in
    Flax); the others reach `tx.update` as extra arguments (for instance the loss `value`).
    A function argument such as `value_fn` takes the params, as `apply_fn` does. An extra
    argument that a transform needs but is missing, or that none reads, is a `TypeError`.

    `apply_gradients` checks the gradients against `params` before anything changes (at
    trace time under `jax.jit`): a gradient tree of another structure, a `None` gradient, or
    a gradient of another shape or dtype kind is a `ValueError` naming its path (and both
    shapes). A transform that takes per-example gradients (`dpsgd`) takes every gradient with
    one leading batch axis, `(batch_size, *param.shape)`; any other takes the parameters' shapes.

    `create` takes `modopt.Optimizer`'s options for low-precision parameters and memory:
    `compensation="kahan"` or `"stochastic_rounding"` (with `key=`) applies the updates to
    `bfloat16` / `float16` parameters with compensation, and `state_memory_kind="pinned_host"`
    keeps the optimizer state (and the compensation) in host memory between steps, moved in
    and out inside the jitted step. The numbers are `modopt.Optimizer`'s, bit for bit.

    Args:
        step: the number of steps taken, an integer scalar (`create` starts it at 0).
        apply_fn: the model's apply function, usually `model.apply` (not a pytree leaf).
        params: the parameters, a pytree.
        tx: the transform: a modopt transform, or an optax one.
        opt_state: the transform's state (`create` initializes it).
        compensation: the compensation state (`Optimizer.compensation`), or `None` (keyword-only;
            `create` makes it from its `compensation` and `key` arguments).
        state_memory_kind: where `opt_state` and `compensation` are kept between steps: `None`
            for the accelerator's memory, or `"pinned_host"` (keyword-only, static).
    """

    step: Any
    apply_fn: Callable = struct.field(pytree_node=False)
    params: Any
    tx: modopt.AbstractTransform
    opt_state: Any
    # Keyword-only with defaults: subclasses still add fields without defaults, as with Flax's.
    compensation: AbstractCompensation | None = struct.field(default=None, kw_only=True)
    state_memory_kind: str | None = struct.field(pytree_node=False, default=None, kw_only=True)

    @classmethod
    def create(
        cls,
        *,
        apply_fn: Callable,
        params: Any,
        tx: Any,
        compensation: str | None = None,
        key: jax.Array | None = None,
        state_memory_kind: str | None = None,
        **kwargs: Any,
    ) -> TrainState:
        """A `TrainState` at step 0 with the transform's initial state.

        Args:
            apply_fn: the model's apply function.
            params: the parameters.
            tx: a modopt transform, or an optax one.
            compensation: `None`, `"kahan"` or `"stochastic_rounding"`: how updates are applied
                to `bfloat16` / `float16` parameters (see `modopt.Optimizer`).
            key: the PRNG key of `compensation="stochastic_rounding"` (required with it, refused
                otherwise).
            state_memory_kind: `None`, or `"pinned_host"` to keep the optimizer state in host memory.
            **kwargs: the fields a subclass adds.
        """
        tx = owned_transform(tx, "TrainState")
        make_compensation(compensation, None, key, "TrainState")  # validates the arguments
        check_memory_kind(state_memory_kind, params, "TrainState")
        opt_state, buffers = owned_init(tx, params), make_compensation(compensation, params, key, "TrainState")
        if state_memory_kind is not None:
            opt_state, buffers = to_host((opt_state, buffers))
        return cls(
            step=0,
            apply_fn=apply_fn,
            params=params,
            tx=tx,
            opt_state=opt_state,
            compensation=buffers,
            state_memory_kind=state_memory_kind,
            **kwargs,
        )

    def apply_gradients(self, *, grads: Any, **kwargs: Any) -> TrainState:
        fields = {f.name for f in dataclasses.fields(self)}
        replace = {name: value for name, value in kwargs.items() if name in fields}
        extra_args = {name: value for name, value in kwargs.items() if name not in fields}
        check_extra_args(self.tx, extra_args, "TrainState.apply_gradients")
        per_example = self.tx.takes_per_example_updates()
        grads = _checked_gradients(self.tx, self.params, grads, per_example, "TrainState.apply_gradients", **_LINEN)
        offloaded = self.state_memory_kind is not None
        opt_state, compensation = (self.opt_state, self.compensation)
        if offloaded:
            opt_state, compensation = to_device((opt_state, compensation))
        check_state(self.tx, opt_state, self.params)
        updates, opt_state = self.tx.update(grads, opt_state, self.params, **extra_args)
        if per_example:
            _check_reduced(self.tx, updates, self.params)
        if compensation is None:
            params = modopt.apply_updates(self.params, updates)
        else:
            params, compensation = compensation.apply(self.params, updates)
        if offloaded:
            opt_state, compensation = to_host((opt_state, compensation))
        new = dict(step=self.step + 1, params=params, opt_state=opt_state, compensation=compensation)
        return self.replace(**new, **replace)

    @property
    def hyperparameters(self) -> dict[str, Any]:
        return hyperparameters_with_state(self.tx, self.opt_state)

    @property
    def learning_rate(self) -> Any:
        """The learning rate the next step applies (see `modopt.Optimizer.learning_rate`)."""
        return single_learning_rate(self.tx, self.opt_state)

    def set(self, **values: Any) -> TrainState:
        """A copy with the transform's hyperparameters replaced by name (no retrace).

        A schedule may replace a number, as in `modopt.Optimizer.set`: its step count is added
        to the state, starting at 0 (then the step traces once more).
        """
        shapes = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(jnp.shape(p), jnp.result_type(p)), self.params)
        init = lambda tx: tx.init(_zeros(shapes))  # noqa: E731
        tx, opt_state = set_hyperparameters_with_state(self.tx, self.opt_state, init=init, **values)
        return self.replace(tx=tx, opt_state=opt_state)


# ---- NNX ----------------------------------------------------------------------------------


class Hyperparameter(nnx.Variable):
    """An `NnxOptimizer`'s transform, hyperparameters and all: state, so changing one never retraces."""


class OptimizerState(nnx.Variable):
    """An `NnxOptimizer`'s transform state (the whole tree, in one variable), or its step count."""


class NnxOptimizer(nnx.Pytree):
    """`nnx.Optimizer` for modopt transforms: `NnxOptimizer(model, tx, wrt=nnx.Param)`.

    `update(model, grads, **extra_args)` applies one step to `model` in place. The transform,
    with its hyperparameters, is a `Hyperparameter` variable: read them with `.hyperparameters`,
    change them with `.set(learning_rate=1e-4)`, and `nnx.jit` does not retrace.

    Three variables hold everything: the transform (`Hyperparameter`), its whole state
    (`opt_state`, an `OptimizerState`; `nnx.as_pure(optimizer.opt_state)` is the transform's
    state tree) and the step count. `nnx.jit` splits and merges every variable of its arguments
    on every call, so one variable per hyperparameter or per state leaf (as `nnx.Optimizer` has)
    would cost more per step than the arithmetic of a small model's update.

    `wrt` (an NNX filter: a variable type such as `nnx.Param`, `nnx.All(...)`, ...) selects the
    variables to train; one that selects no floating-point variable of `model` is a
    `ValueError` saying which variables the model holds.

    The transform sees the pure state of those variables (an `nnx.State` of arrays), so a mask
    or partition labels in `tx` are a tree of that shape, e.g.
    `jax.tree.map(lambda p: p.ndim > 1, nnx.as_pure(nnx.state(model, nnx.Param)))`, or a
    function of it; a plain dict is an error naming the difference. `modopt.weight_decay_mask`
    is such a function: it leaves out biases and Flax's normalization layers by their leaf
    names (`bias`, `scale`), the module types being gone from that state.

    With `shardings=` (the parameters' shardings, e.g. `param_shardings(nnx.state(model,
    nnx.Param), mesh)`), the optimizer state is created directly on the shardings each
    transform's rule derives from them; `zero_axis=` adds ZeRO-1.

    Many small variables are stepped as a few flat buffers, as by `modopt.Optimizer` (see
    there): the same numbers, and `group_small_leaves=False` keeps the state shaped like the
    variables (ignored with `shardings=`).

    `compensation=` (`"kahan"`, or `"stochastic_rounding"` with `key=`) and
    `state_memory_kind="pinned_host"` are `modopt.Optimizer`'s (see there), with its numbers
    bit for bit. The compensation is a fourth variable, `compensation` (an `OptimizerState`,
    `None` without one). `state_memory_kind` is not taken with `shardings=` here: use
    `modopt.Optimizer` for offloaded sharded state.
    """

    def __init__(
        self,
        model: nnx.Module,
        tx: Any,
        *,
        wrt: Any = nnx.Param,
        shardings: Any = None,
        zero_axis: str | None = None,
        group_small_leaves: bool = True,
        compensation: str | None = None,
        key: jax.Array | None = None,
        state_memory_kind: str | None = None,
    ):
        # Muon's dimension numbers left at their default: read off the model's layers.
        tx = with_model_layout(owned_transform(tx, "NnxOptimizer"), model, "NnxOptimizer")
        # The transform and its state are one variable each (see the class docstring).
        self._hyperparameters = Hyperparameter(tx)
        self.wrt = wrt
        # What is trained: the `wrt` variables holding floating or complex arrays (as in
        # `modopt.Optimizer`, integer and boolean variables are never updated and get no state).
        self._trained = nnx.All(wrt, _holds_inexact_array)
        self.step = OptimizerState(jnp.array(0, jnp.uint32))
        params = nnx.as_pure(nnx.state(model, self._trained))
        if not jax.tree_util.tree_leaves(params):
            raise ValueError(_selects_nothing(model, wrt))
        make_compensation(compensation, None, key, "NnxOptimizer")  # validates the arguments
        check_memory_kind(state_memory_kind, params, "NnxOptimizer")
        if state_memory_kind is not None and shardings is not None:
            raise ValueError(
                "NnxOptimizer: state_memory_kind is not taken with shardings= (use modopt.Optimizer, which places "
                "offloaded state on a mesh)."
            )
        self.state_memory_kind = state_memory_kind
        self._groups = plan_groups(tx, params) if group_small_leaves and shardings is None else None
        if shardings is None:
            opt_state = owned_init(tx, packed(self._groups, params))
            buffers = make_compensation(compensation, params, key, "NnxOptimizer")
        else:
            layout = params_layout(tx, params, shardings, zero_axis)
            opt_state, buffers = layout.init(tx, params), None
            if compensation is not None:  # created directly on its shardings, as the state
                start = lambda params, key: make_compensation(compensation, params, key, "NnxOptimizer")  # noqa: E731
                placed = layout.compensation(jax.eval_shape(start, params, key))
                buffers = jax.jit(start, out_shardings=placed)(params, key)
        if state_memory_kind is not None:
            opt_state, buffers = to_host((opt_state, buffers))
        self.opt_state = OptimizerState(opt_state)
        self.compensation = None if buffers is None else OptimizerState(buffers)

    @property
    def tx(self) -> modopt.AbstractTransform:
        return self._hyperparameters.get_value()

    @property
    def hyperparameters(self) -> dict[str, Any]:
        return hyperparameters_with_state(self.tx, nnx.as_pure(self.opt_state))

    @property
    def learning_rate(self) -> Any:
        """The learning rate the next update applies (see `modopt.Optimizer.learning_rate`)."""
        return single_learning_rate(self.tx, nnx.as_pure(self.opt_state))

    def set(self, **values: Any) -> None:
        """Replaces hyperparameters by name, in place (in the state where they live there)."""
        tx, opt_state = set_hyperparameters_with_state(self.tx, nnx.as_pure(self.opt_state), **values)
        if jax.tree_util.tree_structure(tx) != jax.tree_util.tree_structure(self.tx):
            raise ValueError("set cannot change the structure of the transform; build a new optimizer.")
        self._hyperparameters.set_value(tx)
        self._set_state(opt_state)

    def _set_state(self, opt_state: Any) -> None:
        self.opt_state.set_value(opt_state)

    def update(self, model: nnx.Module, grads: Any, /, **extra_args: Any) -> Any:
        """Applies the update for `grads` (from `nnx.grad` with the same `wrt`) to `model`.

        `extra_args` reach the transform (e.g. the loss `value`); a function argument such as
        `value_fn` takes the model, as the loss does.

        Only the gradients of the trained variables (the floating-point ones `wrt` selects) are
        used, those of others are left out, as in Flax; a pure state (`nnx.as_pure(grads)`),
        whose arrays carry no variable type to filter by, is taken as the gradients of exactly
        those variables. They are checked against the trained variables before anything changes
        (at trace time under `nnx.jit`): another structure, or a gradient of another shape or
        dtype kind, is a `ValueError` naming its path (and both shapes). A transform that takes
        per-example gradients (`dpsgd`) takes every gradient with one leading batch axis, e.g.
        from `nnx.vmap(nnx.grad(loss), in_axes=(None, 0))(model, x)`.
        """
        tx = self.tx
        declared = check_extra_args(tx, extra_args, "NnxOptimizer.update")
        graphdef, params, rest = nnx.split(model, self._trained, ...)
        to_model = lambda p: nnx.merge(graphdef, p, rest)  # noqa: E731
        to_params = lambda tree: nnx.as_pure(nnx.state(tree, self._trained))  # noqa: E731
        extra_args = adapt_to_params(declared, nnx.as_pure(extra_args), to_model, to_params)
        params = nnx.as_pure(params)
        per_example = tx.takes_per_example_updates()
        grads = _checked_gradients(
            tx, params, _wrt_gradients(grads, self._trained), per_example, "NnxOptimizer.update", **_nnx_advice(self.wrt)
        )
        offloaded = self.state_memory_kind is not None
        state = nnx.as_pure(self.opt_state)
        compensation = None if self.compensation is None else nnx.as_pure(self.compensation)
        if offloaded:
            state, compensation = to_device((state, compensation))
        updates, new_state = update_in_layout(
            tx,
            self._groups,
            grads,
            state,
            params,
            lambda grads, state, params: tx.update(grads, state, params, **extra_args),
        )
        if per_example:
            _check_reduced(tx, updates, params)
        if compensation is None:
            new_params = modopt.apply_updates(params, updates)
        else:
            new_params, compensation = compensation.apply(params, updates)
        nnx.update(model, new_params)
        if offloaded:
            new_state, compensation = to_host((new_state, compensation))
        self._set_state(new_state)
        if compensation is not None:
            self.compensation.set_value(compensation)
        self.step.set_value(self.step.get_value() + 1)
        return updates


# ---- checks --------------------------------------------------------------------------------

# How the messages of `align_gradients` speak of a linen TrainState's parameters and gradients.
_LINEN = dict(
    of="the parameters (`state.params`)",
    how="`jax.grad` of a loss of `state.params`",
    how_per_example="`jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(state.params, x, y)`, `loss` taking one example",
)


def _nnx_advice(wrt: Any) -> dict[str, str]:
    """How the messages of `align_gradients` speak of an NNX model's `wrt` variables."""
    return dict(
        of=f"the model's floating-point variables selected by wrt={_filter_name(wrt)}",
        how=(
            "`nnx.grad(loss)(model)` (it differentiates the `nnx.Param` variables; for another `wrt`, "
            "`nnx.grad(loss, argnums=nnx.DiffState(0, wrt))`)"
        ),
        how_per_example="`nnx.vmap(nnx.grad(loss), in_axes=(None, 0))(model, x)`, `loss` taking one example",
    )


def _checked_gradients(tx: Any, params: Any, grads: Any, per_example: bool, where: str, **advice: str) -> Any:
    """`grads` checked against `params` by `align_gradients` (structure, shapes, dtypes, by path),
    each present: the adapters hand every gradient to the transform, as Flax does."""
    aligned = align_gradients(params, params, grads, per_example, **advice)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    for (path, _), grad in zip(flat, jax.tree_util.tree_structure(params).flatten_up_to(aligned)):
        if grad is None:
            raise ValueError(
                f"The gradient at {jax.tree_util.keystr(path)} is None, but {where} needs a gradient for every "
                "parameter. To keep some parameters fixed, give them `modopt.set_to_zero()` in a `modopt.partition`."
            )
    return aligned


def _wrt_gradients(grads: Any, wrt: Any) -> Any:
    """The pure gradients of the `wrt` variables: `nnx.grad`'s state of variables (or a model)
    filtered by `wrt`; a pure tree (`nnx.as_pure(grads)`), whose arrays carry no variable type
    to filter by, as it is."""
    is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    if isinstance(grads, nnx.Pytree) or any(map(is_variable, jax.tree_util.tree_leaves(grads, is_leaf=is_variable))):
        return nnx.as_pure(nnx.state(grads, wrt))
    return grads


def _holds_inexact_array(path: Any, variable: Any) -> bool:
    """An NNX filter: a variable holding a floating or complex array."""
    return eqx.is_inexact_array(variable.get_value() if isinstance(variable, nnx.Variable) else variable)


def _filter_name(wrt: Any) -> str:
    """`nnx.Param` for a variable type of NNX, the type's name for another, the repr otherwise."""
    if isinstance(wrt, type):
        return f"nnx.{wrt.__name__}" if getattr(nnx, wrt.__name__, None) is wrt else wrt.__name__
    return repr(wrt)


def _selects_nothing(model: Any, wrt: Any) -> str:
    """The message for a `wrt` that selects no floating-point variable of `model`."""
    by_type: dict[str, list[str]] = {}
    variables = jax.tree_util.tree_flatten_with_path(nnx.state(model), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    for path, variable in variables:
        value = variable.get_value() if isinstance(variable, nnx.Variable) else variable
        dtype = getattr(value, "dtype", type(value).__name__)
        by_type.setdefault(type(variable).__name__, []).append(f"{jax.tree_util.keystr(path)} ({dtype})")
    if by_type:
        holds = "; ".join(
            f"{len(paths)} {name} ({', '.join(paths[:4])}{', ...' if len(paths) > 4 else ''})"
            for name, paths in by_type.items()
        )
    else:
        holds = "no variables"
    return (
        f"NnxOptimizer: wrt={_filter_name(wrt)} selects no floating-point variable of the model "
        f"({type(model).__name__}), so the optimizer would train nothing. The model holds {holds}. "
        "Pass as `wrt` a filter of the variables to train, e.g. `nnx.Param` (the default)."
    )


# ---- shardings from Flax's partitioning metadata -------------------------------------------


def param_shardings(params: Any, mesh: Any, rules: Any = None) -> Any:
    """The `NamedSharding` of each parameter, from Flax's partitioning metadata.

    `params` are linen variables boxed by `nn.with_logical_partitioning` /
    `nn.with_partitioning` (for instance from `jax.eval_shape(model.init, ...)`), or an NNX
    state whose variables carry `sharding` metadata. Logical axis names are mapped to mesh
    axes with `rules` (or the rules set with `nn.logical_axis_rules`). Unannotated leaves
    are replicated. The result has the structure of the unboxed parameters.

    Args:
        params: linen variables boxed with partitioning metadata, or an NNX state whose variables
            carry `sharding` metadata; concrete or abstract.
        mesh: the mesh the shardings are on.
        rules: the logical axis rules, pairs `(logical_name, mesh_axis)`; `None` for the rules set
            with `nn.logical_axis_rules`.
    """
    if isinstance(params, nnx.State):
        specs = nnx.get_partition_spec(params)
        return jax.tree_util.tree_map(
            lambda spec: NamedSharding(mesh, spec if isinstance(spec, PartitionSpec) else PartitionSpec()),
            nnx.as_pure(specs),
            is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None,
        )
    logical = nn.get_partition_spec(params)
    return nn.logical_to_mesh_sharding(logical, mesh, rules)


def state_shardings(state: TrainState, params_shardings: Any, *, zero_axis: str | None = None) -> TrainState:
    """The `NamedSharding` of every array of a `TrainState` (concrete or from `jax.eval_shape`).

    The parameters take `params_shardings` (see `param_shardings`), the optimizer state is
    derived from them by each transform's rule (see `modopt.sharding.shardings`), and the
    step and hyperparameters are replicated. Kahan buffers follow their parameters and a
    stochastic-rounding key is replicated; with `state_memory_kind`, the optimizer state and
    the compensation are in that memory. Use it as `out_shardings` of the jitted
    `TrainState.create` and train step.

    Args:
        state: the `TrainState`, concrete or from `jax.eval_shape`.
        params_shardings: the `NamedSharding` of each parameter, from `param_shardings`.
        zero_axis: the name of a data-parallel mesh axis to split the optimizer state over (ZeRO-1),
            or `None`.
    """
    layout = params_layout(state.tx, state.params, params_shardings, zero_axis, state.opt_state)
    replicated, kind = layout.replicated, state.state_memory_kind
    compensation = state.compensation
    if compensation is not None:
        compensation = compensation.shardings(with_memory_kind(layout.params, kind), with_memory_kind(replicated, kind))
    return state.replace(
        step=replicated,
        params=layout.params,
        tx=jax.tree_util.tree_map(lambda _: replicated, state.tx),
        opt_state=with_memory_kind(layout.state, kind),
        compensation=compensation,
    )
