"""The linear assignment problem (optax 0.2.8's `optax.assignment`): jit-compatible solvers.

`hungarian_algorithm(cost)` and `base_hungarian_algorithm(cost)` return the rows and columns
`(i, j)` of a minimum-cost matching; the cost is `cost[i, j].sum()`.
"""

from ._hungarian import base_hungarian_algorithm as base_hungarian_algorithm
from ._hungarian import hungarian_algorithm as hungarian_algorithm
