"""Registry entries: privacy (`differentially_private_aggregate`, `dpsgd`).

Both take per-example gradients (a leading batch axis on every leaf), while the shared checks
feed gradients shaped like the parameters. The entries therefore run them behind
`BatchOfOne`, a test adapter that hands each gradient on as a batch of one example
(`g[None]`), and the optax oracles behind the same adapter (`_optax_batch_of_one`). With one
example the whole transform still runs: the per-example clipping (to `l2_norm_clip`, which
the registry's gradients exceed), the noise from the key in the state, and the division by
the batch size. The adapter itself takes ordinary gradients, so `Optimizer.step` checks them
against the parameters as usual.

What needs real batches (several examples, per-example gradients through `Optimizer.step`,
the errors of the per-example mode, training) is in `test_privacy.py`.

- The aggregate's noise (`C * sigma` per element, about 150 in global norm here) swamps the
  clipped gradient (norm 1), so its entry does not converge; `dpsgd`'s entry uses a noise
  multiplier of 1e-3, small enough to reach the minimum, and checks the same noise stream.
- optax 0.2.8's `differentially_private_aggregate` warns on `seed=` (deprecated for `key=`),
  and its `dpsgd` passes its `seed` on that way: the aggregate's oracle passes the key, and
  `dpsgd`'s is built with the deprecation silenced. modopt takes a seed or a key silently.
"""

from __future__ import annotations

import warnings

import jax
import optax

from modopt._core.base import AbstractTransform, Part
from modopt.optimizers._dpsgd import dpsgd
from modopt.transforms._privacy import differentially_private_aggregate

from ._entry import Entry


class BatchOfOne(AbstractTransform):
    """`inner` (which takes per-example updates) fed each update as a batch of one example."""

    inner: AbstractTransform

    def init(self, params):
        return self.inner.init(params)

    def update(self, updates, state, params=None, **extra_args):
        batched = jax.tree.map(lambda g: g[None], updates)
        return self.inner.update(batched, state, params, **extra_args)

    def takes_per_example_updates(self):
        return False  # it adds the batch axis itself

    def state_specs(self, params, param_specs):
        return self.inner.state_specs(params, param_specs)

    def parts(self):
        return (Part("", self.inner, _same),)


def _same(state):
    return state


def _quiet(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return make()


def _optax_batch_of_one(tx):
    def update(updates, state, params=None):
        return tx.update(jax.tree.map(lambda g: g[None], updates), state, params)

    return optax.GradientTransformation(tx.init, update)


ENTRIES = [
    Entry(
        "differentially_private_aggregate",
        lambda: BatchOfOne(differentially_private_aggregate(1.0, 1.1, seed=7)),
        lambda: _optax_batch_of_one(optax.contrib.differentially_private_aggregate(1.0, 1.1, key=jax.random.key(7))),
        ("noise_multiplier", 0.5),
        converges=False,  # the noise dominates (see above)
    ),
    Entry(
        "dpsgd",
        lambda: BatchOfOne(dpsgd(0.1, 5.0, 1e-3, 3, momentum=0.9, nesterov=True)),
        lambda: _optax_batch_of_one(_quiet(lambda: optax.contrib.dpsgd(0.1, 5.0, 1e-3, 3, momentum=0.9, nesterov=True))),
        ("l2_norm_clip", 2.0),
        descent=True,
    ),
]
