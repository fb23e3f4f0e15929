"""The numerics of PSGD Kron: the probes, the factors' update, the preconditioning.

Per parameter (`update_factors`, `precondition`), for a tensor of any number of axes whose
factors are triangular matrices or diagonals; for small matrices of several layouts at once
(`fit_padded`, `precondition_padded`), zero-padded to the largest, their factors as dense
matrices (a diagonal one too); and for many short vectors at once (`fit_padded_vector`,
`precondition_padded_vector`), each padded to the longest, entry by entry. The padded forms
compute the same formulas; their padding stays zero throughout. The triangular solves run in
blocks of matrix products on CPU (`conjugate`), the padded programs' row by row (`solve_lower`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._util.numerics import overflow_scale
from .._util.threefry import threefry2x32 as threefry2x32  # (the probes' generator; tested here)

# The damping added to the probed gradient, `sqrt(float32 eps) * mean|g| * v`, as the reference.
DAMPING = math.sqrt(float(np.finfo(np.float32).eps))
RMS_CLIP = 1.1  # the preconditioned update's RMS is capped at this, as the reference
RMS_EPS = 1e-12


def kron_probes(seed: jax.Array, shapes: list[tuple[int, ...]], dtype: Any) -> list[jax.Array]:
    """The probes `V ~ N(0, I)` of a step, one per parameter in the shape of its layout.

    The parameters' entries are numbered in the order of the leaves (row-major within each);
    entry `i`'s probe is Threefry's normal number `i` under the step's `seed`, two uint32 words
    (`normal_at`). A probe depends on where its entry is, never on how the work is
    cut: a device that draws only the probes of the parameters it owns draws the same numbers,
    and so does a parameter preconditioned as its transpose or padded among others."""
    return [
        normal_at(seed, *entry_numbers(split_offset(offset), jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape))).astype(dtype)
        for offset, shape in zip(probe_offsets(shapes), shapes)
    ]


def probe_offsets(shapes: list[tuple[int, ...]]) -> list[int]:
    """The number of the first entry of each parameter (see `kron_probes`)."""
    return [int(n) for n in np.cumsum([0] + [math.prod(s) for s in shapes[:-1]])] if shapes else []


def split_offset(offset: int) -> np.ndarray:
    """An entry number below `2**64` as its two uint32 words `(high, low)`."""
    return np.array([offset >> 32, offset & 0xFFFFFFFF], np.uint32)


def entry_index(shape: tuple[int, ...], turned: Any = None, rows: Any = None, cols: Any = None) -> jax.Array:
    """The row-major index (uint32) of each entry of a unit of `shape` in its parameter: a 2-d
    unit holds a `(rows, cols)` matrix (its leading block, default: all of it), or the transpose
    of a `(cols, rows)` one where `turned`; a unit of another rank is its parameter, reshaped."""
    if len(shape) != 2:
        return jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
    i, j = (jax.lax.broadcasted_iota(jnp.uint32, shape, axis) for axis in (0, 1))
    rows = jnp.uint32(shape[0]) if rows is None else jnp.asarray(rows, jnp.uint32)
    cols = jnp.uint32(shape[1]) if cols is None else jnp.asarray(cols, jnp.uint32)
    index = i * cols + j
    return index if turned is None else jnp.where(turned, j * rows + i, index)


def entry_numbers(offset: Any, index: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The numbers `offset + index` as uint32 words `(high, low)`, `offset` given as its words."""
    offset = jnp.asarray(offset, jnp.uint32)
    low = index + offset[1]
    return offset[0] + (low < offset[1]).astype(jnp.uint32), low  # the carry into the high word


def normal_at(seed: jax.Array, hi: jax.Array, lo: jax.Array, used: Any = None) -> jax.Array:
    """Standard normal float32 numbers, one per entry number `(hi, lo)` (uint32 words): the
    exclusive or of Threefry's two words of the number, a uniform in (-1, 1) from its top 23
    bits, and `sqrt(2) erfinv` of that.

    `used`: a traced boolean that is true wherever the numbers are used (the condition of the
    update that uses them). The Threefry words, then the normal numbers, are made under
    conditionals on it, whose results XLA never fuses into what reads them. Fused, every
    computation that read the numbers (each part of `erfinv`, a stack's solves, its damping) ran
    the 20 rounds again, and the polynomials of `erfinv`: twenty copies of the rounds in Kron's
    program, and 2-4% of its step on the digits MLP on two cores (6% on one)."""
    words = lambda: jnp.bitwise_xor(*threefry2x32(seed, hi, lo))  # noqa: E731
    if used is None:
        return _normal(words())
    bits = _made_if(used, words, jnp.shape(hi), jnp.uint32)
    return _made_if(used, lambda: _normal(bits), jnp.shape(hi), jnp.float32)


