"""modopt: composable gradient transformations and optimizers for JAX, as Equinox modules.

Every transform is an `equinox.Module` whose fields are its hyperparameters, with pure
`init(params)` and `update(updates, state, params=None, **extra_args)` methods (optax's
protocol). `modopt.Optimizer` wraps one with its state for `optimizer.step(model, grads)`.
"""

from . import assignment as assignment
from . import combinators as combinators
from . import contrib as contrib
from . import experimental as experimental
from . import fields as fields
from . import linalg as linalg
from . import losses as losses
from . import microbatching as microbatching
from . import monte_carlo as monte_carlo
from . import optimizers as optimizers
from . import perturbations as perturbations
from . import projections as projections
from . import schedules as schedules
from . import second_order as second_order
from . import sharding as sharding
from . import transforms as transforms
from . import trax as trax
from . import tree as tree
from . import tree_utils as tree_utils
from ._core.base import AbstractComposite as AbstractComposite
from ._core.base import AbstractTransform as AbstractTransform
from ._core.base import AbstractWrapper as AbstractWrapper
from ._core.base import EmptyState as EmptyState
from ._core.base import FromOptax as FromOptax
from ._core.base import GradientTransformation as GradientTransformation
from ._core.base import GradientTransformationExtraArgs as GradientTransformationExtraArgs
from ._core.base import OptState as OptState
from ._core.base import Params as Params
from ._core.base import TransformInitFn as TransformInitFn
from ._core.base import TransformUpdateExtraArgsFn as TransformUpdateExtraArgsFn
from ._core.base import TransformUpdateFn as TransformUpdateFn
from ._core.base import Updates as Updates
from ._core.base import from_optax as from_optax
from ._core.base import init_empty_state as init_empty_state
from ._core.base import inner_transform as inner_transform
from ._core.base import with_extra_args_support as with_extra_args_support
from ._core.checks import check_state as check_state
from ._core.fields import Scalar as Scalar
from ._core.extra_args import ExtraArg as ExtraArg
from ._core.declared import declared_extra_args as declared_extra_args
from ._core.extra_args import extra_arg as extra_arg
from ._core.fields import NONNEGATIVE as NONNEGATIVE
from ._core.fields import POSITIVE as POSITIVE
from ._core.fields import PROBABILITY_EXCLUSIVE as PROBABILITY_EXCLUSIVE
from ._core.fields import UNIT as UNIT
from ._core.fields import Check as Check
from ._core.fields import Rate as Rate
from ._core.fields import hyperparameter as hyperparameter
from ._core.fields import interval as interval
from ._core.fields import prng_key as prng_key
from ._core.fields import rate as rate
from ._core.fields import static as static
from ._step.hyperparameters import hyperparameters as hyperparameters
from ._step.hyperparameters import set_hyperparameters as set_hyperparameters
from ._step.jit_step import jit_step as jit_step
from ._state.moments import bias_correction as bias_correction
from ._state.moments import update_infinity_moment as update_infinity_moment
from ._state.moments import update_moment as update_moment
from ._state.moments import update_moment_per_elem_norm as update_moment_per_elem_norm
from ._util.numerics import abs_sq as abs_sq
from ._util.numerics import global_norm as global_norm
from ._util.numerics import safe_increment as safe_increment
from ._util.numerics import safe_int32_increment as safe_int32_increment
from ._util.numerics import safe_norm as safe_norm
from ._util.numerics import safe_root_mean_squares as safe_root_mean_squares
from ._core.masks import MaskOrFn as MaskOrFn
from ._core.masks import WeightDecayMask as WeightDecayMask
from ._core.masks import weight_decay_mask as weight_decay_mask
from ._step.layouts import dimension_numbers as dimension_numbers
from ._step.optimizer import Optimizer as Optimizer
from ._state.quantization import QuantizedArray as QuantizedArray
from ._state.quantization import quantize_blockwise as quantize_blockwise
from ._state.report import StateMemoryWarning as StateMemoryWarning
from ._state.report import StateReport as StateReport
from ._state.report import state_bytes as state_bytes
from ._state.compensated import AbstractCompensation as AbstractCompensation
from ._state.compensated import KahanCompensation as KahanCompensation
from ._state.compensated import StochasticRounding as StochasticRounding
from ._state.compensated import apply_updates_kahan as apply_updates_kahan
from ._state.compensated import kahan_compensation as kahan_compensation
from ._state.updates import apply_updates as apply_updates
from ._state.updates import incremental_update as incremental_update
from ._state.updates import periodic_update as periodic_update
from ._step.value_and_grad import value_and_grad_from_state as value_and_grad_from_state
from .combinators import *  # noqa: F403
from .linalg import matrix_inverse_pth_root as matrix_inverse_pth_root
from .linalg import nnls as nnls
from .linalg import power_iteration as power_iteration
from .losses import convex_kl_divergence as convex_kl_divergence
from .losses import cosine_distance as cosine_distance
from .losses import cosine_similarity as cosine_similarity
from .losses import ctc_loss as ctc_loss
from .losses import ctc_loss_with_forward_probs as ctc_loss_with_forward_probs
from .losses import generalized_kl_divergence as generalized_kl_divergence
from .losses import hinge_loss as hinge_loss
from .losses import huber_loss as huber_loss
from .losses import kl_divergence as kl_divergence
from .losses import l2_loss as l2_loss
from .losses import log_cosh as log_cosh
from .losses import ntxent as ntxent
from .losses import safe_softmax_cross_entropy as safe_softmax_cross_entropy
from .losses import sigmoid_binary_cross_entropy as sigmoid_binary_cross_entropy
from .losses import sigmoid_focal_loss as sigmoid_focal_loss
from .losses import smooth_labels as smooth_labels
from .losses import softmax_cross_entropy as softmax_cross_entropy
from .losses import softmax_cross_entropy_with_integer_labels as softmax_cross_entropy_with_integer_labels
from .losses import squared_error as squared_error
from .microbatching import microbatch as microbatch
from .monte_carlo import control_delta_method as control_delta_method
from .monte_carlo import control_variates_jacobians as control_variates_jacobians
from .monte_carlo import measure_valued_jacobians as measure_valued_jacobians
from .monte_carlo import moving_avg_baseline as moving_avg_baseline
from .monte_carlo import multi_normal as multi_normal
from .monte_carlo import pathwise_jacobians as pathwise_jacobians
from .monte_carlo import score_function_jacobians as score_function_jacobians
from .optimizers import *  # noqa: F403
from .schedules import *  # noqa: F403
from .transforms import *  # noqa: F403

tree_map_params = tree.map_params  # optax.tree_map_params

# optax.transforms and optax.schedules also hold some combinators (`chain`, `masked`,
# `inject_hyperparams`...). They live in modopt.combinators, a layer above both packages (which
# may not import it): they are set on them here, once all three are imported.
for _namespace in (transforms, schedules):
    for _name in _namespace._FROM_COMBINATORS:
        setattr(_namespace, _name, getattr(combinators, _name))
del _namespace, _name

__version__ = "0.1.0"

_NAMESPACES = ("contrib", "experimental", "trax", "losses", "linalg", "second_order", "monte_carlo", "projections",
               "perturbations", "assignment", "microbatching", "tree", "tree_utils", "sharding")  # fmt: skip


def __getattr__(name: str):
    """A name missing at the top level but public in a namespace (`modopt.muon`, which is
    `modopt.contrib.muon` as in optax) is an error that says where it is."""
    found = [f"modopt.{space}.{name}" for space in _NAMESPACES if not name.startswith("_") and name in vars(globals()[space])]
    where = f"; it is {' and '.join(found)}" if found else ""
    raise AttributeError(f"module 'modopt' has no attribute {name!r}{where}")
