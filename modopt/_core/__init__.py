"""The transform protocol: what every transform is made of.

`module` (the `Module` every transform and schedule is), `fields` (hyperparameters and static
fields, their checks), `types` (`Params`, `Updates`, `OptState`), `checks` (path-aware checks of
gradients and states), `specs` (partition specs of state), `extra_args` (the extra arguments of
`update`), `base` (`AbstractTransform` and the optax protocol), `declared` (the extra arguments
of a composition) and `masks` (a transform's `mask`, and running a transform under one).
"""
