"""The losses optax 0.2.8 added beyond the first set (focal, poly, safe cross entropy, margins,
Fenchel-Young and sparsemax, divergences, Dice, ranking, NT-Xent, triplet): values and gradients
against optax on random inputs, one property per family, modopt's deliberate departures, and
clear errors for bad inputs."""

from __future__ import annotations

import dataclasses
import doctest
import functools
import inspect
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt
import modopt.losses as losses
from modopt.losses import (
    _fenchel_young,
    _margin,
    _ranking,
    _segmentation,
    _self_supervised,
)

NAMES = [
    "safe_softmax_cross_entropy",
    "poly_loss_cross_entropy",
    "sigmoid_focal_loss",
    "perceptron_loss",
    "multiclass_hinge_loss",
    "multiclass_perceptron_loss",
    "sparsemax_loss",
    "multiclass_sparsemax_loss",
    "make_fenchel_young_loss",
    "kl_divergence_with_log_targets",
    "generalized_kl_divergence",
    "dice_loss",
    "binary_dice_loss",
    "multiclass_generalized_dice_loss",
    "ranking_softmax_loss",
    "ntxent",
    "triplet_margin_loss",
]
# _classification and _divergence's examples run in test_losses.py.
MODULES = (_fenchel_young, _margin, _ranking, _segmentation, _self_supervised)

_rng = np.random.default_rng(0)


def normal(*shape, scale=1.0):
    return (scale * _rng.normal(size=shape)).astype(np.float32)


def uniform(*shape, low=0.0, high=1.0):
    return _rng.uniform(low, high, size=shape).astype(np.float32)


def probabilities(*shape, axis=-1):
    x = _rng.uniform(0.1, 1.0, size=shape)
    return (x / x.sum(axis=axis, keepdims=True)).astype(np.float32)


def int_labels(shape, classes):
    return _rng.integers(0, classes, size=shape).astype(np.int32)


def one_hot(labels, classes):
    return np.eye(classes, dtype=np.float32)[labels]


def mask(*shape, p=0.7):
    return _rng.uniform(size=shape) < p


def bf16(*arrays):
    return tuple(
        jnp.asarray(a, jnp.bfloat16) if np.issubdtype(np.asarray(a).dtype, np.floating) else a for a in arrays
    )


def _fenchel_young_case(max_fun):
    """A case's loss for `make_fenchel_young_loss`: the loss it builds, called on the inputs."""
    return lambda lib: lambda *a, **k: getattr(lib, "make_fenchel_young_loss")(max_fun)(*a, **k)


def _tempered_logsumexp(scores, temperature=1.0):
    return temperature * jax.nn.logsumexp(scores / temperature)


def _tempered_fenchel_young(lib):
    """modopt passes keyword arguments on to the max function; optax's `jnp.vectorize` drops
    them, so optax gets them bound in the function instead."""
    if lib is optax.losses:
        return optax.losses.make_fenchel_young_loss(functools.partial(_tempered_logsumexp, temperature=0.5))
    return lambda *a: lib.make_fenchel_young_loss(_tempered_logsumexp)(*a, temperature=0.5)


@dataclasses.dataclass
class Case:
    id: str
    name: str
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    grad: tuple[int, ...] = (0,)  # arguments whose gradients are compared with optax's
    rtol: float = 2e-6
    atol: float = 2e-6
    jit_oracle: bool = True  # optax's dice losses check probabilities in Python: eager only
    build: Callable[[Any], Callable[..., Any]] | None = None  # the loss from a library

    def __str__(self):
        return self.id

    def loss(self, lib):
        return self.build(lib) if self.build else getattr(lib, self.name)


def _bf16(case: Case, **changes) -> Case:
    return dataclasses.replace(
        case, id=case.id + "-bf16", args=bf16(*case.args), rtol=3e-2, atol=3e-2, **changes
    )


_seg_logits = normal(2, 4, 4, 3, scale=2.0)
_seg_targets = one_hot(int_labels((2, 4, 4), 3), 3)
_seg_probabilities = np.asarray(jax.nn.softmax(normal(2, 4, 4, 3, scale=2.0), axis=-1))
_ranking_inputs = (normal(3, 5), uniform(3, 5, high=3.0).round())
_ranking_where = mask(3, 5)
_ranking_where[2] = False  # a list without valid items

