"""Bad input: a table of cases, each a clear error naming the problem and where, with the
caller's objects unchanged afterwards.

Each case takes `Inputs`, the caller's objects (parameters, an Equinox model, optimizers,
Flax states, a checkpoint directory), built on first use and snapshotted; after the error,
every object the case used must be as it was. `FAULTS` holds the faults whose documented
behaviour is a result rather than an error (a weight without elements, gradients of 1e30): each
checks that result, and the caller's objects likewise.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import modopt

PARAMS = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}


def _mlp():
    return eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))


def _mlp_grads(model):
    return eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2))))(model)


class Inputs:
    """The caller's objects a case uses, built on first use; `unchanged()` compares each with
    the snapshot taken when it was built."""

    def __init__(self, tmp_path):
        self._tmp_path = tmp_path
        self._made: dict[str, tuple[Any, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        made = self.__dict__["_made"]
        if name not in made:
            value = getattr(type(self), "_" + name)(self)
            made[name] = (value, _snapshot(value))
        return made[name][0]

    def unchanged(self) -> list[str]:
        return [name for name, (value, snapshot) in self._made.items() if not _same(_snapshot(value), snapshot)]

    # ---- the objects -----------------------------------------------------------------

    def _params(self):
        return {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}

    def _grads(self):
        return {"w": jnp.full((3, 2), 0.5), "b": jnp.full(2, 0.5)}

    def _adam(self):
        return modopt.Optimizer(modopt.adam(1e-3), self.params)

    def _sgd_momentum(self):
        return modopt.Optimizer(modopt.sgd(1e-3, momentum=0.9), self.params)

    def _scheduled(self):
        return modopt.Optimizer(modopt.adam(modopt.cosine_decay_schedule(1e-2, 100)), self.params)

    def _model(self):
        return _mlp()

    def _model_grads(self):
        return _mlp_grads(self.model)

    def _model_optimizer(self):
        return modopt.Optimizer(modopt.adam(1e-3), self.model)

    def _train_state(self):
        from modopt.integrations.flax import TrainState

        return TrainState.create(apply_fn=None, params=self.params, tx=modopt.adam(1e-3))

    def _nnx_model(self):
        from flax import nnx

        return nnx.Linear(2, 3, rngs=nnx.Rngs(0))

    def _nnx_optimizer(self):
        from flax import nnx

        from modopt.integrations.flax import NnxOptimizer

        return NnxOptimizer(self.nnx_model, modopt.adam(1e-3), wrt=nnx.Param)

    def _nnx_grads(self):
        from flax import nnx

        return nnx.grad(lambda m: jnp.sum(m(jnp.ones(2)) ** 2))(self.nnx_model)

    def _flax(self):
        """The Flax names the cases use (imported on first use: flax is an extra)."""
        from types import SimpleNamespace

        from flax import nnx

        from modopt.integrations.flax import NnxOptimizer, TrainState

        return SimpleNamespace(nnx=nnx, NnxOptimizer=NnxOptimizer, TrainState=TrainState)

    def _checkpoints(self):
        """A directory holding step 1 of `params` and `adam`, and its manager."""
        from modopt.integrations.orbax import CheckpointManager

        manager = CheckpointManager(self._tmp_path / "checkpoints")
        manager.save(1, params=self.params, optimizer=self.adam)
        manager.wait_until_finished()
        return manager

    def _checkpoint_of_values(self):
        """A directory holding step 1 of a data loader's state (64-bit numbers, a string), and its manager."""
        from modopt.integrations.orbax import CheckpointManager

        manager = CheckpointManager(self._tmp_path / "values")
        manager.save(1, loader={"position": np.int64(2**40), "epoch": 2**40, "name": "run-1"})
        manager.wait_until_finished()
        return manager

    def _quantized_checkpoints(self):
        """A directory holding step 1 of an 8-bit Adam (blocks of 256, dynamic tables), and its manager."""
        from modopt.integrations.orbax import CheckpointManager

        manager = CheckpointManager(self._tmp_path / "quantized")
        manager.save(1, optimizer=_quantized_adam(self.params))
        manager.wait_until_finished()
        return manager

    def _mesh(self):
        return jax.make_mesh((1,), ("data",))

    def _empty_params(self):
        """A sliced model's parameters: a weight without rows beside ordinary ones."""
        return {"w": jnp.zeros((0, 3)), "m": jnp.ones((3, 2)), "b": jnp.zeros(2)}

    def _huge_grads(self):
        """Gradients of about 1e30: squared, they overflow float32."""
        return {"w": jnp.full((3, 2), 1e30) * jnp.array([[1.0, -0.5]]), "b": jnp.full(2, -1e30)}


def _quantized_adam(params: Any, **options: Any) -> modopt.Optimizer:
    """8-bit Adam on `params`, every moment quantized (`min_size=1`)."""
    return modopt.Optimizer(modopt.quantized_state(modopt.adam(1e-3), min_size=1, **options), params)


def _step_with_float64_gradients(optimizer: modopt.Optimizer, params: Any) -> Any:
    """A step with float64 gradients, with 64-bit types on (`jax_enable_x64`)."""
    with jax.enable_x64(True):
        return optimizer.step(params, jax.tree.map(lambda p: jnp.ones(p.shape, jnp.float64), params))


def _snapshot(tree: Any) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, [np.array(x) if isinstance(x, (jax.Array, np.ndarray)) else x for x in leaves]


def _same(a: tuple, b: tuple) -> bool:
    (treedef_a, leaves_a), (treedef_b, leaves_b) = a, b
    if treedef_a != treedef_b or len(leaves_a) != len(leaves_b):
        return False
    for x, y in zip(leaves_a, leaves_b):
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.dtype == y.dtype):
                return False
            if not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
                return False
        elif x is not y and x != y:
            return False
    return True


class Case(NamedTuple):
    area: str
    name: str
    call: Callable[[Inputs], Any]
    error: type[Exception]
    message: str  # a literal fragment of the error message


