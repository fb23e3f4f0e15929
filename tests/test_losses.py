"""modopt.losses: parity with optax.losses (the test-only oracle), jit, finite-difference
gradients in float64, and clear trace-time errors for bad inputs."""

from __future__ import annotations

import dataclasses
import doctest
import functools
import inspect
import os
import re
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt
import modopt.losses as losses

NAMES = [
    "l2_loss",
    "squared_error",
    "huber_loss",
    "log_cosh",
    "hinge_loss",
    "sigmoid_binary_cross_entropy",
    "softmax_cross_entropy",
    "softmax_cross_entropy_with_integer_labels",
    "smooth_labels",
    "kl_divergence",
    "convex_kl_divergence",
    "cosine_similarity",
    "cosine_distance",
    "ctc_loss",
    "ctc_loss_with_forward_probs",
]


def oracle(name: str):
    """optax's loss of that name, without its deprecation warnings (convex_kl_divergence)."""
    fn = getattr(optax.losses, name)

    def call(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return fn(*args, **kwargs)

    return call


# ---------------------------------------------------------------------------------------------
# Cases: inputs for every loss, shared by the parity, jit and gradient checks.


@dataclasses.dataclass
class Case:
    id: str
    name: str
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    grad: tuple[int, ...] = ()  # arguments to check against finite differences (float64)
    rtol: float = 1e-6
    atol: float = 1e-6
    parity: bool = True  # also compared with optax (every case is, except gradient-only ones)

    def __str__(self):
        return self.id


_rng = np.random.default_rng(0)


def normal(*shape, scale=1.0):
    return (scale * _rng.normal(size=shape)).astype(np.float32)


def probabilities(*shape, axis=-1):
    x = _rng.uniform(0.1, 1.0, size=shape)
    return (x / x.sum(axis=axis, keepdims=True)).astype(np.float32)


def log_probabilities(*shape):
    return np.log(probabilities(*shape))


def one_hot(labels, classes):
    return np.eye(classes, dtype=np.float32)[labels]


def signs(*shape):
    return _rng.choice(np.array([-1, 1], np.int32), size=shape)


def _ctc_inputs(batch=2, frames=6, classes=4, max_labels=3, blank_id=0, scale=1.0):
    """Logits, paddings (the second sequence shorter), labels with a repeat, right-padded."""
    logits = normal(batch, frames, classes, scale=scale)
    logit_paddings = np.zeros((batch, frames), np.float32)
    logit_paddings[1:, frames - 2 :] = 1.0
    ids = [c for c in range(classes) if c != blank_id]
    labels = np.stack([_rng.choice(ids, size=max_labels) for _ in range(batch)]).astype(np.int32)
    labels[0, 1] = labels[0, 0]  # a repeated label needs a blank between
    label_paddings = np.zeros((batch, max_labels), np.float32)
    label_paddings[1:, max_labels - 1 :] = 1.0
    return logits, logit_paddings, labels, label_paddings


def _ctc_cases():
    name = "ctc_loss_with_forward_probs"
    # Three sequences with frames (5, 3, 3) and labels (4, 3, 3), padded with the id -1. The
    # first, 1 1 2 3, just fits in 5 frames (a blank between the repeats); the third, 1 1 1
    # in 3 frames, is impossible: its loss is of the order of -log_epsilon.
    mixed = list(_ctc_inputs(batch=3, frames=5, classes=5, max_labels=4, scale=3.0))
    mixed[2][0] = [1, 1, 2, 3]
    mixed[2][2, :3] = 1
    mixed[2] = np.where(mixed[3] > 0, -1, mixed[2])
    return [
        Case(f"{name}-default", name, _ctc_inputs(), rtol=1e-5),
        Case(
            f"{name}-blank2-eps",
            name,
            _ctc_inputs(blank_id=2),
            {"blank_id": 2, "log_epsilon": -1e4},
            rtol=1e-5,
        ),
        Case("ctc_loss-padded-impossible", "ctc_loss", tuple(mixed), rtol=1e-5),
        Case(
            "ctc_loss-grad",
            "ctc_loss",
            _ctc_inputs(batch=1, frames=4, classes=3, max_labels=2),
            grad=(0,),
            parity=False,  # the cases above cover it; this one is small for finite differences
        ),
    ]


def _int_labels(shape, classes):
    return _rng.integers(0, classes, size=shape).astype(np.int32)


CASES = [
    # Regression.
    *[
        Case(
            f"{name}-{shape}", name, (normal(*shape), normal(*shape)), grad=(0, 1) if len(shape) == 2 else ()
        )
        for name in ("l2_loss", "squared_error", "huber_loss", "log_cosh")
        for shape in [(5,), (2, 3)]
    ],
    Case("l2_loss-scalar", "l2_loss", (np.float32(1.5), np.float32(-0.5))),
    *[Case(f"{name}-no-targets", name, (normal(2, 3),)) for name in ("l2_loss", "squared_error")],
    Case("huber_loss-no-targets", "huber_loss", (normal(2, 3, scale=2.0),)),
    Case("huber_loss-delta", "huber_loss", (normal(7, scale=2.0), normal(7)), {"delta": 0.5}, grad=(0, 1)),
    Case("huber_loss-broadcast", "huber_loss", (normal(3, 4, scale=2.0), normal(4))),
    Case("huber_loss-bfloat16", "huber_loss", (normal(6).astype(jnp.bfloat16),), rtol=1e-2),
    Case("log_cosh-large", "log_cosh", (normal(3, 4, scale=30.0), normal(3, 4)), grad=(0, 1)),
    Case("log_cosh-no-targets", "log_cosh", (normal(2, 3, scale=3.0),)),
    Case("log_cosh-broadcast", "log_cosh", (normal(3, 4), normal(3, 1))),
    # Classification.
    Case("hinge_loss-int-targets", "hinge_loss", (normal(5, scale=2.0), signs(5)), grad=(0,)),
    Case("hinge_loss-float-targets", "hinge_loss", (normal(2, 3, scale=2.0), signs(2, 3).astype(np.float32))),
    Case("hinge_loss-broadcast", "hinge_loss", (normal(2, 3, scale=2.0), signs(3))),
    Case("sigmoid_bce-binary", "sigmoid_binary_cross_entropy", (normal(6), _int_labels((6,), 2)), grad=(0,)),
    Case(
        "sigmoid_bce-probabilities",
        "sigmoid_binary_cross_entropy",
        (normal(2, 3), _rng.uniform(size=(2, 3)).astype(np.float32)),
        grad=(0, 1),
    ),
    Case(
        "sigmoid_bce-large-logits",
        "sigmoid_binary_cross_entropy",
        (
            np.array([-100.0, -30.0, 0.0, 30.0, 100.0], np.float32),
            np.array([1.0, 0.0, 1.0, 1.0, 0.0], np.float32),
        ),
    ),
    Case("sigmoid_bce-broadcast", "sigmoid_binary_cross_entropy", (normal(2, 3), _int_labels((3,), 2))),
    Case(
        "sigmoid_bce-bool-labels",
        "sigmoid_binary_cross_entropy",
        (normal(4), np.array([True, False, True, False])),
    ),
    *[
        Case(
            f"softmax_ce-{shape}",
            "softmax_cross_entropy",
            (normal(*shape), probabilities(*shape)),
            grad=(0, 1) if len(shape) == 2 else (),
        )
        for shape in [(5,), (3, 5), (2, 3, 4)]
    ],
    Case("softmax_ce-one-hot", "softmax_cross_entropy", (normal(4, 3), one_hot(_int_labels((4,), 3), 3))),
    Case(
        "softmax_ce-large-logits",
        "softmax_cross_entropy",
        (normal(3, 5, scale=1000.0), one_hot(_int_labels((3,), 5), 5)),
        rtol=1e-5,
    ),
    Case(
        "softmax_ce-axis0", "softmax_cross_entropy", (normal(5, 3), probabilities(5, 3, axis=0)), {"axis": 0}
    ),
    Case(
        "softmax_ce-axis-none", "softmax_cross_entropy", (normal(2, 3), probabilities(2, 3)), {"axis": None}
    ),
    Case(
        "softmax_ce-where",
        "softmax_cross_entropy",
        (normal(3, 4), one_hot([0, 1, 3], 4)),
        {"where": np.array([[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1]], bool)},
    ),
    Case("softmax_ce-broadcast", "softmax_cross_entropy", (normal(3, 4), probabilities(4))),
    *[
        Case(
            f"int_ce-{shape}",
            "softmax_cross_entropy_with_integer_labels",
            (normal(*shape), _int_labels(shape[:-1], shape[-1])),
            grad=(0,) if len(shape) == 2 else (),
        )
        for shape in [(5,), (3, 5), (2, 3, 4)]
    ],
    Case(
        "int_ce-large-logits",
        "softmax_cross_entropy_with_integer_labels",
        (normal(3, 5, scale=1000.0), _int_labels((3,), 5)),
        rtol=1e-5,
    ),
    Case(
        "int_ce-axis0",
        "softmax_cross_entropy_with_integer_labels",
        (normal(5, 3), _int_labels((3,), 5)),
        {"axis": 0},
    ),
    Case(
        "int_ce-axes",
        "softmax_cross_entropy_with_integer_labels",
        (normal(2, 3, 4), _int_labels((2,), 12)),
        {"axis": (1, 2)},
        grad=(0,),
    ),
    Case(
        "int_ce-where",
        "softmax_cross_entropy_with_integer_labels",
        (normal(3, 4), np.array([0, 1, 3], np.int32)),
        {"where": np.array([[1, 1, 0, 1], [0, 0, 0, 0], [0, 1, 1, 1]], bool)},
    ),
    Case(
        "int_ce-where-batch",
        "softmax_cross_entropy_with_integer_labels",
        (normal(3, 4), np.array([0, 1, 3], np.int32)),
        {"where": np.array([True, False, True])},
    ),
    Case("smooth_labels-2d", "smooth_labels", (one_hot(_int_labels((3,), 5), 5), 0.1), grad=(0,)),
    Case("smooth_labels-1d", "smooth_labels", (one_hot(2, 4), 0.3)),
    Case("smooth_labels-axis0", "smooth_labels", (one_hot(_int_labels((3,), 4), 4).T, 0.2), {"axis": 0}),
    Case(
        "smooth_labels-where",
        "smooth_labels",
        (one_hot([0, 1], 4), 0.2),
        {"where": np.array([[1, 1, 0, 1], [1, 1, 1, 1]], bool)},
    ),
    Case(
        "smooth_labels-where-row",
        "smooth_labels",
        (one_hot([0, 1, 2], 4), 0.2),
        {"where": np.array([1, 1, 1, 0], bool)},
    ),
    # Divergences and similarities.
    *[
        Case(
            f"{name}-{shape}",
            name,
            (log_probabilities(*shape), probabilities(*shape)),
            grad=(0, 1) if len(shape) == 2 else (),
        )
        for name in ("kl_divergence", "convex_kl_divergence")
        for shape in [(5,), (2, 3)]
    ],
    *[
        Case(
            f"{name}-zero-targets",
            name,
            (log_probabilities(2, 4), np.array([[0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0]], np.float32)),
        )
        for name in ("kl_divergence", "convex_kl_divergence")
    ],
    Case(
        "kl_divergence-unnormalized",
        "convex_kl_divergence",
        (normal(3, 4), _rng.uniform(0.1, 2.0, size=(3, 4)).astype(np.float32)),
        grad=(0, 1),
    ),
    Case(
        "kl_divergence-where",
        "kl_divergence",
        (log_probabilities(2, 3), probabilities(2, 3)),
        {"where": np.array([[1, 0, 1], [1, 1, 1]], bool)},
    ),
    Case(
        "convex_kl_divergence-where-row",
        "convex_kl_divergence",
        (log_probabilities(2, 3), probabilities(2, 3)),
        {"where": np.array([1, 0, 1], bool)},
    ),
    Case(
        "kl_divergence-axis-none",
        "kl_divergence",
        (log_probabilities(2, 3), probabilities(2, 3)),
        {"axis": None},
    ),
    Case("kl_divergence-3d", "kl_divergence", (log_probabilities(2, 2, 3), probabilities(2, 2, 3))),
    *[
        Case(
            f"{name}-{shape}", name, (normal(*shape), normal(*shape)), grad=(0, 1) if len(shape) == 2 else ()
        )
        for name in ("cosine_similarity", "cosine_distance")
        for shape in [(5,), (2, 3)]
    ],
    *[
        Case(f"{name}-epsilon", name, (normal(3, 4, scale=1e-3), normal(3, 4)), {"epsilon": 1e-4}, grad=(0,))
        for name in ("cosine_similarity", "cosine_distance")
    ],
    Case("cosine_similarity-axis0", "cosine_similarity", (normal(4, 3), normal(4, 3)), {"axis": 0}),
    Case("cosine_similarity-3d", "cosine_similarity", (normal(2, 2, 3), normal(2, 2, 3))),
    Case("cosine_similarity-broadcast", "cosine_similarity", (normal(3, 4), normal(4))),
    Case(
        "cosine_distance-where",
        "cosine_distance",
        (normal(2, 3), normal(2, 3)),
        {"where": np.array([[1, 0, 1], [1, 1, 1]], bool)},
    ),
    # CTC.
    *_ctc_cases(),
]
GRAD_CASES = [c for c in CASES if c.grad]


def test_every_loss_has_cases():
    # The losses optax added later have their cases in test_losses_extra.py.
    assert set(NAMES) <= set(losses.__all__ if hasattr(losses, "__all__") else _public(losses))
    covered = {c.name for c in CASES}
    assert covered == set(NAMES), set(NAMES) - covered
    # ctc_loss_with_forward_probs computes its loss as ctc_loss does.
    assert {c.name for c in GRAD_CASES} == set(NAMES) - {"ctc_loss_with_forward_probs"}


def _public(module):
    return [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]


def _assert_close(ours, theirs, case: Case):
    ours, theirs = jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape, (a.shape, b.shape)
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_allclose(
            np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=case.rtol, atol=case.atol
        )


@pytest.mark.parametrize("case", [c for c in CASES if c.parity], ids=str)
def test_matches_optax(case):
    """Compiled once each (jit): eager op-by-op dispatch would dominate the test time."""
    ours = jax.jit(functools.partial(getattr(losses, case.name), **case.kwargs))(*case.args)
    theirs = jax.jit(functools.partial(oracle(case.name), **case.kwargs))(*case.args)
    _assert_close(ours, theirs, case)
    assert all(np.all(np.isfinite(np.asarray(x, np.float64))) for x in jax.tree_util.tree_leaves(ours))


EAGER_CASES = [next(c for c in CASES if c.name == name) for name in NAMES]


@pytest.mark.parametrize("case", EAGER_CASES, ids=str)
def test_jit_matches_eager(case):
    fn = functools.partial(getattr(losses, case.name), **case.kwargs)
    eager = fn(*case.args)
    jitted = jax.jit(fn)(*case.args)
    _assert_close(jitted, eager, dataclasses.replace(case, rtol=1e-6, atol=1e-6))


# ---------------------------------------------------------------------------------------------
# Gradients against central finite differences, in float64.


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _to64(x):
    x = np.asarray(x)
    return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x


@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_gradient_matches_finite_differences(case, x64):
    args = [_to64(a) for a in case.args]
    loss = functools.partial(getattr(losses, case.name), **case.kwargs)
    weights = np.random.default_rng(1).normal(size=jax.eval_shape(loss, *args).shape)

    def objective(*a):
        return jnp.sum(weights * loss(*a))

    # One compilation: the finite differences reuse it and ignore the gradients it also returns.
    value_and_grad = jax.jit(jax.value_and_grad(objective, argnums=case.grad))
    value, grads = value_and_grad(*args)
    assert value.dtype == jnp.float64
    h = 1e-6
    for argnum, grad in zip(case.grad, grads):
        base = args[argnum]
        numeric = np.zeros_like(base)
        for index in np.ndindex(base.shape):
            values = []
            for step in (h, -h):
                moved = base.copy()
                moved[index] += step
                values.append(float(value_and_grad(*args[:argnum], moved, *args[argnum + 1 :])[0]))
            numeric[index] = (values[0] - values[1]) / (2 * h)
        np.testing.assert_allclose(
            np.asarray(grad), numeric, rtol=1e-5, atol=1e-6, err_msg=f"argument {argnum}"
        )


# ---------------------------------------------------------------------------------------------
# API: names, signatures, defaults; the seeds' positional calls; no optax inside modopt.


@pytest.mark.parametrize("name", NAMES)
def test_signature_matches_optax(name):
    ours = inspect.signature(getattr(losses, name)).parameters
    theirs = inspect.signature(getattr(optax.losses, name)).parameters
    assert list(ours) == list(theirs)
    for param in theirs.values():
        assert ours[param.name].default == param.default, param.name
        if param.kind is not inspect.Parameter.KEYWORD_ONLY:  # optax's keyword-only may be positional here
            assert ours[param.name].kind == param.kind, param.name


def test_seed_positional_calls():
    """The seeds pass delta, epsilon and blank_id positionally; optax 0.2.8 by keyword only."""
    p, t = normal(6, scale=2.0), normal(6)
    a, b = normal(3, 4), normal(3, 4)
    inputs = _ctc_inputs(blank_id=1)

    @jax.jit
    def run():
        ours = (
            losses.huber_loss(p, t, 0.5),
            losses.cosine_similarity(a, b, 1e-3),
            losses.cosine_distance(a, b, 1e-3),
            losses.ctc_loss(*inputs, 1, -1e5),
        )
        theirs = (
            oracle("huber_loss")(p, t, delta=0.5),
            oracle("cosine_similarity")(a, b, epsilon=1e-3),
            oracle("cosine_distance")(a, b, epsilon=1e-3),
            oracle("ctc_loss")(*inputs, blank_id=1, log_epsilon=-1e5),
        )
        return ours, theirs

    for ours, theirs in zip(*run()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_modopt_losses_never_imports_optax():
    folder = os.path.dirname(losses.__file__)
    for filename in os.listdir(folder):
        if filename.endswith(".py"):
            text = open(os.path.join(folder, filename)).read()
            assert not re.search(r"^\s*(import|from)\s+optax", text, re.MULTILINE), filename


def test_docstring_examples_run():
    from modopt.losses import _classification, _ctc, _divergence, _regression

    for module in (_regression, _classification, _divergence, _ctc):
        result = doctest.testmod(
            module,
            extraglobs={"modopt": modopt, "jnp": jnp},
            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        )
        assert result.attempted > 0 and result.failed == 0, module.__name__
    for name in NAMES:
        doc = getattr(losses, name).__doc__
        for section in ("Args:", "Returns:", "Example:", "Reference:"):
            assert section in doc, (name, section)


# ---------------------------------------------------------------------------------------------
# Edge values, and the places where modopt deliberately differs from optax.


def test_targets_none_means_zeros():
    p = normal(2, 3)
    zeros = np.zeros_like(p)
    for name in ("l2_loss", "squared_error", "huber_loss", "log_cosh"):
        np.testing.assert_array_equal(getattr(losses, name)(p), getattr(losses, name)(p, zeros))


def test_log_cosh_keeps_relative_precision_for_tiny_errors():
    e = np.array([1e-15, 1e-8, 1e-4, 0.5, 0.999, 1.001, 5.0, 80.0, 1e4], np.float32)
    e64 = e.astype(np.float64)
    with np.errstate(over="ignore"):
        expected = np.where(
            e64 < 1e-3,
            e64**2 / 2 - e64**4 / 12,  # float64's cosh rounds to 1 for tiny e
            np.where(e64 < 30, np.log(np.cosh(e64)), e64 - np.log(2.0)),
        )
    log_cosh = jax.jit(losses.log_cosh)
    np.testing.assert_allclose(log_cosh(e), expected, rtol=2e-7)
    for dtype in (jnp.float16, jnp.bfloat16):  # no overflow in the small-error branch
        out = log_cosh(jnp.asarray([0.5, 3.0, 20.0, 1e3], dtype))
        assert out.dtype == dtype and bool(jnp.all(jnp.isfinite(out)))
    assert np.all(np.isfinite(jax.jit(jax.grad(lambda x: losses.log_cosh(x).sum()))(jnp.asarray(e))))


def test_kl_divergence_zero_target_with_zero_prediction_is_zero():
    """optax gives NaN for `0 * (log 0 - (-inf))`; modopt follows `0 log 0 = 0`, with finite gradients."""
    log_p = jnp.array([0.0, -jnp.inf])
    q = jnp.array([1.0, 0.0])
    for name in ("kl_divergence", "convex_kl_divergence"):
        assert float(getattr(losses, name)(log_p, q)) == 0.0
        assert bool(jnp.isnan(oracle(name)(log_p, q)))
        grads = jax.grad(lambda a, b, name=name: getattr(losses, name)(a, b), argnums=(0, 1))(log_p, q)
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def test_softmax_cross_entropy_masked_class_with_minus_inf_logit():
    """A class masked with a `-inf` logit and a zero label contributes 0 (optax: NaN)."""
    logits = jnp.array([[2.0, -jnp.inf, 0.5]])
    labels = jnp.array([[1.0, 0.0, 0.0]])

    @jax.jit
    def run(x, y):
        ours = losses.softmax_cross_entropy(x, y)
        grad = jax.grad(lambda z: losses.softmax_cross_entropy(z, y).sum())(x)
        integer = losses.softmax_cross_entropy_with_integer_labels(x, jnp.array([0]))
        return ours, grad, integer, oracle("softmax_cross_entropy")(x, y), -jax.nn.log_softmax(x)[:, 0]

    ours, grad, integer, theirs, expected = run(logits, labels)
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
    np.testing.assert_allclose(integer, expected, rtol=1e-6)
    assert bool(jnp.all(jnp.isfinite(grad)))
    assert bool(jnp.isnan(theirs[0]))


def test_cosine_with_epsilon_on_zero_vectors():
    zero, v = jnp.zeros((1, 3)), jnp.ones((1, 3))
    assert float(losses.cosine_similarity(zero, v, epsilon=1e-12)[0]) == 0.0
    assert float(losses.cosine_distance(zero, v, epsilon=1e-12)[0]) == 1.0
    assert bool(jnp.isnan(losses.cosine_similarity(zero, v)[0]))  # as optax: the default epsilon is 0


def test_ctc_matches_brute_force_enumeration():
    """An independent reference: sum over every frame-level path that collapses to the labels."""
    import itertools

    logits, _, _, _ = _ctc_inputs(batch=1, frames=4, classes=3)
    ctc_loss = jax.jit(losses.ctc_loss)
    log_probs = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)), np.float64)[0]
    for target in ([1], [1, 2], [2, 2], [1, 1, 2]):
        total = 0.0
        for path in itertools.product(range(3), repeat=4):
            collapsed = [c for i, c in enumerate(path) if c != 0 and (i == 0 or path[i - 1] != c)]
            if collapsed == target:
                total += np.exp(sum(log_probs[t, c] for t, c in enumerate(path)))
        labels = np.array([target + [0] * (3 - len(target))], np.int32)
        label_paddings = np.array([[0.0] * len(target) + [1.0] * (3 - len(target))], np.float32)
        loss = ctc_loss(logits, np.zeros((1, 4), np.float32), labels, label_paddings)
        np.testing.assert_allclose(float(loss[0]), -np.log(total), rtol=1e-5)


