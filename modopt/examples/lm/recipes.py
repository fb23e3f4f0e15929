"""Each optimizer of the job by name, with its default learning rate and schedule.

Every recipe takes a peak learning rate and warms up linearly over the first 10% of the steps
(at most 200), then decays by a cosine to a tenth of the peak; schedule-free AdamW keeps the peak
after its warmup, as its paper prescribes. Weight decay (0.1, decoupled) applies to the matrices
of the blocks and the output head, never to norms or the embedding. The Muon family updates the
blocks' matrices and gives the embedding, the norms and the head to AdamW (its own learning rate
`ADAM_LEARNING_RATE`), as the Muon papers do; it is told that Equinox stores a weight `(out,
in)`. The default learning rates were chosen on the validation split by
`benchmarks/time_to_result.py` (its table lists them).

`--state 8bit` keeps the moments in 8 bits (`modopt.quantized_state`), `--state bf16` in
bfloat16 (`mu_dtype`/`nu_dtype` where the optimizer takes them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import modopt

WEIGHT_DECAY = 0.1
ADAM_LEARNING_RATE = 3e-3  # the Muon family's AdamW part


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to make one optimizer: its default peak learning rate and a function of (the
    schedule, the weight decay mask, the Muon dimension numbers, the state dtype) to the
    transform."""

    learning_rate: float
    make: Callable[..., Any]
    schedule_free: bool = False
    dtypes: bool = True  # takes mu_dtype and nu_dtype


def _muon_family(make: Callable[..., Any]) -> Callable[..., Any]:
    def build(schedule, mask, dims, dtype, adam_schedule):
        return make(
            schedule,
            weight_decay=WEIGHT_DECAY,
            weight_decay_mask=mask,
            adam_learning_rate=adam_schedule,
            adam_weight_decay=WEIGHT_DECAY,
            muon_weight_dimension_numbers=dims,
            mu_dtype=dtype,
            nu_dtype=dtype,
        )

    return build


RECIPES: dict[str, Recipe] = {
    "adamw": Recipe(3e-3, lambda s, m, d, t, a: modopt.adamw(s, weight_decay=WEIGHT_DECAY, mask=m, mu_dtype=t, nu_dtype=t)),
    "muon": Recipe(0.02, _muon_family(modopt.contrib.muon)),
    "normuon": Recipe(0.02, _muon_family(modopt.normuon)),
    "adamuon": Recipe(0.02, _muon_family(modopt.adamuon)),
    "soap": Recipe(3e-3, lambda s, m, d, t, a: modopt.soap(s, weight_decay=WEIGHT_DECAY, mask=m, mu_dtype=t, nu_dtype=t)),
    # Shampoo as distributed Shampoo is usually run: grafted on RMSProp with Adam-like momentum
    # (Adam's learning-rate scale), inverse roots every 10 steps.
    "shampoo": Recipe(
        3e-3,
        lambda s, m, d, t, a: modopt.shampoo(
            s, graft_type="rmsprop", moving_average_for_momentum=True, preconditioning_compute_steps=10, mu_dtype=t, nu_dtype=t
        ),
    ),
    "kron": Recipe(1e-3, lambda s, m, d, t, a: modopt.kron(s, weight_decay=WEIGHT_DECAY, weight_decay_mask=m, mu_dtype=t)),
    "adam_mini": Recipe(3e-3, lambda s, m, d, t, a: modopt.adam_mini(s, weight_decay=WEIGHT_DECAY, mask=m, mu_dtype=t, nu_dtype=t)),
    "mars": Recipe(3e-3, lambda s, m, d, t, a: modopt.mars(s, weight_decay=WEIGHT_DECAY, mu_dtype=t, nu_dtype=t)),
    "laprop": Recipe(3e-3, lambda s, m, d, t, a: modopt.laprop(s, weight_decay=WEIGHT_DECAY, mask=m, mu_dtype=t, nu_dtype=t)),
    "lion": Recipe(3e-4, lambda s, m, d, t, a: modopt.lion(s, weight_decay=WEIGHT_DECAY, mask=m, mu_dtype=t)),
    "schedule_free_adamw": Recipe(
        3e-3,
        lambda s, m, d, t, a: modopt.contrib.schedule_free_adamw(s, warmup_steps=a, weight_decay=WEIGHT_DECAY, nu_dtype=t),
        schedule_free=True,
    ),
}
STATES = ("float32", "bf16", "8bit")


def decay_mask(model: Any) -> Any:
    """True for the matrices of the blocks and the head; False for norms and the embedding."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x.ndim == 2 and "embedding" not in jax.tree_util.keystr(path), eqx.filter(model, eqx.is_array)
    )


def muon_dimensions(model: Any) -> Any:
    """Muon's matrices (the blocks' weights, Equinox's `(out, in)`) with their axes; `None`
    (AdamW) for the embedding, the norms and the head."""
    dims = modopt.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=0)

    def choose(path, x):
        name = jax.tree_util.keystr(path)
        return dims if x.ndim == 2 and ".blocks" in name else None

    return jax.tree_util.tree_map_with_path(choose, eqx.filter(model, eqx.is_array))


def warmup_steps(total_steps: int) -> int:
    return max(1, min(200, total_steps // 10))


def schedule(peak: float, total_steps: int) -> Any:
    """Linear warmup to `peak`, then cosine decay to `peak / 10` at `total_steps`."""
    warmup = warmup_steps(total_steps)
    return modopt.warmup_cosine_decay_schedule(0.0, peak, warmup, max(total_steps, warmup + 1), end_value=peak / 10)


def make_transform(name: str, model: Any, total_steps: int, *, learning_rate: float | None = None, state: str = "float32") -> Any:
    """The transform of optimizer `name` for `model`, trained for `total_steps`."""
    if name not in RECIPES:
        raise ValueError(f"Unknown optimizer {name!r}; the job knows {sorted(RECIPES)}.")
    if state not in STATES:
        raise ValueError(f"Unknown state {state!r}; choose one of {STATES}.")
    recipe = RECIPES[name]
    peak = recipe.learning_rate if learning_rate is None else learning_rate
    dtype = jnp.bfloat16 if state == "bf16" else None
    if recipe.schedule_free:
        tx = recipe.make(peak, decay_mask(model), None, dtype, warmup_steps(total_steps))
    else:
        adam = schedule(ADAM_LEARNING_RATE, total_steps)
        tx = recipe.make(schedule(peak, total_steps), decay_mask(model), muon_dimensions(model), dtype, adam)
    return modopt.quantized_state(tx) if state == "8bit" else tx


def evaluation_model(name: str, model: Any, optimizer: Any) -> Any:
    """The model to evaluate: schedule-free AdamW evaluates at its averaged iterate."""
    if not RECIPES[name].schedule_free:
        return model
    params, rest = eqx.partition(model, eqx.is_array)
    return eqx.combine(modopt.contrib.schedule_free_eval_params(optimizer.state, params), rest)
