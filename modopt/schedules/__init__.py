"""Schedules: modules mapping a step count to a hyperparameter value."""

from ._base import AbstractSchedule as AbstractSchedule
from ._base import FunctionSchedule as FunctionSchedule
from ._base import MappedSchedule as MappedSchedule
from ._base import ScalarOrSchedule as ScalarOrSchedule
from ._base import Schedule as Schedule
from ._base import as_schedule as as_schedule
from ._base import scalar_or_schedule as scalar_or_schedule
from ._cyclic import cosine_onecycle_schedule as cosine_onecycle_schedule
from ._cyclic import linear_onecycle_schedule as linear_onecycle_schedule
from ._cyclic import sgdr_schedule as sgdr_schedule
from ._exponential import ExponentialDecaySchedule as ExponentialDecaySchedule
from ._exponential import WarmupExponentialDecaySchedule as WarmupExponentialDecaySchedule
from ._exponential import exponential_decay as exponential_decay
from ._exponential import warmup_exponential_decay_schedule as warmup_exponential_decay_schedule
from ._piecewise import PiecewiseConstantSchedule as PiecewiseConstantSchedule
from ._piecewise import PiecewiseInterpolateSchedule as PiecewiseInterpolateSchedule
from ._piecewise import piecewise_constant_schedule as piecewise_constant_schedule
from ._piecewise import piecewise_interpolate_schedule as piecewise_interpolate_schedule
from ._piecewise import piecewise_linear_schedule as piecewise_linear_schedule
from ._schedules import ConstantSchedule as ConstantSchedule
from ._schedules import CosineDecaySchedule as CosineDecaySchedule
from ._schedules import JoinSchedules as JoinSchedules
from ._schedules import PolynomialSchedule as PolynomialSchedule
from ._schedules import WarmupCosineDecaySchedule as WarmupCosineDecaySchedule
from ._schedules import constant_schedule as constant_schedule
from ._schedules import cosine_decay_schedule as cosine_decay_schedule
from ._schedules import join_schedules as join_schedules
from ._schedules import linear_schedule as linear_schedule
from ._schedules import polynomial_schedule as polynomial_schedule
from ._schedules import warmup_constant_schedule as warmup_constant_schedule
from ._schedules import warmup_cosine_decay_schedule as warmup_cosine_decay_schedule
from ._stateful import StatefulSchedule as StatefulSchedule
from ._stateful import WrappedSchedule as WrappedSchedule
from ._stateful import WrappedScheduleState as WrappedScheduleState

# optax.schedules also exports `inject_hyperparams` and its kin. modopt's live in
# modopt.combinators, a layer above this package (see docs/development.md): modopt/__init__.py
# sets these names here once it has imported both.
_FROM_COMBINATORS = frozenset(
    {"InjectHyperparamsState", "InjectStatefulHyperparamsState", "inject_hyperparams", "inject_stateful_hyperparams"}
)
