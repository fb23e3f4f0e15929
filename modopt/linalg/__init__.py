"""Linear algebra for optimizers: dominant eigenpairs and inverse matrix roots."""

from ._matrix_root import matrix_inverse_pth_root as matrix_inverse_pth_root
from ._power_iteration import power_iteration as power_iteration
