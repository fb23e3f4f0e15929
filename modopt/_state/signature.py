"""`ModelSignature`: which leaves of a model an optimizer trains, with their shapes and dtypes."""

from __future__ import annotations

from typing import Any

import jax

from .._core.checks import _first_difference
from .._util.trees import structure_from_pickle, structure_to_pickle


class ModelSignature:
    """The model's tree structure and, per leaf, a `jax.ShapeDtypeStruct` if trained, else `None`.

    An `Optimizer` keeps it as a static field, so that its state's sharding can be derived
    from the model's shardings alone. It is hashed once and compared by identity first, so it
    adds nothing measurable to a jitted step's cache lookup.
    """

    __slots__ = ("_hash", "leaves", "treedef")

    def __init__(self, model: Any, params: Any):
        self.treedef = jax.tree_util.tree_structure(model)
        self.leaves = tuple(
            None if p is None else jax.ShapeDtypeStruct(p.shape, p.dtype) for p in self.treedef.flatten_up_to(params)
        )
        self._hash = hash((self.treedef, self.leaves))  # once: it keys every jitted step

    # The hash of strings and treedefs differs between processes: pickle without it. The
    # treedef is pickled as a tree of its structure (see `structure_to_pickle`).
    def __getstate__(self):
        return structure_to_pickle(self.treedef), self.leaves

    def __setstate__(self, state):
        self.treedef, self.leaves = structure_from_pickle(state[0]), state[1]
        self._hash = hash((self.treedef, self.leaves))

    def params(self) -> Any:
        """The trained parameters as abstract arrays, `None` elsewhere (as `eqx.filter` gives)."""
        return self.treedef.unflatten(self.leaves)

    def check_model(self, model: Any, grads: Any) -> None:
        """Raises `ValueError` if `model` does not have the structure of the optimizer's model.

        Gradients from `eqx.filter_grad` have `None` where the model has non-array leaves, so
        `step(grads, model)` with the arguments swapped is caught here for such models. A model
        made only of arrays has the structure of its gradients: no structural check can tell
        those apart.
        """
        if jax.tree_util.tree_structure(model) == self.treedef:
            return
        expected = self.treedef.unflatten([0] * self.treedef.num_leaves)
        swapped = jax.tree_util.tree_structure(grads) == self.treedef
        hint = (
            " The gradients have the model's structure: the arguments look swapped. The call is "
            "`optimizer.step(model, grads)`."
            if swapped
            else " Pass the model the optimizer was made for (`Optimizer(tx, model)`), as `step`'s first argument."
        )
        raise ValueError(
            f"Optimizer.step: the model does not have the structure of the one this optimizer was made for: "
            f"found {_first_difference(expected, model, leaf='a leaf (an array, function or value)')}.{hint}"
        )

    def paths(self) -> list[str]:
        """The path of each of the model's leaves, e.g. `.layers[0].weight`."""
        numbered = self.treedef.unflatten(range(self.treedef.num_leaves))
        return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(numbered)[0]]

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self is other:
            return True
        return (
            isinstance(other, ModelSignature)
            and self._hash == other._hash
            and self.treedef == other.treedef
            and self.leaves == other.leaves
        )

    def __repr__(self):
        trained = sum(leaf is not None for leaf in self.leaves)
        return f"ModelSignature({trained} of {len(self.leaves)} leaves trained)"
