"""Contributed transforms: algorithms from recent papers, with optax's `contrib` names.

`mechanize` wraps any optimizer and learns the scale of its updates (Mechanic).
`split_real_and_imaginary` lives in `modopt.experimental` (as in the seeds); it is also
here because optax 0.2.8 has it in `optax.contrib`.
"""

from ..experimental import SplitRealAndImaginaryState as SplitRealAndImaginaryState
from ..experimental import split_real_and_imaginary as split_real_and_imaginary
from ._mechanic import MechanicState as MechanicState
from ._mechanic import Mechanize as Mechanize
from ._mechanic import mechanize as mechanize
