"""Checkpoints of models, optimizers and any pytree with Orbax: save, restore, resume bit-exact.

Example:
    >>> from modopt.integrations.orbax import CheckpointManager
    >>> with CheckpointManager("checkpoints", max_to_keep=3) as manager:
    ...     manager.save(step, model=model, optimizer=optimizer, key=key)
    ...     restored = manager.restore(model=model, optimizer=optimizer, key=key)  # the latest step
    >>> model, optimizer = restored["model"], restored["optimizer"]

Each step's directory holds the arrays (written by Orbax, asynchronously by default) and a JSON
record a person can read: the modopt version, the step, each item's structure, the
optimizer's transform and hyperparameters, and a checksum of every array. Restore checks the
target against the record first, and the checksums after reading, so it never hands back
numbers that differ from what was saved.

What a checkpoint holds of an item, leaf by leaf:

- JAX arrays and PRNG keys, on any sharding;
- NumPy arrays and scalars of numbers or booleans, kept as NumPy with their dtype: an
  `np.int64(2**40)` data-loader position restores exactly, as an `np.int64`, even where JAX
  has 64-bit types off;
- Python bools, ints (of any size), floats and strings, in the JSON record;
- nothing of code: a function or class (or any other object) in a field of an object, like
  an Equinox model's activation function, is taken from the restore target, as Equinox's own
  serialisation does.

Anything else is refused by `save` before anything is written, naming the item and path: a
function in a plain dict, list or tuple (or as the item itself), a set, a NumPy array of
strings. Saving is in increasing order of steps: saving a step that exists, or one before the
latest, is an error unless `overwrite=True` says to replace it.

One manager writes to a directory at a time: the first save takes the directory's writer lock
(`modopt-writer.lock`), held until `close()`, and a second manager's save, in this process or
another, is an error naming the holder. Reading needs no lock. A lock left by a process that
crashed is taken over by the next save (see `integrations/_lock.py`).

Hyperparameters: by default a restore keeps the target's (`hyperparameters="target"`): the
learning rate, betas and schedules come from the code that builds the target, as with optax,
where the schedule lives in the code. The state (moments, step counts, PRNG keys) comes from
the checkpoint, and a `HyperparameterWarning` names every hyperparameter whose saved value
differs. `hyperparameters="saved"` takes the checkpoint's instead.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import operator
import os
import re
import shutil
import threading
import warnings
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._lock import WriterLock, _abandoned, _read
from modopt._core.module import Constant

from ._records import (
    CheckpointError,
    Leaf,
    checksums,
    described,
    from_record,
    hyperparameter_leaves,
    is_constant,
    leaves_of,
    mismatch,
    unsavable,
)

__all__ = ["CheckpointError", "CheckpointManager", "HyperparameterWarning"]

FORMAT = 1
_ARRAYS = "arrays"
_RECORD = "modopt"
_POLICIES = ("target", "saved")
_TEMPORARY = re.compile(r"^\d+\.orbax-checkpoint-tmp")  # a step Orbax has not finished writing


class HyperparameterWarning(UserWarning):
    """A restore kept the target's hyperparameters where the checkpoint holds other values."""


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "modopt.integrations.orbax needs orbax-checkpoint: pip install 'modopt[orbax]'"
        ) from error
    return ocp


