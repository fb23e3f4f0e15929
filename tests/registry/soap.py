"""Registry entries: SOAP (`soap`, `scale_by_soap`), which optax lacks; compared step by step
with `pytorch_optimizer.SOAP` in `test_soap.py`.

Both refresh the eigenbases every 2 or 3 steps, so the shared checks (5 steps, the resume
after 2) cross a refresh. `soap` runs with the defaults otherwise: every dimension of the
registry's leaves (at most 136) is rotated. `scale_by_soap_merged` merges small dimensions
(max 64): the (3, 5) matrix and the (2, 3, 4) cube are rotated as vectors of 15 and 24, the
vector too (`precondition_1d`), and the 130 x 136 matrix not at all (both dimensions above 64).
The statistics and bases are (d, d) matrices: both entries declare their own sharding rule.
"""

from __future__ import annotations

import modopt

from ._entry import Entry

ENTRIES: list[Entry] = [
    Entry(
        "soap",
        lambda: modopt.soap(1.0, precondition_frequency=2),
        None,
        ("precondition_frequency", 3),
        descent=True,
        # The quadratic's 130 x 136 gradient is close to one matrix, whose eigenbases are its
        # singular vectors: rotated, it is nearly diagonal, and Adam there gives a step of about
        # one per singular value (as Muon's), not per entry. Crossing the distance to the target
        # in 300 steps takes a large rate (pytorch_optimizer's SOAP at 0.05: the same 7000 from
        # 17500 as ours).
        own_rule=True,
        # Used by the sharded check only (no optax oracle). The eigenvectors of the 130 x 130
        # statistic, whose smallest eigenvalues lie close together, move by ~5e-5 when the
        # sharded sums round differently; at rate 1 the parameters then differ by ~3e-4 after 3
        # steps. The algorithm itself is compared at 1e-4 in test_soap.py.
        tolerance=1e-3,
        reference="references/test_soap.py",
    ),
    Entry(
        "scale_by_soap_merged",
        lambda: modopt.scale_by_soap(
            b1=0.9,
            precondition_frequency=3,
            max_precondition_dim=64,
            merge_dims=True,
            precondition_1d=True,
            normalize_grads=True,
        ),
        None,
        ("b1", 0.8),
        own_rule=True,
        reference="references/test_soap.py",
        eager=False,  # the default entry runs the eager step
    ),
]
