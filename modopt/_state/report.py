"""What an optimizer's state costs, read from shapes alone: `state_bytes` and its warning."""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

# More state than this per trained parameter (float32 Adam keeps 8) is warned about, once.
WARN_BYTES_PER_PARAMETER = 16.0

# The options that bound each matrix optimizer's state, named in the warning (keyed by the
# state's type, which is what the composed state shows of the transform).
_BOUNDS = {
    "ScaleBySoapState": "SOAP: `max_precondition_dim` (a larger dimension keeps no basis; "
    "the reference's default is 10000), `precondition_1d`",
    "ScaleByShampooState": "Shampoo: `block_size` (a dimension is cut into blocks of at most this size), "
    "`skip_preconditioning_dim_size_gt`, `merge_small_dims_block_size`",
    "ScaleByKronState": "Kron: `max_size_triangular` (a longer axis gets a diagonal factor; the "
    "reference's default is 8192), `memory_save_mode` ('one_diag', 'all_diag')",
}
_WARNED: set[tuple[str, ...]] = set()


class StateMemoryWarning(UserWarning):
    """An optimizer keeps more than 16 bytes of state per trained parameter in arrays that grow
    with the model (float32 Adam keeps 8; a step count does not count). Silence it with
    `warnings.filterwarnings("ignore", category=modopt.StateMemoryWarning)`."""