class CheckpointManager:
    """Saves and restores named items (models, `modopt.Optimizer`s, Flax TrainStates, pytrees).

    Arguments:
        directory: where steps are written (relative paths are taken from the current
            directory at construction).
        max_to_keep: how many of the latest steps to keep (`None`: all).
        save_interval_steps: `save` writes only steps that are multiples of this.
        async_save: write in the background (default). A program that exits without
            `wait_until_finished()` or `close()` still waits for its last save at exit.

    The first `save` makes the manager the directory's only writer until `close()`; any
    number of managers can restore from it meanwhile (they see new steps as they appear).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int | None = None,
        save_interval_steps: int = 1,
        async_save: bool = True,
    ):
        ocp = _orbax()
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"Invalid max_to_keep: {max_to_keep} (must be >= 1 or None).")
        if save_interval_steps < 1:
            raise ValueError(f"Invalid save_interval_steps: {save_interval_steps} (must be >= 1).")
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=save_interval_steps,
            enable_async_checkpointing=async_save,
            # Not by Orbax at construction: a manager opened to read would delete the files of a
            # save in flight in another. What saves that never finished left is removed here where
            # no writer holds the directory, and by the writer (`_become_writer`).
            cleanup_tmp_directories=False,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=(_ARRAYS, _RECORD))
        self._lock = WriterLock(self.directory)
        self._remove_leftovers()
        self._names = frozenset(os.listdir(self.directory))  # what Orbax found at construction
        # Saves in flight are finished at exit, so an exit without `close()` loses nothing. This
        # must run before Python stops the thread pools Orbax writes with, which happens before
        # plain `atexit` handlers; `threading._register_atexit` callbacks run first (newest first).
        self._finalizer = weakref.finalize(self, _finish, self._manager, self._lock)
        getattr(threading, "_register_atexit", atexit.register)(self._finalizer)

    # ---- saving --------------------------------------------------------------------------

    def save(self, step: int, *, overwrite: bool = False, **items: Any) -> bool:
        """Saves `items` (by name) as `step`; returns whether it was written (see `save_interval_steps`).

        Steps are saved in increasing order. Saving a step that exists, or one before the
        latest, raises a `CheckpointError`, unless `overwrite=True`: then that step and every
        later one are deleted first (a run that went back to an earlier step), and the step is
        written whatever `save_interval_steps` says. The deletion comes before the writing: a
        crash in between loses them.

        Everything is checked before anything is written: the step (an integer >= 0), that each
        leaf is something a checkpoint holds (see the module's documentation), and that no
        other manager writes to the directory.
        """
        step = _step(step, "save")
        if not self._finalizer.alive:
            raise ValueError(f"save: this CheckpointManager of {self.directory} is closed; make a new one to save there.")
        if not items:
            raise ValueError("save needs at least one item, e.g. save(step, model=model, optimizer=optimizer).")
        for name, item in items.items():
            found = unsavable(item)
            if found is not None:
                path, leaf = found
                remedy = "Leave it out" if callable(leaf) else "Convert it (to a list, an array or a string), or leave it out"
                raise CheckpointError(
                    f"save: item {name!r} holds {described(leaf)} at {path or 'the root'}, which a checkpoint cannot "
                    "hold: it holds arrays, numbers and strings, and takes code from the restore target only where it "
                    f"is a field of an object (a model's activation function). {remedy}. Nothing was saved."
                )
        if self._lock.acquire():
            self._become_writer()
        steps = self.all_steps()
        later = [s for s in steps if s >= step]
        if later and not overwrite:
            if later[0] == step:
                problem = f"step {step} already exists in {self.directory}"
                remedy = "to replace it" + (f" and delete the later steps {later[1:]}" if later[1:] else "")
            else:
                problem = f"step {step} is before the latest step {later[-1]} in {self.directory} (steps are saved in increasing order)"
                remedy = f"to go back to step {step}, deleting the steps {later}"
            raise CheckpointError(
                f"save: {problem}. Save under a later step, or pass overwrite=True {remedy}. Nothing was saved."
            )
        if later:
            self._manager.wait_until_finished()
            for old in later:
                self._manager.delete(old)
        elif not self._manager.should_save(step):
            return False
        leaves_by_item = {name: leaves_of(item) for name, item in items.items()}
        # One compiled call computes every item's checksums.
        written = [leaf for leaves in leaves_by_item.values() for leaf in leaves if leaf.data is not None]
        for leaf, checksum in zip(written, checksums([leaf.data for leaf in written])):
            leaf.checksum = checksum
        records, arrays = {}, {}
        for name, item in items.items():
            leaves = leaves_by_item[name]
            arrays[name] = {f"leaf_{i}": leaf.data for i, leaf in enumerate(leaves) if leaf.data is not None}
            records[name] = {
                "type": type(item).__name__,
                "summary": _summary(item),
                "leaves": [leaf.record() for leaf in leaves],
            }
        record = {
            "format": FORMAT,
            "modopt_version": _version(),
            "step": step,
            "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "items": records,
        }
        ocp = _orbax()
        args = ocp.args.Composite(
            **{_ARRAYS: ocp.args.PyTreeSave(arrays), _RECORD: ocp.args.JsonSave(record)}
        )
        try:
            return bool(self._manager.save(step, args=args, force=True))  # `should_save` was asked above
        except Exception as error:  # a full disk, say: written now, or the previous save, in the background
            _failed(self._manager, self.directory, error)
            raise

    def _remove_leftovers(self) -> None:
        """Removes the files of saves that never finished (`<step>.orbax-checkpoint-tmp`: a crash,
        a full disk), which hold disk space, where no writer holds the directory (no save is in
        flight then). They are listed before the lock is read: a writer that starts meanwhile
        writes files of another name."""
        leftovers = _unfinished(self.directory)
        if not leftovers or jax.process_index() != 0:
            return
        owner, age = _read(self._lock.path)
        if owner is None or _abandoned(owner, age):
            _remove(self.directory, leftovers)

    def _become_writer(self) -> None:
        """On becoming the directory's only writer: what other writers left is now known to be done."""
        self._manager.reload()  # the steps saved since this manager was made
        if jax.process_index() == 0:
            _remove(self.directory, _unfinished(self.directory))  # saves that never finished (their process ended)

    # ---- restoring -----------------------------------------------------------------------

    def restore(self, step: int | None = None, *, hyperparameters: str = "target", **like_items: Any) -> dict[str, Any]:
        """The items saved at `step` (default: the latest), shaped and placed like `like_items`.

        Each target may be concrete or abstract (from `jax.eval_shape`); arrays land on its
        shardings, so a checkpoint written on one mesh restores onto another. The targets are
        checked against the checkpoint's record before anything is read, and the data against
        its checksums after: a mismatch raises `CheckpointError` naming the item and path.

        `hyperparameters` says where the optimizers' hyperparameters come from (those of every
        modopt transform in the items: `Optimizer.tx`, a TrainState's `tx`, an `NnxOptimizer`,
        and the numbers `inject_hyperparams` keeps in the state):

        - `"target"` (default): the target's, as the code that built it says. Where the
          checkpoint's differ, a `HyperparameterWarning` names each (`optimizer.b1: saved 0.9,
          target 0.95`). An abstract target has no values: it takes the checkpoint's.
        - `"saved"`: the checkpoint's, as they were when it was written.

        Everything else (moments, step counts, PRNG keys, parameters) comes from the checkpoint.
        A Python number in the target (Flax's `TrainState.create` makes `step=0`) restores the
        saved value as a weakly typed scalar array, what a jitted step makes of the number, so
        the restored state does not retrace a step compiled for the fresh one.
        """
        if hyperparameters not in _POLICIES:
            raise ValueError(
                f"Invalid hyperparameters: {hyperparameters!r} (must be 'target', to keep the target's, or 'saved', "
                "to take the checkpoint's)."
            )
        if not like_items:
            raise ValueError("restore needs the items to restore into, e.g. restore(model=model).")
        step = self._resolve_step(step)
        record = self._read_record(step)
        plans = {name: self._plan(name, like, record, step) for name, like in like_items.items()}

        abstract = {
            name: {f"leaf_{i}": _abstract(x, saved) for i, (saved, x) in enumerate(plan) if saved.kind in ("array", "key")}
            for name, plan in plans.items()
        }
        abstract = {name: leaves for name, leaves in abstract.items() if leaves}
        resized = {
            (name, f"leaf_{i}") for name, plan in plans.items() for i, (saved, x) in enumerate(plan) if _resized(x, saved)
        }
        restored = self._read_arrays(step, abstract, resized) if abstract else {}
        self._verify(step, plans, restored)

        kept: dict[str, dict[int, str]] = {}
        if hyperparameters == "target":
            for name, like in like_items.items():
                hyper = hyperparameter_leaves(like)
                kept[name] = {i: path for i, path in hyper.items() if _is_concrete(plans[name][i][1])}
            differences = [
                f"{name}{path}: saved {saved}, target {target}"
                for name, plan in plans.items()
                for path, (saved, target) in _differences(plan, restored.get(name, {}), kept[name]).items()
            ]
            if differences:
                warnings.warn(
                    HyperparameterWarning(
                        f"The hyperparameters saved at step {step} differ from the target's: {'; '.join(differences)} "
                        "(keeping the target's; pass hyperparameters='saved' to take the checkpoint's)."
                    ),
                    stacklevel=2,
                )
        return {
            name: _rebuild(plan, restored.get(name, {}), like_items[name], kept.get(name, {}))
            for name, plan in plans.items()
        }

    def _resolve_step(self, step: int | None) -> int:
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise FileNotFoundError(f"No checkpoint in {self.directory}.")
            return steps[-1]
        step = _step(step, "restore")
        if step not in steps:
            raise FileNotFoundError(f"No checkpoint of step {step} in {self.directory}; the steps are {steps}.")
        return step

    def _read_record(self, step: int) -> dict:
        ocp = _orbax()
        path = os.path.join(self.directory, str(step), _RECORD)
        try:
            record = self._manager.restore(step, args=ocp.args.Composite(**{_RECORD: ocp.args.JsonRestore()}))[_RECORD]
        except Exception as error:  # noqa: BLE001 - any failure to read means the same to the user
            raise CheckpointError(f"The record of step {step} ({path}) is missing or garbled: {error}") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("items"), dict):
            raise CheckpointError(f"The record of step {step} ({path}) is garbled: it is not a modopt checkpoint record.")
        return record

    def _plan(self, name: str, like: Any, record: dict, step: int) -> list[tuple[Leaf, Any]]:
        """Per leaf of `like`: (the saved leaf, the target leaf), once they are checked to agree."""
        saved_item = record["items"].get(name)
        if saved_item is None:
            raise CheckpointError(f"Step {step} has no item {name!r}; it holds {sorted(record['items'])}.")
        try:
            saved = [from_record(r) for r in saved_item["leaves"]]
        except (KeyError, TypeError) as error:
            raise CheckpointError(f"The record of {name!r} at step {step} is garbled: {error!r}.") from None
        targets = leaves_of(like)
        summary = saved_item.get("summary")
        saved_tx = summary.get("transform") if isinstance(summary, dict) else None
        target_tx = getattr(like, "tx", None)
        holds = _kind(saved_item.get("type"), saved_tx)
        is_ = _kind(type(like).__name__, None if target_tx is None else type(target_tx).__name__)
        differences = mismatch(saved, targets, holds, is_)
        if differences and "['grouped']" in differences:
            differences += (
                " (one of the two optimizers keeps small leaves in grouped buffers and the other does not: "
                "build the target with the `group_small_leaves=` of the one saved, and the same model and transform)"
            )
        if differences:
            raise CheckpointError(
                f"Cannot restore {name!r} from step {step} into this {type(like).__name__}: {differences}. "
                f"The checkpoint holds: {saved_item.get('type')}{_described(saved_item.get('summary'))}. "
                "Nothing was restored."
            )
        return list(zip(saved, jax.tree_util.tree_leaves(like, is_leaf=is_constant)))

    def _read_arrays(self, step: int, abstract: dict, resized: set = frozenset()) -> dict:
        ocp = _orbax()
        try:
            # Items not asked for are not read (`partial_restore`). NumPy data is read as NumPy.
            restore_args = jax.tree.map(
                lambda x: ocp.RestoreArgs(restore_type=np.ndarray, dtype=x.dtype)
                if x.sharding is None
                else ocp.checkpoint_utils.construct_restore_args(x),
                abstract,
            )
            for name, key in resized:  # read at the target's length: saved padding cut, or zeros added
                restore_args[name][key] = dataclasses.replace(restore_args[name][key], strict=False)
            arrays = ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args, partial_restore=True)
            restored = self._manager.restore(step, args=ocp.args.Composite(**{_ARRAYS: arrays}))
        except Exception as error:  # noqa: BLE001
            raise CheckpointError(f"The arrays of step {step} could not be read (is the checkpoint corrupted?): {error}") from None
        return restored[_ARRAYS]

    def _verify(self, step: int, plans: dict, restored: dict) -> None:
        read = [
            (name, leaf, restored[name][f"leaf_{i}"], leaf.shape[0] if _resized(x, leaf) else None)
            for name, plan in plans.items()
            for i, (leaf, x) in enumerate(plan)
            if leaf.kind in ("array", "key")
        ]
        # One compiled call for all items; an array read at another length, as it was saved.
        found = checksums([array for _, _, array, _ in read], [rows for *_, rows in read])
        for (name, leaf, _, _), checksum in zip(read, found):
            if checksum != leaf.checksum:
                raise CheckpointError(
                    f"Checksum mismatch in {name!r} at {leaf.path or 'the root'}, step {step}: the data read differs from "
                    f"what was saved (saved {leaf.checksum}, read {checksum}). The checkpoint is corrupted."
                )

    # ---- steps and lifetime --------------------------------------------------------------

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def all_steps(self) -> list[int]:
        """The steps saved, in increasing order (those being written by this manager included)."""
        if not self._lock.held:  # another manager may be writing here: look again when the directory changed
            try:
                names = frozenset(os.listdir(self.directory))
            except FileNotFoundError:
                names = frozenset()
            if names != self._names:
                self._manager.reload()
                self._names = names
        return sorted(self._manager.all_steps())

    def wait_until_finished(self) -> None:
        """Blocks until every save in flight is written.

        A save that failed in the background (a full disk) raises its error here, once its
        unfinished files are removed (see `save`).
        """
        try:
            self._manager.wait_until_finished()
        except Exception as error:
            _failed(self._manager, self.directory, error)
            raise

    def close(self) -> None:
        """Finishes the saves in flight and releases the manager."""
        self._finalizer()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self):
        return f"CheckpointManager({self.directory!r}, steps={self.all_steps()})"