CASES = [
    # ---- hyperparameters -----------------------------------------------------------------
    Case("hyperparameters", "adam_b2_one", lambda i: modopt.adam(1e-3, b2=1.0), ValueError, "Invalid b2: 1.0 (must be in [0, 1))"),
    Case("hyperparameters", "adam_b1_negative", lambda i: modopt.adam(1e-3, b1=-0.1), ValueError, "Invalid b1: -0.1 (must be in [0, 1))"),
    Case("hyperparameters", "negative_learning_rate", lambda i: modopt.adam(-1e-3), ValueError, "Invalid learning_rate: -0.001 (must be >= 0 and finite)"),
    Case("hyperparameters", "negative_eps", lambda i: modopt.adamw(1e-3, eps=-1e-8), ValueError, "Invalid eps: -1e-08 (must be >= 0)"),
    Case("hyperparameters", "weight_decay_string", lambda i: modopt.adamw(1e-3, weight_decay="0.1"), ValueError, "Invalid weight_decay: '0.1' of type str (expected a number or a schedule"),
    Case("hyperparameters", "momentum_above_one", lambda i: modopt.sgd(0.1, momentum=1.5), ValueError, "Invalid momentum: 1.5 (must be in [0, 1])"),
    Case("hyperparameters", "scale_by_adam_b1_one", lambda i: modopt.scale_by_adam(b1=1.0), ValueError, "Invalid b1: 1.0 (must be in [0, 1))"),
    Case("hyperparameters", "zero_max_norm", lambda i: modopt.clip_by_global_norm(0.0), ValueError, "Invalid max_norm: 0.0 (must be > 0)"),
    Case("hyperparameters", "negative_max_delta", lambda i: modopt.clip(-1.0), ValueError, "Invalid max_delta: -1.0 (must be >= 0)"),
    Case("hyperparameters", "adafactor_decay_rate", lambda i: modopt.adafactor(decay_rate=1.5), ValueError, "Invalid decay_rate: 1.5 (must be in [0, 1])"),
    Case("hyperparameters", "adafactor_clipping", lambda i: modopt.adafactor(clipping_threshold=0.0), ValueError, "Invalid clipping_threshold: 0.0 (must be > 0) in Adafactor"),
    Case("hyperparameters", "trace_decay", lambda i: modopt.trace(decay=-0.5), ValueError, "Invalid decay: -0.5 (must be in [0, 1])"),
    Case("hyperparameters", "lars_trust_coefficient", lambda i: modopt.lars(0.1, trust_coefficient=-1.0), ValueError, "Invalid trust_coefficient: -1.0 (must be >= 0) in Lars"),
    Case("hyperparameters", "noisy_sgd_eta", lambda i: modopt.noisy_sgd(0.1, eta=-1.0), ValueError, "Invalid eta: -1.0 (must be >= 0) in NoisySgd"),
    Case("hyperparameters", "block_rms_threshold", lambda i: modopt.clip_by_block_rms(0.0), ValueError, "Invalid threshold: 0.0 (must be > 0) in ClipByBlockRms"),
    Case("hyperparameters", "set_b2_one", lambda i: i.adam.set(b2=1.0), ValueError, "Invalid b2: 1.0 (must be in [0, 1))"),
    Case("hyperparameters", "set_negative_learning_rate", lambda i: i.adam.set(learning_rate=-0.1), ValueError, "Invalid learning_rate: -0.1 (must be >= 0 and finite)"),
    Case("hyperparameters", "set_unknown_name", lambda i: i.adam.set(lr=0.1), KeyError, "No hyperparameter named 'lr'; the names are ['b1', 'b2', 'eps', 'eps_root', 'learning_rate']"),
    Case("hyperparameters", "set_other_shape", lambda i: i.adam.set(learning_rate=jnp.ones(3)), ValueError, "Cannot set learning_rate to an array of shape (3,): it has shape ()"),
    Case("hyperparameters", "set_value_to_none", lambda i: i.sgd_momentum.set(momentum=None), ValueError, "Cannot set momentum from a value to None"),
    Case("hyperparameters", "set_schedule_on_number_of_a_bare_transform", lambda i: modopt.set_hyperparameters(modopt.adam(1e-3), learning_rate=modopt.cosine_decay_schedule(1e-2, 100)), ValueError, "Cannot set learning_rate to a schedule here: it was a number when the optimizer was made"),
    Case("hyperparameters", "set_schedule_on_a_number_only_field", lambda i: i.adam.set(b1=modopt.cosine_decay_schedule(0.9, 100)), ValueError, "is a schedule or function, but b1 takes a number in Adam"),
    Case("hyperparameters", "set_complex_learning_rate", lambda i: i.adam.set(learning_rate=1e-3 + 1j), ValueError, "Invalid learning_rate: (0.001+1j) is a complex number (hyperparameters are real numbers)"),
    Case("hyperparameters", "learning_rate_list", lambda i: modopt.adam([0.1, 0.2]), ValueError, "Invalid learning_rate: [0.1 0.2] of shape (2,) (expected a scalar) in Adam."),
    Case("hyperparameters", "learning_rate_inf", lambda i: modopt.adam(float("inf")), ValueError, "Invalid learning_rate: inf (must be >= 0 and finite) in Adam."),
    Case("hyperparameters", "learning_rate_none", lambda i: modopt.adam(None), ValueError, "Invalid learning_rate: None (expected a number or a schedule (a callable of the step count)) in Adam."),
    Case("hyperparameters", "learning_rate_string", lambda i: modopt.adam("0.1"), ValueError, "Invalid learning_rate: '0.1' of type str (expected a number or a schedule"),
    Case("hyperparameters", "b1_none", lambda i: modopt.adam(1e-3, b1=None), ValueError, "Invalid b1: None (expected a number) in Adam."),
    Case("hyperparameters", "weight_decay_none", lambda i: modopt.adamw(1e-3, weight_decay=None), ValueError, "Invalid weight_decay: None (expected a number or a schedule"),
    Case("hyperparameters", "set_broadcastable_shape", lambda i: i.adam.set(learning_rate=jnp.ones((1,))), ValueError, "Cannot set learning_rate to an array of shape (1,): it has shape ()"),
    Case("hyperparameters", "set_schedule_value_negative", lambda i: i.scheduled.set(init_value=-0.1), ValueError, "Invalid learning_rate: CosineDecaySchedule(init_value=-0.1, decay_steps=100, alpha=0.0, exponent=1.0) is -0.1 at step 0 (must be >= 0 and finite) in Adam."),
    # ---- schedules -----------------------------------------------------------------------
    Case("schedules", "cosine_decay_steps_zero", lambda i: modopt.cosine_decay_schedule(0.1, decay_steps=0), ValueError, "Invalid decay_steps: 0 (must be > 0)"),
    Case("schedules", "warmup_longer_than_decay", lambda i: modopt.warmup_cosine_decay_schedule(0.0, 1.0, 10, 5), ValueError, "Invalid decay_steps: 5 (must be > warmup_steps"),
    Case("schedules", "exponential_transition_zero", lambda i: modopt.exponential_decay(0.1, transition_steps=0, decay_rate=0.5), ValueError, "Invalid transition_steps: 0 (must be > 0) in ExponentialDecaySchedule"),
    Case("schedules", "join_counts", lambda i: modopt.join_schedules([modopt.constant_schedule(1.0)], [1, 2]), ValueError, "join_schedules needs one more schedule than boundaries: got 1 schedules and boundaries of shape (2,)"),
    Case("schedules", "piecewise_negative_scale", lambda i: modopt.piecewise_constant_schedule(0.1, {10: -1.0}), ValueError, "scale -1.0 at boundary 10 (must be >= 0 and finite)"),
    Case("schedules", "constant_negative_learning_rate", lambda i: modopt.adam(modopt.constant_schedule(-0.1)), ValueError, "Invalid learning_rate: ConstantSchedule(value=-0.1) is -0.1 at step 0 (must be >= 0 and finite) in Adam."),
    Case("schedules", "learning_rate_turning_negative", lambda i: modopt.sgd(modopt.linear_schedule(0.1, -0.1, 100)), ValueError, "is -0.1 at step 100 (must be >= 0 and finite) in Sgd."),
    Case("schedules", "polynomial_negative_power", lambda i: modopt.polynomial_schedule(1.0, 0.0, power=-1, transition_steps=10), ValueError, "Invalid power: -1 (must be >= 0 and finite) in PolynomialSchedule."),
    Case("schedules", "end_value_nan", lambda i: modopt.linear_schedule(0.1, float("nan"), 100), ValueError, "Invalid end_value: nan (must be finite) in PolynomialSchedule."),
    Case("schedules", "warmup_cosine_end_value_inf", lambda i: modopt.warmup_cosine_decay_schedule(0.0, 0.1, 10, 100, end_value=float("inf")), ValueError, "Invalid end_value: inf (must be finite) in WarmupCosineDecaySchedule."),
    Case("schedules", "decay_steps_none", lambda i: modopt.cosine_decay_schedule(0.1, decay_steps=None), ValueError, "Invalid decay_steps: None (expected a number) in CosineDecaySchedule."),
    # ---- gradients -----------------------------------------------------------------------
    Case("gradients", "missing_entry", lambda i: i.adam.step(i.params, {"w": jnp.ones((3, 2))}), ValueError, "found no entry for 'b' in the dict at the root"),
    Case("gradients", "extra_entry", lambda i: i.adam.step(i.params, {**i.grads, "extra": jnp.ones(1)}), ValueError, "found unexpected entries 'extra' in the dict at the root"),
    Case("gradients", "shape", lambda i: i.adam.step(i.params, {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)}), ValueError, "gradient at ['w'] has shape (2, 3), but the parameter has shape (3, 2)"),
    Case("gradients", "integer_dtype", lambda i: i.adam.step(i.params, {"w": jnp.ones((3, 2), jnp.int32), "b": jnp.zeros(2)}), ValueError, "gradient at ['w'] has dtype int32 (integer), but the parameter has dtype float32 (floating)"),
    Case("gradients", "complex_for_real", lambda i: i.adam.step(i.params, {"w": jnp.ones((3, 2)), "b": jnp.zeros(2, jnp.complex64)}), ValueError, "gradient at ['b'] has dtype complex64 (complex)"),
    Case("gradients", "list_for_leaf", lambda i: i.adam.step(i.params, {"w": [1.0, 2.0], "b": jnp.zeros(2)}), ValueError, "The gradient at ['w'] is a list, expected an array"),
    Case("gradients", "dict_for_leaf", lambda i: i.adam.step(i.params, {"w": jnp.ones((3, 2)), "b": {"x": jnp.zeros(2)}}), ValueError, "The gradient at ['b'] is a dict, expected an array"),
    Case("gradients", "list_for_dict", lambda i: i.adam.step(i.params, [jnp.ones((3, 2)), jnp.zeros(2)]), ValueError, "found a list at the root, where a dict is expected"),
    Case("gradients", "per_example_to_adam", lambda i: i.adam.step(i.params, jax.tree.map(lambda g: jnp.stack([g, g]), i.grads)), ValueError, "It looks like per-example gradients (a leading batch axis of size 2)"),
    Case("gradients", "dpsgd_without_batch_axis", lambda i: modopt.Optimizer(modopt.dpsgd(0.1, 1.0, 1.0, seed=0), i.params).step(i.params, i.grads), ValueError, "this optimizer takes per-example gradients"),
    Case("gradients", "equinox_other_width", lambda i: i.model_optimizer.step(i.model, _mlp_grads(eqx.nn.MLP(2, 2, 5, 1, key=jax.random.key(0)))), ValueError, "found a MLP at the root whose static field width_size is 5, where 4 is expected"),
    Case("gradients", "float64_for_float32", lambda i: _step_with_float64_gradients(i.adam, i.params), ValueError, "The gradient at ['b'] has dtype float64, wider than the parameter's float32: the update and the optimizer state would become float64"),
    Case("gradients", "equinox_leaf_shape", lambda i: i.model_optimizer.step(i.model, eqx.tree_at(lambda m: m.layers[1].weight, i.model_grads, jnp.ones((3, 4)))), ValueError, "gradient at .layers[1].weight has shape (3, 4), but the parameter has shape (2, 4)"),
    # ---- models and state ----------------------------------------------------------------
    Case("models", "swapped_model_and_grads", lambda i: i.model_optimizer.step(i.model_grads, i.model), ValueError, "the arguments look swapped"),
    Case("models", "other_model", lambda i: i.model_optimizer.step({"w": jnp.ones(2)}, i.model_grads), ValueError, "the model does not have the structure of the one this optimizer was made for"),
    Case("models", "state_for_other_parameters", lambda i: i.adam.step({"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}, {"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}), ValueError, "state at [0].mu['w'] has shape (3, 2)"),
    Case("models", "state_of_another_optimizer", lambda i: eqx.tree_at(lambda o: o.state, i.adam, i.sgd_momentum.state).step(i.params, i.grads), ValueError, "optimizer state does not belong to this transform (Adam)"),
    Case("models", "missing_params_for_decay", lambda i: modopt.add_decayed_weights(1e-2).update(i.grads, modopt.EmptyState()), ValueError, "AddDecayedWeights.update needs the current parameters"),
    Case("models", "optimizer_of_a_class", lambda i: modopt.Optimizer(modopt.adam, i.params), TypeError, "Optimizer: got the class Adam, not a gradient transformation: call it to make one"),
    Case("models", "optimizer_of_a_function", lambda i: modopt.Optimizer(modopt.nadam, i.params), TypeError, "Optimizer: got the function nadam, not a gradient transformation: call it to make one"),
    Case("models", "wrt_selects_nothing", lambda i: modopt.Optimizer(modopt.sgd(0.1), i.params, wrt={"w": False, "b": False}), ValueError, "Optimizer: `wrt` ({'w': False, 'b': False}) selects no trainable parameter, so every step would change nothing"),
    # ---- extra arguments -----------------------------------------------------------------
    Case("extra arguments", "missing_value", lambda i: modopt.Optimizer(modopt.lbfgs(), i.params).step(i.params, i.grads), TypeError, "Optimizer.step needs the extra argument `value` (the loss at the current parameters)"),
    Case("extra arguments", "unknown", lambda i: i.adam.step(i.params, i.grads, valu=1.0), TypeError, "Optimizer.step got the extra argument `valu`, which no transform of Adam reads"),
    # ---- combinators and wrappers ---------------------------------------------------------
    Case("combinators", "chain_non_transform", lambda i: modopt.chain(modopt.scale(1.0), 3), TypeError, "chain argument 1: expected a gradient transformation, got int"),
    Case("combinators", "chain_state_length", lambda i: modopt.chain(modopt.clip(1.0), modopt.scale_by_adam()).update(i.grads, (modopt.EmptyState(),), i.params), ValueError, "chain of 2 transforms got a state with 1 entries"),
    Case("combinators", "check_state_of_other_chain", lambda i: modopt.check_state(modopt.chain(modopt.clip(1.0), modopt.scale_by_adam()), modopt.sgd(0.1).init(i.params), i.params), ValueError, "optimizer state does not belong to this transform (Chain)"),
    Case("combinators", "partition_label_without_transform", lambda i: modopt.partition({"a": modopt.sgd(0.1)}, {"w": "a", "b": "c"}).init(i.params), ValueError, "partition: the labels [\"'c'\"] have no transform; transforms are given for [\"'a'\"]"),
    Case("combinators", "partition_int_label_for_str_key", lambda i: modopt.partition({"0": modopt.sgd(0.1)}, {"w": 0, "b": 0}).init(i.params), ValueError, "The label 0 (int) and the transform key '0' (str) look alike but their types differ"),
    Case("combinators", "partition_labels_structure", lambda i: modopt.partition({"a": modopt.sgd(0.1)}, {"w": "a", "c": "a"}).init(i.params), ValueError, "partition: the labels and the parameters differ in structure (it must be theirs, or a prefix of it): found no entry for 'b' and unexpected entries 'c' in the dict at the root."),
    Case("combinators", "partition_learning_rate_of_two", lambda i: modopt.Optimizer(modopt.partition({"a": modopt.sgd(0.1), "b": modopt.adam(0.2)}, {"w": "a", "b": "b"}), i.params).learning_rate, AttributeError, "Partition applies several learning rates, not one: ['a'].learning_rate = 0.1, ['b'].learning_rate = 0.2. Read them all with `learning_rates`."),
    Case("combinators", "masked_string_labels", lambda i: modopt.masked(modopt.add_decayed_weights(0.1), {"w": "decay", "b": "none"}).init(i.params), ValueError, "masked: the mask holds 'none' (a str) at ['b']; a mask holds booleans"),
    Case("combinators", "masked_structure", lambda i: modopt.masked(modopt.add_decayed_weights(0.1), {"w": True}).init(i.params), ValueError, "masked: the mask and the parameters differ in structure (it must be theirs, or a prefix of it): found no entry for 'b'"),
    Case("models", "wrt_tree_structure", lambda i: modopt.Optimizer(modopt.sgd(0.1), i.params, wrt={"w": True}), ValueError, "Optimizer: the `wrt` filter tree and the parameters differ in structure"),
    Case("combinators", "multi_steps_every_zero", lambda i: modopt.MultiSteps(modopt.sgd(0.1), every_k_schedule=0), ValueError, "Invalid every_k_schedule: 0 (must be an integer >= 1) in MultiSteps"),
    Case("combinators", "apply_every_zero", lambda i: modopt.apply_every(0), ValueError, "Invalid k: 0 (must be an integer >= 1) in ApplyEveryK"),
    # ---- sharding ------------------------------------------------------------------------
    Case("sharding", "mesh_without_shardings", lambda i: modopt.Optimizer(modopt.adam(0.1), i.params, mesh=i.mesh), ValueError, "Optimizer: `mesh` and `zero_axis` need `shardings=`"),
    Case("sharding", "spec_rank", lambda i: modopt.Optimizer(modopt.adam(0.1), i.params, shardings={"w": P("data", None, None), "b": P()}, mesh=i.mesh), ValueError, "Cannot shard the parameter at ['w'] (shape (3, 2)) as P('data', None, None): the spec has 3 entries but the array has rank 2"),
    Case("sharding", "unknown_mesh_axis", lambda i: modopt.Optimizer(modopt.adam(0.1), i.params, shardings={"w": P("x"), "b": P()}, mesh=i.mesh), ValueError, "'x' is not an axis of the mesh, whose axes are ('data',)"),
    Case("sharding", "shardings_structure", lambda i: modopt.Optimizer(modopt.adam(0.1), i.params, shardings={"w": P()}, mesh=i.mesh), ValueError, "The model shardings do not have the model's structure: found no entry for 'b' in the dict at the root"),
    Case("sharding", "unknown_zero_axis", lambda i: modopt.Optimizer(modopt.adam(0.1), i.params, shardings={"w": P(), "b": P()}, mesh=i.mesh, zero_axis="batch"), ValueError, "zero_axis='batch' is not an axis of the mesh, whose axes are ('data',)"),
    # ---- Flax ----------------------------------------------------------------------------
    Case("flax", "apply_gradients_unknown_keyword", lambda i: i.train_state.apply_gradients(grads=i.grads, misspelled_field=3), TypeError, "TrainState.apply_gradients got the extra argument `misspelled_field`, which no transform of Adam reads"),
    Case("flax", "train_state_set_invalid", lambda i: i.train_state.set(b2=1.0), ValueError, "Invalid b2: 1.0 (must be in [0, 1))"),
    Case("flax", "nnx_set_unknown_name", lambda i: i.nnx_optimizer.set(lr=0.1), KeyError, "No hyperparameter named 'lr'"),
    Case("flax", "nnx_update_unknown_extra_argument", lambda i: i.nnx_optimizer.update(i.nnx_model, i.nnx_model, valu=1.0), TypeError, "NnxOptimizer.update got the extra argument `valu`"),
    Case("flax", "train_state_gradient_batch_axis", lambda i: i.train_state.apply_gradients(grads={"w": jnp.ones((5, 3, 2)), "b": jnp.zeros(2)}), ValueError, "The gradient at ['w'] has shape (5, 3, 2), but the parameter has shape (3, 2). It looks like per-example gradients (a leading batch axis of size 5)"),
    Case("flax", "train_state_gradient_shape", lambda i: i.train_state.apply_gradients(grads={"w": jnp.ones((2, 3)), "b": jnp.zeros(2)}), ValueError, "The gradient at ['w'] has shape (2, 3), but the parameter has shape (3, 2)."),
    Case("flax", "train_state_gradient_dtype", lambda i: i.train_state.apply_gradients(grads={"w": jnp.ones((3, 2), jnp.int32), "b": jnp.zeros(2)}), ValueError, "The gradient at ['w'] has dtype int32 (integer), but the parameter has dtype float32 (floating)."),
    Case("flax", "train_state_gradient_missing_entry", lambda i: i.train_state.apply_gradients(grads={"w": jnp.ones((3, 2))}), ValueError, "The gradients do not have the structure of the parameters (`state.params`): found no entry for 'b' in the dict at the root. Compute them with `jax.grad` of a loss of `state.params`."),
    Case("flax", "train_state_gradient_extra_entry", lambda i: i.train_state.apply_gradients(grads={**i.grads, "c": jnp.ones(1)}), ValueError, "found unexpected entries 'c' in the dict at the root"),
    Case("flax", "train_state_gradient_none", lambda i: i.train_state.apply_gradients(grads={"w": i.grads["w"], "b": None}), ValueError, "The gradient at ['b'] is None, but TrainState.apply_gradients needs a gradient for every parameter."),
    Case("flax", "train_state_dpsgd_without_batch_axis", lambda i: i.flax.TrainState.create(apply_fn=None, params=i.params, tx=modopt.dpsgd(0.1, 1.0, 1.0, seed=0)).apply_gradients(grads=i.grads), ValueError, "The gradient at ['b'] has shape (2,), but this optimizer takes per-example gradients: the parameter's shape (2,) after one leading batch axis, (batch_size, 2). Compute them with `jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(state.params, x, y)`"),
    Case("flax", "train_state_params_replaced", lambda i: i.train_state.replace(params={"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}).apply_gradients(grads={"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}), ValueError, "The optimizer state at [0].mu['w'] has shape (3, 2) and dtype float32, but Adam expects (4, 2) float32."),
    Case("flax", "train_state_mask_structure", lambda i: i.flax.TrainState.create(apply_fn=None, params=i.params, tx=modopt.masked(modopt.add_decayed_weights(0.1), {"w": True})), ValueError, "masked: the mask and the parameters differ in structure (it must be theirs, or a prefix of it): found no entry for 'b' in the dict at the root"),
    Case("flax", "train_state_partition_labels", lambda i: i.flax.TrainState.create(apply_fn=None, params=i.params, tx=modopt.partition({"a": modopt.sgd(0.1)}, {"w": "a", "x": "a"})), ValueError, "partition: the labels and the parameters differ in structure (it must be theirs, or a prefix of it): found no entry for 'b' and unexpected entries 'x' in the dict at the root"),
    Case("flax", "nnx_gradient_batch_axis", lambda i: i.nnx_optimizer.update(i.nnx_model, jax.tree.map(lambda g: jnp.stack([g] * 5), i.nnx_grads)), ValueError, "The gradient at ['bias'] has shape (5, 3), but the parameter has shape (3,). It looks like per-example gradients (a leading batch axis of size 5)"),
    Case("flax", "nnx_gradient_shape", lambda i: i.nnx_optimizer.update(i.nnx_model, i.flax.nnx.State({"kernel": i.flax.nnx.Param(jnp.ones((3, 2))), "bias": i.nnx_grads["bias"]})), ValueError, "The gradient at ['kernel'] has shape (3, 2), but the parameter has shape (2, 3)."),
    Case("flax", "nnx_gradient_missing_entry", lambda i: i.nnx_optimizer.update(i.nnx_model, i.flax.nnx.State({"kernel": i.nnx_grads["kernel"]})), ValueError, "The gradients do not have the structure of the model's floating-point variables selected by wrt=nnx.Param: found no entry for 'bias' in the State at the root. Compute them with `nnx.grad(loss)(model)`"),
    Case("flax", "nnx_gradients_plain_dict", lambda i: i.nnx_optimizer.update(i.nnx_model, {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)}), ValueError, "The gradients do not have the structure of the model's floating-point variables selected by wrt=nnx.Param: found a dict at the root, where a State is expected."),
    Case("flax", "nnx_other_model", lambda i: (lambda m: i.nnx_optimizer.update(m, m))(i.flax.nnx.Linear(4, 3, rngs=i.flax.nnx.Rngs(0))), ValueError, "The optimizer state at [0].mu['kernel'] has shape (2, 3) and dtype float32, but Adam expects (4, 3) float32."),
    Case("flax", "nnx_wrt_none", lambda i: i.flax.NnxOptimizer(i.nnx_model, modopt.adam(1e-3), wrt=None), ValueError, "NnxOptimizer: wrt=None selects no floating-point variable of the model (Linear), so the optimizer would train nothing. The model holds 2 Param (['bias'] (float32), ['kernel'] (float32))."),
    Case("flax", "nnx_wrt_batch_stat", lambda i: i.flax.NnxOptimizer(i.nnx_model, modopt.adam(1e-3), wrt=i.flax.nnx.BatchStat), ValueError, "NnxOptimizer: wrt=nnx.BatchStat selects no floating-point variable of the model (Linear)"),
    Case("flax", "nnx_mask_of_other_structure", lambda i: i.flax.NnxOptimizer(i.nnx_model, modopt.masked(modopt.add_decayed_weights(0.1), {"kernel": True, "bias": False})), ValueError, "masked: the mask and the parameters differ in structure (it must be theirs, or a prefix of it): found a dict at the root, where a State is expected"),
    # ---- checkpoints ---------------------------------------------------------------------
    Case("checkpoints", "missing_step", lambda i: i.checkpoints.restore(7, params=i.params), FileNotFoundError, "No checkpoint of step 7 in"),
    Case("checkpoints", "missing_item", lambda i: i.checkpoints.restore(1, model=i.params), ValueError, "Step 1 has no item 'model'; it holds ['optimizer', 'params']"),
    Case("checkpoints", "restore_without_items", lambda i: i.checkpoints.restore(1), ValueError, "restore needs the items to restore into"),
    Case("checkpoints", "save_without_items", lambda i: i.checkpoints.save(2), ValueError, "save needs at least one item"),
    Case("checkpoints", "save_existing_step", lambda i: i.checkpoints.save(1, params=i.params), ValueError, "save: step 1 already exists in"),
    Case("checkpoints", "save_earlier_step", lambda i: i.checkpoints.save(0, params=i.params), ValueError, "save: step 0 is before the latest step 1 in"),
    Case("checkpoints", "save_negative_step", lambda i: i.checkpoints.save(-1, params=i.params), ValueError, "Invalid step: -1 (must be an integer >= 0) in save."),
    Case("checkpoints", "save_fractional_step", lambda i: i.checkpoints.save(2.5, params=i.params), ValueError, "Invalid step: 2.5 of type float (must be an integer >= 0) in save."),
    Case("checkpoints", "save_function_item", lambda i: i.checkpoints.save(2, params=i.params, callback=print), ValueError, "save: item 'callback' holds a function (builtin_function_or_method) at the root, which a checkpoint cannot hold"),
    Case("checkpoints", "save_function_in_dict", lambda i: i.checkpoints.save(2, params=i.params, extra={"callback": print}), ValueError, "save: item 'extra' holds a function (builtin_function_or_method) at ['callback']"),
    Case("checkpoints", "save_set", lambda i: i.checkpoints.save(2, params=i.params, extra={"tags": {"a"}}), ValueError, "save: item 'extra' holds a set at ['tags'], which a checkpoint cannot hold"),
    Case("checkpoints", "save_string_array", lambda i: i.checkpoints.save(2, params=i.params, extra={"names": np.array(["a"])}), ValueError, "save: item 'extra' holds a NumPy array of dtype <U1 at ['names']"),
    Case("checkpoints", "second_writer", lambda i: type(i.checkpoints)(i.checkpoints.directory).save(2, params=i.params), ValueError, "save: another CheckpointManager of this process writes to"),
    Case("checkpoints", "restore_int64_into_int32", lambda i: i.checkpoint_of_values.restore(1, loader={"position": np.int32(0), "epoch": 0, "name": ""}), ValueError, "at ['position'] the checkpoint has an array of shape () and dtype int64, the target an array of shape () and dtype int32"),
    Case("checkpoints", "restore_int_too_large", lambda i: i.checkpoint_of_values.restore(1, loader={"position": np.int64(0), "epoch": jnp.int32(0), "name": ""}), ValueError, "at ['epoch'] the checkpoint has the value 1099511627776, which does not fit the target's dtype int32"),
    Case("checkpoints", "restore_string_into_number", lambda i: i.checkpoint_of_values.restore(1, loader={"position": np.int64(0), "epoch": 0, "name": 0}), ValueError, "at ['name'] the checkpoint has the value 'run-1', the target the value 0"),
    # ---- 8-bit state and PRNG keys (issue 39) ----------------------------------------------
    # What is quantized is chosen by role (moments); a transform without moments is refused.
    Case("8-bit state", "quantized_state_of_lbfgs", lambda i: modopt.quantized_state(modopt.scale_by_lbfgs()).init(i.params), ValueError, "quantized_state: ScaleByLBFGS keeps no moments (running averages of the gradients per parameter element, such as Adam's mu and nu) to store in 8 bits; its state holds inner_state.diff_params_memory['w'] (shape (10, 3, 2)), inner_state.diff_updates_memory['w'] (shape (10, 3, 2)), inner_state.diff_params_memory['b'] (shape (10, 2)) and 6 more, none of them a moment."),
    Case("8-bit state", "quantized_state_of_a_stateless_transform", lambda i: modopt.quantized_state(modopt.clip_by_global_norm(1.0)).init(i.params), ValueError, "quantized_state: ClipByGlobalNorm keeps no moments (running averages of the gradients per parameter element, such as Adam's mu and nu) to store in 8 bits; its state holds no floating array."),
    Case("8-bit state", "quantized_state_twice", lambda i: modopt.quantized_state(modopt.quantized_state(modopt.adam(1e-3), min_size=1)).init(i.params), ValueError, "quantized_state: the state of QuantizedState is already in 8 bits (at inner_state.inner_state[0].mu['b']): wrap a transform in `quantized_state` once."),
    # 8-bit codes mean nothing under other tables or blocks: the checkpoint records its layout.
    Case("8-bit state", "restore_into_other_block_size", lambda i: i.quantized_checkpoints.restore(1, optimizer=_quantized_adam(i.params, block_size=250)), ValueError, "at .state.inner_state[0].mu['b'].codes the checkpoint has an array of shape (2,) and dtype uint8 (of 8-bit state: blocks of 256, 'dynamic' tables, dequantized to float32), the target an array of shape (2,) and dtype uint8 (of 8-bit state: blocks of 250, 'dynamic' tables, dequantized to float32)"),
    Case("8-bit state", "restore_into_other_tables", lambda i: i.quantized_checkpoints.restore(1, optimizer=_quantized_adam(i.params, quantization="linear")), ValueError, "the target an array of shape (2,) and dtype uint8 (of 8-bit state: blocks of 256, 'linear' tables, dequantized to float32)"),
    Case("8-bit state", "restore_into_float32_state", lambda i: i.quantized_checkpoints.restore(1, optimizer=i.adam), ValueError, "it holds an Optimizer of QuantizedState, the target is an Optimizer of Adam"),
    # A key is checked where it is given, naming the argument (it used to fail inside jax.random at the first step).
    Case("PRNG keys", "stochastic_rounding_integer_key", lambda i: modopt.Optimizer(modopt.sgd(0.1), i.params, compensation="stochastic_rounding", key=0), TypeError, "Invalid key: 0 (an integer, not a key: make one with `jax.random.key(seed)`) in Optimizer. Expected a PRNG key (`jax.random.key(seed)`), its raw key data (uint32, shape (2,))."),
    Case("PRNG keys", "stochastic_rounding_float_key", lambda i: modopt.Optimizer(modopt.sgd(0.1), i.params, compensation="stochastic_rounding", key=1.5), TypeError, "Invalid key: 1.5 (of type float) in Optimizer."),
    Case("PRNG keys", "apply_updates_integer_key", lambda i: modopt.apply_updates(i.params, i.grads, key=3), TypeError, "Invalid key: 3 (an integer, not a key: make one with `jax.random.key(seed)`) in apply_updates."),
    Case("PRNG keys", "train_state_integer_key", lambda i: i.flax.TrainState.create(apply_fn=None, params=i.params, tx=modopt.sgd(0.1), compensation="stochastic_rounding", key=0), TypeError, "Invalid key: 0 (an integer, not a key: make one with `jax.random.key(seed)`) in TrainState."),
    Case("PRNG keys", "kron_float_key", lambda i: modopt.kron(1e-3, key=0.5), TypeError, "Invalid key: 0.5 (of type float) in Kron. Expected a PRNG key (`jax.random.key(seed)`), its raw key data (uint32, shape (2,)), or an integer seed."),
    Case("PRNG keys", "scale_by_kron_key_data_of_other_shape", lambda i: modopt.scale_by_kron(key=jnp.zeros(3, jnp.uint32)), TypeError, "Invalid key: [0 0 0] (key data of shape (3,), not (2,)) in ScaleByKron."),
    Case("PRNG keys", "scale_by_kron_signed_key_data", lambda i: modopt.scale_by_kron(key=jnp.zeros(2, jnp.int32)), TypeError, "Invalid key: [0 0] (an array of dtype int32 and shape (2,)) in ScaleByKron."),
    Case("PRNG keys", "noisy_sgd_two_keys", lambda i: modopt.noisy_sgd(0.1, key=jax.random.split(jax.random.key(0))), TypeError, "Invalid key: keys of shape (2,) (2 keys, not one) in noisy_sgd."),
    Case("PRNG keys", "add_noise_bool_seed", lambda i: modopt.add_noise(0.1, 0.5, seed=True), TypeError, "Invalid seed: True (a bool, not a key) in add_noise."),
    # ---- applying updates (issue 39) --------------------------------------------------------
    # An update of another shape names its leaf, with or without a key, and never broadcasts the parameter.
    Case("updates", "apply_updates_with_key_other_shape", lambda i: modopt.apply_updates(i.params, {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)}, key=jax.random.key(0)), ValueError, "apply_updates: the update at ['w'] has shape (2, 3), but the parameter has shape (3, 2)."),
    Case("updates", "apply_updates_other_shape", lambda i: modopt.apply_updates(i.params, {"w": i.grads["w"], "b": jnp.zeros(3)}), ValueError, "apply_updates: the update at ['b'] has shape (3,), but the parameter has shape (2,)."),
    Case("updates", "apply_updates_broadcasting_the_parameter", lambda i: modopt.apply_updates(i.params, {"w": i.grads["w"], "b": jnp.zeros((4, 2))}), ValueError, "apply_updates: the update at ['b'] has shape (4, 2), but the parameter has shape (2,)."),
    Case("updates", "apply_updates_kahan_other_shape", lambda i: modopt.apply_updates_kahan(i.params, {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)}, modopt.kahan_compensation(i.params)), ValueError, "apply_updates_kahan: the update at ['w'] has shape (2, 3), but the parameter has shape (3, 2)."),
    Case("PRNG keys", "hutchinson_string_seed", lambda i: modopt.contrib.hutchinson_estimator_diag_hessian("seed"), TypeError, "Invalid random_seed: 'seed' (of type str) in HutchinsonEstimatorDiagHessian."),
]


