"""Threefry-2x32, the generator behind `jax.random`, as straight-line code on JAX or NumPy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

# Threefry-2x32's rotations and key-schedule parity (Salmon et al., 2011, "Parallel random
# numbers: as easy as 1, 2, 3", https://doi.org/10.1145/2063384.2063405).
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def threefry2x32(seed: Any, hi: Any, lo: Any) -> tuple[Any, Any]:
    """Threefry-2x32 with 20 rounds of the counters `(hi, lo)` (uint32 arrays) under the key
    `seed` (two uint32 words): straight-line elementwise code, one fused kernel under `jit`
    (JAX's own Threefry compiles to a loop on CPU). NumPy arrays in, NumPy arrays out: the
    same words, computed when a program is traced."""
    k = (seed[0], seed[1], seed[0] ^ seed[1] ^ np.uint32(_PARITY))
    x0, x1 = hi + k[0], lo + k[1]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
            x1 = x0 ^ x1
        x0 = x0 + k[(block + 1) % 3]
        x1 = x1 + k[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1
