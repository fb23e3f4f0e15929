"""Which axes of a model's weights are inputs and outputs, read off the model's layers.

Equinox stores a `Linear` weight as `(out, in)` (`y = W @ x`), Flax linen and NNX as
`(in, out)` (`y = x @ W`, optax's default for Muon); convolution kernels are `(out, in,
*spatial)` in Equinox and `(*spatial, in, out)` in Flax. `dimension_numbers(model)` reads each
weight's `MuonDimensionNumbers` from the layer that holds it, and `with_model_layout` gives them
to every transform of an `Optimizer` whose dimension numbers were left at their default: the
matrices' to Muon and its variants, the higher-rank kernels' to Kron and Shampoo
(`modopt.transforms._kernel_views`: the matrix each kernel is merged into).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings
from typing import Any

import equinox as eqx
import jax
import numpy as np

from ..transforms._kernel_views import last_axis_out, matrix_runs
from ..transforms._newton_schulz import MuonDimensionNumbers, matrix_axes, shape_of

# A rule: a leaf's shape -> its `MuonDimensionNumbers`, None where it is no weight matrix (a
# layer's bias: Adam's, whatever its rank), or `_UNKNOWN` where the layer does not tell.
_UNKNOWN = object()
_IN_OUT = MuonDimensionNumbers(reduction_axis=0, output_axis=1)  # `x @ W`: optax's default
_OUT_IN = MuonDimensionNumbers(reduction_axis=1, output_axis=0)  # `W @ x`: Equinox, PyTorch


def _numbers(reduction: tuple[int, ...], output: tuple[int, ...]) -> MuonDimensionNumbers:
    """`MuonDimensionNumbers` with single axes written as integers."""
    one = lambda axes: axes[0] if len(axes) == 1 else tuple(axes)  # noqa: E731
    return MuonDimensionNumbers(reduction_axis=one(reduction), output_axis=one(output))


def _in_then_out(batch: int, outputs: int):
    """A kernel laid out as `(*batch, *inputs, *outputs)` (Flax's Dense, DenseGeneral, Conv)."""

    def rule(shape):
        ndim = len(shape)
        if ndim - batch - outputs < 1 or outputs < 1:
            return _UNKNOWN
        return _numbers(tuple(range(batch, ndim - outputs)), tuple(range(ndim - outputs, ndim)))

    return rule


def _out_then_in(shape):
    """A kernel laid out as `(out, in, *spatial)` (Equinox's Linear, Conv, ConvTranspose, GRU)."""
    return _OUT_IN if len(shape) == 2 else _numbers(tuple(range(1, len(shape))), (0,))


def _flax_transposed(shape):
    """Flax's `ConvTranspose(transpose_kernel=True)` kernel: `(*spatial, out, in)`."""
    ndim = len(shape)
    return _numbers((*range(ndim - 2), ndim - 1), (ndim - 2,))


def _einsum(einsum_str: str):
    """The rule of an einsum's second operand (the kernel of Flax's `Einsum`): its axes
    contracted with the input reduce, those kept in the output are outputs, those in all
    three are batch axes. `_UNKNOWN` where that does not describe every axis (ellipses, axes
    summed within the kernel, no input or no output axis)."""
    try:
        operands, result = einsum_str.replace(" ", "").split("->")
        lhs, kernel = operands.split(",")
    except ValueError:
        return lambda shape: _UNKNOWN
    if "." in kernel or len(set(kernel)) != len(kernel):
        return lambda shape: _UNKNOWN
    reduction = tuple(i for i, a in enumerate(kernel) if a in lhs and a not in result)
    output = tuple(i for i, a in enumerate(kernel) if a in result and a not in lhs)
    described = sum(1 for a in kernel if a in lhs and a in result) + len(reduction) + len(output)
    if not reduction or not output or described != len(kernel):
        return lambda shape: _UNKNOWN
    return lambda shape: _numbers(reduction, output) if len(shape) == len(kernel) else _UNKNOWN


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _no_matrix(shape):
    return None


def _equinox_rules(layer: Any) -> dict[str, Any] | None:
    """The rules of an Equinox layer's weights, by attribute; None for any other object."""
    nn = eqx.nn
    if isinstance(layer, (nn.Linear, nn.Conv, nn.ConvTranspose)):
        return {"weight": _out_then_in, "bias": _no_matrix}
    if isinstance(layer, nn.Embedding):  # a lookup: one-hot (rows) in, features (columns) out
        return {"weight": lambda shape: _IN_OUT}
    if isinstance(layer, (nn.GRUCell, nn.LSTMCell)):
        return {"weight_ih": _out_then_in, "weight_hh": _out_then_in, "bias": _no_matrix, "bias_n": _no_matrix}
    return None


def _flax_rules(layer: Any, kind: str) -> dict[str, Any] | None:
    """The rules of a Flax layer's kernels (`kind`: "linen" or "nnx"), by attribute."""
    lib = sys.modules["flax.linen" if kind == "linen" else "flax.nnx"]
    if kind == "linen":
        dense, general, embed = lib.Dense, lib.DenseGeneral, lib.Embed
        outputs = lambda m: len(_as_tuple(m.features))  # noqa: E731
        batch = lambda m: len(_as_tuple(m.batch_dims))  # noqa: E731
    else:
        dense, general, embed = lib.Linear, lib.LinearGeneral, lib.Embed
        outputs = lambda m: len(_as_tuple(m.out_features))  # noqa: E731
        batch = lambda m: len(m.batch_axis)  # noqa: E731
    if isinstance(layer, embed):
        return {"embedding": lambda shape: _IN_OUT}
    if isinstance(layer, dense):
        kernel = _in_then_out(0, 1)
    elif isinstance(layer, general):
        kernel = _in_then_out(batch(layer), outputs(layer))
    elif isinstance(layer, lib.ConvTranspose) and getattr(layer, "transpose_kernel", False):
        kernel = _flax_transposed
    elif isinstance(layer, (lib.Conv, lib.ConvTranspose)):  # (*spatial, in, out)
        kernel = _in_then_out(0, 1)
    elif isinstance(layer, lib.Einsum):
        kernel = _einsum(layer.einsum_str)
    else:
        return None
    return {"kernel": kernel, "bias": _no_matrix}


def _key(entry: Any) -> Any:
    """A path entry as a plain value: a dict key, an attribute's name or a sequence index."""
    for name in ("key", "name", "idx"):
        if hasattr(entry, name):
            return getattr(entry, name)
    return entry


def _equinox_layers(model: Any) -> dict[tuple, Any]:
    """The rule of every weight inside an Equinox layer of `model`, by its path."""
    found: dict[tuple, Any] = {}

    def visit(path, node):
        rules = _equinox_rules(node)
        for attribute, rule in (rules or {}).items():
            found[(*map(_key, path), attribute)] = rule
        return node

    jax.tree_util.tree_map_with_path(visit, model, is_leaf=lambda x: _equinox_rules(x) is not None)
    return found


def _nnx_layers(model: Any) -> dict[tuple, Any]:
    """The rule of every kernel inside an NNX layer of `model`, by its path in `nnx.state(model)`."""
    nnx = sys.modules["flax.nnx"]
    found: dict[tuple, Any] = {}
    for path, module in nnx.iter_modules(model):
        for attribute, rule in (_flax_rules(module, "nnx") or {}).items():
            found[(*path, attribute)] = rule
    return found


def _linen_layers(module: Any, variables: Any, args: tuple, kwargs: dict) -> dict[tuple, Any]:
    """The rule of every kernel of a linen `module`, by its path in `variables`: the layers are
    found by running `module.apply(variables, *args, **kwargs)` abstractly."""
    nn = sys.modules["flax.linen"]
    found: dict[tuple, Any] = {}
    bare = not (isinstance(variables, dict) or hasattr(variables, "keys")) or "params" not in variables
    prefix = () if bare else ("params",)

    def record(next_fun, call_args, call_kwargs, context):
        for attribute, rule in (_flax_rules(context.module, "linen") or {}).items():
            found[(*prefix, *context.module.scope.path, attribute)] = rule
        return next_fun(*call_args, **call_kwargs)

    with nn.intercept_methods(record):
        jax.eval_shape(functools.partial(module.apply, **kwargs), {"params": variables} if bare else variables, *args)
    return found


def _framework(model: Any) -> str | None:
    """"linen" or "nnx" for a Flax module, "equinox" for a tree holding Equinox modules."""
    for kind, module in (("linen", "flax.linen"), ("nnx", "flax.nnx")):
        lib = sys.modules.get(module)
        if lib is not None and isinstance(model, lib.Module):
            return kind
    is_module = lambda x: isinstance(x, eqx.Module)  # noqa: E731
    return "equinox" if any(map(is_module, jax.tree_util.tree_leaves(model, is_leaf=is_module))) else None


def _optax_default(shape: tuple[int, ...]) -> MuonDimensionNumbers | None:
    """optax's default: a matrix is `x @ W`, anything else is not Muon's."""
    return _IN_OUT if len(shape) == 2 else None


class _Derived:
    """Each leaf's dimension numbers, and the matrices whose layout no layer told."""

    def __init__(self, model: Any, args: tuple, kwargs: dict, higher_rank: bool, where: str):
        kind = _framework(model)
        if kind == "linen":
            if not args:
                raise TypeError(
                    f"{where}: a Flax linen module holds no parameters, so its layers are found by running it: "
                    "give its variables and an example input, as to `module.apply(variables, *args, **kwargs)`."
                )
            rules, tree = _linen_layers(model, args[0], args[1:], kwargs), args[0]
        elif args or kwargs:
            raise TypeError(f"{where}: example inputs are taken with a Flax linen module only; got {type(model).__name__}.")
        elif kind == "nnx":
            nnx = sys.modules["flax.nnx"]
            rules, tree = _nnx_layers(model), nnx.as_pure(nnx.state(model, nnx.Param))
        else:
            rules, tree = (_equinox_layers(model) if kind == "equinox" else {}), model
        self.tree, self.by_path, self.unknown = tree, {}, []
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if not hasattr(leaf, "shape"):
                continue
            shape, key = shape_of(leaf), tuple(map(_key, path))
            rule = rules.get(key)
            dims = _UNKNOWN if rule is None else rule(shape)
            if dims is _UNKNOWN:
                dims = _optax_default(shape)
                if dims is not None and kind is not None and np.issubdtype(np.dtype(leaf.dtype), np.inexact):
                    self.unknown.append((key, jax.tree_util.keystr(path)))
            elif dims is not None and len(shape) != 2 and not higher_rank:
                dims = None  # as optax's default: Muon takes the matrices only
            self.by_path[key] = (shape, dims)

    def as_tree(self) -> Any:
        """The dimension numbers shaped like the model (None at every other leaf)."""
        return jax.tree_util.tree_map_with_path(
            lambda path, leaf: self.by_path.get(tuple(map(_key, path)), (None, None))[1], self.tree
        )

    def warn(self, where: str, stacklevel: int, trained: Any = None) -> None:
        """Warns of the matrices whose layout no layer told (of those in `trained`, if given)."""
        keys = None if trained is None else {tuple(map(_key, p)) for p, _ in jax.tree_util.tree_flatten_with_path(trained)[0]}
        unknown = [path for key, path in self.unknown if keys is None or key in keys]
        if not unknown:
            return
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        warnings.warn(
            f"{where}: no layer of the model tells the layout of {len(unknown)} "
            f"{'matrix' if len(unknown) == 1 else 'matrices'} ({shown}); Muon takes "
            "each as used in `x @ W` (rows: the input, columns: the output, optax's layout). A weight used as "
            "`W @ x` (Equinox's and PyTorch's layout) needs MuonDimensionNumbers(reduction_axis=1, output_axis=0) "
            "at its path in `muon_weight_dimension_numbers`; giving the dimension numbers (a tree of them, e.g. "
            "from `modopt.dimension_numbers(model)` with those entries changed) also silences this warning.",
            stacklevel=stacklevel,
        )


def dimension_numbers(model: Any, *args: Any, higher_rank: bool = False, **kwargs: Any) -> Any:
    """Each weight's `MuonDimensionNumbers`, read off the layer that holds it.

    Muon and its variants (`modopt.contrib.muon`, `normuon`, `adamuon`) need to know which
    axis of a weight takes the input and which gives the output: the width scaling
    `sqrt(fan_out / fan_in)`, NorMuon's per-neuron second moment and AOL's row scaling depend
    on it. Their default is optax's, a weight used as `y = x @ W` (`(in, out)`, as Flax
    stores it); Equinox stores a `Linear` weight as `(out, in)` (`y = W @ x`).
    `modopt.Optimizer(tx, model)` (and `NnxOptimizer`) derive the layout themselves where the
    dimension numbers are left at `None`; this gives the same tree for code that calls
    `tx.init(params)` itself, to pass as `muon_weight_dimension_numbers=`.

    Layers read: Equinox's `Linear`, `Conv`, `ConvTranspose` (`(out, in, *spatial)`),
    `Embedding` (a lookup: `(vocabulary, features)`), `GRUCell` and `LSTMCell`; Flax's (linen
    and NNX) `Dense`/`Linear`, `DenseGeneral`/`LinearGeneral`, `Conv`, `ConvTranspose`,
    `Embed` and `Einsum` (from its equation). Every other matrix (rank 2) gets optax's default,
    reduction axis 0 and output axis 1, with a warning naming it when the model is an Equinox
    or Flax model (a plain pytree of arrays is taken as optax takes it, without a warning).
    A layer's bias gets `None` (Adam's, in `muon`) whatever its rank. Other leaves of a rank
    other than 2 get `None`, as in optax's default, unless
    `higher_rank=True`: then known kernels of higher rank (convolutions, multi-axis
    `DenseGeneral`) get theirs, and Muon orthogonalizes them as `(inputs, outputs)` matrices
    (an Equinox `Conv` kernel `(out, in, k, k)` as the matrix `(in * k * k, out)`). That tree
    is also what `kron` and `shampoo` take as `weight_dimension_numbers` (they merge such a
    kernel into that matrix; `modopt.Optimizer` fills it for them from the model).

    Args:
        model: an Equinox model (any pytree holding Equinox modules), an NNX module, a Flax
            linen module (with `args`), or a plain pytree of arrays.
        *args: for a linen module only: its variables (or params) and an example input, as
            `module.apply(variables, *args)` takes them; it is run abstractly (no FLOPs), to
            see which layer made each kernel.
        higher_rank: also give the dimension numbers of known kernels of rank above 2.
        **kwargs: for a linen module only: keyword arguments of `module.apply`.

    Returns:
        A tree shaped like the model (for NNX, like `nnx.state(model, nnx.Param)`; for linen,
        like the variables given) with a `MuonDimensionNumbers` or `None` at every leaf.

    Example:
        >>> model = eqx.nn.MLP(784, 10, 128, 2, key=jax.random.key(0))
        >>> dims = modopt.dimension_numbers(model)
        >>> dims.layers[0].weight
        MuonDimensionNumbers(reduction_axis=1, output_axis=0)
        >>> tx = modopt.contrib.muon(0.02, muon_weight_dimension_numbers=dims)
    """
    derived = _Derived(model, args, kwargs, higher_rank, "modopt.dimension_numbers")
    derived.warn("modopt.dimension_numbers", stacklevel=3)
    return derived.as_tree()


class ModelLayout:
    """The dimension numbers an `Optimizer` derived from its model (a function of the params).

    It holds only the leaves whose dimension numbers change what its transform does, by path
    and shape: for Muon, those that differ from optax's default (matrices stored `(out, in)`,
    a layer's bias of rank 2); for Kron and Shampoo, the kernels of rank above 2 that their
    own rules merge otherwise (Equinox's `(out, in, *spatial)`). Every other leaf of the tree
    it is called on gets optax's default (`None` for a rank other than 2). A tree that a
    wrapper reshaped (so that a path or shape differs) gets optax's default there too.
    """

    __slots__ = ("_hash", "oriented")

    def __init__(self, oriented: tuple[tuple[tuple, tuple[int, ...], MuonDimensionNumbers], ...]):
        self.oriented = oriented
        self._hash = hash(oriented)  # a static field: hashed by every jitted call

    def __call__(self, tree: Any) -> Any:
        oriented = {key: (shape, dims) for key, shape, dims in self.oriented}

        def dims(path, leaf):
            shape = shape_of(leaf)
            found = oriented.get(tuple(map(_key, path)))
            return found[1] if found is not None and found[0] == shape else _optax_default(shape)

        return jax.tree_util.tree_map_with_path(dims, tree)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, ModelLayout) and self.oriented == other.oriented

    def __repr__(self):
        count = len(self.oriented)
        return f"ModelLayout(<{count} {'leaf' if count == 1 else 'leaves'} laid out as the model's layers store them>)"


