"""The pages a user reads first: the README's code runs and stays a front page; the catalog's
table (docs/api/catalog.md) lists every public name of `modopt`, and only those; the training
guide's quickstart and the development page's example transform run as written."""

from __future__ import annotations

import re
import types

import equinox as eqx
import jax
import jax.numpy as jnp

import modopt
from pages import python_blocks, read, section



NAMESPACES_TABLE = "optax 0.2.8's namespaces, each under the same name in modopt"


def _included_section() -> str:
    return section("docs/api/catalog.md", "What's included")


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]


def test_the_table_lists_every_public_name_and_no_other():
    names_part = _included_section().split(NAMESPACES_TABLE, 1)[0]
    table = "\n".join(_table_rows(names_part))
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", table))
    public = {n for n in dir(modopt) if not n.startswith("_") and not isinstance(getattr(modopt, n), types.ModuleType)}
    assert public - listed == set(), f"public names missing from the catalog's table: {sorted(public - listed)}"
    assert listed - public == set(), f"names in the catalog's table that modopt lacks: {sorted(listed - public)}"


def test_the_namespaces_table_names_what_its_namespaces_hold():
    """Each row of the namespaces table names modopt's subpackages in its first cell; every
    name in its second cell is in one of them (or at the top level, for the schedules row)."""
    rows = _table_rows(_included_section().split(NAMESPACES_TABLE, 1)[1])[1:]  # after the header
    assert len(rows) >= 8
    for row in rows:
        namespaces_cell, names_cell = row.strip("| ").split(" | ", 1)
        namespaces = [getattr(modopt, n.split(".", 1)[1]) for n in re.findall(r"`(modopt\.[a-z_]+)`", namespaces_cell)]
        assert namespaces, row
        for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", names_cell):
            if name.startswith("modopt."):
                assert _resolves(name), f"{name} does not exist"
            else:
                assert any(hasattr(ns, name) for ns in [*namespaces, modopt]), f"{name}: not in {namespaces_cell}"


def _resolves(dotted: str) -> bool:
    obj = modopt
    for part in dotted.split(".")[1:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def test_the_adding_a_transform_example_runs():
    """The development page's example transform and optimizer work as written and as described."""
    import jax.numpy as jnp
    import pytest

    blocks = python_blocks(section("docs/development.md", "Adding a transform"))[:2]
    namespace: dict = {}
    exec(compile("\n".join(blocks), "docs/development.md", "exec"), namespace)
    with pytest.raises(ValueError, match=re.escape("Invalid decay: 1.0 (must be in [0, 1)) in ScaleByFoo.")):
        namespace["scale_by_foo"](decay=1.0)
    params = {"w": jnp.ones(3)}
    optimizer = modopt.Optimizer(namespace["foo"](0.1), params)
    new_params, _ = optimizer.step(params, {"w": jnp.full(3, 2.0)})
    # nu = 0.1 * 2 after one step, so the update is -0.1 * 2 / (0.2 + 1e-8).
    assert jnp.allclose(new_params["w"], 1.0 - 0.1 * 2.0 / (0.2 + 1e-8))


def test_the_quickstart_runs(capsys):
    """The training guide's quickstart blocks, run in order as one script."""
    blocks = python_blocks(section("docs/guides/training.md", "Quickstart"))
    assert len(blocks) >= 4, len(blocks)
    namespace: dict = {}
    exec(compile("\n".join(blocks), "docs/guides/training.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "'steps': 1.0" in out and "grad_norm" in out, out[-2000:]
    # The NaN guard skipped its step: the model is unchanged and the skip is counted.
    guarded = namespace["guarded"]
    assert int(guarded.state.total_notfinite) == 1 and int(guarded.state.inner_state[0].count) == 0
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(eqx.filter(namespace["unchanged_model"], eqx.is_array)))


def test_the_readme_is_a_front_page_whose_code_runs(capsys):
    """At most 300 lines, and its Python blocks run in order as one script (the quickstart
    trains, the optax and Flax block mixes the libraries)."""
    text = read("README.md")
    assert len(text.splitlines()) <= 300, len(text.splitlines())
    blocks = python_blocks(text)
    assert len(blocks) >= 2
    namespace: dict = {}
    exec(compile("\n".join(blocks), "README.md", "exec"), namespace)
    assert "step 150" in capsys.readouterr().out
    assert float(namespace["loss"]) < 0.05, float(namespace["loss"])
    assert namespace["optimizer"].hyperparameters["peak_value"] == jnp.float32(3e-3)
    assert int(namespace["state"].step) == 1