CASES = [
    # Cross entropies.
    *[
        Case(
            f"safe_softmax_ce-{shape}",
            "safe_softmax_cross_entropy",
            (normal(*shape), probabilities(*shape)),
            grad=(0, 1),
        )
        for shape in [(5,), (3, 5), (2, 3, 4)]
    ],
    Case("safe_softmax_ce-broadcast", "safe_softmax_cross_entropy", (normal(3, 5), probabilities(5))),
    Case(
        "safe_softmax_ce-minus-inf",
        "safe_softmax_cross_entropy",
        (
            np.array([[1.0, -np.inf, 0.5], [-np.inf, 2.0, 0.0]], np.float32),
            np.array([[0.3, 0.0, 0.7], [0.0, 1.0, 0.0]], np.float32),
        ),
    ),
    *[
        Case(
            f"poly-{shape}-{eps}",
            "poly_loss_cross_entropy",
            (normal(*shape), probabilities(*shape)),
            {"epsilon": eps},
            grad=(0, 1),
        )
        for shape, eps in [((5,), 2.0), ((3, 5), -1.0), ((2, 3, 4), 0.5)]
    ],
    Case("poly-axis0", "poly_loss_cross_entropy", (normal(4, 3), probabilities(4, 3, axis=0)), {"axis": 0}),
    Case(
        "poly-axis-none",
        "poly_loss_cross_entropy",
        (normal(2, 3), probabilities(6).reshape(2, 3)),
        {"axis": None},
    ),
    Case(
        "poly-where",
        "poly_loss_cross_entropy",
        (normal(3, 5), probabilities(3, 5)),
        {"where": mask(3, 5, p=0.8)},
    ),
    Case("focal-default", "sigmoid_focal_loss", (normal(6, scale=3.0), int_labels((6,), 2))),
    Case(
        "focal-alpha-gamma",
        "sigmoid_focal_loss",
        (normal(3, 4, scale=3.0), uniform(3, 4)),
        {"alpha": 0.25, "gamma": 1.5},
        grad=(0, 1),
    ),
    Case(
        "focal-small-gamma",
        "sigmoid_focal_loss",
        (normal(2, 5, scale=10.0), int_labels((2, 5), 2)),
        {"gamma": 0.5},
    ),
    Case("focal-broadcast", "sigmoid_focal_loss", (normal(2, 3), int_labels((3,), 2)), {"alpha": 0.5}),
    # Margins.
    Case("perceptron-int", "perceptron_loss", (normal(6), _rng.choice([-1, 1], size=6).astype(np.int32))),
    Case(
        "perceptron-float",
        "perceptron_loss",
        (normal(2, 3), _rng.choice([-1.0, 1.0], size=(2, 3)).astype(np.float32)),
    ),
    Case("multiclass_hinge-2d", "multiclass_hinge_loss", (normal(4, 5), int_labels((4,), 5))),
    Case("multiclass_hinge-3d", "multiclass_hinge_loss", (normal(2, 3, 4, scale=0.3), int_labels((2, 3), 4))),
    Case("multiclass_perceptron-2d", "multiclass_perceptron_loss", (normal(4, 5), int_labels((4,), 5))),
    Case("multiclass_perceptron-3d", "multiclass_perceptron_loss", (normal(2, 3, 4), int_labels((2, 3), 4))),
    # Fenchel-Young and sparsemax.
    Case("sparsemax-int", "sparsemax_loss", (normal(8, scale=1.5), int_labels((8,), 2))),
    Case(
        "sparsemax-bool-broadcast",
        "sparsemax_loss",
        (normal(2, 4, scale=1.5), np.array([True, False, True, False])),
    ),
    Case(
        "multiclass_sparsemax-dense",
        "multiclass_sparsemax_loss",
        (normal(4, 5, scale=0.2), int_labels((4,), 5)),
    ),
    Case(
        "multiclass_sparsemax-sparse",
        "multiclass_sparsemax_loss",
        (normal(6, 7, scale=2.0), int_labels((6,), 7)),
    ),
    Case(
        "fenchel_young-logsumexp",
        "make_fenchel_young_loss",
        (normal(3, 4), one_hot(int_labels((3,), 4), 4)),
        grad=(0, 1),
        build=_fenchel_young_case(jax.nn.logsumexp),
    ),
    Case(
        "fenchel_young-kwargs-3d",
        "make_fenchel_young_loss",
        (normal(2, 3, 4), probabilities(2, 3, 4)),
        grad=(0, 1),
        build=_tempered_fenchel_young,
    ),
    # Divergences.
    *[
        Case(
            f"kl_log_targets-{axis}",
            "kl_divergence_with_log_targets",
            (np.log(probabilities(3, 5)), np.log(probabilities(3, 5, axis=0 if axis == 0 else -1))),
            {"axis": axis},
            grad=(0, 1),
        )
        for axis in (-1, 0, None, (0, 1))
    ],
    Case(
        "kl_log_targets-where",
        "kl_divergence_with_log_targets",
        (np.log(probabilities(3, 5)), np.log(probabilities(3, 5))),
        {"where": mask(3, 5)},
        grad=(0, 1),
    ),
    *[
        Case(
            f"generalized_kl-{axis}",
            "generalized_kl_divergence",
            (normal(3, 5), uniform(3, 5, low=0.1, high=2.0)),
            {"axis": axis},
            grad=(0, 1),
        )
        for axis in (-1, 0, None)
    ],
    Case(
        "generalized_kl-where",
        "generalized_kl_divergence",
        (normal(3, 5), uniform(3, 5, low=0.1)),
        {"where": mask(3, 5)},
        grad=(0, 1),
    ),
    # Segmentation.
    Case("dice-default", "dice_loss", (_seg_logits, _seg_targets)),
    Case(
        "dice-tversky", "dice_loss", (_seg_logits, _seg_targets), {"alpha": 0.3, "beta": 0.7, "smooth": 0.1}
    ),
    Case(
        "dice-weights-background-sum",
        "dice_loss",
        (_seg_logits, _seg_targets),
        {
            "class_weights": np.array([0.5, 1.0, 2.0], np.float32),
            "ignore_background": True,
            "reduction": "sum",
        },
    ),
    Case("dice-none-axis", "dice_loss", (_seg_logits, _seg_targets), {"reduction": "none", "axis": (1, 2)}),
    Case("dice-axis-batch", "dice_loss", (_seg_logits, _seg_targets), {"axis": (0, 1, 2)}),
    Case("dice-binary-channel", "dice_loss", (normal(2, 6, 1), int_labels((2, 6), 2).astype(np.float32))),
    Case(
        "dice-probabilities",
        "dice_loss",
        (_seg_probabilities, _seg_targets),
        {"apply_softmax": False},
        jit_oracle=False,
    ),
    Case("binary_dice-2d", "binary_dice_loss", (normal(3, 8), int_labels((3, 8), 2))),
    Case(
        "binary_dice-4d-smooth",
        "binary_dice_loss",
        (normal(2, 4, 4, 1), int_labels((2, 4, 4, 1), 2)),
        {"smooth": 0.5},
    ),
    Case("generalized_dice-default", "multiclass_generalized_dice_loss", (_seg_logits, _seg_targets)),
    Case(
        "generalized_dice-background-smooth",
        "multiclass_generalized_dice_loss",
        (_seg_logits, _seg_targets),
        {"ignore_background": True, "smooth": 0.1},
    ),
    Case(
        "generalized_dice-probabilities",
        "multiclass_generalized_dice_loss",
        (_seg_probabilities, _seg_targets),
        {"apply_softmax": False},
        jit_oracle=False,
    ),
    # Ranking.
    Case("ranking-1d", "ranking_softmax_loss", (normal(5), uniform(5, high=3.0).round())),
    Case("ranking-2d", "ranking_softmax_loss", _ranking_inputs),
    Case(
        "ranking-where-weights-sum",
        "ranking_softmax_loss",
        _ranking_inputs,
        {"where": _ranking_where, "weights": uniform(3, 5, low=0.5, high=2.0), "reduce_fn": jnp.sum},
    ),
    Case("ranking-where-mean", "ranking_softmax_loss", _ranking_inputs, {"where": _ranking_where}),
    Case(
        "ranking-where-none",
        "ranking_softmax_loss",
        _ranking_inputs,
        {"where": _ranking_where, "reduce_fn": None},
    ),
    # Self-supervised.
    Case("ntxent-default", "ntxent", (normal(6, 3), np.array([0, 0, 1, 1, 2, 2], np.int32))),
    Case(
        "ntxent-groups-temperature",
        "ntxent",
        (normal(7, 4), np.array([0, 1, 0, 1, 2, 2, 2])),
        {"temperature": 0.5},
    ),
    Case(
        "triplet-default", "triplet_margin_loss", (normal(4, 3), normal(4, 3), normal(4, 3)), grad=(0, 1, 2)
    ),
    Case(
        "triplet-axis0-degree4",
        "triplet_margin_loss",
        (normal(3, 4), normal(3, 4), normal(3, 4)),
        {"axis": 0, "norm_degree": 4, "margin": 0.5, "eps": 1e-3},
        grad=(0, 1, 2),
    ),
    Case(
        "triplet-broadcast",
        "triplet_margin_loss",
        (normal(4, 3), normal(4, 3), normal(3)),
        {"margin": 2.0},
        grad=(0, 1, 2),
    ),
]