def _finish(manager: Any, lock: WriterLock) -> None:
    try:
        try:
            manager.wait_until_finished()
        except Exception as error:
            _failed(manager, lock.directory, error)
            raise
        manager.close()
    finally:
        lock.release()


def _failed(manager: Any, directory: str, error: BaseException) -> None:
    """After a save failed (a full disk, a lost connection): removes the files it left
    unfinished, which would hold the space until the next writer, and says so on `error`."""
    try:
        manager.wait_until_finished()  # nothing in flight any more
    except Exception:  # noqa: BLE001 - the failure being handled, raised again
        pass
    if jax.process_index() != 0:
        return
    removed = _unfinished(directory)
    _remove(directory, removed)
    if removed and hasattr(error, "add_note"):
        error.add_note(
            f"modopt: the save failed; its unfinished files ({', '.join(removed)}) were removed from {directory}. "
            "The steps saved before are intact."
        )


def _unfinished(directory: str) -> list[str]:
    """The entries of `directory` that saves not finished (or not finished yet) are writing."""
    try:
        return sorted(name for name in os.listdir(directory) if _TEMPORARY.match(name))
    except FileNotFoundError:
        return []


def _remove(directory: str, names: list[str]) -> None:
    for name in names:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _step(step: Any, method: str) -> int:
    """`step` as an int, if it is an integer >= 0 (a Python or NumPy int, an integer scalar array)."""
    try:
        index = operator.index(step) if not isinstance(step, bool) else None
    except TypeError:
        index = None
    if index is None or index < 0:
        kind = "" if isinstance(step, int) and not isinstance(step, bool) else f" of type {type(step).__name__}"
        raise ValueError(f"Invalid step: {step!r}{kind} (must be an integer >= 0) in {method}.")
    return index


