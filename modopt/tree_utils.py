"""`modopt.tree`'s functions by optax's `tree_utils` names (`tree_add`, `tree_get`, ...).

Each name is the same function as in `modopt.tree` (`tree_utils.tree_norm is tree.norm`), for
code written against `optax.tree_utils`. The names optax deprecated (`tree_scalar_mul`,
`tree_add_scalar_mul`, `tree_l1_norm`, `tree_l2_norm`, `tree_linf_norm`) still resolve, with a
`DeprecationWarning` naming the replacement, as in optax 0.2.8.
"""

import functools as _functools
import warnings as _warnings

from . import tree as _tree
from .tree._state import NamedTupleKey as NamedTupleKey

tree_add = _tree.add
tree_add_scale = _tree.add_scale
tree_allclose = _tree.allclose
tree_batch_shape = _tree.batch_shape
tree_bias_correction = _tree.bias_correction
tree_cast = _tree.cast
tree_cast_like = _tree.cast_like
tree_clip = _tree.clip
tree_conj = _tree.conj
tree_div = _tree.div
tree_dtype = _tree.dtype
tree_full_like = _tree.full_like
tree_get = _tree.get
tree_get_all_with_path = _tree.get_all_with_path
tree_map_params = _tree.map_params
tree_max = _tree.max
tree_min = _tree.min
tree_mul = _tree.mul
tree_norm = _tree.norm
tree_ones_like = _tree.ones_like
tree_random_like = _tree.random_like
tree_real = _tree.real
tree_scale = _tree.scale
tree_set = _tree.set
tree_size = _tree.size
tree_split_key_like = _tree.split_key_like
tree_sub = _tree.sub
tree_sum = _tree.sum
tree_unwrap_random_key_data = _tree.unwrap_random_key_data
tree_update_infinity_moment = _tree.update_infinity_moment
tree_update_moment = _tree.update_moment
tree_update_moment_per_elem_norm = _tree.update_moment_per_elem_norm
tree_vdot = _tree.vdot
tree_where = _tree.where
tree_zeros_like = _tree.zeros_like

_DEPRECATED = {
    "tree_scalar_mul": ("tree_scale", _tree.scale),
    "tree_add_scalar_mul": ("tree_add_scale", _tree.add_scale),
    "tree_l1_norm": ("tree_norm(..., ord=1)", _functools.partial(_tree.norm, ord=1)),
    "tree_l2_norm": ("tree_norm", _functools.partial(_tree.norm, ord=2)),
    "tree_linf_norm": ("tree_norm(..., ord='inf')", _functools.partial(_tree.norm, ord="inf")),
}


def __getattr__(name):
    if name in _DEPRECATED:
        replacement, value = _DEPRECATED[name]
        _warnings.warn(
            f"modopt.tree_utils.{name} is deprecated (as in optax): use modopt.tree_utils.{replacement}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return value
    raise AttributeError(f"module 'modopt.tree_utils' has no attribute {name!r}")
