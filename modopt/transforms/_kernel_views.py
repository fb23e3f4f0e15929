"""The matrix that Kron and Shampoo merge a kernel of rank above 2 into, from its dimension numbers.

A kernel's weight dimension numbers (`MuonDimensionNumbers`, read off the model's layers by
`modopt.dimension_numbers`) say which axes are its inputs and which its outputs; merged in
their stored order, two runs of neighbouring axes make the layer's matrix.
"""

from __future__ import annotations

from typing import Any

import jax

from ._newton_schulz import dimension_numbers_per_leaf, matrix_axes, shape_of

Runs = tuple[tuple[int, ...], tuple[int, ...]]


def matrix_runs(axes: tuple[tuple[int, ...], ...], ndim: int) -> Runs | None:
    """The two runs of neighbouring axes, in stored order, whose merge makes a kernel with
    `axes` (`(batch, reduction, output)`, from `matrix_axes`) the matrix of its layer; `None`
    where it has batch axes, or its reduction or output axes are not one run each."""
    batch, reduction, output = axes
    first, second = sorted((tuple(sorted(reduction)), tuple(sorted(output))))
    return None if batch or first + second != tuple(range(ndim)) else (first, second)


def last_axis_out(ndim: int) -> Runs:
    """The runs Kron's and Shampoo's own rules already read: every axis but the last, then the
    last (Flax's `(*spatial, in, out)` convolution and `(in, out)` layers)."""
    return tuple(range(ndim - 1)), (ndim - 1,)


def kernel_views(spec: Any, tree: Any, owner: str) -> list[Runs | None]:
    """Per leaf of `tree`, the runs of axes that Kron and Shampoo merge a kernel into (its
    matrix `(inputs, outputs)`, or `(outputs, inputs)`), from its weight dimension numbers.

    `None` (their own rules) for leaves of rank 2 or less (a matrix is one already), leaves
    without dimension numbers, and kernels whose runs are every axis but the last, then the
    last (what the rules read anyway). `spec` is as `dimension_numbers_per_leaf` takes it;
    dimension numbers with batch axes, or whose reduction or output axes are not each a run of
    neighbouring axes, are a `ValueError` naming `owner` and the path.
    """
    leaves = jax.tree_util.tree_leaves(tree)
    if spec is None:
        return [None] * len(leaves)
    views: list[Runs | None] = []
    for leaf, (where, dims) in zip(leaves, dimension_numbers_per_leaf(spec, tree, owner)):
        shape = shape_of(leaf)
        if dims is None or len(shape) <= 2:
            views.append(None)
            continue
        runs = matrix_runs(matrix_axes(shape, dims, where or "the root", owner), len(shape))
        if runs is None:
            raise ValueError(
                f"{owner}: the weight dimension numbers {dims} at {where or 'the root'} do not make the "
                f"kernel of shape {shape} a matrix: {owner} merges a kernel's axes in their stored order, "
                "so its reduction axes and its output axes must each be a run of neighbouring axes, with "
                "no batch axes. Give None there (the default rules) or such dimension numbers."
            )
        views.append(None if runs == last_axis_out(len(shape)) else runs)
    return views
