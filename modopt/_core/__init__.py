"""The transform protocol: what every transform is made of.

`module` (the `Module` every transform and schedule is), `fields` (hyperparameters and static
fields, their checks), `types` (`Params`, `Updates`, `OptState`), `checks` (path-aware checks of
gradients and states), `specs` (partition specs of state), `extra_args` (the extra arguments a
transform's `update` reads), `base` (`AbstractTransform` and the optax protocol), `declared` (the
extra arguments of a composition), `masks` (the type of a `mask` field, `weight_decay_mask`) and
`masking` (running a transform under a mask: the core of `masked`).
"""