# bfloat16 wherever optax computes in bfloat16 too (its dice and sparsemax losses promote).
CASES += [
    _bf16(next(c for c in CASES if c.id == id_))
    for id_ in (
        "safe_softmax_ce-(3, 5)",
        "poly-(3, 5)--1.0",
        "focal-alpha-gamma",
        "perceptron-float",
        "multiclass_hinge-2d",
        "multiclass_perceptron-2d",
        "sparsemax-int",
        "kl_log_targets--1",
        "generalized_kl--1",
        "dice-default",
        "ranking-2d",
        "ntxent-default",
        "triplet-default",
    )
]


def _grad_weights(case: Case):
    shape = jax.eval_shape(lambda *a: case.loss(losses)(*a, **case.kwargs), *case.args).shape
    return np.random.default_rng(1).normal(size=shape).astype(np.float32)


def _value_and_grads(case: Case, lib, weights):
    loss = case.loss(lib)

    def objective(*args):
        value = loss(*args, **case.kwargs)
        return jnp.sum(weights * value.astype(jnp.float32)), value

    (_, value), grads = jax.value_and_grad(objective, argnums=case.grad, has_aux=True)(*case.args)
    return value, grads


def _close(ours, theirs, case: Case, what: str):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    np.testing.assert_allclose(ours, theirs, rtol=case.rtol, atol=case.atol, err_msg=what)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_value_and_gradients_match_optax(case):
    """One compilation per case runs both libraries (optax's dice checks run eagerly)."""
    weights = _grad_weights(case)
    if case.jit_oracle:
        (ours, our_grads), (theirs, their_grads) = jax.jit(
            lambda: (_value_and_grads(case, losses, weights), _value_and_grads(case, optax.losses, weights))
        )()
    else:
        ours, our_grads = jax.jit(lambda: _value_and_grads(case, losses, weights))()
        theirs, their_grads = _value_and_grads(case, optax.losses, weights)
    floating_in = (
        np.asarray(case.args[0]).dtype if not isinstance(case.args[0], jax.Array) else case.args[0].dtype
    )
    assert ours.dtype == floating_in, (ours.dtype, floating_in)  # the dtype of the scores is kept
    _close(ours, theirs, case, "value")
    assert np.all(np.isfinite(np.asarray(ours, np.float64)))
    for argnum, ours_g, theirs_g in zip(case.grad, our_grads, their_grads):
        _close(ours_g, theirs_g, case, f"gradient of argument {argnum}")


