"""Combinators: transforms built from other transforms."""

from ._chain import Chain as Chain
from ._chain import NamedChain as NamedChain
from ._chain import chain as chain
from ._chain import named_chain as named_chain
from ._masked import Masked as Masked
from ._masked import MaskedNode as MaskedNode
from ._masked import MaskedState as MaskedState
from ._masked import masked as masked
from ._partition import Partition as Partition
from ._partition import PartitionState as PartitionState
from ._partition import multi_transform as multi_transform
from ._partition import partition as partition

# Wrappers (apply_every, apply_if_finite, MultiSteps, lookahead, conditional transforms).

# Monitoring and selection (flatten, freeze, selective_transform, monitor, snapshot, measure_with_ema, scale_gradient).