def test_the_table_covers_every_area_with_enough_cases():
    areas = {case.area for case in CASES}
    assert {"hyperparameters", "gradients", "models", "combinators", "checkpoints", "flax", "sharding"} <= areas
    assert len(CASES) >= 45
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[f"{case.area}-{case.name}" for case in CASES])
def test_bad_input(case, tmp_path):
    inputs = Inputs(tmp_path)
    with pytest.raises(case.error, match=re.escape(case.message)):
        case.call(inputs)
    assert inputs.unchanged() == []


class Fault(NamedTuple):
    """A fault with a documented behaviour rather than an error: `check(inputs, result)`
    asserts it, and the caller's objects are unchanged afterwards."""

    area: str
    name: str
    call: Callable[[Inputs], Any]
    check: Callable[[Inputs, Any], None]


def _step(tx: Any, params: Any, grads: Any = None) -> Any:
    """The parameters after two `Optimizer` steps (SOAP's first only gathers statistics), with
    gradients of ones by default."""
    grads = jax.tree.map(jnp.ones_like, params) if grads is None else grads
    new, optimizer = modopt.Optimizer(tx, params).step(params, grads)
    return optimizer.step(new, grads)[0]


def _finite_like(inputs: Inputs, new_params: Any, params: str = "params") -> None:
    """The new parameters have the shapes and dtypes of `inputs.<params>`, every entry finite."""
    old = getattr(inputs, params)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), new_params) == jax.tree.map(lambda x: (x.shape, x.dtype), old)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new_params))


