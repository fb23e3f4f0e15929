"""Soak: 10,000 jitted, donated steps leave no arrays behind, grow no memory and never retrace."""

from __future__ import annotations

import gc
import resource

import equinox as eqx
import jax
import jax.numpy as jnp

import modopt

STEPS = 10_000


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def test_ten_thousand_steps_no_retrace_no_growth():
    traces = []
    model = eqx.nn.MLP(4, 1, 16, 2, key=jax.random.key(0))
    schedule = modopt.warmup_cosine_decay_schedule(0.0, 1e-2, 100, STEPS)
    optimizer = modopt.Optimizer(modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adamw(schedule)), model)
    x = jax.random.normal(jax.random.key(1), (32, 4))
    y = jnp.sin(x[:, :1])

    @eqx.filter_jit(donate="all-except-first")
    def train_step(batch, model, optimizer):
        traces.append(None)
        loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(batch[0]) - batch[1]) ** 2))(model)
        model, optimizer = optimizer.step(model, grads)
        return model, optimizer, loss

    first_loss = None
    for step in range(STEPS):
        model, optimizer, loss = train_step((x, y), model, optimizer)
        if step == 0:
            first_loss = float(loss)
        if step == 999:
            jax.block_until_ready(loss)
            gc.collect()
            arrays_then, resident_then = len(jax.live_arrays()), _resident_bytes()
        if step % 500 == 0 and step:
            optimizer = optimizer.set(**{"transforms[0].max_norm": 1.0 + step / STEPS})  # a changed value
    jax.block_until_ready(loss)
    gc.collect()
    assert len(traces) == 1
    assert int(optimizer.count) == STEPS
    assert float(loss) < first_loss / 10  # it trained
    assert len(jax.live_arrays()) - arrays_then < 10  # a leak per step would leave thousands
    assert _resident_bytes() - resident_then < 32 * 2**20  # MiB: allocator noise, no leak per step
