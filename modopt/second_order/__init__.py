"""Second-order utilities: Hessian-vector products, Hessian and Fisher diagonals of a loss."""

from ._curvature import fisher_diag as fisher_diag
from ._curvature import hessian_diag as hessian_diag
from ._curvature import hvp as hvp
