"""The step machinery: `Optimizer` and what stepping a model with it takes.

`optimizer` (`Optimizer`: transform, state and step count, `step(model, grads)`),
`hyperparameters` (reading and setting hyperparameters by name), `grouping` (small leaves
stepped as flat buffers), `layouts` (weight layouts read off the model's layers), `jit_step`
(a cheap jitted training step) and `value_and_grad` (`value_and_grad_from_state`).
"""
