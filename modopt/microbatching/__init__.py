"""Microbatching (optax 0.2.8's `optax.microbatching`): evaluate a function on a large batch one
microbatch at a time in a sequential loop, and combine the results.

`microbatch` is the general transformation, `micro_vmap` a memory-bounded `jax.vmap`, and
`micro_grad` computes per-example gradients, transforms them (e.g. clips them) and combines
them: its gradients feed `modopt.Optimizer.step`. `Accumulator` and `AccumulationType` say how
results combine; `reshape_batch_axis` splits a batch axis the way they do.
"""

from ._accumulators import AccumulationType as AccumulationType
from ._accumulators import Accumulator as Accumulator
from ._microbatching import micro_grad as micro_grad
from ._microbatching import micro_vmap as micro_vmap
from ._microbatching import microbatch as microbatch
from ._microbatching import reshape_batch_axis as reshape_batch_axis
