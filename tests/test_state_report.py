"""What an optimizer's state costs, before it is allocated (`modopt.state_bytes`,
`Optimizer.state_bytes`, the repr) and the warning above 16 bytes per parameter: bytes against
the algorithms' own counts (Adam: two moments; SOAP: two moments and, per dimension up to
`max_precondition_dim`, a statistic and a basis; Kron: its factors)."""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import modopt
from modopt._state import report as _state_report


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


def test_the_warning_points_into_an_example_job_not_past_it(fresh_warnings):
    """The example jobs (`modopt.examples`) are user code: the warning names their line that
    built the optimizer, not the line that launched the job."""
    job = compile("optimizer = modopt.Optimizer(modopt.soap(3e-3), model)\n", "example_job.py", "exec")
    with pytest.warns(modopt.StateMemoryWarning) as record:
        exec(job, {"__name__": "modopt.examples.example_job", "modopt": modopt, "model": _Net()})
    assert (record[0].filename, record[0].lineno) == ("example_job.py", 1)


def test_the_warning_comes_before_the_state_is_allocated(fresh_warnings):
    """An abstract optimizer (`jax.eval_shape`) warns and reports alike: no array allocated."""
    with pytest.warns(modopt.StateMemoryWarning, match="Kron: `max_size_triangular`"):
        abstract = jax.eval_shape(lambda: modopt.Optimizer(modopt.kron(3e-4), _Net()))
    report = abstract.state_bytes()
    # Kron: per 2-D weight a triangular factor per axis (<= 8192) and the momentum.
    assert report.bytes >= 4 * (2048**2 + 64**2 + 64 * 2048)


def test_a_step_count_does_not_tip_sixteen_bytes_into_a_warning(fresh_warnings):
    """Adan keeps four float32 arrays per parameter (its two moments, the moment of the
    gradient's difference and the last gradient) and a step count: more than 16 bytes per
    parameter only by the count's 4 bytes, which do not grow with the model. No warning; one
    float32 array more per parameter (an EMA of the updates after it) warns."""
    params = {"w": jnp.zeros((30, 20)), "b": jnp.zeros((20,))}
    report = modopt.state_bytes(modopt.adan(1e-3), params)
    assert report.bytes == 4 * 4 * 620 + 4 and report.per_parameter > 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        modopt.Optimizer(modopt.adan(1e-3), params)
    with pytest.warns(modopt.StateMemoryWarning, match="20.0 bytes per trained parameter"):
        modopt.Optimizer(modopt.chain(modopt.adan(1e-3), modopt.ema(0.9)), params)
