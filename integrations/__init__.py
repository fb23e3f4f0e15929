"""Adapters to other libraries, installed as `modopt.integrations`.

Each submodule imports its library lazily, so `import modopt` needs only jax and equinox.
The Flax (TrainState, NNX) and Orbax (checkpointing) adapters live here.
"""
