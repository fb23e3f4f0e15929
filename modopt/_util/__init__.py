"""The lowest layer: pytree and number helpers that import nothing else of modopt.

`trees` (mapping over updates with `None` leaves, zeros, casts, norms, picklable tree
structures), `numerics` (norms with correct gradients at zero, safe counters) and `threefry`
(JAX's random bits as straight-line code).
"""