def _abstract(x: Any, saved: Leaf) -> Any:
    """The array Orbax reads `saved` into: its shape and dtype, on the target leaf's sharding, or
    on the host (no sharding: read as NumPy) for a NumPy target and for a dtype JAX cannot hold
    (64-bit types where `jax_enable_x64` is off)."""
    if saved.kind == "array" and (
        isinstance(x, (np.ndarray, np.generic)) or jax.dtypes.canonicalize_dtype(saved.dtype) != np.dtype(saved.dtype)
    ):
        return jax.ShapeDtypeStruct(tuple(saved.shape), np.dtype(saved.dtype))
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # this process's first
    if saved.kind == "key":
        shape = tuple(saved.shape) + tuple(jax.random.key_data(jax.random.key(0, impl=saved.impl)).shape)
        return jax.ShapeDtypeStruct(shape, jnp.uint32, sharding=_key_data_sharding(sharding, len(shape)))
    # A stack of units saved with other padding (`restacked`, checked by `_plan`) is read at the
    # target's length: Orbax drops the saved padding units, or adds zero ones.
    shape = tuple(np.shape(x)) if _resized(x, saved) else tuple(saved.shape)
    return jax.ShapeDtypeStruct(shape, jnp.dtype(saved.dtype), sharding=sharding)