def test_every_optax_loss_is_here_with_its_signature():
    ours = {n for n in dir(losses) if not n.startswith("_")}
    theirs = {n for n in dir(optax.losses) if not n.startswith("_")}
    assert theirs <= ours, sorted(theirs - ours)
    assert {c.name for c in CASES} == set(NAMES)
    for name in NAMES:
        mine = inspect.signature(getattr(losses, name)).parameters
        optax_params = inspect.signature(getattr(optax.losses, name)).parameters
        assert list(mine) == list(optax_params), name
        for param in optax_params.values():
            assert mine[param.name].default is param.default or mine[param.name].default == param.default, (
                name,
                param.name,
            )
            assert mine[param.name].kind == param.kind, (name, param.name)


def test_top_level_has_optax_top_level_losses():
    top = {n for n in dir(optax) if not n.startswith("_")} & {
        n for n in dir(optax.losses) if not n.startswith("_")
    }
    for name in top:
        assert getattr(modopt, name) is getattr(losses, name), name


def test_docstring_examples_run():
    for module in MODULES:
        result = doctest.testmod(
            module,
            extraglobs={"modopt": modopt, "jnp": jnp, "jax": jax},
            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        )
        assert result.attempted > 0 and result.failed == 0, module.__name__
    for name in NAMES:
        doc = getattr(losses, name).__doc__
        for section in ("Args:", "Returns:", "Example:", "Reference:"):
            assert section in doc, (name, section)


# ---------------------------------------------------------------------------------------------
# A property per family, each independent of optax.


def test_focal_loss_with_gamma_zero_is_sigmoid_cross_entropy():
    logits, labels = normal(4, 5, scale=4.0), uniform(4, 5)

    @jax.jit
    def run():
        return (
            losses.sigmoid_focal_loss(logits, labels, gamma=0.0),
            losses.sigmoid_binary_cross_entropy(logits, labels),
            losses.sigmoid_focal_loss(logits, labels, gamma=0.0, alpha=0.5),
            losses.sigmoid_focal_loss(logits, labels),
        )

    focal, bce, half, gamma2 = run()
    np.testing.assert_array_equal(focal, bce)
    np.testing.assert_allclose(half, 0.5 * bce, rtol=1e-6)
    # The focal weight (1 - p_t)^2 in NumPy, float64.
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    one_minus_pt = labels * (1 - p) + (1 - labels) * p
    np.testing.assert_allclose(gamma2, one_minus_pt**2 * np.asarray(bce, np.float64), rtol=1e-5, atol=1e-7)


def test_cross_entropy_family_identities():
    """poly with epsilon 0 and the safe cross entropy are the softmax cross entropy; the
    Fenchel-Young loss of logsumexp is too, and that of max is the multiclass perceptron loss."""
    logits, labels = normal(4, 6), int_labels((4,), 6)
    targets = one_hot(labels, 6)

    @jax.jit
    def run():
        ce = losses.softmax_cross_entropy(logits, targets)
        return (
            ce,
            (
                losses.poly_loss_cross_entropy(logits, targets, epsilon=0.0),
                losses.safe_softmax_cross_entropy(logits, targets),
                losses.make_fenchel_young_loss(jax.nn.logsumexp)(logits, targets),
            ),
            (
                losses.make_fenchel_young_loss(jnp.max)(logits, targets),
                losses.multiclass_perceptron_loss(logits, labels),
            ),
        )

    ce, same_as_ce, (fy_max, perceptron) = run()
    for other in same_as_ce:
        np.testing.assert_allclose(other, ce, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fy_max, perceptron, rtol=1e-6, atol=1e-6)


def _simplex_projection(v):
    """NumPy reference: the Euclidean projection onto the simplex, by bisection on the threshold."""
    lo, hi = v.min() - 1.0, v.max()
    for _ in range(200):
        tau = (lo + hi) / 2
        lo, hi = (tau, hi) if np.maximum(v - tau, 0).sum() > 1 else (lo, tau)
    return np.maximum(v - (lo + hi) / 2, 0)


