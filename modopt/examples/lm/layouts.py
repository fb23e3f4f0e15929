"""Where the job's arrays live: one device, or a (data, model) mesh in one of two layouts.

- "tp": Megatron's tensor parallelism over "model" (the query, key, value and up-projection
  weights split by output features, the attention output and down-projection by input
  features, the embedding and the head by model width; norms replicated), the batch over
  "data".
- "fsdp": every weight split along an axis that all devices divide, over ("data", "model"),
  and the batch over all devices.

Arrays are placed from host copies that every process holds alike (the model comes from the
same seed everywhere, each batch from `(seed, step)`), so the same code runs in one process or
in several.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

_COLUMNS = (".query", ".key", ".value", ".up")  # (out, in) weights split by output features
_ROWS = (".output", ".down")  # split by input features


class Placement:
    """The mesh (or none) and the shardings of the model, its optimizer and the batches."""

    def __init__(self, mesh_shape: tuple[int, int] | None, layout: str = "tp", zero: bool = False):
        self.layout, self.zero = layout, zero
        self.mesh = None
        if mesh_shape is not None:
            if mesh_shape[0] * mesh_shape[1] != jax.device_count():
                raise ValueError(f"--mesh {mesh_shape[0]}x{mesh_shape[1]} needs {mesh_shape[0] * mesh_shape[1]} devices; there are {jax.device_count()}")
            self.mesh = jax.make_mesh(mesh_shape, ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
        self._shardings = None

    def specs(self, model: Any) -> Any:
        """A `PartitionSpec` per array leaf of `model` (None elsewhere)."""
        every = ("data", "model")

        def tp(path: str, x) -> P:
            if x.ndim == 2 and path.endswith(_COLUMNS + tuple(name + ".weight" for name in _COLUMNS)):
                return P("model", None)
            if x.ndim == 2 and any(path.endswith(name + ".weight") for name in _ROWS):
                return P(None, "model")
            if x.ndim == 2:  # the embedding and the head, (vocabulary, width)
                return P(None, "model")
            return P()

        def fsdp(path: str, x) -> P:
            for axis in range(x.ndim):
                if x.ndim == 2 and x.shape[axis] % self.mesh.size == 0:
                    return P(*(every if i == axis else None for i in range(x.ndim)))
            return P()

        choose = tp if self.layout == "tp" else fsdp
        return jax.tree_util.tree_map_with_path(
            lambda path, x: choose(jax.tree_util.keystr(path), x) if eqx.is_array(x) else None, model
        )

    def model(self, model: Any) -> Any:
        if self.mesh is None:
            return model
        self._shardings = jax.tree.map(lambda s: NamedSharding(self.mesh, s), self.specs(model), is_leaf=lambda s: isinstance(s, P))
        arrays, rest = eqx.partition(model, eqx.is_array)
        return eqx.combine(jax.tree.map(_place, arrays, self._shardings), rest)

    def optimizer_arguments(self, model: Any) -> dict:
        if self.mesh is None:
            return {}
        return {"shardings": self._shardings, "zero_axis": "data" if self.zero else None}

    def batch(self, rows: np.ndarray) -> jax.Array:
        if self.mesh is None:
            return jax.numpy.asarray(rows)
        axes = "data" if self.layout == "tp" else ("data", "model")
        return _place(rows, NamedSharding(self.mesh, P(axes, *([None] * (rows.ndim - 1)))))


def _place(x: Any, sharding: NamedSharding) -> jax.Array:
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