def _resized(x: Any, saved: Leaf) -> bool:
    """Whether the target leaf `x` takes the saved array at another length (a stack of units
    stored with other padding: the only difference of shape `_plan` lets through)."""
    return saved.kind == "array" and hasattr(x, "shape") and tuple(np.shape(x)) != tuple(saved.shape)


def _key_data_sharding(sharding: Any, ndim: int) -> Any:
    # Key data has one more axis than the key array; it is not split.
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec))
    return sharding


def _rebuild(plan: list, arrays: dict, like: Any, kept: dict[int, str]) -> Any:
    """`like` with each leaf replaced by what the checkpoint holds for it, except the `kept` ones."""
    leaves = []
    for i, (saved, x) in enumerate(plan):
        if i in kept:
            leaves.append(_copy(x))
        elif saved.kind == "array":
            leaves.append(_array_like(arrays[f"leaf_{i}"], x))
        elif saved.kind == "key":
            leaves.append(jax.random.wrap_key_data(_owned(arrays[f"leaf_{i}"]), impl=saved.impl))
        elif saved.kind == "empty":
            empty = np.zeros(saved.shape, saved.dtype)
            sharding = getattr(x, "sharding", None)
            on_host = isinstance(x, np.ndarray) or jax.dtypes.canonicalize_dtype(empty.dtype) != empty.dtype
            leaves.append(empty if on_host else jax.device_put(empty, sharding) if sharding else jnp.asarray(empty))
        elif saved.kind == "value":
            leaves.append(_number_like(saved.value, x))
        else:
            leaves.append(x)
    return jax.tree_util.tree_structure(like, is_leaf=is_constant).unflatten(leaves)