def test_sparsemax_is_the_simplex_projection_and_its_loss_gradient_is_p_minus_onehot():
    scores, labels = normal(3, 4, 6, scale=1.5), int_labels((3, 4), 6)

    @jax.jit
    def run():
        p = _fenchel_young._sparsemax(scores)
        loss, grad = jax.value_and_grad(lambda s: losses.multiclass_sparsemax_loss(s, labels).sum())(scores)
        return p, loss, grad

    p, loss, grad = run()
    np.testing.assert_allclose(np.sum(p, axis=-1), 1.0, rtol=1e-6)
    assert np.all(np.asarray(p) >= 0) and np.any(np.asarray(p) == 0)  # sparse
    expected = np.apply_along_axis(_simplex_projection, -1, scores.astype(np.float64))
    np.testing.assert_allclose(p, expected, atol=1e-6)
    np.testing.assert_allclose(grad, expected - one_hot(labels, 6), atol=1e-6)
    assert float(loss) >= 0
    # A margin of at least 1 makes p one-hot: zero loss; the binary loss is 0 exactly where
    # sparse_sigmoid(logits) equals the labels.
    margin = one_hot(labels, 6) * 1.5
    np.testing.assert_allclose(losses.multiclass_sparsemax_loss(margin, labels), 0.0, atol=1e-7)
    binary = np.array([2.0, 1.0, -1.5, 0.3], np.float32)
    np.testing.assert_allclose(
        losses.sparsemax_loss(binary, np.array([1, 1, 0, 1])), [0, 0, 0, 0.1225], rtol=1e-6
    )


def test_multiclass_margin_losses_vanish_beyond_the_margin():
    labels = int_labels((5,), 4)
    scores = normal(5, 4, scale=0.1) + 2.0 * one_hot(labels, 4)
    # max_j(s_j + 1 - [j = c]) - s_c is 0 up to the rounding of s_c + 1 - 1 (optax's formula).
    np.testing.assert_allclose(losses.multiclass_hinge_loss(scores, labels), 0.0, atol=4e-7)
    np.testing.assert_allclose(losses.multiclass_perceptron_loss(scores, labels), 0.0, atol=4e-7)
    np.testing.assert_array_equal(losses.perceptron_loss(np.float32([2.0, -3.0]), np.int32([1, -1])), 0.0)


def test_divergences_against_their_definitions():
    log_p, q = np.log(probabilities(3, 5)), probabilities(3, 5)
    unnormalized_q = uniform(3, 5, low=0.1, high=3.0)

    @jax.jit
    def run():
        return (
            losses.kl_divergence(log_p, q),
            losses.kl_divergence_with_log_targets(log_p, jnp.log(q)),
            losses.generalized_kl_divergence(log_p, q),
            losses.generalized_kl_divergence(jnp.log(unnormalized_q), unnormalized_q),
            losses.generalized_kl_divergence(log_p, unnormalized_q),
        )

    kl, kl_log_targets, generalized_normalized, generalized_equal, generalized = run()
    np.testing.assert_allclose(kl_log_targets, kl, rtol=1e-5, atol=1e-7)
    # Normalized: the generalized divergence is the KL divergence; and it is 0 at p = q.
    np.testing.assert_allclose(generalized_normalized, kl, atol=1e-6)
    np.testing.assert_allclose(generalized_equal, 0.0, atol=1e-6)
    p64, q64 = np.exp(log_p.astype(np.float64)), unnormalized_q.astype(np.float64)
    expected = np.sum(q64 * np.log(q64 / p64) + p64 - q64, axis=-1)
    np.testing.assert_allclose(generalized, expected, rtol=1e-5)
    assert np.all(expected > 0)


def test_dice_loss_of_a_perfect_prediction_is_zero():
    targets = _seg_targets
    perfect_logits = 30.0 * (2 * targets - 1)

    @jax.jit
    def run():
        return (
            losses.dice_loss(targets, targets, apply_softmax=False),
            losses.dice_loss(perfect_logits, targets),
            losses.dice_loss(targets, targets, apply_softmax=False, alpha=0.9, beta=0.1, smooth=0.0),
            losses.multiclass_generalized_dice_loss(perfect_logits, targets),
            losses.binary_dice_loss(perfect_logits[..., 1], targets[..., 1]),
            losses.dice_loss(1 - targets, targets, apply_softmax=False, smooth=0.0),
        )

    *perfect, wrong = run()
    for value in perfect:
        np.testing.assert_allclose(value, 0.0, atol=1e-6)
    np.testing.assert_allclose(wrong, 1.0)  # no overlap at all


def test_dice_loss_matches_numpy():
    """An independent reference for the Tversky form, with the class weights and ignored background."""
    logits, targets = _seg_logits.astype(np.float64), _seg_targets.astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    i, ps, ts = (p * targets).sum((1, 2)), p.sum((1, 2)), targets.sum((1, 2))
    per_class = 1 - (i + 0.2) / (i + 0.3 * (ps - i) + 0.7 * (ts - i) + 0.2)
    weights = np.array([1.0, 2.0, 3.0])
    expected = (per_class * weights)[:, 1:].mean(-1)
    ours = jax.jit(losses.dice_loss, static_argnames=("ignore_background",))(
        _seg_logits,
        _seg_targets,
        smooth=0.2,
        alpha=0.3,
        beta=0.7,
        class_weights=weights,
        ignore_background=True,
    )
    np.testing.assert_allclose(ours, expected, rtol=1e-5)


