"""Pytree utilities in optax's names (`optax.tree`): arithmetic, norms, casts, random trees, and
finding, replacing and mapping values in optimizer states.

`modopt.tree.get(state, "count")`, `modopt.tree.set(state, learning_rate=...)` and
`modopt.tree.map_params(tx, f, state, ...)` work on modopt's states (NamedTuples, Equinox
modules such as `modopt.Optimizer`, masked and partitioned states, grouped ones) as on
optax's. The same functions go by optax's older names in `modopt.tree_utils` (`tree_add`...).
"""

from ._casting import cast as cast
from ._casting import cast_like as cast_like
from ._casting import dtype as dtype
from ._math import add as add
from ._math import add_scale as add_scale
from ._math import allclose as allclose
from ._math import batch_shape as batch_shape
from ._math import bias_correction as bias_correction
from ._math import clip as clip
from ._math import conj as conj
from ._math import div as div
from ._math import full_like as full_like
from ._math import max as max  # noqa: A004
from ._math import min as min  # noqa: A004
from ._math import mul as mul
from ._math import norm as norm
from ._math import ones_like as ones_like
from ._math import real as real
from ._math import scale as scale
from ._math import size as size
from ._math import sub as sub
from ._math import sum as sum  # noqa: A004
from ._math import update_infinity_moment as update_infinity_moment
from ._math import update_moment as update_moment
from ._math import update_moment_per_elem_norm as update_moment_per_elem_norm
from ._math import vdot as vdot
from ._math import where as where
from ._math import zeros_like as zeros_like
from ._random import random_like as random_like
from ._random import split_key_like as split_key_like
from ._random import unwrap_random_key_data as unwrap_random_key_data
from ._state import get as get
from ._state import get_all_with_path as get_all_with_path
from ._state import map_params as map_params
from ._state import set as set  # noqa: A004