def test_ctc_padded_frames_change_nothing():
    logits, _, labels, label_paddings = _ctc_inputs(batch=1, frames=4)
    longer = np.concatenate([logits, normal(1, 3, logits.shape[2], scale=5.0)], axis=1)
    paddings = np.array([[0, 0, 0, 0, 1, 1, 1]], np.float32)
    ctc_loss = jax.jit(losses.ctc_loss)
    np.testing.assert_allclose(
        ctc_loss(longer, paddings, labels, label_paddings),
        ctc_loss(logits, np.zeros((1, 4), np.float32), labels, label_paddings),
        rtol=1e-6,
    )


# ---------------------------------------------------------------------------------------------
# Bad input: a clear error at trace time, naming the loss, the argument and the problem.

L = losses
f3, f4, f35 = np.ones(3, np.float32), np.ones(4, np.float32), np.ones((3, 5), np.float32)
i3 = np.zeros(3, np.int32)
_ctc = _ctc_inputs(batch=2, frames=6, classes=4)  # logits (2, 6, 4), paddings (2, 6), labels (2, 3)


def _ctc_with(index, value, name="ctc_loss", **kwargs):
    args = list(_ctc)
    if index is not None:
        args[index] = value
    return lambda: getattr(L, name)(*args, **kwargs)


