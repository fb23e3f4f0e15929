"""The arithmetic of optax's schedules, to the bit: constants optax derives in Python, and powers.

optax builds its schedules as closures over the numbers given. Where those are Python floats,
the constants it derives from them (`init_value - end_value`, `end_value / peak_value`,
`1 - alpha`) are computed in Python, in double precision, and rounded to float32 once when
they meet an array. modopt's hyperparameters are float32 array leaves: the same constant
computed from them is rounded twice and can differ in its last bit. So a schedule derives
each such constant when it is built, from the numbers as given (`derive`), and keeps it
with the hyperparameters it came from (`Derived`).

Under `jit`, XLA also rewrites arithmetic on constants: a division by a constant `x / c`
becomes `x * (1 / c)`, and a product of a product with two constants `(x * c1) * c2` becomes
`x * (c1 * c2)`, the constants multiplied at compile time. In optax's jitted schedules those
numbers are constants of its closure; in a modopt schedule passed to a jitted step they are
traced, and XLA leaves them alone. Where a schedule's numbers are traced (`is_traced`), its
formula is written in the form XLA gives optax's (`divide`, and at each product of constants
in the schedules); outside `jit` it is optax's formula as written, as optax's eager schedules
compute it. This follows the compiler, not a specification: the forms are those of XLA's
CPU backend in the JAX version tested (whose LLVM backend then fuses multiply-adds alike in
both), and `tests/test_schedule_bits.py` compares every step with optax's, jitted and eager.

The power `x ** y` of a schedule (a polynomial's `power`, a cosine's `exponent`) is, in
optax, a Python number: an integer power is computed by repeated multiplication, and under
`jit` XLA replaces a constant float exponent of 2, 3 or 0.5 by multiplications or a square
root. `power` computes what optax's schedule would, also where the exponent is traced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.fields import as_hyperparameter, is_concrete
from .._core.module import Module


class Derived(Module):
    """A constant derived from hyperparameters as optax computes it, with those hyperparameters.

    `get(fallback, *current)` is the constant while the hyperparameters are still the ones it
    was derived from, and `fallback(*current)` once one was changed (by `set`): the same
    formula on the float32 values, within a rounding of the exact constant.

    Args:
        value: the constant (an array, or a `Rate` holding a rate and its complement).
        inputs: the hyperparameters it was derived from, as the schedule stores them.
    """

    value: Any
    inputs: tuple[Any, ...]

    def get(self, fallback: Callable[..., Any], *current: Any) -> Any:
        if all(is_concrete(x) for x in (*self.inputs, *current)):
            if all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(self.inputs, current)):
                return self.value
            return fallback(*current)
        same = jnp.asarray(True)
        for given, now in zip(self.inputs, current):
            same = same & jnp.all(jnp.asarray(given) == jnp.asarray(now))
        return jax.tree_util.tree_map(lambda v, r: jnp.where(same, v, r), self.value, fallback(*current))


def derive(fn: Callable[..., Any], *given: Any, convert: Callable[[Any], Any] = as_hyperparameter) -> Derived:
    """`fn(*given)` on the numbers as given (Python floats: in double precision, as optax), made a
    leaf by `convert`, with the hyperparameters `given` becomes. Numbers that are not numbers
    (`None`, a string) derive nothing: the schedule's validation then names them."""
    try:
        value = convert(fn(*given))
    except (TypeError, ValueError):
        value = None
    return Derived(value, tuple(as_hyperparameter(x) for x in given))


def is_traced(*values: Any) -> bool:
    """Whether any of `values` is traced: the constants of optax's closure are then runtime values
    here, and a formula takes the form XLA gives optax's after folding its constants."""
    return any(isinstance(v, jax.core.Tracer) for v in values)


def divide(x: Any, y: Any) -> Any:
    """`x / y` as an optax schedule computes it with `y` a number of its closure: `x * (1 / y)`
    where `y` is traced (XLA's rewrite of a division by a constant under `jit`), `x / y` where
    it is concrete (outside `jit`, or a constant that XLA rewrites itself)."""
    return x * (1 / y) if is_traced(y) else x / y


def power(x: Any, y: Any) -> Any:
    """`x ** y` as an optax schedule computes it with the exponent `y` a Python number.

    An integer `y` is raised by repeated squaring (JAX's `integer_pow`). A float `y` uses
    `pow`, which XLA replaces under `jit` by `x * x`, `x * x * x` or `sqrt(x)` where the
    exponent is a constant 2, 3 or 0.5: a concrete `y` is such a constant under `jit`, and a
    traced one gets the same replacements here.
    """
    y = jnp.asarray(y)
    if jnp.issubdtype(y.dtype, jnp.integer):
        if is_concrete(y):
            return jnp.asarray(x) ** int(y)  # `integer_pow`, as for optax's Python int
        return _integer_power(jnp.asarray(x), y)
    if is_concrete(y):
        return jnp.power(x, y)
    x = jnp.asarray(x)
    result = jnp.power(x, y)
    for exponent, folded in ((2.0, lambda: x * x), (3.0, lambda: x * x * x), (0.5, lambda: jnp.sqrt(x))):
        result = jnp.where(y == exponent, folded(), result)
    return result


def _integer_power(x: jax.Array, n: jax.Array) -> jax.Array:
    """`x ** n` for a traced integer `n >= 0` by the multiplications of JAX's `integer_pow`
    (binary exponentiation: the product of the squarings `x^(2^k)` for the bits of `n`)."""
    n = jnp.maximum(n, 0)

    def multiply_in(bit, carry):
        acc, base = carry
        return jnp.where((n >> bit) & 1 == 1, acc * base, acc), base * base

    # A loop over the 31 bits of an int32, not 31 copies of its body: the program stays small
    # (about 10% less to compile for a step with a warmup schedule), and differentiable.
    return jax.lax.fori_loop(0, 31, multiply_in, (jnp.ones_like(x), x))[0]


def strongly_typed(value: Any) -> jax.Array:
    """`value` without JAX's weak type, as optax's schedules of an int32 count return it: their
    arithmetic meets the count, a strongly typed array, where here the hyperparameters are
    weakly typed leaves (which under `jit` would otherwise let a bfloat16 gradient decide the
    dtype of, say, Adam's moments, where optax's gives float32)."""
    value = jnp.asarray(value)
    return jax.lax.convert_element_type(value, value.dtype)
