"""Sharding an optimizer's state on a mesh, for `jax.jit`-sharded training.

`shardings(optimizer, model_shardings)` derives the `NamedSharding` of every leaf of an
optimizer from the model's shardings, for any composition of transforms; `zero_axis=`
adds ZeRO-1. `bytes_per_device` plans memory from abstract values. Transforms declare how
their state is laid out in `state_specs` (see `modopt.AbstractTransform`), with the helpers
below for writing such rules.
"""

from .._core.specs import REPLICATED as REPLICATED
from .._core.specs import OWNED as OWNED
from .._core.specs import OWNED_ELEMENTWISE as OWNED_ELEMENTWISE
from .._core.specs import NoRule as NoRule
from .._core.specs import drop_axis as drop_axis
from .._core.specs import follow_params as follow_params
from ._cost import Collective as Collective
from ._cost import CompiledCost as CompiledCost
from ._cost import compiled_cost as compiled_cost
from ._owners import LeafUnits as LeafUnits
from ._owners import UnitMap as UnitMap
from ._owners import UnitStacks as UnitStacks
from ._owners import current_mesh as current_mesh
from ._owners import owner_mesh as owner_mesh
from ._owners import owner_spec as owner_spec
from ._owners import padded_length as padded_length
from ._owners import run_per_unit as run_per_unit
from ._owners import spec_of as spec_of
from ._owners import specs_of as specs_of
from ._owners import spread_spec as spread_spec
from ._shardings import Layout as Layout
from ._shardings import bytes_per_device as bytes_per_device
from ._shardings import shardings as shardings
from ._shardings import split_further as split_further
from ._shardings import unpadded as unpadded
