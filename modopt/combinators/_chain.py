"""Sequencing transforms: `chain` and `named_chain`."""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Any

from .._core.base import AbstractTransform, Part, as_transform, parts_act_elementwise
from .._core.fields import static


class Chain(AbstractTransform):
    """Applies `transforms` in order; the state is the tuple of their states."""

    transforms: tuple[AbstractTransform, ...]

    def __init__(self, *transforms: Any):
        self.transforms = tuple(as_transform(t, f"chain argument {i}") for i, t in enumerate(transforms))

    def init(self, params):
        return tuple(t.init(params) for t in self.transforms)

    def update(self, updates, state, params=None, **extra_args):
        _check_length(state, len(self.transforms), "chain")
        new_state = []
        for transform, inner in zip(self.transforms, state):
            updates, inner = transform.update(updates, inner, params, **extra_args)
            new_state.append(inner)
        return updates, tuple(new_state)

    def state_specs(self, params, param_specs):
        return tuple(t.state_specs(params, param_specs) for t in self.transforms)

    def parts(self):
        return tuple(Part(f"[{i}]", t, operator.itemgetter(i)) for i, t in enumerate(self.transforms))

    def acts_elementwise(self) -> bool:
        return parts_act_elementwise(self)


class NamedChain(AbstractTransform):
    """Like `Chain`, with each transform named; the state is an ordered dict by name."""

    names: tuple[str, ...] = static()
    transforms: tuple[AbstractTransform, ...]

    def __init__(self, *named: tuple[str, Any]):
        names = tuple(name for name, _ in named)
        if len(set(names)) != len(names):
            raise ValueError(f"named_chain needs unique names, got {list(names)}.")
        self.names = names
        self.transforms = tuple(as_transform(t, f"named_chain entry {name!r}") for name, t in named)

    def init(self, params):
        return OrderedDict((name, t.init(params)) for name, t in zip(self.names, self.transforms))

    def update(self, updates, state, params=None, **extra_args):
        found = list(state.keys()) if isinstance(state, dict) else type(state).__name__
        if found != list(self.names):
            raise ValueError(
                f"named_chain state has entries {found}, expected {list(self.names)}: was the state "
                "made by this transform's init?"
            )
        new_state = OrderedDict()
        for name, transform in zip(self.names, self.transforms):
            updates, new_state[name] = transform.update(updates, state[name], params, **extra_args)
        return updates, new_state

    def state_specs(self, params, param_specs):
        return OrderedDict((name, t.state_specs(params, param_specs)) for name, t in zip(self.names, self.transforms))

    def parts(self):
        return tuple(Part(f"[{name!r}]", t, operator.itemgetter(name)) for name, t in zip(self.names, self.transforms))

    def acts_elementwise(self) -> bool:
        return parts_act_elementwise(self)


def _check_length(state: Any, expected: int, where: str) -> None:
    if not isinstance(state, tuple) or len(state) != expected:
        found = f"{len(state)} entries" if isinstance(state, tuple) else f"a {type(state).__name__}"
        raise ValueError(
            f"{where} of {expected} transforms got a state with {found}: was the state made by "
            "this transform's init?"
        )


chain = Chain
named_chain = NamedChain
