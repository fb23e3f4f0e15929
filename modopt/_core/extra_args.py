"""Extra arguments of `update`: what a transform declares it reads, and reading one.

optax's `update(updates, state, params, **extra_args)` passes keyword arguments (the loss
`value`, a `value_fn`...) to every transform of a chain. Here a transform declares the ones it
reads in `extra_args_spec` (a tuple of `ExtraArg`), and reads one with `extra_arg`, whose error
says what to pass. What a whole composition reads is found by `modopt._core.declared`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class ExtraArg(NamedTuple):
    """An extra argument a transform's `update` reads.

    name: the keyword, e.g. `"value"`.
    description: what to pass, e.g. `"the loss at the current parameters"`.
    required: whether `update` fails without it.
    of_params: the argument is a function of the parameters (e.g. `value_fn`). `Optimizer.step`
        takes a function of the whole model instead and adapts it.
    like_params: the argument is a tree shaped like the parameters (e.g. the gradient
        `grad`). `Optimizer.step` takes one shaped like the model and keeps its trained leaves.
    """

    name: str
    description: str
    required: bool = True
    of_params: bool = False
    like_params: bool = False


def extra_arg(extra_args: Mapping[str, Any], name: str, owner: Any) -> Any:
    """`extra_args[name]` for `owner.update`, or a `TypeError` saying what to pass.

    Args:
        extra_args: the `**extra_args` that `update` received.
        name: the name of the extra argument to read.
        owner: the transform reading it, named in the error (its `extra_args_spec` describes the
            argument).
    """
    if name in extra_args:
        return extra_args[name]
    spec = next((s for s in type(owner).extra_args_spec if s.name == name), None)
    what = f" ({spec.description})" if spec else ""
    raise TypeError(
        f"{type(owner).__name__}.update needs the extra argument `{name}`{what}: call "
        f"`update(updates, state, params, {name}=...)` or `optimizer.step(model, grads, {name}=...)`. "
        "Inside `optax.chain`, which passes extra arguments only to `optax.GradientTransformationExtraArgs`, "
        "wrap the modopt transform as `optax.GradientTransformationExtraArgs(*tx)`."
    )