def _copy(x: Any) -> Any:
    """A kept target leaf, in a buffer of its own (donating the restored item leaves the target intact)."""
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        return jax.device_put(x, x.sharding, may_alias=False)
    return x


def _array_like(value: Any, x: Any) -> Any:
    """A saved array (a `jax.Array`, or a NumPy array read on the host) as the target leaf `x` holds it."""
    if is_constant(x):  # a hyperparameter the checkpoint holds at another value than the target's identity
        value = _owned(jnp.asarray(value))
        return _weak(value) if value.ndim == 0 else value
    if isinstance(x, np.ndarray):
        return np.asarray(value)
    if isinstance(x, np.generic):
        return np.asarray(value)[()]  # a NumPy scalar of the saved dtype
    if isinstance(value, np.ndarray) and isinstance(x, (bool, int, float)):
        return type(x)(value.item())  # a 64-bit number JAX cannot hold stays a Python number
    if isinstance(value, np.ndarray):
        return value
    value = _owned(value)
    if isinstance(x, (bool, int, float)):
        # A Python number (a fresh Flax TrainState's `step=0`) is weakly typed under `jit`, and
        # on no device in particular: it goes with arrays on any mesh, of any process. So is
        # the restored value (uncommitted), not on the device it was read to.
        weak = jnp.asarray(value.item())
        return weak if weak.dtype == value.dtype else jnp.asarray(np.asarray(value))
    if getattr(x, "weak_type", False) and value.ndim == 0:
        # Hyperparameters are weakly typed (bf16 * lr stays bf16); Orbax forgets it.
        return _weak(value)
    return value


def _owned(value: jax.Array) -> jax.Array:
    """A restored array in host memory (an optimizer's offloaded state) in a buffer of its own: as
    read, it may still reference the reader's memory (on a GPU), and a donated step could not take it."""
    if getattr(value.sharding, "memory_kind", None) in (None, "device"):
        return value
    return jax.device_put(value, value.sharding, may_alias=False)


def _weak(value: jax.Array) -> jax.Array:
    """A scalar as the weakly typed array a Python number becomes, where that has its dtype."""
    weak = jnp.asarray(value.item())
    return jax.device_put(weak, value.sharding) if weak.dtype == value.dtype else value


