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