def test_ranking_loss_is_invariant_to_a_constant_shift_of_the_scores():
    logits, labels = _ranking_inputs
    shift = normal(3, 1, scale=50.0)

    @jax.jit
    def run(x):
        return (
            losses.ranking_softmax_loss(x, labels, reduce_fn=None),
            losses.ranking_softmax_loss(x, labels, where=_ranking_where, reduce_fn=None),
        )

    for before, after in zip(run(logits), run(logits + shift)):
        np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-5)
    # And the per-list losses are the cross entropies of the labels, computed in NumPy.
    x = logits.astype(np.float64)
    log_softmax = x - np.log(np.exp(x).sum(-1, keepdims=True))
    np.testing.assert_allclose(run(logits)[0], -(labels * log_softmax).sum(-1), rtol=1e-5)


def test_ntxent_against_numpy_and_invariant_to_the_embedding_scale():
    embeddings, labels, t = normal(6, 3), np.array([0, 1, 0, 1, 2, 2]), 0.3
    e = embeddings.astype(np.float64)
    unit = e / np.linalg.norm(e, axis=1, keepdims=True)
    s = unit @ unit.T / t
    terms = []
    for i in range(6):
        for j in range(6):
            if i != j and labels[i] == labels[j]:
                negatives = np.exp(s[i][labels != labels[i]]).sum()
                terms.append(-np.log(np.exp(s[i, j]) / (np.exp(s[i, j]) + negatives)))
    ours = jax.jit(losses.ntxent)(embeddings, labels, t)
    np.testing.assert_allclose(ours, np.mean(terms), rtol=1e-5)
    scaled = embeddings * uniform(6, 1, low=0.5, high=4.0)
    np.testing.assert_allclose(jax.jit(losses.ntxent)(scaled, labels, t), ours, rtol=1e-5)


def test_triplet_margin_loss_is_zero_when_the_margin_is_met():
    anchors, positives = normal(4, 3), normal(4, 3, scale=0.01)
    positives = anchors + positives
    negatives = anchors + 10.0

    @jax.jit
    def run(a, p, n):
        return jax.value_and_grad(
            lambda *x: losses.triplet_margin_loss(*x, margin=1.0).sum(), argnums=(0, 1, 2)
        )(a, p, n)

    value, grads = run(anchors, positives, negatives)
    assert float(value) == 0.0
    assert all(np.all(np.asarray(g) == 0) for g in grads)
    # Violated: the hinge is d(a, p) - d(a, n) + margin, with NumPy's Euclidean distances.
    value, _ = run(anchors, anchors + 1.0, anchors + 1.5)
    d = lambda x: np.sqrt(3 * x**2 + 1e-6)  # noqa: E731
    np.testing.assert_allclose(value, 4 * (d(1.0) - d(1.5) + 1.0), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Where modopt departs from optax on purpose (each said in the docstring).


def test_triplet_odd_norm_degree_is_a_distance():
    """optax sums signed powers (no absolute value): NaN for degree 3; modopt takes the p-norm."""
    a, p, n = normal(4, 3), normal(4, 3), normal(4, 3)

    def reference(x, y, degree):
        return (np.sum(np.abs(x - y).astype(np.float64) ** degree, axis=-1) + 1e-6) ** (1 / degree)

    for degree in (1, 3):
        ours = losses.triplet_margin_loss(a, p, n, norm_degree=degree)
        expected = np.maximum(reference(a, p, degree) - reference(a, n, degree) + 1.0, 0)
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    assert np.any(np.isnan(optax.losses.triplet_margin_loss(a, p, n, norm_degree=3)))


def test_binary_dice_loss_takes_probabilities():
    """optax 0.2.8 refuses foreground probabilities with apply_sigmoid=False (it checks that a
    single channel 'sums to 1'); modopt computes the loss, which equals the sigmoid path."""
    logits, targets = normal(3, 8), int_labels((3, 8), 2)
    probs = np.asarray(jax.nn.sigmoid(logits))
    np.testing.assert_allclose(
        losses.binary_dice_loss(probs, targets, apply_sigmoid=False),
        losses.binary_dice_loss(logits, targets),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="sum to 1"):
        optax.losses.binary_dice_loss(probs, targets, apply_sigmoid=False)


def test_dice_probability_check_runs_only_on_concrete_inputs():
    bad = _seg_probabilities * 2
    with pytest.raises(
        ValueError, match=re.escape("dice_loss: with apply_softmax=False, predictions must be valid probability distributions")
    ):
        losses.dice_loss(bad, _seg_targets, apply_softmax=False)
    # Under jit the values are unknown: no check (optax fails to trace there).
    assert jax.jit(lambda p: losses.dice_loss(p, _seg_targets, apply_softmax=False))(bad).shape == (2,)


def test_zero_targets_and_masked_items_keep_gradients_finite():
    """log targets of -inf, and a ranking list without valid items: optax gives NaN (the value
    of the first, the weights' gradient of the second); modopt 0 with finite gradients."""
    log_p, log_q = jnp.log(jnp.array([0.5, 0.5])), jnp.array([0.0, -jnp.inf])
    logits, labels = _ranking_inputs

    def ranking(lib, x, w):
        return lib.ranking_softmax_loss(x, labels, where=_ranking_where, weights=w)

    @jax.jit
    def run(weights):
        kl = jax.value_and_grad(losses.kl_divergence_with_log_targets, argnums=(0, 1))(log_p, log_q)
        ours = jax.grad(lambda x, w: ranking(losses, x, w), argnums=(0, 1))(logits, weights)
        theirs = jax.grad(lambda x, w: ranking(optax.losses, x, w), argnums=(0, 1))(logits, weights)
        return kl, optax.losses.kl_divergence_with_log_targets(log_p, log_q), ours, theirs

    (value, grads), optax_kl, ours, theirs = run(jnp.ones((3, 5)))
    np.testing.assert_allclose(value, np.log(2.0), rtol=1e-6)
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert np.isnan(optax_kl)
    assert all(np.all(np.isfinite(g)) for g in ours)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-7)
    valid = np.isfinite(np.asarray(theirs[1]))
    assert not valid.all()
    np.testing.assert_allclose(np.asarray(ours[1])[valid], np.asarray(theirs[1])[valid], rtol=1e-5, atol=1e-7)
    # All lists masked: the mean is 0.
    assert float(jax.jit(losses.ranking_softmax_loss)(logits, labels, where=np.zeros((3, 5), bool))) == 0.0


