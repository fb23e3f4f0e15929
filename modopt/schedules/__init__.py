"""Schedules: modules mapping a step count to a hyperparameter value."""

from ._base import AbstractSchedule as AbstractSchedule
from ._base import FunctionSchedule as FunctionSchedule
from ._base import MappedSchedule as MappedSchedule
from ._base import ScalarOrSchedule as ScalarOrSchedule
from ._base import Schedule as Schedule
from ._base import as_schedule as as_schedule
from ._base import scalar_or_schedule as scalar_or_schedule
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
from ._schedules import warmup_cosine_decay_schedule as warmup_cosine_decay_schedule

# Wrappers (apply_every, apply_if_finite, MultiSteps, lookahead, conditional transforms).

# Monitoring and selection (flatten, freeze, selective_transform, monitor, snapshot, measure_with_ema, scale_gradient).

# Line searches and L-BFGS.

# Schedules.
