"""Registry entries: `quantized_state` (8-bit block-wise quantized state), which optax lacks;
compared with bitsandbytes' block-wise quantization and 8-bit Adam, and with float32 Adam in
PyTorch, in `references/test_quantized_state.py`.

The registry's leaves are small, so both entries lower `min_size` to quantize most of them.
`quantized_state_adamw` keeps bitsandbytes' blocks of 256: the (130, 136) matrix is cut along
its flattened axes (70 blocks), the cube and the matrix are one block each. The linear entry
uses blocks of 8, so the scales have leading axes of their own (the 130 x 136 matrix has
130 x 17 of them), placed by the wrapper's own sharding rule.
"""

from __future__ import annotations

import modopt

from ._entry import Entry

ENTRIES: list[Entry] = [
    Entry(
        "quantized_state_adamw",
        lambda: modopt.quantized_state(modopt.adamw(0.05, weight_decay=1e-4), min_size=16),
        None,
        ("learning_rate", 0.01),
        descent=True,
        own_rule=True,
        reference="references/test_quantized_state.py",
    ),
    Entry(
        "quantized_state_momentum_linear",
        lambda: modopt.quantized_state(modopt.sgd(0.05, momentum=0.9), block_size=8, min_size=4, quantization="linear"),
        None,
        ("learning_rate", 0.01),
        descent=True,
        own_rule=True,
        reference="references/test_quantized_state.py",
    ),
]
