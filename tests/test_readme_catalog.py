"""The README's "What's included" table lists every public name of `modopt`, and only those."""

from __future__ import annotations

import os
import re
import types

import equinox as eqx
import jax
import jax.numpy as jnp

import modopt

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def test_the_table_lists_every_public_name_and_no_other():
    text = open(README).read()
    section = text.split("## What's included", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| ") and "---" not in line)
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", table))
    public = {n for n in dir(modopt) if not n.startswith("_") and not isinstance(getattr(modopt, n), types.ModuleType)}
    assert public - listed == set(), f"public names missing from the README table: {sorted(public - listed)}"
    assert listed - public == set(), f"names in the README table that modopt lacks: {sorted(listed - public)}"


def test_the_adding_a_transform_example_runs():
    """The README's example transform and optimizer work as written and as described."""
    import jax.numpy as jnp
    import pytest

    text = open(README).read()
    section = text.split("## Adding a transform", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[:2]
    namespace: dict = {}
    exec(compile("\n".join(blocks), "README.md", "exec"), namespace)
    with pytest.raises(ValueError, match=re.escape("Invalid decay: 1.0 (must be in [0, 1)) in ScaleByFoo.")):
        namespace["scale_by_foo"](decay=1.0)
    params = {"w": jnp.ones(3)}
    optimizer = modopt.Optimizer(namespace["foo"](0.1), params)
    new_params, _ = optimizer.step(params, {"w": jnp.full(3, 2.0)})
    # nu = 0.1 * 2 after one step, so the update is -0.1 * 2 / (0.2 + 1e-8).
    assert jnp.allclose(new_params["w"], 1.0 - 0.1 * 2.0 / (0.2 + 1e-8))


def test_the_quickstart_runs(capsys):
    """The README's quickstart blocks, run in order as one script."""
    text = open(README).read()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) >= 4, len(blocks)
    namespace: dict = {}
    exec(compile("\n".join(blocks), "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "'steps': 1.0" in out and "grad_norm" in out, out[-2000:]
    # The NaN guard skipped its step: the model is unchanged and the skip is counted.
    guarded = namespace["guarded"]
    assert int(guarded.state.total_notfinite) == 1 and int(guarded.state.inner_state[0].count) == 0
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(eqx.filter(namespace["unchanged_model"], eqx.is_array)))
