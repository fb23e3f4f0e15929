"""trax's optimizers with trax's semantics: `modopt.trax`.

`SGD`, `Momentum`, `RMSProp`, `Adam`, `Adafactor` and `SM3` take trax 1.4.1's constructor
arguments and defaults, and offer trax's API (`tree_init`, `tree_update`, `slots`,
`opt_params`; per weight `weight_init` and `weight_update`) with trax's numbers, slot layout
and return values. Each is also a modopt transform, so `modopt.Optimizer`, the Flax adapters,
`modopt.sharding` and Orbax take it as they take `modopt.adam`.

Where trax's math is optax's, they are built from modopt's transforms; where it differs,
from the transforms here (`ScaleByTraxFactoredRms`, `StoredEma`, `WeightDecayRamp`,
`ScaleByTraxSM3`). The main differences from modopt's optax-style optimizers: the caller
passes the step to `tree_update`; weight decay is on by default in `Adam`, `Momentum` and
`Adafactor` and is not multiplied by the learning rate; `RMSProp`'s accumulator starts at 1
with `eps` outside the square root; `Adafactor` factors over the last two axes; `SM3` has
momentum types and grafting. See the training guide's "trax optimizers" section (docs/guides/training.md).

`modopt.trax.Optimizer` is trax's base class; `modopt.Optimizer` is modopt's optimizer module.
"""

from ._adafactor import Adafactor as Adafactor
from ._adafactor import ScaleByTraxFactoredRms as ScaleByTraxFactoredRms
from ._adafactor import StoredEma as StoredEma
from ._adafactor import StoredEmaState as StoredEmaState
from ._adafactor import TraxFactoredState as TraxFactoredState
from ._adafactor import WeightDecayRamp as WeightDecayRamp
from ._adaptive import Adam as Adam
from ._adaptive import RMSProp as RMSProp
from ._base import Optimizer as Optimizer
from ._base import TraxSide as TraxSide
from ._base import weight_decay_after_learning_rate as weight_decay_after_learning_rate
from ._sgd import SGD as SGD
from ._sgd import Momentum as Momentum
from ._sm3 import SM3 as SM3
from ._sm3 import MomentumType as MomentumType
from ._sm3 import ScaleByTraxSM3 as ScaleByTraxSM3
from ._sm3 import TraxSM3State as TraxSM3State
from ._tree import clip_grads as clip_grads
from ._tree import l2_norm as l2_norm
