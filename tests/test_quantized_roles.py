"""`quantized_state` keeps moments in 8 bits, chosen by their role, over the whole registry.

1. Every state type that a registry entry's state holds with floating arrays has its moments
   declared (`modopt._state.roles.MOMENTS`, possibly none), naming fields it has: a new
   transform cannot slip through with its statistics quantized because of their shape, nor
   with its moments silently kept in float32.
2. For entries holding every state type between them: `quantized_state(tx, min_size=1)`
   either refuses (`tx` keeps no moments, or is quantized already), or, compared with `tx` in
   float32 on the same gradients, gives the same first update; after it, every leaf that is
   not a moment is the float32 one, and every moment is within 8-bit rounding of it (half a
   step of the dynamic table, 0.00704 of the leaf's largest magnitude).
3. On a square weight (the case where the old rule, by shape, quantized SOAP's statistics and
   Kron's factors), SOAP, Shampoo and Kron keep their preconditioners in float32, and SOAP's
   update after 6 steps is as far from the float32 one as 8-bit Adam's is from float32 Adam's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from registry import ENTRIES, Entry
from test_registry import make_grads, make_params, quadratic

import modopt
from modopt._state.roles import MOMENTS, is_state_type, moment_mask

HALF_STEP = 0.00704  # the largest half gap of the dynamic tables, relative to the block's scale


def is_quantized(x) -> bool:
    return isinstance(x, modopt.QuantizedArray)


def real_array(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and len(x.shape) >= 1


def state_types_with_arrays(state) -> dict[str, set[str]]:
    """The state types in `state` that hold floating arrays in their own fields (not only
    through a nested state type), with the names of their fields."""
    found: dict[str, set[str]] = {}

    def visit(node, owner):
        if is_state_type(node):
            for field in node._fields:
                visit(getattr(node, field), node)
        elif jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(node)):
            if real_array(node) and owner is not None:
                found.setdefault(type(owner).__name__, set(owner._fields))
        else:
            for child in jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)[0]:
                visit(child, owner)

    visit(state, None)
    return found


@functools.cache
def abstract_state(entry: Entry):
    return jax.eval_shape(entry.make().init, make_params())


def test_every_state_type_with_arrays_declares_its_moments():
    undeclared, wrong_fields = set(), set()
    for entry in ENTRIES:
        for name, fields in state_types_with_arrays(abstract_state(entry)).items():
            if name not in MOMENTS:
                undeclared.add(f"{name} (in {entry})")
            elif not set(MOMENTS[name]) <= fields:
                wrong_fields.add(f"{name}: {set(MOMENTS[name]) - fields}")
    assert not undeclared, f"state types without declared moments (modopt._state.roles.MOMENTS): {sorted(undeclared)}"
    assert not wrong_fields, f"declared moments that are no field of the state type: {sorted(wrong_fields)}"


def _covering_every_state_type() -> list[Entry]:
    """Entries whose states hold, between them, every state type with arrays (the roles checked
    are theirs): an entry is taken when it holds one that those before did not; plus the first
    entry without arrays in its state."""
    chosen, covered = [], set()
    for entry in ENTRIES:
        names = set(state_types_with_arrays(abstract_state(entry)))
        if names - covered or (not names and "" not in covered):
            chosen.append(entry)
            covered |= names or {""}
    return chosen


COVERING = _covering_every_state_type()


@pytest.mark.parametrize("entry", COVERING, ids=str)
def test_quantized_state_stores_moments_only_and_changes_nothing_else(entry: Entry):
    tx = entry.make()
    params = make_params()
    state = tx.init(params)
    moments = jax.tree.leaves(moment_mask(state))
    leaves = jax.tree.leaves(state)
    quantized_tx = modopt.quantized_state(tx, min_size=1)
    if any(is_quantized(x) for x in jax.tree.leaves(state, is_leaf=is_quantized)):
        with pytest.raises(ValueError, match="is already in 8 bits"):
            quantized_tx.init(params)
        return
    if not any(m and real_array(x) for x, m in zip(leaves, moments)):
        with pytest.raises(ValueError, match=f"quantized_state: {type(tx).__name__} keeps no moments"):
            quantized_tx.init(params)
        return
    grads = make_grads(0, params)
    extra = entry.args(quadratic(params), params)

    @jax.jit
    def both(state, quantized):
        return tx.update(grads, state, params, **extra), quantized_tx.update(grads, quantized, params, **extra)

    (updates, new_state), (quantized_updates, new_quantized) = both(state, quantized_tx.init(params))
    # The same numbers in, compiled in another program: float rounding apart (Newton-Schulz
    # iterations, AdaMuon's, make it 4e-5), where one 8-bit rounding would be 1e-2.
    for ours, theirs in zip(jax.tree.leaves(quantized_updates), jax.tree.leaves(updates), strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-4, atol=1e-6, err_msg=str(entry))
    stored = jax.tree.leaves(new_quantized.inner_state, is_leaf=is_quantized)
    flags = jax.tree.leaves(moment_mask(new_state))
    assert any(is_quantized(x) for x in stored), f"{entry}: no moment stored in 8 bits"
    for kept, exact, moment in zip(stored, jax.tree.leaves(new_state), flags, strict=True):
        if is_quantized(kept):
            assert moment, f"{entry}: a leaf that is no moment was quantized"
            exact = np.asarray(exact, np.float32)
            error = np.abs(np.asarray(kept.dequantize(), np.float32) - exact)
            assert np.all(error <= HALF_STEP * np.abs(exact).max() + 1e-12), str(entry)
        elif jnp.issubdtype(jnp.result_type(exact), jax.dtypes.prng_key):
            np.testing.assert_array_equal(jax.random.key_data(kept), jax.random.key_data(exact))
        else:
            assert not (moment and real_array(exact)), f"{entry}: a moment was kept in float32 (min_size=1)"
            np.testing.assert_allclose(np.asarray(kept), np.asarray(exact), rtol=1e-6, atol=1e-7, err_msg=str(entry))


# ---- square weights: the preconditioners of SOAP, Shampoo and Kron stay float32 ------------------


def _relative_error_after(tx, steps=6, seed=0):
    """The largest error of 8-bit `tx`'s update at `steps` against float32 `tx`'s, relative to
    the float32 update's largest magnitude (a 64x64 weight and a 64 vector)."""
    keys = jax.random.split(jax.random.key(seed), 2)
    params = {"w": jax.random.normal(keys[0], (64, 64)), "b": jax.random.normal(keys[1], (64,))}
    quantized = modopt.quantized_state(tx, min_size=64)

    def run(transform):
        state = transform.init(params)
        step = jax.jit(transform.update)
        for i in range(steps):
            grads = jax.tree.map(lambda p, i=i: jax.random.normal(jax.random.fold_in(jax.random.key(i + 1), p.size), p.shape), params)
            updates, state = step(grads, state, params)
        return updates, state

    (exact, _), (ours, state) = run(tx), run(quantized)
    error = max(float(jnp.max(jnp.abs(o - e)) / jnp.max(jnp.abs(e))) for o, e in zip(jax.tree.leaves(ours), jax.tree.leaves(exact)))
    return error, state