def _layout_field(tx: Any) -> str | None:
    """The name of the field holding `tx`'s weight dimension numbers, if it has one."""
    return getattr(type(tx), "dimension_numbers_field", None)


def _takes_kernels(tx: Any) -> bool:
    """Whether `tx`'s dimension numbers are those of kernels of rank above 2 (Kron and Shampoo
    merge them into matrices) rather than those of matrices (Muon, as optax)."""
    return bool(getattr(type(tx), "dimension_numbers_higher_rank", False))


def _model_layout(derived: _Derived, kernels: bool) -> ModelLayout | None:
    """The entries of `derived` that change what a transform does, as a `ModelLayout`: for a
    matrix transform, the matrices not in optax's layout; for a kernel transform, the kernels
    of rank above 2 whose matrix its own rules do not read (`kernel_views`). `None` if none."""
    if kernels:
        oriented = tuple(
            (key, shape, dims)
            for key, (shape, dims) in derived.by_path.items()
            if len(shape) > 2
            and dims is not None
            and matrix_runs(matrix_axes(shape, dims, str(key), "modopt"), len(shape)) not in (None, last_axis_out(len(shape)))
        )
    else:
        oriented = tuple(
            (key, shape, dims)
            for key, (shape, dims) in derived.by_path.items()
            if len(shape) == 2 and dims != _optax_default(shape)
        )
    return ModelLayout(oriented) if oriented else None