def _normal(bits: jax.Array) -> jax.Array:
    unit = jax.lax.bitcast_convert_type((bits >> jnp.uint32(9)) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    lowest = np.nextafter(np.float32(-1.0), np.float32(0.0))
    return np.float32(math.sqrt(2.0)) * jax.lax.erf_inv(jnp.maximum(2.0 * unit - 1.0, lowest))


def _made_if(used: Any, make: Any, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """`make()` where `used` holds, zeros else: a conditional's result, made whole once."""
    return jax.lax.cond(used, make, lambda: jnp.zeros(shape, dtype))


def normals_at(seed: jax.Array, numbers: list[tuple[jax.Array, jax.Array]], used: Any = None) -> list[jax.Array]:
    """`normal_at` of several arrays of entry numbers `(hi, lo)`, drawn together (one copy of
    Threefry's rounds in the compiled step, however many stacks draw probes; see `used` there)."""
    if len(numbers) == 1:
        return [normal_at(seed, *numbers[0], used)]
    flat = normal_at(seed, *(jnp.concatenate([jnp.ravel(x[k]) for x in numbers]) for k in (0, 1)), used)
    bounds = np.cumsum([0] + [x[0].size for x in numbers])
    return [flat[a:b].reshape(x[0].shape) for x, a, b in zip(numbers, bounds[:-1], bounds[1:])]


def _along(x: jax.Array, axis: int, fn: Any) -> jax.Array:
    """`fn` applied to the unfolding of `x` along `axis` (that axis first, the rest flattened)."""
    moved = jnp.moveaxis(x, axis, 0)
    out = fn(moved.reshape(moved.shape[0], -1)).reshape(moved.shape)
    return jnp.moveaxis(out, 0, axis)


def _unfolding(x: jax.Array, axis: int) -> jax.Array:
    moved = jnp.moveaxis(x, axis, 0)
    return moved.reshape(moved.shape[0], -1)


def _gram(x: jax.Array, axis: int, diagonal: bool) -> jax.Array:
    """`X X^T` of the unfolding `X` along `axis`, or its diagonal."""
    u = _unfolding(x, axis)
    return jnp.sum(u * u, axis=1) if diagonal else u @ u.T


def norm_lower_bound(a: jax.Array) -> jax.Array:
    """A lower bound of the spectral norm of a symmetric matrix `a` (0 for a zero matrix).

    From the column of largest norm `c`: `x = c^T a / |c^T a|`, bound `|a x|` (exact for rank one).
    """
    max_abs = jnp.max(jnp.abs(a))
    scaled = a / jnp.where(max_abs > 0, max_abs, 1)
    column = jnp.argmax(jnp.sum(scaled * scaled, axis=0))
    x = jnp.take(scaled, column, axis=1) @ scaled
    x_norm = jnp.linalg.norm(x)
    x = x / jnp.where(x_norm > 0, x_norm, 1)
    return jnp.where(max_abs > 0, jnp.linalg.norm(scaled @ x) * max_abs, 0)


def diagonal_step(q: jax.Array, step: jax.Array, total: jax.Array, tiny: Any) -> jax.Array:
    """A diagonal factor `q` after its step `step = lr (a - b)`, `total = a + b` (the diagonals
    of the Gram matrices), normalized by the largest entry of `total`."""
    return q - step * (q / jnp.maximum(jnp.max(jnp.abs(total)), tiny))


def triangular_step(q: jax.Array, step: jax.Array, total: jax.Array, tiny: Any) -> jax.Array:
    """A triangular factor `q` after its step `step = lr (A A^T - B B^T)`, `total = A A^T + B B^T`,
    normalized by a lower bound of the spectral norm of `total`."""
    return q - (jnp.triu(step) / jnp.maximum(norm_lower_bound(total), tiny)) @ q


def damped(fitted: jax.Array, probe: jax.Array, count: Any = None) -> jax.Array:
    """`fitted + sqrt(eps) mean|fitted| probe`, the mean over `count` entries (default: all; the
    others are zero padding), taken on a copy scaled by a power of two (huge entries)."""
    count = fitted.size if count is None else count
    scale = overflow_scale(fitted)  # 1 but for huge entries, whose mean would overflow
    mean = jnp.sum(jnp.abs(fitted * scale)) / count / scale
    return fitted + (DAMPING * mean).astype(fitted.dtype) * probe


def update_factors(Qs: tuple, G: jax.Array, V: jax.Array, lr: Any, tiny: Any) -> tuple:
    """One update of the factors `Qs` from the pair (probe `V`, probed gradient `G`)."""
    A = G
    for axis, q in enumerate(Qs):
        A = _along(A, axis, lambda u, q=q: (q[:, None] * u) if q.ndim == 1 else q @ u)
    A, conj_B = _scaled_alike(A, conjugate(Qs, V))
    new = []
    for axis, q in enumerate(Qs):
        diagonal = q.ndim == 1
        term_a, term_b = _gram(A, axis, diagonal), _gram(conj_B, axis, diagonal)
        step, total = (term_a - term_b) * lr, term_a + term_b
        new.append(diagonal_step(q, step, total, tiny) if diagonal else triangular_step(q, step, total, tiny))
    return tuple(new)


def _scaled_alike(A: jax.Array, B: jax.Array) -> tuple[jax.Array, jax.Array]:
    # A and B scaled alike by a power of two (1 but for huge entries): each factor's step is
    # a ratio of their Gram matrices, the same, and the Gram matrices stay finite.
    scale = jnp.minimum(overflow_scale(A), overflow_scale(B))
    return A * scale, B * scale


def balance_scales(norms: jax.Array, balance: jax.Array) -> jax.Array:
    """Per factor, the scale that brings its largest entry (`norms`) to the geometric mean of
    all of them, where `balance` holds (the product, `P`, unchanged); exactly 1 else."""
    return jnp.where(balance, jnp.exp(jnp.mean(jnp.log(norms))) / norms, 1)


def balanced(Qs: tuple, balance: jax.Array) -> tuple:
    """The factors rescaled to the geometric mean of their largest entries, where `balance`
    holds (a product of factors with the same `P`); `Qs` as they are (times exactly 1) else."""
    if len(Qs) < 2:
        return Qs
    factors = balance_scales(jnp.stack([jnp.max(jnp.abs(q)) for q in Qs]), balance)
    return tuple(q * f.astype(q.dtype) for q, f in zip(Qs, factors))


def precondition(Qs: tuple, G: jax.Array) -> jax.Array:
    """`P G = G ×_i (Q_i^T Q_i)`."""
    for axis, q in enumerate(Qs):
        if q.ndim == 1:
            G = _along(G, axis, lambda u, q=q: (q * q)[:, None] * u)
        else:
            G = _along(G, axis, lambda u, q=q: q.T @ (q @ u))
    return G


def clip_rms(update: jax.Array, count: Any = None) -> jax.Array:
    """`update * min(1, 1.1 / (rms(update) + 1e-12))`, the RMS over `count` entries (default:
    all; the others are zero padding), of huge entries without overflow."""
    count = update.size if count is None else count
    scale = overflow_scale(update)
    rms = jnp.sqrt(jnp.sum(jnp.square(update * scale)) / count) / scale
    return update * jnp.minimum(1.0, RMS_CLIP / (rms + RMS_EPS))


# ---- triangular solves --------------------------------------------------------------------

SOLVE_BLOCK = 16  # rows per block of `blocked_substitution` (the fastest of 8 to 128 on CPU)


def conjugate(Qs: tuple, V: jax.Array) -> jax.Array:
    """`V` with each factor's inverse transpose applied along its axis (`Q^{-T}`; a diagonal
    factor divides): the probe's side of the factors' update.

    On CPU by `blocked_substitution`, the diagonal blocks of all the triangular factors inverted
    together, in one loop; elsewhere by the backend's triangular solves. On CPU, LAPACK's solves
    (jaxlib's, threaded) are slower: a 128 x 128 factor's solve took about as long as the blocks',
    a 2048 x 2048 one 2-3 times as long, and with other processes busy on the cores each stalled
    for milliseconds."""

    def along_axes(V, Qs, solve):
        for axis, q in enumerate(Qs):
            V = _along(V, axis, lambda u, q=q, axis=axis: u / q[:, None] if q.ndim == 1 else solve(axis, q.T, u))
        return V

    def by_blocks(V, *Qs):
        triangular = [axis for axis, q in enumerate(Qs) if q.ndim == 2]
        inverses = dict(zip(triangular, diagonal_inverses([Qs[axis].T for axis in triangular])))
        return along_axes(V, Qs, lambda axis, lower, u: blocked_substitution(lower, u, inverses[axis]))

    def by_backend(V, *Qs):
        return along_axes(V, Qs, lambda axis, lower, u: jax.lax.linalg.triangular_solve(lower, u, left_side=True, lower=True))

    return jax.lax.platform_dependent(V, *Qs, cpu=by_blocks, default=by_backend)


def _blocks(lower: jax.Array) -> jax.Array:
    """`lower` padded with the identity to a multiple of `SOLVE_BLOCK` rows."""
    size = lower.shape[0]
    padding = -size % SOLVE_BLOCK
    if not padding:
        return lower
    lower = jnp.pad(lower, ((0, padding), (0, padding)))
    return lower.at[size:, size:].set(jnp.eye(padding, dtype=lower.dtype))


def diagonal_inverses(lowers: list[jax.Array]) -> list[jax.Array]:
    """The inverses of the diagonal `SOLVE_BLOCK` blocks of each lower triangular matrix (padded
    with the identity, see `_blocks`), `(blocks, SOLVE_BLOCK, SOLVE_BLOCK)` each: all of them by
    one batched `forward_substitution` on the identity."""
    block = SOLVE_BLOCK
    if not lowers:
        return []
    diagonals = []
    for lower in lowers:
        padded = _blocks(lower)
        count = padded.shape[0] // block
        diagonals.append(jnp.moveaxis(jnp.diagonal(padded.reshape(count, block, count, block), axis1=0, axis2=2), -1, 0))
    stacked = jnp.concatenate(diagonals)
    inverses = jax.vmap(forward_substitution)(stacked, jnp.broadcast_to(jnp.eye(block, dtype=stacked.dtype), stacked.shape))
    bounds = np.cumsum([0] + [len(d) for d in diagonals])
    return [inverses[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def blocked_substitution(lower: jax.Array, rhs: jax.Array, inverses: jax.Array) -> jax.Array:
    """`X` with `lower @ X = rhs` (`rhs` a matrix), `lower` lower triangular, by blocks of
    `SOLVE_BLOCK` rows, given the inverses `D_i^{-1}` of its diagonal blocks (`diagonal_inverses`):
    block row by block row `X_i = D_i^{-1} (R_i - L_i X)`, where
    `L_i` is the whole block row and `X` is zero below the rows solved so far (one block: a
    product). A size that is not a multiple of the block is padded with the identity (its rows
    of `X` stay zero)."""
    size = lower.shape[0]
    if len(inverses) == 1:
        return inverses[0, :size, :size] @ rhs
    lower, block = _blocks(lower), SOLVE_BLOCK
    rhs = jnp.pad(rhs, ((0, lower.shape[0] - size), (0, 0)))

    def block_row(i, x):
        rows = jax.lax.dynamic_slice_in_dim(lower, i * block, block)
        residual = jax.lax.dynamic_slice_in_dim(rhs, i * block, block) - rows @ x
        return jax.lax.dynamic_update_slice_in_dim(x, inverses[i] @ residual, i * block, 0)

    return jax.lax.fori_loop(0, len(inverses), block_row, jnp.zeros_like(rhs))[:size]


def solve_lower(lower: jax.Array, rhs: jax.Array) -> jax.Array:
    """`X` with `lower @ X = rhs`, `lower` lower triangular (nonsingular): on CPU by
    `forward_substitution` (the padded programs' solves: it compiles in about half the time of
    `blocked_substitution`), elsewhere by the backend's triangular solve."""
    return jax.lax.platform_dependent(
        lower, rhs, cpu=forward_substitution, default=functools.partial(jax.lax.linalg.triangular_solve, left_side=True, lower=True)
    )


def forward_substitution(lower: jax.Array, rhs: jax.Array) -> jax.Array:
    """`X` with `lower @ X = rhs`, `lower` lower triangular (nonsingular): row by row, in a loop
    of XLA's own operations."""

    def row(i, x):
        return x.at[i].set((rhs[i] - lower[i] @ x) / lower[i, i])

    return jax.lax.fori_loop(0, lower.shape[0], row, jnp.zeros_like(rhs))


# ---- many small parameters at once, padded --------------------------------------------------

# Vectors no longer than this (biases, norms' scales) are fitted and preconditioned together,
# each padded to the longest of them: their one diagonal factor is fitted entry by entry, so the
# padding costs little, and one program for all of them compiles in a fraction of the time of
# one per length. Matrices with no axis longer than this may share a padded program with others
# (see `ScaleByKron`).
PADDED_MAX = 192


def fit_padded(fitted, probe, q1, q2, rows, cols, count, diagonal1, diagonal2, balance, lr, tiny):
    """One small matrix's two dense factors after an update (see `update_factors`): its
    `(rows, cols)` matrix (`fitted`, `probe`) zero-padded, `q1` and `q2` zero-padded too, a
    diagonal factor as a diagonal matrix (`diagonal1`, `diagonal2`: per matrix, or a Python bool
    for a whole group)."""
    scales = balance_scales(jnp.stack([jnp.max(jnp.abs(q1)), jnp.max(jnp.abs(q2))]), balance)
    q1, q2 = q1 * scales[0].astype(q1.dtype), q2 * scales[1].astype(q2.dtype)
    G = damped(fitted, probe, count)
    A = q1 @ G @ q2.T
    # The padding's diagonal is 1 for the solves: B = Q1^{-T} V Q2^{-1}, zero in the padding.
    eye1 = jnp.diag((jnp.arange(q1.shape[0]) >= rows).astype(q1.dtype))
    eye2 = jnp.diag((jnp.arange(q2.shape[0]) >= cols).astype(q2.dtype))
    B = solve_lower((q2 + eye2).T, solve_lower((q1 + eye1).T, probe).T).T
    A, B = _scaled_alike(A, B)
    return padded_step(q1, A @ A.T, B @ B.T, lr, tiny, diagonal1), padded_step(q2, A.T @ A, B.T @ B, lr, tiny, diagonal2)


def padded_step(q: jax.Array, term_a: jax.Array, term_b: jax.Array, lr: Any, tiny: Any, diagonal: Any) -> jax.Array:
    """A dense factor (zero-padded) after its step from the Gram matrices: `triangular_step`, or
    `diagonal_step` on the diagonals where `diagonal` (the factor is then a diagonal matrix); a
    Python bool (every member of a group alike) compiles only its own step."""
    step, total = (term_a - term_b) * lr, term_a + term_b

    def along():
        new = diagonal_step(jnp.diagonal(q), jnp.diagonal(step), jnp.diagonal(total), tiny)
        return new[:, None] * jnp.eye(q.shape[0], dtype=q.dtype)

    if isinstance(diagonal, bool):
        return along() if diagonal else triangular_step(q, step, total, tiny)
    return jnp.where(diagonal, along(), triangular_step(q, step, total, tiny))


def precondition_padded(m_hat: jax.Array, q1: jax.Array, q2: jax.Array, count: Any) -> jax.Array:
    """One small parameter's update `Q1^T Q1 m_hat Q2^T Q2` from its padded matrix and factors,
    its RMS (over `count` entries) capped."""
    left = q1.T @ (q1 @ m_hat)
    return clip_rms((q2.T @ (q2 @ left.T)).T, count)


def fit_padded_vector(fitted: jax.Array, probe: jax.Array, q: jax.Array, count: Any, lr: Any, tiny: Any) -> jax.Array:
    """One small vector's diagonal factor after an update (`update_factors` on a vector), entry
    by entry: `fitted` and `probe` zero-padded, `q` padded with ones (which stay ones)."""
    A, conj_B = _scaled_alike(q * damped(fitted, probe, count), probe / q)
    term_a, term_b = A * A, conj_B * conj_B
    return diagonal_step(q, (term_a - term_b) * lr, term_a + term_b, tiny)


def precondition_padded_vector(m_hat: jax.Array, q: jax.Array, count: Any) -> jax.Array:
    """One small vector's update `q^2 m_hat` (`precondition`), its RMS (over `count` entries) capped."""
    return clip_rms((q * q) * m_hat, count)
