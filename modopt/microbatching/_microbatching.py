"""Microbatching: evaluate a function on a large batch one slice at a time, and per-example
gradients (`micro_grad`) that feed `Optimizer.step`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ._accumulators import AccumulationType, explicit_sharding, resolve


class Aux(NamedTuple):
    """What `micro_grad`'s function returns besides the gradients, one row per example."""

    values: Any
    metrics: Any
    aux: Any


def reshape_batch_axis(tree: Any, microbatch_size: int, axis: int = 0) -> Any:
    """Splits the batch axis of every leaf into `(num_microbatches, microbatch_size)`.

    The split is column-major: microbatch `i` holds examples `i, i + n, i + 2n, ...` with `n`
    the number of microbatches. A batch sharded along its axis keeps that sharding on the new
    `microbatch_size` axis (every microbatch spans all devices); the new leading axis is
    replicated.

    Args:
        tree: a pytree of arrays, each with a batch axis.
        microbatch_size: the number of examples per microbatch; it must divide the batch size.
        axis: the batch axis.

    Returns:
        The pytree with each batch axis replaced by two axes, `num_microbatches` first.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.microbatching import reshape_batch_axis
        >>> reshape_batch_axis(jnp.arange(6), 2)
        Array([[0, 3],
               [1, 4],
               [2, 5]], dtype=int32)
    """

    def split(x):
        if x.shape[axis] % microbatch_size:
            raise ValueError(
                f"reshape_batch_axis: the batch axis {axis} of size {x.shape[axis]} is not divisible by "
                f"microbatch_size={microbatch_size}."
            )
        shape = (*x.shape[:axis], -1, microbatch_size, *x.shape[axis + 1 :])
        sharding = explicit_sharding(x)
        if sharding is None:
            return x.reshape(shape, order="F")
        spec = tuple(sharding.spec)
        if len(spec) > axis:  # the batch axis is sharded: keep it on the microbatch_size axis
            spec = (*spec[:axis], None, *spec[axis:])
        shards = x.shape[axis] // sharding.shard_shape(x.shape)[axis]
        if microbatch_size % shards:
            raise ValueError(
                f"reshape_batch_axis: the batch is split over {shards} shards, which must divide "
                f"microbatch_size={microbatch_size}."
            )
        out = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec))
        return jnp.reshape(x, shape, order="F", out_sharding=out)

    return jax.tree_util.tree_map(split, tree)


def _as_tuple(value: int | str | Sequence[Any]) -> tuple[Any, ...]:
    return (value,) if isinstance(value, (int, str)) else tuple(value)