def _moved(inputs: Inputs, new_params: Any) -> None:
    """As `_finite_like`, and every entry of the weight `w` moved (by an orthogonalized step)."""
    _finite_like(inputs, new_params)
    assert bool(jnp.all(new_params["w"] != inputs.params["w"]))


FAULTS = [
    # ---- parameters without elements (issue 39): an empty update, as Adam gives --------------
    # contrib.muon divided by a weight's zero width; kron reduced its empty factor with `max`.
    Fault("zero-size", "contrib_muon", lambda i: _step(modopt.contrib.muon(0.02), i.empty_params), lambda i, r: _finite_like(i, r, "empty_params")),
    Fault("zero-size", "kron", lambda i: _step(modopt.kron(1e-3), i.empty_params), lambda i, r: _finite_like(i, r, "empty_params")),
    Fault("zero-size", "soap", lambda i: _step(modopt.soap(1e-3), i.empty_params), lambda i, r: _finite_like(i, r, "empty_params")),
    Fault("zero-size", "shampoo", lambda i: _step(modopt.shampoo(1e-3), i.empty_params), lambda i, r: _finite_like(i, r, "empty_params")),
    # Found over the registry: SM3 reduced an empty axis with `max`.
    Fault("zero-size", "sm3", lambda i: _step(modopt.sm3(0.1), i.empty_params), lambda i, r: _finite_like(i, r, "empty_params")),
    # ---- huge gradients (issue 39): statistics kept finite, not NaN parameters ---------------
    # Squares of 1e30 overflow float32; the statistics are scaled by powers of two (see
    # tests/test_huge_gradients.py for the updates' scale behaviour).
    Fault("huge gradients", "shampoo", lambda i: _step(modopt.shampoo(1e-3, start_preconditioning_step=0), i.params, i.huge_grads), _finite_like),
    Fault("huge gradients", "soap", lambda i: _step(modopt.soap(1e-3), i.params, i.huge_grads), _finite_like),
    Fault("huge gradients", "kron", lambda i: _step(modopt.kron(1e-3), i.params, i.huge_grads), _finite_like),
    # Found alike: Newton-Schulz's norm overflowed and Muon's update was zero (no step, no error).
    Fault("huge gradients", "contrib_muon", lambda i: _step(modopt.contrib.muon(0.02), i.params, i.huge_grads), _moved),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f"{fault.area}-{fault.name}" for fault in FAULTS])
def test_fault(fault, tmp_path):
    inputs = Inputs(tmp_path)
    fault.check(inputs, fault.call(inputs))
    assert inputs.unchanged() == []


def test_the_unchanged_check_sees_mutations(tmp_path):
    inputs = Inputs(tmp_path)
    inputs.params["extra"] = jnp.ones(1)  # a new entry: another structure
    inputs.grads["w"] = inputs.grads["w"] + 1  # a new value at the same place
    assert inputs.unchanged() == ["params", "grads"]


def test_error_raised_before_anything_changes_with_donation():
    params = {k: v + 1 for k, v in PARAMS.items()}
    optimizer = modopt.Optimizer(modopt.adam(1e-3), params)
    step = eqx.filter_jit(lambda p, o, g: o.step(p, g), donate="all")
    with pytest.raises(ValueError, match="has shape"):
        step(params, optimizer, {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)})
    # Nothing was donated or modified: the inputs are intact and still usable.
    np.testing.assert_array_equal(params["w"], 2.0)
    assert int(optimizer.count) == 0
    new_params, optimizer = step(params, optimizer, {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)})
    assert int(optimizer.count) == 1
