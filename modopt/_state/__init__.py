"""How a transform's state is stored: the numbers, their precision, where they live, their cost.

`moments` (running averages and the state dtypes), `quantization` (8-bit blocks), `compensated`
(stochastic rounding and Kahan summation of low-precision parameters), `updates`
(`apply_updates`), `roles` (which state fields are moments), `report` (what a state costs),
`offload` (state in host memory) and `signature` (the model's trained leaves a state is made for).
"""
