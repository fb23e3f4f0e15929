"""The extra arguments a composition reads, merged over its parts, and checked at the call.

Each transform declares the extra arguments its `update` reads (`ExtraArg`, in
`extra_args_spec`). `declared_extra_args` merges them over a composition, so that
`Optimizer.step`, the Flax adapters and direct calls can say which argument is missing, for
which transform, before anything runs (`check_extra_args`), and can turn a function of the model
(`value_fn`) into the function of the parameters the transform needs (`adapt_to_params`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .base import AbstractComposite, AbstractTransform, FromOptax
from .extra_args import ExtraArg


class Declared(NamedTuple):
    """The extra arguments a composition reads: `name -> (ExtraArg, names of the transforms)`.

    `open` is True when some part (an optax transform taking `**extra_args`) may read
    arguments it does not declare.
    """

    args: dict[str, tuple[ExtraArg, tuple[str, ...]]]
    open: bool


def declared_extra_args(tx: Any) -> Declared:
    """Every extra argument read by `tx` or any transform inside it.

    Args:
        tx: a transform, possibly a composition of others.
    """
    args: dict[str, tuple[ExtraArg, tuple[str, ...]]] = {}
    is_open = False

    def add(spec: ExtraArg, owner: str) -> None:
        if spec.name in args:
            known, owners = args[spec.name]
            spec = spec._replace(required=spec.required or known.required)
            args[spec.name] = (spec, owners if owner in owners else owners + (owner,))
        else:
            args[spec.name] = (spec, (owner,))

    def visit(node: Any) -> None:
        nonlocal is_open
        if isinstance(node, FromOptax):
            specs, node_open = _optax_extra_args(node.tx)
            for spec in specs:
                add(spec, _name(node.tx))
            is_open |= node_open
        elif isinstance(node, AbstractTransform):
            for spec in type(node).extra_args_spec:
                add(spec, type(node).__name__)
            if isinstance(node, AbstractComposite):
                visit(node.build())
            else:
                for f in dataclasses.fields(node):
                    if not f.metadata.get("static", False):
                        visit(getattr(node, f.name))
        elif isinstance(node, (tuple, list)):
            for child in node:
                visit(child)
        elif isinstance(node, Mapping):
            for child in node.values():
                visit(child)

    visit(tx)
    return Declared(args, is_open)


def _name(tx: Any) -> str:
    return getattr(tx, "__name__", None) or type(tx).__name__


def _optax_extra_args(tx: Any) -> tuple[list[ExtraArg], bool]:
    """The keyword-only arguments of a foreign transform's `update`, and whether it takes `**kwargs`."""
    try:
        parameters = list(inspect.signature(tx.update).parameters.values())
    except (TypeError, ValueError):
        return [], False
    specs = [
        ExtraArg(
            p.name, "an extra argument of this optax transform", required=p.default is inspect.Parameter.empty
        )
        for p in parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    return specs, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def check_extra_args(tx: Any, given: Mapping[str, Any], where: str) -> Declared:
    """Raises `TypeError` for a required extra argument that is missing, or one nothing reads.

    `where` names the caller in the message (e.g. `"Optimizer.step"`). Returns what `tx` declares.
    """
    declared = declared_extra_args(tx)
    for name, (spec, owners) in declared.args.items():
        if spec.required and name not in given:
            raise TypeError(
                f"{where} needs the extra argument `{name}` ({spec.description}) for "
                f"{', '.join(owners)}: pass `{name}=...`."
            )
    unknown = sorted(set(given) - set(declared.args))
    if unknown and not declared.open:
        reads = ", ".join(f"`{name}`" for name in sorted(declared.args)) or "none"
        raise TypeError(
            f"{where} got the extra argument{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(f'`{name}`' for name in unknown)}, which no transform of {type(tx).__name__} reads "
            f"(extra arguments it reads: {reads})."
        )
    return declared


def adapt_to_params(
    declared: Declared,
    given: Mapping[str, Any],
    to_model: Callable[[Any], Any],
    to_params: Callable[[Any], Any],
) -> dict[str, Any]:
    """`given`, written for the model, as the transform needs it for the trained parameters.

    A function of the parameters (`value_fn`) is made from the given function of the model:
    `to_model` rebuilds the model from parameters. A tree like the parameters (`grad`) is
    cut from the given tree like the model by `to_params`.
    """
    adapted = dict(given)
    for name, (spec, _) in declared.args.items():
        if name not in adapted:
            continue
        if spec.of_params and callable(adapted[name]):
            fn = adapted[name]
            adapted[name] = lambda params, *args, fn=fn, **kwargs: fn(to_model(params), *args, **kwargs)
        elif spec.like_params:
            adapted[name] = to_params(adapted[name])
    return adapted
