r"""The linear assignment problem, solved by shortest augmenting paths (the Hungarian method).

Given an $n \times m$ cost matrix $C$, find $\min(n, m)$ (row, column) pairs, no row and no
column used twice, with the least total cost. Both solvers below work on the orientation with
$n \le m$ (the matrix is transposed otherwise), assign one row at a time along a shortest
augmenting path in reduced costs $C_{ij} - u_i - v_j$, and keep the dual potentials $u, v$
feasible, which makes the final matching optimal. Each runs in $O(n^2 m)$ under `jit`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


def _prepare(cost_matrix: Any, where: str) -> tuple[jax.Array, bool]:
    """The cost as a float matrix with no more rows than columns, and whether it was transposed."""
    cost = jnp.asarray(cost_matrix)
    if cost.ndim != 2:
        raise ValueError(f"{where}: the cost matrix must be 2-D; got shape {cost.shape}.")
    if jnp.issubdtype(cost.dtype, jnp.complexfloating):
        raise ValueError(f"{where}: the cost matrix must be real; got dtype {cost.dtype}.")
    transposed = cost.shape[0] > cost.shape[1]
    cost = cost.T if transposed else cost
    return cost.astype(jnp.promote_types(cost.dtype, jnp.float32)), transposed


def _empty() -> tuple[jax.Array, jax.Array]:
    return jnp.zeros(0, int), jnp.zeros(0, int)


# --------------------------------------------------------------------------------------------
# Potentials with a virtual column (Kuhn-Munkres as in Jonker-Volgenant's shortest paths)
# --------------------------------------------------------------------------------------------


def _row_of_each_column(cost: jax.Array) -> jax.Array:
    """For `n <= m`, the row matched to each column (-1 where none), by Dijkstra-like sweeps.

    Columns are numbered from 1; column 0 is virtual and holds the row being inserted. Each
    sweep marks the column with the least reduced cost `minv` as used and shifts the
    potentials by it, until it reaches a free column; the path is then flipped.
    """
    n, m = cost.shape

    def insert_row(carry, row):
        u, v, owner = carry  # u: (n + 1,), v: (m + 1,), owner[j]: 1-based row of column j, 0 if free
        owner = owner.at[0].set(row + 1)

        def still_searching(state):
            return owner[state[-1]] != 0

        def sweep(state):
            u, v, used, minv, came_from, col = state
            used = used.at[col].set(True)
            free = ~used[1:]
            reduced = cost[owner[col] - 1] - u[owner[col]] - v[1:]
            better = free & (reduced < minv)
            minv = jnp.where(better, reduced, minv)
            came_from = jnp.where(better, col, came_from)
            candidates = jnp.where(free, minv, jnp.inf)
            nearest = jnp.argmin(candidates)
            delta = candidates[nearest]
            # Rows owning a used column (the inserted row included) rise by delta; their
            # columns fall by it; the other columns' distances shrink by it.
            u = u.at[jnp.where(used, owner, n + 1)].add(delta, mode="drop")
            v = jnp.where(used, v - delta, v)
            minv = jnp.where(free, minv - delta, minv)
            return u, v, used, minv, came_from, nearest + 1

        state = (u, v, jnp.zeros(m + 1, bool), jnp.full(m, jnp.inf, cost.dtype), jnp.zeros(m, int), 0)
        u, v, _, _, came_from, col = lax.while_loop(still_searching, sweep, state)

        def flip(state):
            owner, col = state
            previous = came_from[col - 1]
            return owner.at[col].set(owner[previous]), previous

        owner, _ = lax.while_loop(lambda state: state[1] != 0, flip, (owner, col))
        return (u, v, owner), None

    init = (jnp.zeros(n + 1, cost.dtype), jnp.zeros(m + 1, cost.dtype), jnp.zeros(m + 1, int))
    (_, _, owner), _ = lax.scan(insert_row, init, jnp.arange(n))
    return owner[1:] - 1


def hungarian_algorithm(cost_matrix: Any) -> tuple[jax.Array, jax.Array]:
    r"""Solves the linear assignment problem (minimum-cost matching of rows and columns).

    The problem, for a cost matrix $C \in \mathbb{R}^{n \times m}$:
    $$\min_{X \in \{0, 1\}^{n \times m}} \sum_{ij} C_{ij} X_{ij} \quad \text{subject to} \quad
    \sum_i X_{ij} \le 1,\ \sum_j X_{ij} \le 1,\ \sum_{ij} X_{ij} = \min(n, m),$$
    a minimum-cost maximum matching of the complete bipartite graph of rows and columns.

    Rows are inserted one at a time; each insertion grows a shortest-path tree from a virtual
    column in reduced costs, shifting the dual potentials as it goes, until it reaches a free
    column, then flips the path (Kuhn-Munkres with Jonker-Volgenant's shortest paths, the
    formulation of Scenic's JAX solver). Jit-compatible; $O(n^2 m)$ for $n \le m$.

    The pairs come in optax 0.2.8's order: for a square matrix, `j` is `0, 1, ..., n - 1`
    and `i[k]` is the row matched to column `k`; otherwise, the pairs are sorted by the index
    on the smaller side, in decreasing order.

    Args:
        cost_matrix: the $n \times m$ matrix of real costs.

    Returns:
        `(i, j)`: integer arrays of $\min(n, m)$ row and column indices; the optimal cost is
        `cost_matrix[i, j].sum()`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.assignment import hungarian_algorithm
        >>> cost = jnp.array([[8, 4, 7], [5, 2, 3], [9, 6, 7], [9, 4, 8]])
        >>> i, j = hungarian_algorithm(cost)
        >>> print(cost[i, j].sum())
        15

    References:
        Kuhn, [The Hungarian method for the assignment
        problem](https://doi.org/10.1002/nav.3800020109), 1955.

        Dehghani et al., [Scenic: A JAX Library for Computer Vision Research and
        Beyond](https://arxiv.org/abs/2110.11403), 2022.
    """
    cost, transposed = _prepare(cost_matrix, "hungarian_algorithm")
    n, m = cost.shape
    if n == 0:
        return _empty()
    row_of_col = _row_of_each_column(cost)
    if n == m:
        rows, cols = row_of_col, jnp.arange(m)
    else:
        rows, cols = lax.top_k(row_of_col, n)  # the matched columns, by decreasing row
    return (cols, rows) if transposed else (rows, cols)


# --------------------------------------------------------------------------------------------
# Crouse's shortest augmenting path (the algorithm of scipy's linear_sum_assignment)
# --------------------------------------------------------------------------------------------


def _column_of_each_row(cost: jax.Array) -> jax.Array:
    """For `n <= m`, the column matched to each row, by Crouse's shortest augmenting paths."""
    n, m = cost.shape

    def assign_row(row, carry):
        u, v, row4col, col4row = carry

        def searching(state):
            return state[-1] == -1

        def scan_from(state):
            i, min_value, remaining, rows_seen, cols_seen, dist, path, _ = state
            rows_seen = rows_seen.at[i].set(True)
            reduced = min_value + cost[i] - u[i] - v
            better = remaining & (reduced < dist)
            path = jnp.where(better, i, path)
            dist = jnp.where(better, reduced, dist)
            candidates = jnp.where(remaining, dist, jnp.inf)
            lowest = jnp.min(candidates)
            ties = remaining & (candidates == lowest)
            free_ties = ties & (row4col == -1)  # among equals, a free column ends the search
            j = jnp.where(jnp.any(free_ties), jnp.argmax(free_ties), jnp.argmax(ties))
            is_free = row4col[j] == -1
            return (
                jnp.where(is_free, i, row4col[j]),
                lowest,
                remaining.at[j].set(False),
                rows_seen,
                cols_seen.at[j].set(True),
                dist,
                path,
                jnp.where(is_free, j, -1),
            )

        state = (
            row,
            jnp.zeros([], cost.dtype),
            jnp.ones(m, bool),
            jnp.zeros(n, bool),
            jnp.zeros(m, bool),
            jnp.full(m, jnp.inf, cost.dtype),
            jnp.full(m, -1),
            -1,
        )
        _, min_value, _, rows_seen, cols_seen, dist, path, sink = lax.while_loop(searching, scan_from, state)

        # Dual update: keeps the reduced costs non-negative and zero on the matching.
        u = u.at[row].add(min_value)
        others = rows_seen & (jnp.arange(n) != row)
        u = jnp.where(others, u + min_value - dist[col4row], u)
        v = jnp.where(cols_seen, v + dist - min_value, v)

        def augment(state):
            row4col, col4row, j, _ = state
            i = path[j]
            row4col = row4col.at[j].set(i)
            return row4col, col4row.at[i].set(j), col4row[i], i == row

        row4col, col4row, _, _ = lax.while_loop(
            lambda state: ~state[-1], augment, (row4col, col4row, sink, jnp.array(False))
        )
        return u, v, row4col, col4row

    init = (jnp.zeros(n, cost.dtype), jnp.zeros(m, cost.dtype), jnp.full(m, -1), jnp.full(n, -1))
    return lax.fori_loop(0, n, assign_row, init)[-1]


def base_hungarian_algorithm(cost_matrix: Any) -> tuple[jax.Array, jax.Array]:
    r"""Solves the linear assignment problem by Crouse's shortest augmenting path algorithm.

    The problem, for a cost matrix $C \in \mathbb{R}^{n \times m}$:
    $$\min_{X \in \{0, 1\}^{n \times m}} \sum_{ij} C_{ij} X_{ij} \quad \text{subject to} \quad
    \sum_i X_{ij} \le 1,\ \sum_j X_{ij} \le 1,\ \sum_{ij} X_{ij} = \min(n, m),$$
    a minimum-cost maximum matching of the complete bipartite graph of rows and columns.

    For each row in turn, a Dijkstra search in reduced costs $C_{ij} - u_i - v_j$ finds the
    shortest alternating path to a free column; the duals $u, v$ are then updated and the
    path augmented (Crouse 2016, the algorithm behind `scipy.optimize.linear_sum_assignment`).
    Each step of the search scans all columns at once. Jit-compatible; $O(n^2 m)$ for
    $n \le m$. `hungarian_algorithm` solves the same problem with a smaller program.

    The pairs come in optax 0.2.8's order, sorted by row: `i` is `0, 1, ...` when the
    matrix has no more rows than columns, else the matched rows in increasing order. Where
    several matchings are optimal (ties in integer costs), the one returned may differ from
    optax's: the search scans all columns at once and breaks ties by the lowest index.

    Args:
        cost_matrix: the $n \times m$ matrix of real costs.

    Returns:
        `(i, j)`: integer arrays of $\min(n, m)$ row and column indices; the optimal cost is
        `cost_matrix[i, j].sum()`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.assignment import base_hungarian_algorithm
        >>> cost = jnp.array([[8, 4, 7], [5, 2, 3], [9, 6, 7], [9, 4, 8]])
        >>> i, j = base_hungarian_algorithm(cost)
        >>> print(i, j, cost[i, j].sum())
        [0 1 3] [0 2 1] 15

    References:
        Crouse, [On implementing 2D rectangular assignment
        algorithms](https://ieeexplore.ieee.org/document/7738348), 2016.
    """
    cost, transposed = _prepare(cost_matrix, "base_hungarian_algorithm")
    n, _ = cost.shape
    if n == 0:
        return _empty()
    col4row = _column_of_each_row(cost)
    if transposed:
        order = jnp.argsort(col4row)
        return col4row[order], order
    return jnp.arange(n), col4row