def with_model_layout(tx: Any, model: Any, where: str, trained: Any = None, stacklevel: int = 4) -> Any:
    """`tx` with every weight-dimension-numbers field left at `None` set from `model`'s layers.

    Only transforms declaring `dimension_numbers_field` are touched, and only where the field
    is `None` (explicit dimension numbers are the user's). A transform declaring
    `dimension_numbers_higher_rank = True` (Kron, Shampoo) gets the kernels of rank above 2
    whose matrix its own rules would not read; any other (Muon and its variants) the
    matrices not in optax's layout. Where there are none, the transform is left as it is.
    `trained` (the trained leaves, `None` elsewhere) limits the warning about matrices of
    unknown layout (given where a matrix transform is filled) to those.
    """
    is_open = lambda x: _layout_field(x) is not None and getattr(x, _layout_field(x)) is None  # noqa: E731
    open_parts = [x for x in jax.tree_util.tree_leaves(tx, is_leaf=is_open) if is_open(x)]
    if not open_parts:
        return tx
    derived = _Derived(model, (), {}, True, where)
    if not all(map(_takes_kernels, open_parts)):  # Kron and Shampoo do not mind a matrix's orientation
        derived.warn(where, stacklevel, trained)
    layouts = {kernels: _model_layout(derived, kernels) for kernels in {_takes_kernels(x) for x in open_parts}}
    if not any(layouts.values()):
        return tx

    def fill(x):
        layout = layouts[_takes_kernels(x)] if is_open(x) else None
        return x if layout is None else dataclasses.replace(x, **{_layout_field(x): layout})

    return jax.tree_util.tree_map(fill, tx, is_leaf=is_open)