def microbatch(
    fun: Callable[..., Any],
    argnums: int | Sequence[int],
    microbatch_size: int | None,
    accumulator: Any = AccumulationType.SUM,
    *,
    argnames: str | Sequence[str] = (),
    in_axes: int | Sequence[int] = 0,
    num_real_microbatches: int | jax.Array | None = None,
) -> Callable[..., Any]:
    """Evaluates `fun` one microbatch at a time in a sequential loop and combines the results.

    The returned function takes `fun`'s arguments. The batch arguments (`argnums`, `argnames`)
    are split into microbatches of `microbatch_size` examples (`reshape_batch_axis`), `fun` runs
    on each in a `jax.lax.fori_loop` (so only one microbatch's intermediates are alive at a
    time), and `accumulator` combines the results:

    ```python
    carry = accumulator.init(shape of fun(microbatch_0))
    for i, mb in enumerate(microbatches):
        carry = accumulator.update(carry, fun(mb), i)
    return accumulator.finalize(carry)
    ```

    Args:
        fun: the function to evaluate.
        argnums: the positions of the arguments that have a batch axis.
        microbatch_size: the number of examples per microbatch; it must divide the batch size.
            `None` returns `fun` unchanged.
        accumulator: how results combine: an `AccumulationType` (`SUM`, the default, `MEAN`,
            `RUNNING_MEAN`, `CONCAT`; optax's `AccumulationType` members are read by name),
            an `Accumulator`, or a pytree of them that is a prefix of `fun`'s output (one per
            output).
        argnames: the names of the keyword arguments that have a batch axis.
        in_axes: the batch axis of each batch argument, in the order `argnums + argnames`,
            or one axis for all (default 0).
        num_real_microbatches: run only this many microbatches (the others are padding), a
            static int or a traced array: variable batch sizes without recompiling.

    Returns:
        A function with `fun`'s signature.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.microbatching import AccumulationType, microbatch
        >>> fun = lambda x: (x + 1, jnp.sum(3 * x))
        >>> f = microbatch(fun, argnums=0, microbatch_size=2,
        ...                accumulator=(AccumulationType.CONCAT, AccumulationType.SUM))
        >>> f(jnp.array([1, 2, 3, 4]))
        (Array([2, 3, 4, 5], dtype=int32), Array(30, dtype=int32))
    """
    if microbatch_size is None:
        return fun
    if isinstance(microbatch_size, bool) or not isinstance(microbatch_size, int) or microbatch_size < 1:
        raise ValueError(
            f"Invalid microbatch_size: {microbatch_size!r} (must be an int >= 1 or None) in microbatch."
        )
    argnums, argnames = _as_tuple(argnums), _as_tuple(argnames)
    axes = (in_axes,) * (len(argnums) + len(argnames)) if isinstance(in_axes, int) else tuple(in_axes)
    if len(axes) != len(argnums) + len(argnames):
        raise ValueError(
            f"microbatch: in_axes has {len(axes)} entries but there are {len(argnums) + len(argnames)} batch "
            f"arguments (argnums={argnums}, argnames={argnames}); give one axis per batch argument."
        )
    positional, named = dict(zip(argnums, axes)), dict(zip(argnames, axes[len(argnums) :]))

    @functools.wraps(fun)
    def microbatched(*args, **kwargs):
        missing = [i for i in positional if i >= len(args)] + [k for k in named if k not in kwargs]
        if missing:
            raise ValueError(f"microbatch: the batch arguments {missing} were not passed.")
        batched = [(args[i], ax) for i, ax in positional.items()] + [
            (kwargs[k], ax) for k, ax in named.items()
        ]
        sizes = {jnp.shape(x)[ax] for tree, ax in batched for x in jax.tree_util.tree_leaves(tree)}
        if len(sizes) > 1:
            raise ValueError(
                f"microbatch: the batch arguments have batch axes of different sizes {sorted(sizes)}."
            )
        if not sizes:
            raise ValueError("microbatch: the batch arguments hold no arrays.")
        (batch_size,) = sizes
        if batch_size % microbatch_size:
            raise ValueError(
                f"microbatch: the batch size {batch_size} is not divisible by microbatch_size={microbatch_size}."
            )
        num_microbatches = batch_size // microbatch_size
        args, kwargs = list(args), dict(kwargs)
        for i, ax in positional.items():
            args[i] = reshape_batch_axis(args[i], microbatch_size, ax)
        for k, ax in named.items():
            kwargs[k] = reshape_batch_axis(kwargs[k], microbatch_size, ax)
        combine = resolve(accumulator, num_microbatches)

        def on_microbatch(index):
            def take(tree, ax):
                return jax.tree_util.tree_map(lambda x: jnp.take(x, index, axis=ax), tree)

            these_args = [take(a, positional[i]) if i in positional else a for i, a in enumerate(args)]
            these_kwargs = {k: take(v, named[k]) if k in named else v for k, v in kwargs.items()}
            return fun(*these_args, **these_kwargs)

        carry = combine.init(jax.eval_shape(on_microbatch, 0))
        stop = num_microbatches if num_real_microbatches is None else num_real_microbatches
        carry = jax.lax.fori_loop(
            0, stop, lambda index, carry: combine.update(carry, on_microbatch(index), index), carry
        )
        return combine.finalize(carry)

    return microbatched


