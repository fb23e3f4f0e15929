"""A character-level transformer language model on Shakespeare: `python -m modopt.examples.lm`.

`corpus` (the text and its split), `model` (the Equinox transformer), `recipes` (each optimizer
with its default learning rate and schedule), `layouts` (one device or a mesh), `job` (the
training run: checkpoints, resume, interrupts, processes).
"""