class StateArray(NamedTuple):
    """One array of a state: its path in the state, shape, dtype and bytes."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int

    def __str__(self) -> str:
        return f"{self.path} {self.dtype}[{','.join(map(str, self.shape))}] ({readable_bytes(self.bytes)})"


class StateReport(NamedTuple):
    """The bytes of an optimizer's state (`state_bytes`).

    bytes: the state's bytes, every array counted whole (`modopt.sharding.bytes_per_device`
        gives what each device holds of it on a mesh).
    parameters: the number of trained parameter elements.
    per_parameter: `bytes / parameters`.
    largest: the largest arrays of the state, largest first (`StateArray`s).
    by_parameter: with `state_bytes(..., by_parameter=True)`, the bytes of state each
        parameter brings, by its path in the parameters, largest first; otherwise `None`.
    """

    bytes: int
    parameters: int
    per_parameter: float
    largest: tuple[StateArray, ...]
    by_parameter: dict[str, int] | None = None

    def __str__(self) -> str:
        lines = [
            f"{readable_bytes(self.bytes)} of state for {self.parameters:,} parameters "
            f"({self.per_parameter:.1f} bytes per parameter); largest arrays:"
        ]
        lines += [f"  {a}" for a in self.largest]
        if self.by_parameter is not None:
            lines.append("by parameter:")
            lines += [f"  {path or 'the root'}: {readable_bytes(b)}" for path, b in self.by_parameter.items()]
        return "\n".join(lines)


def state_bytes(tx: Any, params: Any, *, largest: int = 5, by_parameter: bool = False) -> StateReport:
    """What the state of `tx` on `params` costs, computed from shapes before anything is
    allocated (`jax.eval_shape` of `tx.init`).

    Args:
        tx: a transform (`modopt.soap(3e-3)`, a chain, ...).
        params: the parameters: arrays or `jax.ShapeDtypeStruct`s; a model's trainable part
            (`eqx.filter(model, eqx.is_inexact_array)`).
        largest: how many of the largest state arrays to list.
        by_parameter: also attribute the state to each parameter (one more `eval_shape` per
            parameter: each parameter's real shape among scalars in the others' places).

    Returns:
        A `StateReport`: total bytes, bytes per parameter, the largest arrays (and per
        parameter, with `by_parameter`).

    Example:
        >>> report = modopt.state_bytes(modopt.soap(3e-3), eqx.filter(model, eqx.is_inexact_array))
        >>> report.per_parameter, report.largest[0]
    """
    abstract = jax.tree_util.tree_map(_abstract, params)
    report = report_of(jax.eval_shape(tx.init, abstract), abstract, largest)
    if by_parameter:
        report = report._replace(by_parameter=_by_parameter(tx, abstract))
    return report


def report_of(state: Any, params: Any, largest: int = 5) -> StateReport:
    """The `StateReport` of `state` (arrays or abstract) made for `params` (without `by_parameter`)."""
    arrays = [
        StateArray(jax.tree_util.keystr(path), tuple(x.shape), str(x.dtype), _nbytes(x))
        for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
        if hasattr(x, "shape") and hasattr(x, "dtype")
    ]
    total = sum(a.bytes for a in arrays)
    count = sum(math.prod(np.shape(p)) for p in jax.tree_util.tree_leaves(params))
    ranked = tuple(sorted(arrays, key=lambda a: -a.bytes)[:largest])
    return StateReport(total, count, total / max(count, 1), ranked)


def warn_if_large(state: Any, params: Any, where: str) -> None:
    """A `StateMemoryWarning` (once per process and kind of state) if `state` keeps more than
    `WARN_BYTES_PER_PARAMETER` bytes per element of `params` in arrays of one or more axes,
    naming its largest arrays. Scalars (a step count, a key) do not grow with the model: four
    float32 moments and a count (Adan's) are 16 bytes per parameter, not more."""
    report = report_of(state, params, largest=3)
    scalars = sum(_nbytes(x) for x in jax.tree_util.tree_leaves(state) if hasattr(x, "dtype") and not np.shape(x))
    if report.bytes - scalars <= WARN_BYTES_PER_PARAMETER * report.parameters:
        return
    kinds = _state_types(state)
    key = tuple(sorted(kinds))
    if key in _WARNED:
        return
    _WARNED.add(key)
    bounds = [_BOUNDS[k] for k in _BOUNDS if k in kinds]
    listed = "; ".join(f"state{a}" for a in report.largest)
    warnings.warn(
        f"{where}: the optimizer's state takes {report.per_parameter:.1f} bytes per trained parameter "
        f"({readable_bytes(report.bytes)} for {report.parameters:,} parameters; float32 Adam keeps 8). Largest arrays: "
        f"{listed}. "
        + (f"Options that bound it: {'; '.join(bounds)}. " if bounds else "")
        + "`modopt.state_bytes(tx, params, by_parameter=True)` shows what each parameter costs, before "
        "anything is allocated. Silence this with "
        "`warnings.filterwarnings('ignore', category=modopt.StateMemoryWarning)`.",
        StateMemoryWarning,
        stacklevel=_user_stacklevel(),
    )


def _user_stacklevel() -> int:
    """The `stacklevel` of the first caller outside modopt, Equinox and JAX (the user's line;
    the example jobs in `modopt.examples` are user code)."""
    import sys

    inside = ("modopt", "equinox", "jax", "jaxlib", "contextlib")

    def library(name: str) -> bool:
        return name.split(".")[0] in inside and not name.startswith("modopt.examples.")

    frame, level = sys._getframe(2), 2  # the caller of `warn_if_large`'s caller
    while frame is not None and library(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    return level


def _state_types(state: Any) -> set[str]:
    found: set[str] = set()

    def visit(x: Any) -> bool:
        if type(x).__name__ in _BOUNDS:
            found.add(type(x).__name__)
        return False

    jax.tree_util.tree_leaves(state, is_leaf=visit)
    return found


def _by_parameter(tx: Any, abstract: Any) -> dict[str, int]:
    """Per parameter, the state it brings: the state with that parameter among scalars (of
    the same dtypes, in the same structure, so masks and partitions still apply) less the
    state of the scalars alone."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    scalars = [jax.ShapeDtypeStruct((), x.dtype) for _, x in flat]

    def total(leaves: list) -> int:
        state = jax.eval_shape(tx.init, treedef.unflatten(leaves))
        return sum(_nbytes(x) for x in jax.tree_util.tree_leaves(state) if hasattr(x, "dtype"))

    base = total(scalars)
    out = {}
    for i, (path, x) in enumerate(flat):
        if x.shape == ():
            continue
        out[jax.tree_util.keystr(path)] = total([*scalars[:i], x, *scalars[i + 1 :]]) - base
    return dict(sorted(out.items(), key=lambda item: -item[1]))


def _abstract(x: Any) -> Any:
    return jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)) if x is not None else None


def _nbytes(x: Any) -> int:
    size = getattr(x.dtype, "itemsize", None)
    return math.prod(x.shape) * (size if isinstance(size, int) else np.dtype(x.dtype).itemsize)


def readable_bytes(n: float) -> str:
    """`n` bytes in B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
