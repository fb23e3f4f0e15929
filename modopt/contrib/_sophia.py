"""Sophia: Adam-like momentum preconditioned by a clipped estimate of the Hessian diagonal,
and Hutchinson's estimator of that diagonal (`hutchinson_estimator_diag_hessian`)."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform, as_transform, require_params
from .._core.extra_args import ExtraArg, extra_arg
from .._core.fields import NONNEGATIVE, NONNEGATIVE_INTEGER, POSITIVE_INTEGER, as_key, hyperparameter, static
from .._state.moments import (
    bias_correction,
    in_update_dtype,
    init_state,
    store,
    widen,
    widened_update_moment,
)
from .._util.numerics import safe_increment
from .._core.specs import follow_params
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..second_order import hvp
from ..transforms import AddDecayedWeights, ScaleByLearningRate
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn

READS_OBJ_FN = (
    ExtraArg(
        "obj_fn", "the loss as a function of the parameters alone, `obj_fn(params) -> scalar`", of_params=True
    ),
)


class HutchinsonState(NamedTuple):
    """The state of `hutchinson_estimator_diag_hessian`: the PRNG key of the next estimate."""

    key: jax.Array  # a typed PRNG key


class HutchinsonEstimatorDiagHessian(AbstractTransform):
    r"""Estimates the diagonal of the Hessian of `obj_fn` at `params` (Hutchinson's estimator).

    Each call draws random signs `z` (a Rademacher vector, one independent draw per leaf)
    and returns `z * (H z)`, with `H z` a Hessian-vector product of the objective at `params`
    (forward over reverse, see `modopt.second_order.hvp`). Since `E[z_i z_j] = delta_ij`, its
    expectation is `diag(H)`: unbiased, but noisy (the off-diagonal entries of a row add
    variance). The `updates` passed in are ignored; the estimate replaces them.

    Pass the objective at every call: `update(updates, state, params, obj_fn=f)` with
    `f(params) -> scalar`, or `optimizer.step(model, grads, obj_fn=f)` with `f` a function of
    the model. The key advances in the state; the signs are cast to the lowest float dtype of
    the parameters, as optax does.

    Args:
        random_seed: the PRNG key of the first draw (`jax.random.key(0)`), its raw data, or an
            integer seed; `None` (the default) is seed 0, optax's `jax.random.PRNGKey(0)`.

    Example:
        >>> estimator = modopt.contrib.hutchinson_estimator_diag_hessian(jax.random.key(0))
        >>> state = estimator.init(params)
        >>> diagonal, state = estimator.update(grads, state, params, obj_fn=loss_fn)

    Reference: Hutchinson, 1989, "A stochastic estimator of the trace of the influence matrix
    for Laplacian smoothing splines", https://doi.org/10.1080/03610918908812806; as used by
    Sophia-H (Liu et al., 2023, https://arxiv.org/abs/2305.14342).
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = READS_OBJ_FN

    random_seed: jax.Array = fields.prng_key()

    def __init__(self, random_seed: Any = None):
        self.random_seed = as_key(0 if random_seed is None else random_seed, "random_seed", type(self).__name__)

    def init(self, params):
        # A copy: the state's key must not be the transform's buffer (both are donated).
        return HutchinsonState(key=jnp.copy(self.random_seed))

    def update(self, updates, state, params=None, **extra_args):
        del updates
        require_params(params, self)
        obj_fn = extra_arg(extra_args, "obj_fn", self)
        _check_objective(obj_fn, params)
        key, subkey = jax.random.split(state.key)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        keys = jax.random.split(subkey, len(leaves))
        lowest = _lowest_float(leaves)
        signs = [
            jax.random.rademacher(k, jnp.shape(p), jnp.float32).astype(lowest) for k, p in zip(keys, leaves)
        ]
        signs = treedef.unflatten(signs)
        product = hvp(lambda p, _inputs, _targets: obj_fn(p), signs, params, None, None)
        return jax.tree_util.tree_map(lambda h, z: h * z, product, signs), HutchinsonState(key=key)


def _check_objective(obj_fn: Any, params: Any) -> None:
    """Clear errors for an objective that is not a function of the params to a scalar."""
    if not callable(obj_fn):
        raise TypeError(
            f"Invalid obj_fn: a {type(obj_fn).__name__} (expected a function obj_fn(params) -> scalar loss). "
            "Close over the batch: `obj_fn=lambda params: loss_fn(params, batch)`."
        )
    out = jax.eval_shape(obj_fn, params)
    leaves = jax.tree_util.tree_leaves(out)
    if len(leaves) != 1 or leaves[0].shape != () or not jnp.issubdtype(leaves[0].dtype, jnp.floating):
        raise ValueError(
            f"Invalid obj_fn: it returned {out} (expected a real floating scalar: the loss alone, "
            "reduced over the batch, without auxiliary outputs)."
        )


def _lowest_float(leaves: list[Any]) -> Any:
    """The float dtype every leaf's dtype promotes from (bf16 among f32); float32 for none."""
    dtypes = [jnp.result_type(leaf) for leaf in leaves]
    lowest = jnp.dtype(jnp.float32) if not dtypes else dtypes[0]
    for dtype in dtypes[1:]:
        if jnp.promote_types(lowest, dtype) == lowest:
            lowest = dtype
    return lowest


def _hessian_diagonal_fn(value: Any) -> AbstractTransform:
    """Converter: `None` is Hutchinson's estimator with seed 0 (optax's default); a transform
    (modopt or optax) is taken as it is."""
    if value is None:
        return HutchinsonEstimatorDiagHessian()
    return as_transform(value, "sophia: hessian_diagonal_fn")


class SophiaState(NamedTuple):
    """The state of `sophia`.

    count: updates made so far (int32 scalar).
    mu: the EMA of the gradients (in `mu_dtype`).
    nu: the EMA of the Hessian diagonal (in `nu_dtype`), refreshed every `update_interval` steps.
    hessian_fn_state: the state of the Hessian diagonal estimator.
    """

    count: jax.Array
    mu: Any
    nu: Any
    hessian_fn_state: Any


class ScaleBySophia(AbstractTransform):
    r"""Sophia's preconditioned step, before weight decay and the learning rate (see `sophia`).

    Args:
        b1: the decay rate of the EMA of the gradients, in [0, 1).
        b2: the decay rate of the EMA of the Hessian diagonal, in [0, 1).
        eps: the floor of the denominator, >= 0.
        gamma: the factor of the Hessian diagonal in the denominator, >= 0.
        clip_threshold: updates are clipped to `[-clip_threshold, clip_threshold]`, >= 0; `None`
            for no clipping.
        update_interval: steps between refreshes of the Hessian diagonal, an integer >= 1.
        hessian_diagonal_fn: the estimator of the Hessian diagonal (a transform whose update
            returns it); `None` is `hutchinson_estimator_diag_hessian()`.
        mu_dtype: the dtype of the EMA of the gradients; `None` keeps the parameters'.
        nu_dtype: the dtype of the EMA of the Hessian diagonal; `None` keeps the parameters'.
        verbose: print the win rate (static).
        print_win_rate_every_n_steps: the period of the printing, an integer >= 0 (0: never).
    """

    b1: Scalar = fields.decay_rate(0.965)
    b2: Scalar = fields.decay_rate(0.99)
    eps: Scalar = fields.eps(1e-8)
    gamma: Scalar = hyperparameter(0.01, check=NONNEGATIVE)
    clip_threshold: Scalar | None = hyperparameter(1.0, check=NONNEGATIVE, optional=True)
    update_interval: Scalar = hyperparameter(10, check=POSITIVE_INTEGER)
    hessian_diagonal_fn: AbstractTransform = eqx.field(default=None, converter=_hessian_diagonal_fn)
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    verbose: bool = static(default=False)
    print_win_rate_every_n_steps: Scalar = hyperparameter(0, check=NONNEGATIVE_INTEGER)

    def init(self, params):
        return SophiaState(
            count=jnp.zeros([], jnp.int32),
            mu=init_state(params, self.mu_dtype),
            nu=init_state(params, self.nu_dtype),
            hessian_fn_state=self.hessian_diagonal_fn.init(params),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        count = safe_increment(state.count)
        grads = updates
        mu = widened_update_moment(grads, state.mu, self.b1, 1, self.mu_dtype)
        mu_hat = bias_correction(mu, self.b1, count)
        updates = jax.tree_util.tree_map(
            lambda m, h: m / jnp.maximum(self.gamma * h, self.eps), mu_hat, widen(state.nu, self.nu_dtype)
        )
        if self.clip_threshold is not None:
            threshold = self.clip_threshold
            if self.verbose:
                self._print_win_rate(updates, threshold, count)
            updates = jax.tree_util.tree_map(lambda u: jnp.clip(u, -threshold, threshold), updates)

        def refresh(hessian_state, nu):
            diagonal, hessian_state = self.hessian_diagonal_fn.update(
                grads, hessian_state, params, **extra_args
            )
            return hessian_state, store(widened_update_moment(diagonal, nu, self.b2, 1, self.nu_dtype), self.nu_dtype, nu)

        hessian_state, nu = jax.lax.cond(
            state.count % self.update_interval == 0,
            refresh,
            lambda h, n: (h, n),
            state.hessian_fn_state,
            state.nu,
        )
        updates = in_update_dtype(updates, grads, self.mu_dtype, self.nu_dtype)
        return updates, SophiaState(
            count=count, mu=store(mu, self.mu_dtype), nu=nu, hessian_fn_state=hessian_state
        )

    def _print_win_rate(self, updates, threshold, count):
        """Prints the fraction of unclipped elements, every `print_win_rate_every_n_steps` steps."""
        leaves = jax.tree_util.tree_leaves(updates)
        unclipped = sum(jnp.sum(jnp.abs(u) < threshold) for u in leaves)
        win_rate = unclipped / sum(u.size for u in leaves)
        period = self.print_win_rate_every_n_steps
        due = (period > 0) & (count % jnp.maximum(period, 1) == 0)
        jax.lax.cond(due, lambda: jax.debug.print("Sophia optimizer win rate: {}", win_rate), lambda: None)

    def state_specs(self, params, param_specs):
        # The moments are laid out as the parameters; the estimator's state by its own rule.
        own = follow_params(jax.eval_shape(self.init, params), params, param_specs, type(self).__name__)
        return own._replace(hessian_fn_state=self.hessian_diagonal_fn.state_specs(params, param_specs))


class Sophia(AbstractComposite):
    r"""Sophia: momentum divided by a clipped, periodically refreshed Hessian-diagonal estimate.

    With `g` the gradient, `t` the step from 1 and `h` the EMA of Hessian-diagonal estimates:

        m      = b1 * m + (1 - b1) * g
        u      = clip((m / (1 - b1**t)) / max(gamma * h, eps), -clip_threshold, clip_threshold)
        params -= learning_rate * (u + weight_decay * params)

    and every `update_interval` steps (at steps 0, `update_interval`, ...), after `u` is
    computed, `h = b2 * h + (1 - b2) * hessian_diagonal_fn(...)`. The effective decay of `h`
    per step is about `1 - (1 - b2) / update_interval`. The clipping bounds each element's
    step where the curvature is small or negative, so the first steps (`h = 0`) are
    sign-like steps of size `learning_rate`.

    The default estimator is Hutchinson's (Sophia-H, `hutchinson_estimator_diag_hessian`),
    which needs the objective: pass `obj_fn`, the loss as a function of the parameters alone,
    at every step: `update(grads, state, params, obj_fn=lambda p: loss_fn(p, batch))`, or
    `optimizer.step(model, grads, obj_fn=lambda m: loss_fn(m, batch))`. Every extra argument
    reaches the estimator. Under data parallelism the estimate must be averaged across
    devices, as the gradients are: `jax.jit` with sharded inputs does it, `pmap` does not.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the EMA of the gradients, in [0, 1).
        b2: the decay rate of the EMA of the Hessian diagonal (per refresh), in [0, 1).
        eps: the floor of the denominator `max(gamma * h, eps)`, >= 0.
        weight_decay: the coefficient of decoupled weight decay (a number or a schedule).
        weight_decay_mask: which parameters the decay applies to: `None` for all, a pytree of
            bools shaped like a prefix of the params, or a function of the params returning one.
        gamma: the factor of the Hessian diagonal in the denominator, >= 0 (raise it when few
            elements escape the clipping).
        clip_threshold: the bound of each element of the preconditioned step, >= 0; `None` for no
            clipping.
        update_interval: steps between refreshes of the Hessian diagonal, an integer >= 1.
        hessian_diagonal_fn: the estimator of the Hessian diagonal: a transform (modopt or optax)
            whose `update(grads, state, params, **extra_args)` returns the diagonal. `None` (the
            default) is `hutchinson_estimator_diag_hessian()`, seed 0, optax's default.
        mu_dtype: the dtype of the EMA of the gradients; `None` keeps the parameters'.
        nu_dtype: the dtype of the EMA of the Hessian diagonal; `None` keeps the parameters'.
        verbose: print the win rate, the fraction of elements not clipped (static; the paper
            suggests keeping it between 0.1 and 0.5).
        print_win_rate_every_n_steps: print it every this many steps, an integer >= 0 (0: never).

    Example:
        >>> tx = modopt.contrib.sophia(1e-3)
        >>> optimizer = modopt.Optimizer(tx, model)
        >>> loss, grads = eqx.filter_value_and_grad(loss_fn)(model, batch)
        >>> model, optimizer = optimizer.step(model, grads, obj_fn=lambda m: loss_fn(m, batch))

    Reference: Liu et al., 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for
    Language Model Pre-training", https://arxiv.org/abs/2305.14342 (the estimator draws
    Rademacher rather than Gaussian vectors, as optax's does).
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.965)
    b2: Scalar = fields.decay_rate(0.99)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(1e-4)
    weight_decay_mask: MaskOrFn = fields.mask()
    gamma: Scalar = hyperparameter(0.01, check=NONNEGATIVE)
    clip_threshold: Scalar | None = hyperparameter(1.0, check=NONNEGATIVE, optional=True)
    update_interval: Scalar = hyperparameter(10, check=POSITIVE_INTEGER)
    hessian_diagonal_fn: AbstractTransform = eqx.field(default=None, converter=_hessian_diagonal_fn)
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    verbose: bool = static(default=False)
    print_win_rate_every_n_steps: Scalar = hyperparameter(0, check=NONNEGATIVE_INTEGER)

    def build(self):
        return Chain(
            ScaleBySophia(
                self.b1,
                self.b2,
                self.eps,
                self.gamma,
                self.clip_threshold,
                self.update_interval,
                self.hessian_diagonal_fn,
                self.mu_dtype,
                self.verbose,
                self.print_win_rate_every_n_steps,
                nu_dtype=self.nu_dtype,
            ),
            AddDecayedWeights(self.weight_decay, self.weight_decay_mask),
            ScaleByLearningRate(self.learning_rate),
        )


hutchinson_estimator_diag_hessian = HutchinsonEstimatorDiagHessian
sophia = Sophia