def micro_vmap(
    fun: Callable[..., Any],
    in_axes: int | Sequence[int | None] = 0,
    out_axes: Any = 0,
    *,
    microbatch_size: int | None = None,
    vmap_fn: Callable[..., Any] = jax.vmap,
    accumulator: Any = AccumulationType.CONCAT,
    num_real_microbatches: int | jax.Array | None = None,
) -> Callable[..., Any]:
    """`jax.vmap` evaluated one microbatch at a time, with an optional reduction over the batch.

    Each microbatch of `microbatch_size` examples is vmapped in one go; the microbatches run in
    a sequential loop. With the default `CONCAT` the result is `jax.vmap(fun)`'s; `SUM`, `MEAN`
    or `RUNNING_MEAN` reduce over the batch axis instead, without ever holding the whole
    batched output. Keyword arguments are mapped over their axis 0, as `jax.vmap` does.

    Args:
        fun: the function to map.
        in_axes: the mapped axis of each positional argument (`None`: not mapped), or one int
            for every positional argument.
        out_axes: must be 0 (the only output axis supported).
        microbatch_size: the number of examples per microbatch; it must divide the batch size.
            `None` vmaps the whole batch at once.
        vmap_fn: the vectorizing map, called as `vmap_fn(fun, in_axes, out_axes)` (default
            `jax.vmap`; e.g. a `functools.partial` of it with more options).
        accumulator: what to do with the mapped outputs: `CONCAT` (the default) keeps the batch
            axis, `SUM`, `MEAN` and `RUNNING_MEAN` reduce it; an `Accumulator` or a pytree of
            them (a prefix of `fun`'s output) as in `microbatch`.
        num_real_microbatches: run only this many microbatches, as in `microbatch`.

    Returns:
        The mapped function.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.microbatching import micro_vmap
        >>> micro_vmap(lambda x: x**2, microbatch_size=4)(jnp.arange(8))
        Array([ 0,  1,  4,  9, 16, 25, 36, 49], dtype=int32)

    Note:
        optax 0.2.8 turns an int `in_axes` into a one-element tuple (so it maps one positional
        argument only); here an int applies to every positional argument, as in `jax.vmap`.
    """
    if out_axes != 0:
        raise NotImplementedError(
            f"micro_vmap: out_axes={out_axes!r} is not supported; outputs are mapped on axis 0."
        )

    def mapped(*args, **kwargs):
        axes = (in_axes,) * len(args) if isinstance(in_axes, int) else tuple(in_axes)

        def vmapped_and_reduced(*args, kwargs):
            output = vmap_fn(fun, axes, out_axes)(*args, **kwargs)
            leaves = jax.tree_util.tree_leaves(output)
            size = leaves[0].shape[0] if leaves else 1
            return resolve(accumulator, size).aggregate(output)

        mapped_args = tuple(i for i, ax in enumerate(axes) if ax is not None)
        over = microbatch(
            vmapped_and_reduced,
            argnums=mapped_args,
            argnames="kwargs",
            microbatch_size=microbatch_size,
            accumulator=accumulator,
            in_axes=tuple(ax for ax in axes if ax is not None) + (0,),
            num_real_microbatches=num_real_microbatches,
        )
        return over(*args, kwargs=kwargs)

    return mapped


def _identity(tree: Any) -> Any:
    return tree


def _no_metrics(tree: Any) -> None:
    return None


