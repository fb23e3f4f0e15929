"""Experimental transforms, with optax's `experimental` names.

`split_real_and_imaginary` runs a real transform on complex parameters, part by part;
`aggregating` holds the transforms that aggregate per-element gradients (optax 0.2.8's
`optax.experimental.aggregating`).
"""

from ._complex import RealAndImaginary as RealAndImaginary
from ._complex import SplitRealAndImaginary as SplitRealAndImaginary
from ._complex import SplitRealAndImaginaryState as SplitRealAndImaginaryState
from ._complex import split_real_and_imaginary as split_real_and_imaginary
from . import aggregating as aggregating
