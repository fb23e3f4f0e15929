"""Optimizer state kept in host memory and moved to the accelerator inside each step.

Adam's state is twice the model; on an accelerator whose memory the model and activations
already fill, it can live in the host's pinned memory instead, at the cost of moving it in
and out once per step (`Optimizer(..., state_memory_kind="pinned_host")`). Inside the jitted
step, `jax.device_put(x, jax.memory.Space.Device)` brings each state array in and
`jax.memory.Space.Host` takes the new one back, so the step's inputs and outputs are both in
host memory and donation pairs them as usual.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax

MEMORY_KINDS = ("pinned_host",)
"""The memory kinds the state can be kept in (besides the accelerator's own, `None`)."""


def check_memory_kind(kind: str | None, params: Any, where: str) -> None:
    """Raises `ValueError` unless `kind` is `None` or a kind of `MEMORY_KINDS` that every
    device holding `params` (the default device for abstract ones) has."""
    if kind is None:
        return
    if kind not in MEMORY_KINDS:
        raise ValueError(
            f"{where}: Invalid state_memory_kind: {kind!r} (must be one of {', '.join(map(repr, MEMORY_KINDS))} "
            "or None for the accelerator's own memory)."
        )
    devices = set()
    for leaf in jax.tree_util.tree_leaves(params):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.Sharding) and not isinstance(leaf, jax.core.Tracer):
            devices |= set(sharding.device_set)
    for device in devices or {jax.devices()[0]}:
        kinds = [memory.kind for memory in device.addressable_memories()]
        if kind not in kinds:
            raise ValueError(
                f"{where}: state_memory_kind={kind!r}, but device {device} has only the memory kinds {kinds}."
            )


def to_device(tree: Any) -> Any:
    """`tree`'s arrays in accelerator memory (inside a jitted step; a no-op for those already there)."""
    return _moved(tree, jax.memory.Space.Device)


def to_host(tree: Any) -> Any:
    """`tree`'s arrays in pinned host memory, on the same devices and shardings."""
    return _moved(tree, jax.memory.Space.Host)


def _moved(tree: Any, space: Any) -> Any:
    arrays, rest = eqx.partition(tree, eqx.is_array)
    if not jax.tree_util.tree_leaves(arrays):
        return tree
    return eqx.combine(jax.device_put(arrays, space), rest)


def with_memory_kind(shardings: Any, kind: str | None) -> Any:
    """Each sharding of `shardings` in memory kind `kind` (the tree as it is for `None`)."""
    if kind is None:
        return shardings
    return jax.tree_util.tree_map(lambda s: s.with_memory_kind(kind), shardings)


def place(x: jax.Array, sharding: Any, constrain: Any) -> jax.Array:
    """`x` (in accelerator memory, inside a jitted step) laid out as `sharding`, and moved to
    its memory kind when that is a host's; `constrain(x, sharding)` lays out."""
    kind = getattr(sharding, "memory_kind", None)
    if kind is None or kind == "device":
        return constrain(x, sharding)
    return jax.device_put(constrain(x, sharding.with_memory_kind("device")), jax.memory.Space.Host)
