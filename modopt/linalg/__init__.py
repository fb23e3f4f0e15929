"""Linear algebra for optimizers: dominant eigenpairs, inverse matrix roots, non-negative least squares."""

from ._matrix_root import matrix_inverse_pth_root as matrix_inverse_pth_root
from ._nnls import nnls as nnls
from ._power_iteration import power_iteration as power_iteration
