"""What an optimizer's state costs, before it is allocated (`modopt.state_bytes`,
`Optimizer.state_bytes`, the repr) and the warning above 16 bytes per parameter: bytes against
the algorithms' own counts (Adam: two moments; SOAP: two moments and, per dimension up to
`max_precondition_dim`, a statistic and a basis), Shampoo's statistics' shapes against the
reference's (a dimension smaller than the block is not padded to it)."""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modopt
from modopt import _state_report


class _Net(eqx.Module):
    """The digits CNN's large layer, (64, 2048), and a small one (10, 64)."""

    big: eqx.nn.Linear
    small: eqx.nn.Linear

    def __init__(self):
        k1, k2 = jax.random.split(jax.random.key(0))
        self.big = eqx.nn.Linear(2048, 64, key=k1)
        self.small = eqx.nn.Linear(64, 10, key=k2)


@pytest.fixture
def fresh_warnings(monkeypatch):
    """The warning is given once per process; each test starts with none given."""
    monkeypatch.setattr(_state_report, "_WARNED", set())


def _params(model):
    return eqx.filter(model, eqx.is_inexact_array)


def test_adam_keeps_two_moments_per_parameter():
    params = {"w": jnp.zeros((30, 20)), "b": jnp.zeros((20,))}
    report = modopt.state_bytes(modopt.adam(1e-3), params)
    assert report.parameters == 620
    assert report.bytes == 2 * 4 * 620 + 4  # mu, nu and the int32 count
    assert report.per_parameter == pytest.approx(8.0, abs=0.01)
    assert report.largest[0].shape == (30, 20) and report.largest[0].bytes == 4 * 600


def test_soap_bytes_by_parameter_are_its_matrices():
    """SOAP on a (64, 2048) weight: Adam's two moments, and per dimension a statistic and an
    eigenbasis, d x d (the reference's `max_precondition_dim=10000` keeps both dimensions);
    the bias (1-D, `precondition_1d=False`) keeps the moments only."""
    params = _params(_Net())
    report = modopt.state_bytes(modopt.soap(3e-3), params, by_parameter=True)
    big = 4 * (2 * 64 * 2048 + 2 * (64**2 + 2048**2))
    # The attribution subtracts a scalar's state (mu, nu, a log2 scale) in the parameter's place.
    assert report.by_parameter[".big.weight"] == pytest.approx(big, abs=16)
    assert report.by_parameter[".big.bias"] == pytest.approx(4 * 2 * 64, abs=16)
    assert list(report.by_parameter)[0] == ".big.weight"
    assert report.largest[0].shape[-2:] == (2048, 2048)
    assert report.per_parameter > 100


def test_optimizer_warns_once_above_16_bytes_naming_the_arrays(fresh_warnings):
    model = _Net()
    with pytest.warns(modopt.StateMemoryWarning, match=r"float32\[1,2048,2048\].*max_precondition_dim") as record:
        optimizer = modopt.Optimizer(modopt.soap(3e-3), model)
    assert record[0].filename == __file__  # points at the caller's line
    report = optimizer.state_bytes()
    assert f"{report.per_parameter:.1f} bytes per trained parameter" in str(record[0].message)
    assert report.per_parameter == pytest.approx(modopt.state_bytes(modopt.soap(3e-3), _params(model)).per_parameter)
    assert f"{report.per_parameter:.1f} B per parameter" in repr(optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        modopt.Optimizer(modopt.soap(3e-3), model)  # once
        modopt.Optimizer(modopt.adamw(1e-3), model)  # 8 bytes per parameter: nothing to say


def test_the_warning_comes_before_the_state_is_allocated(fresh_warnings):
    """An abstract optimizer (`jax.eval_shape`) warns and reports alike: no array allocated."""
    with pytest.warns(modopt.StateMemoryWarning, match="Kron: `max_size_triangular`"):
        abstract = jax.eval_shape(lambda: modopt.Optimizer(modopt.kron(3e-4), _Net()))
    report = abstract.state_bytes()
    # Kron: per 2-D weight a triangular factor per axis (<= 8192) and the momentum.
    assert report.bytes >= 4 * (2048**2 + 64**2 + 64 * 2048)


@pytest.fixture(scope="module")
def reference():
    pytest.importorskip("precondition")
    added = [name for name in ("tree_map", "tree_flatten", "tree_unflatten") if not hasattr(jax, name)]
    for name in added:
        setattr(jax, name, getattr(jax.tree_util, name))
    from precondition import distributed_shampoo

    yield distributed_shampoo
    for name in added:
        delattr(jax, name)


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype float64")
def test_shampoo_statistics_have_the_reference_shapes(reference):
    """Dimensions smaller than the block keep their own size: a (10, 64) weight and a (10,)
    bias with blocks of 128 (shapes not merged) have the reference's statistics, 10 x 10 and
    64 x 64, not 128 x 128."""
    params = {"w": jnp.ones((10, 64)), "b": jnp.ones((10,))}
    ours = modopt.scale_by_shampoo(128, best_effort_shape_interpretation=False)
    mine = ours.unstacked(ours.init(params)).statistics
    theirs = reference.distributed_shampoo(1e-3, block_size=128, best_effort_shape_interpretation=False).init(params)
    shapes = {k: [tuple(s.shape) for s in v.statistics] for k, v in theirs.stats.items()}
    assert {k: [tuple(s.shape[1:]) for s in v] for k, v in mine.items()} == shapes == {"w": [(10, 10), (64, 64)], "b": [(10, 10)]}


def test_shampoo_small_statistics_share_one_root_program():
    """Without a mesh, statistics of sizes 2 to 64 with one root are padded to the largest and
    rooted in one batch: four vectors of four sizes lower to as many loops as one vector (each
    batch of roots is a program of its own, seconds to compile), with the roots of each size
    alone (the padded root is the root, padded)."""
    tx = modopt.scale_by_shampoo(start_preconditioning_step=0, graft_type="none", beta1=0.0, nesterov=False)
    sizes = (10, 16, 33, 64)
    params = {f"b{n}": jnp.zeros((n,)) for n in sizes}
    grads = {f"b{n}": jax.random.normal(jax.random.key(n), (n,)) for n in sizes}

    def loops(p):
        g = {k: grads[k] for k in p}
        return jax.jit(lambda g, s: tx.update(g, s)).lower(g, tx.init(p)).as_text().count("stablehlo.while")

    assert loops(params) == loops({"b10": params["b10"]})
    together, _ = tx.update(grads, tx.init(params))
    for n in sizes:
        alone, _ = tx.update({"b": grads[f"b{n}"]}, tx.init({"b": params[f"b{n}"]}))
        # A one-step statistic (rank one, damped by 1e-6 of its largest eigenvalue) has a
        # condition number of 1e6: float32 determines its root to ~1e-4 (see test_shampoo.py).
        np.testing.assert_allclose(together[f"b{n}"], alone["b"], rtol=1e-4, atol=1e-4 * float(jnp.abs(alone["b"]).max()))
