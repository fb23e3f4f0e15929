"""Contributed transforms: algorithms from recent papers, with optax's `contrib` names.

`mechanize` wraps any optimizer and learns the scale of its updates (Mechanic).
`split_real_and_imaginary` lives in `modopt.experimental` (as in the seeds); it is also
here because optax 0.2.8 has it in `optax.contrib`.
"""

from ..experimental import SplitRealAndImaginaryState as SplitRealAndImaginaryState
from ..experimental import split_real_and_imaginary as split_real_and_imaginary
from ._acprop import Acprop as Acprop
from ._acprop import ScaleByAcprop as ScaleByAcprop
from ._acprop import acprop as acprop
from ._acprop import scale_by_acprop as scale_by_acprop
from ._ademamix import Ademamix as Ademamix
from ._ademamix import ScaleByAdemamix as ScaleByAdemamix
from ._ademamix import ScaleByAdemamixState as ScaleByAdemamixState
from ._ademamix import ScaleBySimplifiedAdEMAMix as ScaleBySimplifiedAdEMAMix
from ._ademamix import ScaleBySimplifiedAdEMAMixState as ScaleBySimplifiedAdEMAMixState
from ._ademamix import ademamix as ademamix
from ._ademamix import scale_by_ademamix as scale_by_ademamix
from ._ademamix import scale_by_simplified_ademamix as scale_by_simplified_ademamix
from ._ademamix import SimplifiedAdEMAMix as SimplifiedAdEMAMix
from ._ademamix import simplified_ademamix as simplified_ademamix
from ._cocob import COCOBState as COCOBState
from ._cocob import Cocob as Cocob
from ._cocob import ScaleByCocob as ScaleByCocob
from ._cocob import cocob as cocob
from ._cocob import scale_by_cocob as scale_by_cocob
from ._dog import DoGState as DoGState
from ._dog import Dog as Dog
from ._dog import Dowg as Dowg
from ._dog import DoWGState as DoWGState
from ._dog import ScaleByDoG as ScaleByDoG
from ._dog import ScaleByDoWG as ScaleByDoWG
from ._dog import dog as dog
from ._dog import dowg as dowg
from ._mechanic import MechanicState as MechanicState
from ._mechanic import Mechanize as Mechanize
from ._mechanic import mechanize as mechanize
from ._dadapt import DAdaptAdamW as DAdaptAdamW
from ._dadapt import DAdaptAdamWState as DAdaptAdamWState
from ._dadapt import Prodigy as Prodigy
from ._dadapt import ProdigyState as ProdigyState
from ._dadapt import dadapt_adamw as dadapt_adamw
from ._dadapt import prodigy as prodigy
from ._momo import Momo as Momo
from ._momo import MomoAdam as MomoAdam
from ._momo import MomoAdamState as MomoAdamState
from ._momo import MomoState as MomoState
from ._momo import momo as momo
from ._momo import momo_adam as momo_adam
from ._schedule_free import ScheduleFree as ScheduleFree
from ._schedule_free import ScheduleFreeAdamW as ScheduleFreeAdamW
from ._schedule_free import ScheduleFreeSgd as ScheduleFreeSgd
from ._schedule_free import ScheduleFreeState as ScheduleFreeState
from ._schedule_free import schedule_free as schedule_free
from ._schedule_free import schedule_free_adamw as schedule_free_adamw
from ._schedule_free import schedule_free_eval_params as schedule_free_eval_params
from ._schedule_free import schedule_free_sgd as schedule_free_sgd
from ._galore import GaLoreDimensionNumbers as GaLoreDimensionNumbers
from ._galore import GaLoreState as GaLoreState
from ._galore import Galore as Galore
from ._galore import ScaleByGalore as ScaleByGalore
from ._galore import galore as galore
from ._galore import scale_by_galore as scale_by_galore
from ._reduce_on_plateau import ReduceLROnPlateauState as ReduceLROnPlateauState
from ._reduce_on_plateau import ReduceOnPlateau as ReduceOnPlateau
from ._reduce_on_plateau import reduce_on_plateau as reduce_on_plateau
from ._sam import Normalize as Normalize
from ._sam import NormalizeState as NormalizeState
from ._sam import Sam as Sam
from ._sam import SAMState as SAMState
from ._sam import normalize as normalize
from ._sam import sam as sam
from ._sophia import HutchinsonEstimatorDiagHessian as HutchinsonEstimatorDiagHessian
from ._sophia import HutchinsonState as HutchinsonState
from ._sophia import Sophia as Sophia
from ._sophia import SophiaState as SophiaState
from ._sophia import hutchinson_estimator_diag_hessian as hutchinson_estimator_diag_hessian
from ._sophia import sophia as sophia
# Differential privacy lives in modopt's optimizers and transforms; optax 0.2.8 also has it here.
from ..optimizers import dpsgd as dpsgd
from ..transforms import DifferentiallyPrivateAggregateState as DifferentiallyPrivateAggregateState
from ..transforms import differentially_private_aggregate as differentially_private_aggregate
