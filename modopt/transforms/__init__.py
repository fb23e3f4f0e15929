"""Gradient transformations, one family per file."""

from .._core.masking import MaskedNode as MaskedNode
from .._core.masking import MaskedState as MaskedState
from ._accumulation import Ema as Ema
from ._accumulation import EmaState as EmaState
from ._accumulation import Trace as Trace
from ._accumulation import TraceState as TraceState
from ._accumulation import ema as ema
from ._accumulation import trace as trace
from ._adam import ScaleByAdam as ScaleByAdam
from ._adam import ScaleByAdamax as ScaleByAdamax
from ._adam import ScaleByAdamState as ScaleByAdamState
from ._adam import ScaleByAmsgrad as ScaleByAmsgrad
from ._adam import ScaleByAmsgradState as ScaleByAmsgradState
from ._adam import scale_by_adam as scale_by_adam
from ._adam import scale_by_adamax as scale_by_adamax
from ._adam import scale_by_amsgrad as scale_by_amsgrad
from ._adam_mini import AdamMiniHeads as AdamMiniHeads
from ._adam_mini import ScaleByAdamMini as ScaleByAdamMini
from ._adam_mini import ScaleByAdamMiniState as ScaleByAdamMiniState
from ._adam_mini import scale_by_adam_mini as scale_by_adam_mini
from ._adam_variants import ScaleByAdan as ScaleByAdan
from ._adam_variants import ScaleByAdanState as ScaleByAdanState
from ._adam_variants import ScaleByBelief as ScaleByBelief
from ._adam_variants import ScaleByBeliefState as ScaleByBeliefState
from ._adam_variants import ScaleByRadam as ScaleByRadam
from ._adam_variants import ScaleByYogi as ScaleByYogi
from ._adam_variants import scale_by_adan as scale_by_adan
from ._adam_variants import scale_by_belief as scale_by_belief
from ._adam_variants import scale_by_radam as scale_by_radam
from ._adam_variants import scale_by_yogi as scale_by_yogi
from ._cautious_weight_decay import AddCautiousDecayedWeights as AddCautiousDecayedWeights
from ._cautious_weight_decay import add_cautious_decayed_weights as add_cautious_decayed_weights
from ._clipping import AdaptiveGradClip as AdaptiveGradClip
from ._clipping import AdaptiveGradClipState as AdaptiveGradClipState
from ._clipping import Clip as Clip
from ._clipping import ClipByBlockRms as ClipByBlockRms
from ._clipping import ClipByGlobalNorm as ClipByGlobalNorm
from ._clipping import ClipByGlobalNormState as ClipByGlobalNormState
from ._clipping import ClipState as ClipState
from ._clipping import adaptive_grad_clip as adaptive_grad_clip
from ._clipping import clip as clip
from ._clipping import clip_by_block_rms as clip_by_block_rms
from ._clipping import clip_by_global_norm as clip_by_global_norm
from ._clipping import per_example_global_norm_clip as per_example_global_norm_clip
from ._clipping import per_example_layer_norm_clip as per_example_layer_norm_clip
from ._clipping import unitwise_clip as unitwise_clip
from ._clipping import unitwise_norm as unitwise_norm
from ._constraints import KeepParamsNonnegative as KeepParamsNonnegative
from ._constraints import NonNegativeParamsState as NonNegativeParamsState
from ._constraints import ZeroNans as ZeroNans
from ._constraints import ZeroNansState as ZeroNansState
from ._constraints import keep_params_nonnegative as keep_params_nonnegative
from ._constraints import zero_nans as zero_nans
from ._distance_over_gradients import ScaleByDistanceOverGradients as ScaleByDistanceOverGradients
from ._distance_over_gradients import ScaleByDistanceOverGradientsState as ScaleByDistanceOverGradientsState
from ._distance_over_gradients import scale_by_distance_over_gradients as scale_by_distance_over_gradients
from ._factored import FactoredState as FactoredState
from ._factored import ScaleByFactoredRms as ScaleByFactoredRms
from ._factored import scale_by_factored_rms as scale_by_factored_rms
from ._layerwise import Centralize as Centralize
from ._layerwise import NormalizeByUpdateNorm as NormalizeByUpdateNorm
from ._layerwise import ScaleBySign as ScaleBySign
from ._layerwise import ScaleByTrustRatio as ScaleByTrustRatio
from ._layerwise import ScaleByTrustRatioState as ScaleByTrustRatioState
from ._layerwise import centralize as centralize
from ._layerwise import normalize_by_update_norm as normalize_by_update_norm
from ._layerwise import scale_by_sign as scale_by_sign
from ._layerwise import scale_by_trust_ratio as scale_by_trust_ratio
from ._kron import PrecondUpdateProbSchedule as PrecondUpdateProbSchedule
from ._kron import ScaleByKron as ScaleByKron
from ._kron import ScaleByKronState as ScaleByKronState
from ._kron import precond_update_prob_schedule as precond_update_prob_schedule
from ._kron import scale_by_kron as scale_by_kron
from ._laprop import ScaleByLaprop as ScaleByLaprop
from ._laprop import ScaleByLapropState as ScaleByLapropState
from ._laprop import scale_by_laprop as scale_by_laprop
from ._lbfgs import ScaleByLBFGS as ScaleByLBFGS
from ._lbfgs import ScaleByLBFGSState as ScaleByLBFGSState
from ._lbfgs import scale_by_lbfgs as scale_by_lbfgs
from ._linesearch import BacktrackingLinesearchInfo as BacktrackingLinesearchInfo
from ._linesearch import ScaleByBacktrackingLinesearch as ScaleByBacktrackingLinesearch
from ._linesearch import ScaleByBacktrackingLinesearchState as ScaleByBacktrackingLinesearchState
from ._linesearch import scale_by_backtracking_linesearch as scale_by_backtracking_linesearch
from ._lion import ScaleByLion as ScaleByLion
from ._lion import ScaleByLionState as ScaleByLionState
from ._lion import scale_by_lion as scale_by_lion
from ._muon_variants import ScaleByAdaMuon as ScaleByAdaMuon
from ._muon_variants import ScaleByAdaMuonState as ScaleByAdaMuonState
from ._muon_variants import ScaleByNorMuon as ScaleByNorMuon
from ._muon_variants import ScaleByNorMuonState as ScaleByNorMuonState
from ._muon_variants import scale_by_adamuon as scale_by_adamuon
from ._muon_variants import scale_by_normuon as scale_by_normuon
from ._mars import ScaleByMars as ScaleByMars
from ._mars import ScaleByMarsState as ScaleByMarsState
from ._mars import scale_by_mars as scale_by_mars
from ._noise import AddNoise as AddNoise
from ._noise import AddNoiseState as AddNoiseState
from ._noise import add_noise as add_noise
from ._novograd import ScaleByNovograd as ScaleByNovograd
from ._novograd import ScaleByNovogradState as ScaleByNovogradState
from ._novograd import scale_by_novograd as scale_by_novograd
from ._optimistic import ScaleByOptimisticGradient as ScaleByOptimisticGradient
from ._optimistic import ScaleByOptimisticGradientState as ScaleByOptimisticGradientState
from ._optimistic import scale_by_optimistic_gradient as scale_by_optimistic_gradient
from ._polyak import ScaleByPolyak as ScaleByPolyak
from ._polyak import scale_by_polyak as scale_by_polyak
from ._privacy import DifferentiallyPrivateAggregate as DifferentiallyPrivateAggregate
from ._privacy import DifferentiallyPrivateAggregateState as DifferentiallyPrivateAggregateState
from ._privacy import differentially_private_aggregate as differentially_private_aggregate
from ._rms import ScaleByAdadelta as ScaleByAdadelta
from ._rms import ScaleByAdaDeltaState as ScaleByAdaDeltaState
from ._rms import ScaleByRms as ScaleByRms
from ._rms import ScaleByRmsState as ScaleByRmsState
from ._rms import ScaleByRmsWithCountState as ScaleByRmsWithCountState
from ._rms import ScaleByRss as ScaleByRss
from ._rms import ScaleByRssState as ScaleByRssState
from ._rms import ScaleByRStdDevState as ScaleByRStdDevState
from ._rms import ScaleByRStdDevWithCountState as ScaleByRStdDevWithCountState
from ._rms import ScaleByStddev as ScaleByStddev
from ._rms import scale_by_adadelta as scale_by_adadelta
from ._rms import scale_by_rms as scale_by_rms
from ._rms import scale_by_rss as scale_by_rss
from ._rms import scale_by_stddev as scale_by_stddev
from ._rprop import ScaleByRprop as ScaleByRprop
from ._rprop import ScaleByRpropState as ScaleByRpropState
from ._rprop import scale_by_rprop as scale_by_rprop
from ._scale import Scale as Scale
from ._scale import ScaleByLearningRate as ScaleByLearningRate
from ._scale import ScaleByParamBlockNorm as ScaleByParamBlockNorm
from ._scale import ScaleByParamBlockRms as ScaleByParamBlockRms
from ._scale import ScaleBySchedule as ScaleBySchedule
from ._scale import ScaleByScheduleState as ScaleByScheduleState
from ._scale import ScaleState as ScaleState
from ._scale import scale as scale
from ._scale import scale_by_learning_rate as scale_by_learning_rate
from ._scale import scale_by_param_block_norm as scale_by_param_block_norm
from ._scale import scale_by_param_block_rms as scale_by_param_block_rms
from ._scale import scale_by_schedule as scale_by_schedule
from ._shampoo import ScaleByShampoo as ScaleByShampoo
from ._shampoo import ScaleByShampooState as ScaleByShampooState
from ._shampoo import scale_by_shampoo as scale_by_shampoo
from ._soap import ScaleBySoap as ScaleBySoap
from ._soap import ScaleBySoapState as ScaleBySoapState
from ._soap import scale_by_soap as scale_by_soap
from ._sm3 import ScaleBySM3 as ScaleBySM3
from ._sm3 import ScaleBySM3State as ScaleBySM3State
from ._sm3 import scale_by_sm3 as scale_by_sm3
from ._stateless import Identity as Identity
from ._stateless import SetToZero as SetToZero
from ._stateless import Stateless as Stateless
from ._stateless import StatelessWithTreeMap as StatelessWithTreeMap
from ._stateless import identity as identity
from ._stateless import set_to_zero as set_to_zero
from ._stateless import stateless as stateless
from ._stateless import stateless_with_tree_map as stateless_with_tree_map
from ._weight_decay import AddDecayedWeights as AddDecayedWeights
from ._weight_decay import AddDecayedWeightsState as AddDecayedWeightsState
from ._weight_decay import WeightDecaySchedule as WeightDecaySchedule
from ._weight_decay import add_decayed_weights as add_decayed_weights
from ._zoom import ScaleByZoomLinesearch as ScaleByZoomLinesearch
from ._zoom import ScaleByZoomLinesearchState as ScaleByZoomLinesearchState
from ._zoom import ZoomLinesearchInfo as ZoomLinesearchInfo
from ._zoom import scale_by_zoom_linesearch as scale_by_zoom_linesearch

# optax.transforms also exports its combinators. modopt's live in modopt.combinators, a layer
# above this package (see docs/development.md): modopt/__init__.py sets these names here once it
# has imported both. The state types of `masked` are defined below both, with its core.
_FROM_COMBINATORS = frozenset(
    {
        "ApplyIfFiniteState",
        "ConditionFn",
        "ConditionallyMaskState",
        "ConditionallyTransformState",
        "MonitorState",
        "MultiSteps",
        "MultiStepsState",
        "PartitionState",
        "ShouldSkipUpdateFunction",
        "SnapshotState",
        "apply_if_finite",
        "chain",
        "conditionally_mask",
        "conditionally_transform",
        "flatten",
        "freeze",
        "masked",
        "measure_with_ema",
        "monitor",
        "named_chain",
        "partition",
        "selective_transform",
        "skip_large_updates",
        "skip_not_finite",
        "snapshot",
    }
)
