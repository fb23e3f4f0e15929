"""Differentiable smoothing of functions by random perturbations (optax 0.2.8's `optax.perturbations`).

`make_perturbed_fun(f)` returns `(key, x) -> ` a Monte-Carlo estimate of `E_z f(x + sigma z)`
whose autodiff derivatives are unbiased, also for piecewise-constant `f`; `Gumbel` and `Normal`
are the noise distributions.
"""

from ._perturbed import Gumbel as Gumbel
from ._perturbed import Normal as Normal
from ._perturbed import make_perturbed_fun as make_perturbed_fun