def _number_like(number: Any, x: Any) -> Any:
    """A saved Python value (a number or a string) as the target leaf `x` (a value of its kind,
    or a scalar array) holds it."""
    if is_constant(x):  # a hyperparameter the target holds as a constant: the saved number, as `set` takes it
        return x if Constant(number) == x else jnp.asarray(number)
    if isinstance(x, (bool, int, float, str)):
        return type(x)(number)
    if isinstance(x, np.generic):
        return x.dtype.type(number)
    if isinstance(x, np.ndarray):
        return np.asarray(number, x.dtype)
    array = jnp.asarray(number)
    if not (getattr(x, "weak_type", False) and array.dtype == x.dtype):
        array = jnp.asarray(number, x.dtype)
    sharding = getattr(x, "sharding", None)
    return jax.device_put(array, sharding) if sharding is not None else array


def _differences(plan: list, arrays: dict, kept: dict[int, str]) -> dict[str, tuple[str, str]]:
    """The kept hyperparameters whose saved value differs from the target's: path -> (saved, target).

    A hyperparameter of several leaves (a rate and its complement) is shown by its first.
    """
    groups: dict[str, list[int]] = {}
    for i, path in kept.items():
        groups.setdefault(path, []).append(i)
    found = {}
    for path, indices in groups.items():
        pairs = [(_saved_value(plan[i][0], arrays.get(f"leaf_{i}")), plan[i][1]) for i in sorted(indices)]
        if any(not _equal(saved, target) for saved, target in pairs):
            saved, target = pairs[0]
            found[path] = (_shown(saved), _shown(target))
    return found


def _saved_value(saved: Leaf, array: Any) -> Any:
    if saved.kind == "value":
        return saved.value
    if saved.kind == "empty":
        return np.zeros(saved.shape, saved.dtype)
    if saved.kind == "key":
        return jax.random.wrap_key_data(array, impl=saved.impl)
    return array


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _equal(a: Any, b: Any) -> bool:
    a, b = (x.value if is_constant(x) else x for x in (a, b))
    if _is_key(a) or _is_key(b):
        return _is_key(a) and _is_key(b) and bool(np.array_equal(jax.random.key_data(a), jax.random.key_data(b)))
    if not (isinstance(a, (jax.Array, np.ndarray, np.generic, bool, int, float)) and isinstance(b, (jax.Array, np.ndarray, np.generic, bool, int, float))):
        return a == b
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def _shown(value: Any) -> str:
    if _is_key(value):
        return f"a PRNG key with data {np.asarray(jax.random.key_data(value)).tolist()}"
    plain = _plain(value)
    if plain is not None:
        return repr(plain)
    if isinstance(value, (jax.Array, np.ndarray)):
        return np.array2string(np.asarray(value), threshold=8)
    return repr(value)


def _summary(item: Any) -> dict:
    """A person's view of an item: an optimizer's transform and hyperparameters, a step."""
    summary: dict[str, Any] = {}
    tx = getattr(item, "tx", None)
    if tx is not None and hasattr(item, "hyperparameters"):
        summary["transform"] = repr(tx) if _is_concrete(tx) else type(tx).__name__
        summary["hyperparameters"] = {
            name: _plain(value) for name, value in item.hyperparameters.items() if _plain(value) is not None
        }
    for name in ("count", "step"):
        value = getattr(item, name, None)
        value = value.get_value() if hasattr(value, "get_value") else value  # an NNX variable
        if _plain(value) is not None:
            summary[name] = _plain(value)
    return summary


def _is_concrete(tree: Any) -> bool:
    return not any(isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct)) for x in jax.tree_util.tree_leaves(tree))


def _plain(value: Any) -> Any:
    """A scalar as a JSON number, else `None`."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (jax.Array, np.ndarray, np.generic)) and np.ndim(value) == 0 and _is_concrete(value):
        scalar = np.asarray(value)[()]
        # A float at its own precision (0.001, not 0.0010000000474974513).
        return float(str(scalar)) if np.issubdtype(scalar.dtype, np.floating) else scalar.item()
    return None


def _kind(type_name: Any, transform: Any) -> str:
    """What an item is, for a mismatch's summary: "an Optimizer of Adam", "an MLP"; `transform`
    is the description of its transform (the type first), if it has one."""
    name = str(type_name)
    kind = f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
    if isinstance(transform, str):
        head = re.match(r"\w+", transform)  # the type of the transform, without its fields
        kind += f" of {head.group(0) if head else transform}"
    return kind


def _described(summary: Any) -> str:
    if isinstance(summary, dict) and "transform" in summary:
        return f" of {summary['transform']}"
    return ""


def _version() -> str:
    import modopt

    return modopt.__version__
