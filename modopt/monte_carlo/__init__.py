"""Monte Carlo gradient estimation: gradients of expectations `E_{p(x; theta)} f(x)` in `theta`.

Estimators (`score_function_jacobians`, `pathwise_jacobians`, `measure_valued_jacobians`)
return per-sample jacobians; control variates (`control_delta_method`, `moving_avg_baseline`)
lower their variance through `control_variates_jacobians`. `multi_normal(loc, log_scale)` is
the diagonal Gaussian they are written for. These are optax's former `optax.monte_carlo`.
"""

from ._control_variates import AbstractControlVariate as AbstractControlVariate
from ._control_variates import ControlDeltaMethod as ControlDeltaMethod
from ._control_variates import MovingAverageBaseline as MovingAverageBaseline
from ._control_variates import MovingAverageBaselineState as MovingAverageBaselineState
from ._control_variates import control_delta_method as control_delta_method
from ._control_variates import control_variates_jacobians as control_variates_jacobians
from ._control_variates import estimate_control_variate_coefficients as estimate_control_variate_coefficients
from ._control_variates import moving_avg_baseline as moving_avg_baseline
from ._distributions import MultiNormalDiagFromLogScale as MultiNormalDiagFromLogScale
from ._distributions import multi_normal as multi_normal
from ._estimators import measure_valued_jacobians as measure_valued_jacobians
from ._estimators import pathwise_jacobians as pathwise_jacobians
from ._estimators import score_function_jacobians as score_function_jacobians
