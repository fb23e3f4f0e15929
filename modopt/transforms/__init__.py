"""Gradient transformations, one family per file."""

from ._accumulation import Ema as Ema
from ._accumulation import EmaState as EmaState
from ._accumulation import Trace as Trace
from ._accumulation import TraceState as TraceState
from ._accumulation import ema as ema
from ._accumulation import trace as trace
from ._adam import ScaleByAdam as ScaleByAdam
from ._adam import ScaleByAdamState as ScaleByAdamState
from ._adam import scale_by_adam as scale_by_adam
from ._clipping import Clip as Clip
from ._clipping import ClipByBlockRms as ClipByBlockRms
from ._clipping import ClipByGlobalNorm as ClipByGlobalNorm
from ._clipping import clip as clip
from ._clipping import clip_by_block_rms as clip_by_block_rms
from ._clipping import clip_by_global_norm as clip_by_global_norm
from ._factored import FactoredState as FactoredState
from ._factored import ScaleByFactoredRms as ScaleByFactoredRms
from ._factored import scale_by_factored_rms as scale_by_factored_rms
from ._scale import Scale as Scale
from ._scale import ScaleByLearningRate as ScaleByLearningRate
from ._scale import ScaleByParamBlockRms as ScaleByParamBlockRms
from ._scale import ScaleBySchedule as ScaleBySchedule
from ._scale import ScaleByScheduleState as ScaleByScheduleState
from ._scale import scale as scale
from ._scale import scale_by_learning_rate as scale_by_learning_rate
from ._scale import scale_by_param_block_rms as scale_by_param_block_rms
from ._scale import scale_by_schedule as scale_by_schedule
from ._stateless import Identity as Identity
from ._stateless import SetToZero as SetToZero
from ._stateless import Stateless as Stateless
from ._stateless import StatelessWithTreeMap as StatelessWithTreeMap
from ._stateless import identity as identity
from ._stateless import set_to_zero as set_to_zero
from ._stateless import stateless as stateless
from ._stateless import stateless_with_tree_map as stateless_with_tree_map
from ._weight_decay import AddDecayedWeights as AddDecayedWeights
from ._weight_decay import WeightDecaySchedule as WeightDecaySchedule
from ._weight_decay import add_decayed_weights as add_decayed_weights

# Adaptive family.

# Layer-wise, normalizing, clipping and constraining family.

# Special family (SM3, Rprop, Polyak, optimistic gradients, noise).
