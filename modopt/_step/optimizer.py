"""`Optimizer`: a transform, its state and a step count, stepping a model."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._core.base import AbstractTransform, owned_init, owned_transform, single_learning_rate
from .._core.checks import align_gradients
from .._state.compensated import AbstractCompensation, make_compensation
from .._core.module import Module
from .._core.declared import adapt_to_params, check_extra_args
from .._core.fields import (
    as_static_tree,
    is_concrete,
    pretty,
    resolve_tree,
    static,
)
from .grouping import LeafGroups, packed, plan_groups, update_in_layout
from .layouts import with_model_layout
from .hyperparameters import hyperparameters_with_state, set_hyperparameters_with_state
from .._util.numerics import safe_increment
from .._state.offload import check_memory_kind, to_device, to_host
from .._state.signature import ModelSignature
from .._state.report import StateReport, readable_bytes, report_of, warn_if_large
from .._util.trees import is_none
from .._state.updates import apply_updates
from ..combinators._diagnostics import diagnostics
from ..sharding._owners import owner_mesh
from ..sharding._shardings import Layout, derive_layout, update_on_mesh


class Optimizer(Module):
    """A transform (with its hyperparameters), its state and a step count, as one module.

    `optimizer.step(model, grads)` returns `(new_model, new_optimizer)`. It is pure: use it
    inside `modopt.jit_step` (or `eqx.filter_jit`, `jax.jit`) with the model and optimizer donated.

    Only the leaves selected by `wrt` are trained (default: floating and complex arrays);
    everything else in the model (integer and boolean arrays, functions, static fields)
    passes through unchanged and gets no optimizer state. A `None` gradient leaves its
    parameter unchanged (the state advances as for a zero gradient).

    Example:
        >>> model = eqx.nn.MLP(2, 1, 32, 2, key=jax.random.key(0))
        >>> optimizer = modopt.Optimizer(modopt.adam(1e-3), model)
        >>> @modopt.jit_step
        ... def train_step(model, optimizer, x, y):
        ...     grads = eqx.filter_grad(loss)(model, x, y)
        ...     return optimizer.step(model, grads)

    Many small leaves: where the transform acts elementwise (`AbstractTransform.acts_elementwise`:
    Adam, SGD, RMSProp, Lion... without a weight-decay mask) and there are at least 8 leaves
    of at most 1024 elements, those are stepped as a few flat buffers per dtype, and their state
    is kept that way (`{"grouped": buffers, "ungrouped": the rest}`), because per-array
    dispatch, not arithmetic, is what a step of many tiny arrays costs. The numbers are the
    same; `group_small_leaves=False` keeps the state shaped like the model (optax's layout).

    Sharded: with `shardings=` (the model's NamedShardings or PartitionSpecs, see
    `modopt.sharding.shardings`), the state is created directly sharded and never exists
    whole on one device; `zero_axis=` also splits it over a data-parallel mesh axis
    (ZeRO-1). Each step then keeps the parameters and the state on those shardings. On several
    CPU devices (XLA's simulated ones), the constructor waits for the sharded state: some inits
    hold collectives, and programs with collectives in flight at once can deadlock XLA's CPU
    runtime (a training loop there should wait on its results every few steps too).

    Low-precision parameters: a `bfloat16` (or `float16`) parameter loses every update smaller
    than half its spacing (about 0.2% of its value) to rounding. `compensation="kahan"` keeps
    what rounding lost in a buffer of the parameter's dtype and adds it back at the next step
    (`apply_updates_kahan`); `compensation="stochastic_rounding"` rounds each sum up or down at
    random, unbiased (`apply_updates(..., key=...)`), with the `key` given, split every step.
    The buffers or the key are the optimizer's `compensation` field: checkpointed and sharded
    with it. Float32 leaves are updated as without compensation and get no buffer.

    Host offload: `state_memory_kind="pinned_host"` keeps the state and the compensation in the
    host's pinned memory; each step moves it to the accelerator, updates it and moves it back,
    inside the jitted step, so donation works as usual. The numbers are the same; what it
    costs is the transfers (`modopt.sharding.bytes_per_device(..., memory_kind=...)` plans it).

    Args:
        tx: the transform (`modopt.adam(1e-3)`, a chain, or an optax transform).
        model: the model (an Equinox module or any pytree); its trainable leaves get a state.
        wrt: which leaves to train: a predicate of a leaf (as in `eqx.partition`) or a tree of
            bools shaped like (a prefix of) the model. It must select some floating or complex
            array. Default: every floating and complex array.
        shardings: the model's shardings (NamedShardings, or PartitionSpecs with `mesh`), to
            create the state directly sharded.
        mesh: the mesh that PartitionSpecs in `shardings` refer to.
        zero_axis: a data-parallel mesh axis to split the state over (ZeRO-1).
        group_small_leaves: step small leaves as flat buffers where the numbers are the same
            (see above); ignored with `shardings=`, where the state follows the parameters.
            (`modopt.sharding.shardings` of a grouped optimizer replicates its buffers.)
        compensation: how updates are applied to `bfloat16` and `float16` parameters: `None`
            (rounded to nearest, as `apply_updates`), `"kahan"` or `"stochastic_rounding"`
            (see above).
        key: the PRNG key of `compensation="stochastic_rounding"` (required with it, refused
            otherwise): a typed key (`jax.random.key(seed)`) or its raw `uint32` key data. Any
            other value, an integer seed included, is refused here, naming `key`.
        state_memory_kind: where the state is kept between steps: `None` for the accelerator's
            memory, or `"pinned_host"`.

    Per-example gradients: an optimizer that reduces a batch of gradients itself (`dpsgd`, or
    a chain that starts with `differentially_private_aggregate`; see
    `AbstractTransform.takes_per_example_updates`) takes every gradient with one leading batch
    axis, `(batch_size, *param.shape)`, e.g. from
    `jax.vmap(eqx.filter_grad(loss), in_axes=(None, 0, 0))(model, x, y)` with `loss` of one
    example. Any other optimizer takes gradients shaped like the parameters.
    """

    tx: AbstractTransform
    state: Any
    count: jax.Array
    compensation: AbstractCompensation | None
    wrt: Any = static()
    signature: ModelSignature = static()
    layout: Layout | None = static()
    groups: LeafGroups | None = static()
    state_memory_kind: str | None = static()

    def __init__(
        self,
        tx: Any,
        model: Any,
        *,
        wrt: Any = eqx.is_inexact_array,
        shardings: Any = None,
        mesh: Any = None,
        zero_axis: str | None = None,
        group_small_leaves: bool = True,
        compensation: str | None = None,
        key: jax.Array | None = None,
        state_memory_kind: str | None = None,
    ):
        self.tx = owned_transform(tx, "Optimizer")
        self.wrt = as_static_tree(wrt)
        params = self.trainable(model)
        if not jax.tree_util.tree_leaves(params):
            raise ValueError(f"Optimizer: {_selects_nothing(wrt, model)}")
        # Muon's dimension numbers left at their default: read off the model's layers.
        self.tx = with_model_layout(self.tx, model, "Optimizer", params)
        self.signature = ModelSignature(model, params)
        make_compensation(compensation, None, key, "Optimizer")  # validates the arguments
        check_memory_kind(state_memory_kind, params, "Optimizer")
        self.state_memory_kind = state_memory_kind
        if shardings is None:
            if mesh is not None or zero_axis is not None:
                raise ValueError("Optimizer: `mesh` and `zero_axis` need `shardings=` (the model's shardings).")
            self.layout = None
            self.groups = plan_groups(self.tx, params) if group_small_leaves else None
            self.state = owned_init(self.tx, packed(self.groups, params))
            self.count = jnp.zeros([], jnp.int32)
            self.compensation = make_compensation(compensation, params, key, "Optimizer")
            warn_if_large(self.state, params, "Optimizer")
            if state_memory_kind is not None:
                self.state, self.compensation = to_host((self.state, self.compensation))
            return
        self.groups = None
        abstract_state = jax.eval_shape(self.tx.init, params)
        # The owner scheme's stacks stored padded: every device owns as many units (`padded_length`).
        self.layout = derive_layout(
            self.tx, self.signature, abstract_state, shardings, mesh, zero_axis, memory_kind=state_memory_kind, pad_owned=True
        )
        if len(set(getattr(self.layout.mesh, "axis_types", ()))) > 1:
            raise ValueError(
                "Optimizer(shardings=...) needs a mesh whose axes are all Auto or all Explicit; this one has "
                f"{dict(zip(self.layout.mesh.axis_names, self.layout.mesh.axis_types))}. Create the state with "
                "`jax.jit(..., out_shardings=modopt.sharding.shardings(...))` instead."
            )
        replicated = self.layout.replicated
        warn_if_large(abstract_state, params, "Optimizer")  # before the state is allocated
        self.state = self.layout.init(self.tx, params)
        # A jitted copy, not `device_put`: that refuses a typed PRNG key (Kron's `key`) on a mesh
        # that spans processes.
        arrays, rest = eqx.partition(self.tx, eqx.is_array)
        self.tx = eqx.combine(_copy_to(replicated)(arrays), rest)
        self.count = jax.device_put(jnp.zeros([], jnp.int32), replicated)
        self.compensation = None
        if compensation is not None:  # created directly on its shardings, as the state
            start = lambda params, key: make_compensation(compensation, params, key, "Optimizer")  # noqa: E731
            placed = self.layout.compensation(jax.eval_shape(start, params, key))
            self.compensation = jax.jit(start, out_shardings=placed)(params, key)
        _wait_on_simulated_devices((self.tx, self.state, self.count, self.compensation), self.layout.mesh)

    def trainable(self, model: Any) -> Any:
        """The trainable leaves of `model`, with `None` everywhere else."""
        return eqx.filter(model, self._filter(model))

    def _filter(self, model):
        """A bool per leaf of `model`: selected by `wrt`, and a floating or complex array."""
        # A callable `wrt` is a per-leaf predicate (as in `eqx.partition`); a tree is a filter spec.
        spec = self.wrt if callable(self.wrt) else resolve_tree(self.wrt, model, "Optimizer: the `wrt` filter tree")
        selected = eqx.filter(model, spec)
        return jax.tree_util.tree_map(lambda x, s: s is not None and eqx.is_inexact_array(x), model, selected)

    def step(self, model: Any, grads: Any, **extra_args: Any) -> tuple[Any, Optimizer]:
        """Applies one update; returns `(new_model, new_optimizer)`.

        `extra_args` (for instance the loss `value`) reach the transform's `update`. A missing
        one that a transform needs, or one that no transform reads, is a `TypeError`. Function
        arguments such as `value_fn` take the model, as the loss does, and trees such as `grad`
        are shaped like the model, as `grads` is.

        Where the transform takes per-example gradients (`dpsgd`), each gradient has one
        leading batch axis, the same for all: `(batch_size, *param.shape)`. Either way, a
        gradient of another shape is a `ValueError` naming its path and the shapes.
        """
        self.signature.check_model(model, grads)
        params, rest = eqx.partition(model, self._filter(model))
        per_example = self.tx.takes_per_example_updates()
        grads = align_gradients(model, params, grads, per_example)
        declared = check_extra_args(self.tx, extra_args, "Optimizer.step")
        as_params = lambda tree: _filled(params, align_gradients(model, params, tree))  # noqa: E731
        extra_args = adapt_to_params(declared, extra_args, lambda p: eqx.combine(p, rest), as_params)
        batch = _batch_size(grads) if per_example else None
        offloaded = self.state_memory_kind is not None
        state, compensation = to_device((self.state, self.compensation)) if offloaded else (self.state, self.compensation)
        with owner_mesh(*self._placed(params, state)):  # per-matrix work on owners (modopt.sharding)
            updates, state = update_in_layout(
                self.tx,
                self.groups,
                _filled(params, grads, batch),
                state,
                params,
                lambda grads, state, params: update_on_mesh(self.tx, grads, state, params, extra_args),
            )
        if per_example:
            _check_reduced(self.tx, updates, params)
        # A `None` gradient leaves its parameter (and its compensation buffer) as they were.
        keep = lambda old, new: jax.tree_util.tree_map(  # noqa: E731
            lambda o, n, g: o if g is None else n, old, new, grads, is_leaf=is_none
        )
        if compensation is None:
            new_params = keep(params, apply_updates(params, updates))
        else:
            applied, new_compensation = compensation.apply(params, updates)
            new_params, compensation = keep(params, applied), new_compensation.keep(compensation, keep)
        if self.layout is not None:
            new_params, state = self.layout.impose(new_params, state)
            compensation = self.layout.impose_compensation(compensation)
        elif offloaded:
            state, compensation = to_host((state, compensation))
        new_model = eqx.combine(new_params, rest)
        return new_model, self._replace(state=state, count=safe_increment(self.count), compensation=compensation)

    def _placed(self, params: Any, state: Any) -> tuple[Any, list]:
        """The mesh and the (array, PartitionSpec) pairs of the parameters and state being
        stepped, for the owner scheme of matrix optimizers (none without shardings)."""
        if self.layout is None:
            return None, []
        pairs = list(zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(self.layout.params)))
        state_shardings = jax.tree_util.tree_structure(state).flatten_up_to(self.layout.state)
        pairs += list(zip(jax.tree_util.tree_leaves(state), state_shardings))
        return self.layout.mesh, [(x, s.spec) for x, s in pairs]

    def state_bytes(self, largest: int = 5) -> StateReport:
        """The bytes of the state, per trained parameter, and its largest arrays, read from shapes
        (also on an abstract optimizer, `jax.eval_shape(lambda: modopt.Optimizer(tx, model))`,
        before anything is allocated). `modopt.state_bytes(tx, params, by_parameter=True)` also
        attributes the state to each parameter.

        Args:
            largest: how many of the largest state arrays to list.
        """
        return report_of(self.state, [x for x in self.signature.leaves if x is not None], largest)

    def __repr__(self):
        """A summary: the transform with its hyperparameters, the step, the state's size.

        The state itself (moments as large as the model) is `optimizer.state`.
        """
        tx = pretty(self.tx).replace("\n", "\n  ")
        arrays = [x for x in jax.tree_util.tree_leaves(self.state) if hasattr(x, "dtype")]
        numbers = sum(int(np.prod(x.shape)) for x in arrays)
        trained = [leaf for leaf in self.signature.leaves if leaf is not None]
        report = report_of(self.state, trained, largest=0)
        step = int(self.count) if is_concrete(self.count) else "traced"
        sharded = "" if self.layout is None else f",\n  sharded on a mesh of shape {dict(self.layout.mesh.shape)}"
        grouped = "" if self.groups is None else f",\n  {self.groups.describe()}"
        options = "" if self.state_memory_kind is None else f",\n  state kept in {self.state_memory_kind} memory"
        if self.compensation is not None:
            options += f",\n  compensation={type(self.compensation).__name__}"
        return (
            f"Optimizer(\n  tx={tx},\n  step={step},\n"
            f"  state={_state_names(self.state)}: {len(arrays)} arrays, {numbers:,} numbers "
            f"({readable_bytes(report.bytes)}, {report.per_parameter:.1f} B per parameter),\n"
            f"  trains {len(trained)} of {len(self.signature.leaves)} model leaves "
            f"({report.parameters:,} numbers){sharded}{grouped}{options}\n)"
        )

    # ---- hyperparameters -------------------------------------------------------------

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """Every hyperparameter of the transform by name (a dotted path where names clash).

        Those that live in the state (`inject_hyperparams`) are read there.
        """
        return hyperparameters_with_state(self.tx, self.state)

    @property
    def diagnostics(self) -> dict[str, jax.Array]:
        """What the last step did, recorded by `modopt.with_diagnostics` in the transform:
        gradient and update norms, the learning rate applied, step and skipped-step counts."""
        return diagnostics(self.tx, self.state)

    @property
    def learning_rates(self) -> dict[str, jax.Array]:
        """Every learning rate the next step will apply, by name (see `AbstractTransform.learning_rates`)."""
        return self.tx.learning_rates(self.state)

    @property
    def learning_rate(self) -> jax.Array:
        """The learning rate the next step will apply, for logging.

        A schedule is evaluated at the step count of the transform that applies it, so behind a
        wrapper that skips or accumulates steps it is the rate really used. An error names the
        rates when there are several (a partition of two optimizers): read `learning_rates`.
        """
        return single_learning_rate(self.tx, self.state)

    def set(self, **values: Any) -> Optimizer:
        """A copy with hyperparameters replaced by name, e.g. `optimizer.set(learning_rate=1e-4)`.

        Numbers keep the array type of the value they replace, so a jitted step does not
        retrace. A hyperparameter that lives in the state (`inject_hyperparams`) is written
        there.

        A schedule may replace a number (`set(learning_rate=modopt.cosine_decay_schedule(1e-3,
        1000))` on an optimizer made with `learning_rate=1e-3`): the state then needs the
        schedule's step count, which is added, starting at 0, so the schedule's step 0 is the
        next step (the optimizer's own `count` goes on). Everything else in the state is kept.
        The transform's structure changes, so a jitted step traces once more. A number
        replacing a schedule becomes a constant schedule (with a warning), keeping the state.
        """
        groups, params = self.groups, self.signature.params()
        tx, state = set_hyperparameters_with_state(
            self.tx, self.state, init=lambda tx: tx.init(packed(groups, _zeros(params))), **values
        )
        layout = self.layout
        if layout is not None and jax.tree_util.tree_structure(state) != jax.tree_util.tree_structure(self.state):
            # The parts added (step counts) are replicated; the rest keeps its shardings.
            devices = set(layout.mesh.devices.flat)
            on_mesh = lambda x: isinstance(x.sharding, jax.sharding.NamedSharding) and x.sharding.device_set == devices  # noqa: E731
            state = jax.tree_util.tree_map(lambda x: x if on_mesh(x) else jax.device_put(x, layout.replicated), state)
            layout = Layout(layout.mesh, layout.params, jax.tree_util.tree_map(lambda x: x.sharding, state))
        return self._replace(tx=tx, state=state, layout=layout)

    def _replace(self, **changes: Any) -> Optimizer:
        new = object.__new__(Optimizer)
        for f in dataclasses.fields(self):
            object.__setattr__(new, f.name, changes.get(f.name, getattr(self, f.name)))
        return new


@functools.lru_cache(maxsize=32)
def _copy_to(sharding: Any) -> Any:
    """A jitted copy onto `sharding`, one per sharding (compiled once per set of arrays)."""
    return jax.jit(lambda arrays: arrays, out_shardings=sharding)


def _zeros(abstract: Any) -> Any:
    """Zeros shaped like the abstract arrays of `abstract` (`None` stays)."""
    return jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), abstract)


def _filled(params: Any, grads: Any, batch: int | None = None) -> Any:
    """`grads` with zeros at trained leaves whose gradient is `None` (the transform sees zeros),
    with a leading axis of size `batch` when the gradients are per example."""

    def zeros(p):
        return jnp.zeros_like(p) if batch is None else jnp.zeros((batch, *jnp.shape(p)), jnp.result_type(p))

    return jax.tree_util.tree_map(lambda p, g: zeros(p) if g is None and p is not None else g, params, grads, is_leaf=is_none)


def _batch_size(grads: Any) -> int:
    """The batch size of per-example gradients (checked alike by `align_gradients`); 1 if all are `None`."""
    return next((jnp.shape(g)[0] for g in jax.tree_util.tree_leaves(grads)), 1)


def _check_reduced(tx: AbstractTransform, updates: Any, params: Any) -> None:
    """Per-example gradients must come out of the transform reduced to the parameters' shapes."""
    for (path, p), u in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree_util.tree_leaves(updates)):
        if jnp.shape(u) != jnp.shape(p):
            raise ValueError(
                f"{type(tx).__name__} returned an update of shape {jnp.shape(u)} at {jax.tree_util.keystr(path)} for a "
                f"parameter of shape {jnp.shape(p)}: the transform that reduces per-example gradients must be the "
                "first one applied to them (first in the chain, in every group of a partition)."
            )


def _state_names(state: Any) -> str:
    """The state's type, its parts' types for a tuple of states (a chain's)."""
    if type(state) is tuple:
        return "(" + ", ".join(_state_names(part) for part in state) + ")"
    return type(state).__name__


def _selects_nothing(wrt: Any, model: Any) -> str:
    """Why an optimizer would train nothing: what `wrt` is, and what the model holds."""
    arrays = [x for x in jax.tree_util.tree_leaves(model) if eqx.is_array(x)]
    kinds = sorted({f"{x.dtype}" for x in arrays})
    held = (
        f"The model holds {len(arrays)} arrays (dtypes {', '.join(kinds)})"
        if arrays
        else "The model holds no arrays at all"
    )
    return (
        f"`wrt` ({getattr(wrt, '__name__', None) or _short(wrt)}) selects no trainable parameter, so every step "
        f"would change nothing. {held}; `wrt` must select floating or complex arrays (the default, "
        "`eqx.is_inexact_array`, selects all of them)."
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _wait_on_simulated_devices(tree: Any, mesh: Any) -> None:
    """Waits for `tree`'s arrays where `mesh` is several CPU devices (and `tree` is not traced)."""
    if not isinstance(mesh, jax.sharding.Mesh) or mesh.devices.size < 2 or mesh.devices.flat[0].platform != "cpu":
        return
    leaves = jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array))
    if not any(isinstance(x, jax.core.Tracer) for x in leaves):
        jax.block_until_ready(leaves)