def test_fenchel_young_loss_passes_arguments_to_max_fun():
    """optax 0.2.8 drops keyword arguments (and refuses positional ones) on their way to max_fun."""
    scores, targets = normal(3, 4), probabilities(3, 4)
    loss = losses.make_fenchel_young_loss(_tempered_logsumexp)

    @jax.jit
    def run():
        theirs = optax.losses.make_fenchel_young_loss(_tempered_logsumexp)(scores, targets, temperature=0.5)
        return (
            loss(scores, targets, temperature=0.5),
            loss(scores, targets, 0.5),
            loss(scores, targets),
            theirs,
        )

    by_keyword, by_position, at_one, theirs = run()
    s64, t64 = scores.astype(np.float64), targets.astype(np.float64)
    expected = 0.5 * np.log(np.exp(s64 / 0.5).sum(-1)) - np.sum(t64 * s64, axis=-1)
    np.testing.assert_allclose(by_keyword, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(by_position, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(theirs, at_one, rtol=1e-6)  # optax used temperature 1


def test_multiclass_sparsemax_takes_any_leading_axes():
    """optax takes `[batch, classes]` only; here `[..., classes]`, as for the other multiclass losses."""
    scores, labels = normal(2, 3, 5, scale=2.0), int_labels((2, 3), 5)

    @jax.jit
    def run():
        flat = optax.losses.multiclass_sparsemax_loss(scores.reshape(6, 5), labels.reshape(6))
        ours = losses.multiclass_sparsemax_loss(scores, labels)
        return flat, ours, losses.multiclass_sparsemax_loss(scores[0, 0], labels[0, 0])

    flat, ours, single = run()
    np.testing.assert_allclose(ours, flat.reshape(2, 3), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(single, flat[0], rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors naming the argument, at trace time.

f34, i3 = np.ones((3, 4), np.float32), np.zeros(3, np.int32)

BAD = [
    (
        "perceptron-shapes",
        lambda: losses.perceptron_loss(np.ones(3, np.float32), np.ones(4, np.int32)),
        ValueError,
        "perceptron_loss: predictor_outputs of shape (3,) and targets of shape (4,) must have the same shape",
    ),
    (
        "perceptron-bool",
        lambda: losses.perceptron_loss(np.ones(2, np.float32), np.array([True, False])),
        TypeError,
        "map {0, 1} labels with `2 * labels - 1`",
    ),
    (
        "hinge-labels-shape",
        lambda: losses.multiclass_hinge_loss(f34, np.zeros(4, np.int32)),
        ValueError,
        "multiclass_hinge_loss: labels of shape (4,) must have the shape of scores (3, 4) without its last (class) axis, that is (3,)",
    ),
    (
        "perceptron-one-hot",
        lambda: losses.multiclass_perceptron_loss(f34, f34),
        TypeError,
        "these look like one-hot labels: take `labels.argmax(-1)`",
    ),
    (
        "sparsemax-int-scores",
        lambda: losses.multiclass_sparsemax_loss(np.ones((3, 4), np.int32), i3),
        TypeError,
        "multiclass_sparsemax_loss: scores must be a floating-point array",
    ),
    (
        "focal-gamma",
        lambda: losses.sigmoid_focal_loss(f34, f34, gamma=-1.0),
        ValueError,
        "Invalid gamma: -1.0 (must be >= 0) in sigmoid_focal_loss.",
    ),
    (
        "focal-broadcast",
        lambda: losses.sigmoid_focal_loss(f34, np.ones(3)),
        ValueError,
        "sigmoid_focal_loss: logits of shape (3, 4) and labels of shape (3,) do not broadcast",
    ),
    (
        "poly-int-labels",
        lambda: losses.poly_loss_cross_entropy(f34, i3),
        TypeError,
        "poly_loss_cross_entropy: labels must be a floating-point array",
    ),
    (
        "poly-where",
        lambda: losses.poly_loss_cross_entropy(f34, f34, where=np.ones(5, bool)),
        ValueError,
        "poly_loss_cross_entropy: where of shape (5,) does not broadcast to logits of shape (3, 4)",
    ),
    (
        "kl-log-targets-int",
        lambda: losses.kl_divergence_with_log_targets(f34, np.ones((3, 4), np.int32)),
        TypeError,
        "kl_divergence_with_log_targets: log_targets must be a floating-point array",
    ),
    (
        "generalized-kl-axis",
        lambda: losses.generalized_kl_divergence(f34, f34, axis=2),
        ValueError,
        "generalized_kl_divergence: axis 2 is out of range",
    ),
    (
        "dice-shapes",
        lambda: losses.dice_loss(np.ones((2, 4, 3), np.float32), np.ones((2, 4, 2))),
        ValueError,
        "dice_loss: predictions of shape (2, 4, 3) and targets of shape (2, 4, 2) must have the same shape",
    ),
    (
        "dice-reduction",
        lambda: losses.dice_loss(f34, f34, reduction="max"),
        ValueError,
        "Invalid reduction: 'max' (must be 'mean', 'sum' or 'none') in dice_loss.",
    ),
    (
        "dice-class-weights",
        lambda: losses.dice_loss(f34, f34, class_weights=np.ones(3)),
        ValueError,
        "dice_loss: class_weights must have shape (4,), one weight per class, got shape (3,).",
    ),
    (
        "dice-smooth",
        lambda: losses.dice_loss(f34, f34, smooth=-1.0),
        ValueError,
        "Invalid smooth: -1.0 (must be >= 0) in dice_loss.",
    ),
    (
        "generalized-dice-shapes",
        lambda: losses.multiclass_generalized_dice_loss(f34, np.ones((3, 1))),
        ValueError,
        "multiclass_generalized_dice_loss: predictions of shape (3, 4) and targets of shape (3, 1) must have the same shape",
    ),
    (
        "binary-dice-int",
        lambda: losses.binary_dice_loss(np.ones(4, np.int32), np.ones(4)),
        TypeError,
        "binary_dice_loss: predictions must be a floating-point array",
    ),
    (
        "ranking-where",
        lambda: losses.ranking_softmax_loss(f34, f34, where=np.ones((2, 4), bool)),
        ValueError,
        "ranking_softmax_loss: where of shape (2, 4) does not broadcast to the inputs of shape (3, 4)",
    ),
    (
        "ranking-weights",
        lambda: losses.ranking_softmax_loss(f34, f34, weights=np.ones((2, 3, 4))),
        ValueError,
        "ranking_softmax_loss: weights of shape (2, 3, 4) do not broadcast to the inputs' shape (3, 4).",
    ),
    (
        "ntxent-labels",
        lambda: losses.ntxent(f34, np.zeros(4)),
        ValueError,
        "ntxent: labels of shape (4,) must have one label per embedding, that is shape (3,)",
    ),
    (
        "ntxent-rank",
        lambda: losses.ntxent(np.ones(3, np.float32), i3),
        ValueError,
        "ntxent: embeddings must have rank 2, laid out (batch, features), got shape (3,)",
    ),
    (
        "ntxent-temperature",
        lambda: losses.ntxent(f34, i3, 0.0),
        ValueError,
        "Invalid temperature: 0.0 (must be > 0) in ntxent.",
    ),
    (
        "triplet-broadcast",
        lambda: losses.triplet_margin_loss(f34, f34, np.ones((2, 4), np.float32)),
        ValueError,
        "triplet_margin_loss: anchors of shape (3, 4) and negatives of shape (2, 4) do not broadcast",
    ),
    (
        "triplet-degree",
        lambda: losses.triplet_margin_loss(f34, f34, f34, norm_degree=0),
        ValueError,
        "Invalid norm_degree: 0 (must be > 0) in triplet_margin_loss.",
    ),
    (
        "fenchel-young-max-fun",
        lambda: losses.make_fenchel_young_loss(3.0),
        TypeError,
        "make_fenchel_young_loss: max_fun must be a function of the scores, got a float.",
    ),
    (
        "fenchel-young-shapes",
        lambda: losses.make_fenchel_young_loss(jax.nn.logsumexp)(f34, np.ones(3, np.float32)),
        ValueError,
        "fenchel_young_loss: scores of shape (3, 4) and targets of shape (3,) do not broadcast",
    ),
]


@pytest.mark.parametrize("call, error, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_gives_a_clear_error(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_errors_are_raised_at_trace_time_under_jit():
    with pytest.raises(ValueError, match=re.escape("multiclass_hinge_loss: labels of shape (4,)")):
        jax.jit(losses.multiclass_hinge_loss)(jnp.ones((3, 4)), jnp.zeros(4, jnp.int32))
    # Traced hyperparameters cannot be checked and are accepted.
    out = jax.jit(losses.sigmoid_focal_loss)(jnp.zeros(2), jnp.ones(2))
    np.testing.assert_allclose(out, 0.25 * np.log(2.0), rtol=1e-6)
    out = jax.jit(lambda g: losses.sigmoid_focal_loss(jnp.zeros(2), jnp.ones(2), gamma=g))(jnp.asarray(0.0))
    np.testing.assert_allclose(out, np.log(2.0), rtol=1e-6)
