"""A pytest plugin that runs optax's own test files with modopt's objects in place of optax's.

Loaded with `-p optax_swap` (this folder on `sys.path`), it imports every optax module, then
replaces, in each of them, every public object of optax's namespaces (`optax.adam`,
`optax.contrib.muon`, `optax.tree.get`, `optax.losses.ntxent`, their state classes...) by
modopt's object of the same public name. The replacement goes by identity, so
`optax._src.alias.adam`, `optax.adam` and a test's `alias.adam(...)` all become `modopt.adam`
before the test files are imported. Type aliases and optax's protocol classes stay optax's.

What optax's tests then check of modopt is what they check of optax: numbers against values
written in the tests, behaviour under `jax.jit`, structures of states, errors. Where a test
exercises optax's private helpers (`_muon.orthogonalize_via_newton_schulz`), it still runs
optax's code: such tests say nothing of modopt and pass or fail as they do for optax.

`tests/test_optax_suite.py` runs the chosen files in a subprocess with this plugin, and lists
the tests modopt departs from on purpose (`DEPARTURES`), each with its reason; it passes them
as `--departure=<node id>`, which deselects that test and its parametrizations only.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import types
import typing

import pytest
import testing_gc

# optax's public namespaces, each with modopt's namespace of the same objects.
NAMESPACES = (
    "",
    "contrib",
    "tree",
    "tree_utils",
    "losses",
    "projections",
    "perturbations",
    "assignment",
    "microbatching",
    "schedules",
    "transforms",
    "second_order",
    "experimental",
    "experimental.aggregating",
)

# Names that stay optax's: its protocol and base classes (modopt's objects satisfy them by duck
# typing; optax's own code subclasses or instantiates them).
KEEP = frozenset(
    {
        "GradientTransformation",
        "GradientTransformationExtraArgs",
        "TransformInitFn",
        "TransformUpdateFn",
        "TransformUpdateExtraArgsFn",
        "Params",
        "Updates",
        "OptState",
        "Schedule",
        "ScalarOrSchedule",
        "StatefulSchedule",
        "MaskOrFn",
    }
)


def _replaceable(value: object) -> bool:
    """Functions and classes are replaced; modules, constants and typing constructs are not."""
    if isinstance(value, types.ModuleType):
        return False
    if typing.get_origin(value) is not None or isinstance(value, typing.TypeVar):
        return False
    return inspect.isfunction(value) or inspect.isclass(value) or callable(value)


def replacements() -> dict[int, tuple[object, object, str]]:
    """`id(optax object) -> (optax object, modopt object, public name)` for every public name
    that both libraries have."""
    import modopt

    found: dict[int, tuple[object, object, str]] = {}
    for namespace in NAMESPACES:
        suffix = f".{namespace}" if namespace else ""
        try:
            theirs = importlib.import_module(f"optax{suffix}")
            ours = importlib.import_module(f"modopt{suffix}")
        except ImportError:
            continue
        for name in dir(theirs):
            if name.startswith("_") or name in KEEP:
                continue
            their_value, our_value = getattr(theirs, name), getattr(ours, name, None)
            if our_value is None or not _replaceable(their_value):
                continue
            found.setdefault(id(their_value), (their_value, our_value, f"optax{suffix}.{name}"))
    del modopt
    return found


def import_all_optax() -> list[types.ModuleType]:
    """Every module of optax but its tests, imported."""
    import optax

    modules = [optax]
    for info in pkgutil.walk_packages(optax.__path__, "optax."):
        if info.name.endswith("_test") or ".test_utils" in info.name:
            continue
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError:
            continue
    return modules


def swap() -> int:
    """Replaces optax's public objects by modopt's in every optax module; returns how many."""
    import_all_optax()
    table = replacements()
    count = 0
    for name, module in list(sys.modules.items()):
        if not (name == "optax" or name.startswith("optax.")) or name.endswith("_test"):
            continue
        for attribute, value in list(vars(module).items()):
            entry = table.get(id(value))
            if entry is not None and entry[0] is value:
                setattr(module, attribute, entry[1])
                count += 1
    return count


_COUNT = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption(
        "--departure",
        action="append",
        default=[],
        help="deselect the test with this node id (relative to the rootdir) and its parametrizations "
        "(the id followed by digits, as absl's parameterized names them, or by '[')",
    )


def departs(node_id: str, departure: str) -> bool:
    """Whether `node_id` is the test `departure` names, or one of its parametrizations.

    Not a plain prefix: `test_extra_args` must not take `test_extra_args_chaining` along.
    """
    if not node_id.startswith(departure):
        return False
    rest = node_id[len(departure) :]
    return rest == "" or rest.isdigit() or rest.startswith("[")


def pytest_collection_modifyitems(config, items):
    departures = config.getoption("departure")
    if not departures:
        return
    kept, dropped = [], []
    for item in items:
        (dropped if any(departs(item.nodeid, d) for d in departures) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_configure(config):
    count = swap()
    config.stash[_COUNT] = count
    testing_gc.collect_less()  # as in this suite's own workers


def pytest_collection_finish(session):
    testing_gc.collect_less()


def pytest_report_header(config):
    return f"optax_swap: {config.stash[_COUNT]} references to optax's public objects now point to modopt's"