BAD: list[tuple[str, Any, type, str]] = [
    # Regression.
    (
        "huber-shapes",
        lambda: L.huber_loss(f3, f4),
        ValueError,
        "huber_loss: predictions of shape (3,) and targets of shape (4,) do not broadcast",
    ),
    (
        "log_cosh-shapes",
        lambda: L.log_cosh(f35, f4),
        ValueError,
        "log_cosh: predictions of shape (3, 5) and targets",
    ),
    (
        "l2-same-shape",
        lambda: L.l2_loss(f3, f3[:, None]),
        ValueError,
        "l2_loss: predictions of shape (3,) and targets of shape (3, 1) must have the same shape",
    ),
    (
        "squared-same-shape",
        lambda: L.squared_error(f3, f4),
        ValueError,
        "squared_error: predictions of shape (3,)",
    ),
    (
        "squared-int-predictions",
        lambda: L.squared_error(i3),
        TypeError,
        "squared_error: predictions must be a floating-point array, got the integer dtype int32",
    ),
    (
        "huber-complex-targets",
        lambda: L.huber_loss(f3, f3.astype(np.complex64)),
        TypeError,
        "huber_loss: targets must be a real",
    ),
    (
        "huber-delta",
        lambda: L.huber_loss(f3, delta=-1.0),
        ValueError,
        "Invalid delta: -1.0 (must be >= 0) in huber_loss.",
    ),
    ("log_cosh-string", lambda: L.log_cosh("abc"), TypeError, "log_cosh: predictions must be"),
    # Classification.
    (
        "hinge-bool-targets",
        lambda: L.hinge_loss(f3, np.array([True, False, True])),
        TypeError,
        "hinge_loss: targets must be a real floating-point or integer array, got the boolean dtype bool; "
        "targets must be -1 or +1; map {0, 1} labels with `2 * labels - 1`",
    ),
    (
        "hinge-int-outputs",
        lambda: L.hinge_loss(i3, i3),
        TypeError,
        "hinge_loss: predictor_outputs must be a floating",
    ),
    (
        "hinge-shapes",
        lambda: L.hinge_loss(f3, f4),
        ValueError,
        "hinge_loss: predictor_outputs of shape (3,) and targets",
    ),
    (
        "sigmoid-int-logits",
        lambda: L.sigmoid_binary_cross_entropy(i3, i3),
        TypeError,
        "sigmoid_binary_cross_entropy: logits must be a floating-point array",
    ),
    (
        "sigmoid-shapes",
        lambda: L.sigmoid_binary_cross_entropy(f35, f4),
        ValueError,
        "sigmoid_binary_cross_entropy: logits of shape (3, 5) and labels of shape (4,) do not broadcast",
    ),
    (
        "softmax-integer-labels",
        lambda: L.softmax_cross_entropy(f35, i3),
        TypeError,
        "softmax_cross_entropy: labels must be a floating-point array, got the integer dtype int32; "
        "softmax_cross_entropy takes one-hot or probability labels with the class axis; for integer class "
        "indices use softmax_cross_entropy_with_integer_labels",
    ),
    (
        "softmax-int-one-hot",
        lambda: L.softmax_cross_entropy(f35, np.zeros((3, 5), np.int32)),
        TypeError,
        "cast one-hot labels with `labels.astype(float32)`",
    ),
    (
        "softmax-int-logits",
        lambda: L.softmax_cross_entropy(i3, f3),
        TypeError,
        "softmax_cross_entropy: logits must",
    ),
    (
        "softmax-shapes",
        lambda: L.softmax_cross_entropy(f35, f4),
        ValueError,
        "softmax_cross_entropy: logits of shape (3, 5) and labels of shape (4,) do not broadcast",
    ),
    (
        "softmax-axis",
        lambda: L.softmax_cross_entropy(f35, f35, axis=2),
        ValueError,
        "softmax_cross_entropy: axis 2 is out of range for logits of rank 2",
    ),
    (
        "softmax-where-dtype",
        lambda: L.softmax_cross_entropy(f35, f35, where=np.ones((3, 5), np.int32)),
        TypeError,
        "softmax_cross_entropy: where must be a boolean mask, got the integer dtype int32",
    ),
    (
        "softmax-where-shape",
        lambda: L.softmax_cross_entropy(f35, f35, where=np.ones((2, 3, 5), bool)),
        ValueError,
        "softmax_cross_entropy: where of shape (2, 3, 5) does not broadcast to logits of shape (3, 5), or to "
        "that shape without the reduced axis 1",
    ),
    (
        "int_ce-float-labels",
        lambda: L.softmax_cross_entropy_with_integer_labels(f35, f35),
        TypeError,
        "softmax_cross_entropy_with_integer_labels: labels must be an integer array of class indices, "
        "got the floating-point dtype float32; these look like one-hot or probability labels: "
        "use softmax_cross_entropy",
    ),
    (
        "int_ce-float-indices",
        lambda: L.softmax_cross_entropy_with_integer_labels(f35, f3),
        TypeError,
        "cast class indices with `labels.astype(jnp.int32)`",
    ),
    (
        "int_ce-shape",
        lambda: L.softmax_cross_entropy_with_integer_labels(f35, np.zeros(4, np.int32)),
        ValueError,
        "softmax_cross_entropy_with_integer_labels: labels of shape (4,) must have the shape of logits "
        "(3, 5) without its class axis -1, that is (3,)",
    ),
    (
        "int_ce-rank",
        lambda: L.softmax_cross_entropy_with_integer_labels(f35, np.zeros((3, 1), np.int32)),
        ValueError,
        "labels of shape (3, 1) must have the shape of logits (3, 5)",
    ),
    (
        "int_ce-axis-none",
        lambda: L.softmax_cross_entropy_with_integer_labels(f35, i3, axis=None),
        TypeError,
        "softmax_cross_entropy_with_integer_labels: axis must be an int or a tuple of ints, got None",
    ),
    (
        "int_ce-int-logits",
        lambda: L.softmax_cross_entropy_with_integer_labels(i3, i3),
        TypeError,
        "softmax_cross_entropy_with_integer_labels: logits must be a floating-point array",
    ),
    (
        "smooth-int-labels",
        lambda: L.smooth_labels(np.eye(3, dtype=np.int32), 0.1),
        TypeError,
        "smooth_labels: labels must be a floating-point array, got the integer dtype int32",
    ),
    (
        "smooth-alpha",
        lambda: L.smooth_labels(f35, 1.5),
        ValueError,
        "Invalid alpha: 1.5 (must be in [0, 1]) in smooth_labels.",
    ),
    (
        "smooth-where-shape",
        lambda: L.smooth_labels(f35, 0.1, where=np.ones(3, bool)),
        ValueError,
        "smooth_labels: where of shape (3,) does not broadcast to labels of shape (3, 5).",
    ),
    # Divergences and similarities.
    (
        "kl-int-targets",
        lambda: L.kl_divergence(f35, np.zeros((3, 5), np.int32)),
        TypeError,
        "kl_divergence: targets must be a floating-point array, got the integer dtype int32; targets are "
        "probabilities: cast with `targets.astype(float32)`",
    ),
    (
        "kl-shapes",
        lambda: L.kl_divergence(f35, f4),
        ValueError,
        "kl_divergence: log_predictions of shape (3, 5) and targets of shape (4,) do not broadcast",
    ),
    (
        "convex_kl-int-log-predictions",
        lambda: L.convex_kl_divergence(i3, f3),
        TypeError,
        "convex_kl_divergence: log_predictions must be a floating-point array",
    ),
    (
        "cosine-epsilon",
        lambda: L.cosine_similarity(f3, f3, epsilon=-1.0),
        ValueError,
        "Invalid epsilon: -1.0 (must be >= 0) in cosine_similarity.",
    ),
    (
        "cosine-int",
        lambda: L.cosine_distance(f3, i3),
        TypeError,
        "cosine_distance: targets must be a floating-point array, got the integer dtype int32",
    ),
    (
        "cosine-shapes",
        lambda: L.cosine_distance(f35, f4),
        ValueError,
        "cosine_distance: predictions of shape (3, 5) and targets of shape (4,) do not broadcast",
    ),
    (
        "cosine-axis",
        lambda: L.cosine_similarity(f35, f35, axis=(0, 0)),
        ValueError,
        "cosine_similarity: axis (0, 0) repeats an axis",
    ),
    # CTC.
    (
        "ctc-logits-rank",
        _ctc_with(0, np.ones((2, 6), np.float32)),
        ValueError,
        "ctc_loss: logits must have rank 3, laid out (B, T, K): batch, time frames, classes including "
        "the blank, got shape (2, 6) (rank 2)",
    ),
    (
        "ctc-int-logits",
        _ctc_with(0, np.ones((2, 6, 4), np.int32)),
        TypeError,
        "ctc_loss: logits must be a floating-point array",
    ),
    (
        "ctc-logit-paddings",
        _ctc_with(1, np.zeros((2, 7), np.float32)),
        ValueError,
        "ctc_loss: logit_paddings of shape (2, 7) must have the shape (B, T) = (2, 6) of logits (2, 6, 4) "
        "without the class axis",
    ),
    (
        "ctc-float-labels",
        _ctc_with(2, np.ones((2, 3), np.float32)),
        TypeError,
        "ctc_loss: labels must be an integer array of class indices, got the floating-point dtype float32",
    ),
    (
        "ctc-labels-rank",
        _ctc_with(2, np.ones(2, np.int32)),
        ValueError,
        "ctc_loss: labels must have rank 2, laid out (B, N): batch, label positions, got shape (2,) (rank 1)",
    ),
    (
        "ctc-labels-batch",
        _ctc_with(2, np.ones((3, 3), np.int32)),
        ValueError,
        "ctc_loss: labels of shape (3, 3) must have the batch size B = 2 of logits (2, 6, 4)",
    ),
    (
        "ctc-label-paddings",
        _ctc_with(3, np.zeros((2, 4), np.float32)),
        ValueError,
        "ctc_loss: label_paddings of shape (2, 4) must have the shape of labels, (2, 3)",
    ),
    (
        "ctc-complex-paddings",
        _ctc_with(3, np.zeros((2, 3), np.complex64)),
        TypeError,
        "ctc_loss: label_paddings must be a real",
    ),
    (
        "ctc-blank-id",
        _ctc_with(None, None, blank_id=4),
        ValueError,
        "Invalid blank_id: 4 (must be in [0, 4), a class of logits (2, 6, 4)) in ctc_loss.",
    ),
    (
        "ctc-blank-id-type",
        _ctc_with(None, None, blank_id=1.5),
        TypeError,
        "ctc_loss: blank_id must be a Python int",
    ),
    (
        "ctc-log-epsilon",
        _ctc_with(None, None, log_epsilon=-np.inf),
        ValueError,
        "Invalid log_epsilon: -inf (must be a finite negative number, e.g. -1e5) in ctc_loss.",
    ),
    (
        "ctc-forward-probs-names-itself",
        _ctc_with(2, np.ones((2, 3), np.float32), name="ctc_loss_with_forward_probs"),
        TypeError,
        "ctc_loss_with_forward_probs: labels must be an integer array",
    ),
]


@pytest.mark.parametrize("call, error, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_gives_a_clear_error(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_errors_are_raised_at_trace_time_under_jit():
    with pytest.raises(
        ValueError, match=re.escape("huber_loss: predictions of shape (3,) and targets of shape (4,)")
    ):
        jax.jit(losses.huber_loss)(jnp.ones(3), jnp.ones(4))
    with pytest.raises(
        TypeError, match=re.escape("softmax_cross_entropy_with_integer_labels: labels must be an")
    ):
        jax.jit(losses.softmax_cross_entropy_with_integer_labels)(jnp.ones((3, 5)), jnp.ones(3))
    # Traced hyperparameters cannot be checked and are accepted.
    out = jax.jit(losses.huber_loss)(jnp.ones(3), jnp.zeros(3), jnp.asarray(0.5))
    np.testing.assert_allclose(out, [0.375] * 3)