def micro_grad(
    fun: Callable[..., Any],
    has_aux: bool = False,
    argnums: int | Sequence[int] = 0,
    *,
    batch_argnums: int | Sequence[int] = 1,
    keep_batch_dim: bool = True,
    microbatch_size: int | None = None,
    accumulator: Any = AccumulationType.SUM,
    transform_fn: Callable[[Any], Any] = _identity,
    metrics_fn: Callable[[Any], Any] = _no_metrics,
    num_real_microbatches: int | jax.Array | None = None,
) -> Callable[..., tuple[Any, Aux]]:
    """Per-example gradients, transformed and combined over the batch, in microbatches.

    For each example of the batch arguments, computes `g = grad(fun)` on that example alone,
    then combines `transform_fn(g)` over the batch with `accumulator` (the sum by default, `MEAN`
    for the gradient of a mean loss). Per-example work in between is what this is for: clip
    each example's gradient (differential privacy), collect its square for a variance, compute
    per-example metrics. The returned function gives `(combined, Aux(values, metrics, aux))`,
    where `values` are the per-example losses, `metrics` are `metrics_fn(g)` per example and
    `aux` is `fun`'s auxiliary output per example.

    The combined gradients are a pytree like the parameters: feed them to
    `modopt.Optimizer.step(model, grads)` or to any transform's `update`.

    Args:
        fun: the loss, `fun(params, batch, ...)` by default (see `batch_argnums`).
        has_aux: whether `fun` returns `(value, aux)`.
        argnums: the argument(s) to differentiate with respect to (default 0).
        batch_argnums: the argument(s) with a batch axis 0 (default 1).
        keep_batch_dim: whether `fun` expects its batch arguments with a batch axis (each
            example is then given as a batch of one); `False` gives examples without it.
        microbatch_size: the number of examples per microbatch; `None` does the whole batch at
            once.
        accumulator: how the transformed per-example gradients combine (default `SUM`), as in
            `microbatch`.
        transform_fn: applied to each example's gradient before combining (default identity).
        metrics_fn: applied to each example's gradient, returned per example in `Aux.metrics`
            (default: no metrics).
        num_real_microbatches: run only this many microbatches, as in `microbatch`.

    Returns:
        A function of `fun`'s arguments returning `(combined, Aux(values, metrics, aux))`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.microbatching import AccumulationType, micro_grad
        >>> def loss(w, x, y):
        ...     return 0.5 * jnp.mean((x @ w - y) ** 2)
        >>> grad_fn = micro_grad(loss, batch_argnums=(1, 2), microbatch_size=2,
        ...                      accumulator=AccumulationType.MEAN)
        >>> g, aux = grad_fn(jnp.zeros(1), jnp.ones((4, 1)), jnp.array([0.0, 2.0, 4.0, 6.0]))
        >>> g, aux.values
        (Array([-3.], dtype=float32), Array([ 0.,  2.,  8., 18.], dtype=float32))

    References:
        The per-example gradient clipping use: Abadi et al., [Deep Learning with Differential
        Privacy](https://arxiv.org/abs/1607.00133), 2016. This API: [Efficient per-example
        gradient computations](https://arxiv.org/abs/2510.00236), 2025.
    """
    batch_argnums = _as_tuple(batch_argnums)
    value_and_grad = jax.value_and_grad(
        fun if has_aux else lambda *a, **k: (fun(*a, **k), None), argnums, has_aux=True
    )

    def per_example(*args, **kwargs):
        (value, aux), grad = value_and_grad(*args, **kwargs)
        return transform_fn(grad), Aux(values=value, metrics=metrics_fn(grad), aux=aux)

    def grad_fn(*args, **kwargs):
        if keep_batch_dim:
            args = tuple(
                jax.tree_util.tree_map(lambda x: jnp.expand_dims(x, 1), a) if i in batch_argnums else a
                for i, a in enumerate(args)
            )
        # Arguments past the last batch argument (a PRNG key, flags) are not mapped.
        in_axes = [0 if i in batch_argnums else None for i in range(max(len(args), max(batch_argnums) + 1))]
        mapped = micro_vmap(
            per_example,
            in_axes=in_axes,
            accumulator=(accumulator, AccumulationType.CONCAT),
            microbatch_size=microbatch_size,
            num_real_microbatches=num_real_microbatches,
        )
        return mapped(*args, **kwargs)

    return grad_fn