def _stored(state, field):
    """The leaves of `field` of the (single) state type that has it, in a quantized state."""
    nodes = [n for n in jax.tree.leaves(state.inner_state, is_leaf=is_state_type) if is_state_type(n) and field in n._fields]
    return jax.tree.leaves(getattr(nodes[0], field), is_leaf=is_quantized)


def test_square_weights_keep_the_preconditioners_in_float32_and_soap_is_as_close_as_adam():
    adam_error, _ = _relative_error_after(modopt.adam(1e-3))
    soap_error, soap = _relative_error_after(modopt.soap(1e-3, precondition_frequency=2))
    for field in ("statistics", "eigenbases"):
        assert _stored(soap, field) and not any(is_quantized(x) for x in _stored(soap, field))
    assert all(is_quantized(x) for field in ("mu", "nu") for x in _stored(soap, field))
    _, kron = _relative_error_after(modopt.kron(1e-3, preconditioner_update_probability=1.0), steps=2)
    assert _stored(kron, "Qs") and not any(is_quantized(x) for x in _stored(kron, "Qs"))
    assert all(is_quantized(x) for x in _stored(kron, "momentum"))
    _, shampoo = _relative_error_after(modopt.shampoo(1e-3), steps=2)
    for field in ("statistics", "preconditioners"):
        assert _stored(shampoo, field) and not any(is_quantized(x) for x in _stored(shampoo, field))
    # Measured: 8-bit Adam's update 5.0% off float32 Adam's (in units of its largest entry),
    # SOAP's 2.7%; with SOAP's statistics and eigenbases also in 8 bits (the rule by shape) 17.9%.
    assert adam_error < 0.1
    assert soap_error <= 1.5 * adam_error, (soap_error, adam_error)
