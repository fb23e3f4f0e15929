"""The job's text: Shakespeare's plays, character by character, with a fixed split.

`shakespeare.txt.gz` (1,115,394 characters, 65 distinct) is the "tinyshakespeare" selection of
Shakespeare's plays from Andrej Karpathy's char-rnn repository (MIT licence); the plays are in
the public domain. It ships with modopt, so nothing is downloaded. The first 90% is the
training split, the rest the validation split.

Batches are windows of `context + 1` characters at offsets drawn from `(seed, step)` alone, so a
resumed run sees the batches an uninterrupted one would. The validation loss is taken on fixed,
evenly spaced windows of the validation split.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import os

import numpy as np

PATH = os.path.join(os.path.dirname(__file__), "shakespeare.txt.gz")
TRAIN_FRACTION = 0.9


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The encoded text: `train` and `validation` as arrays of character indices into `alphabet`."""

    alphabet: str
    train: np.ndarray
    validation: np.ndarray

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet)

    def decode(self, indices) -> str:
        return "".join(self.alphabet[i] for i in np.asarray(indices))

    def batch(self, seed: int, step: int, batch_size: int, context: int) -> np.ndarray:
        """The training batch of `step`: `(batch_size, context + 1)` indices (inputs and, shifted
        by one, targets)."""
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, len(self.train) - context - 1, size=batch_size)
        return np.stack([self.train[s : s + context + 1] for s in starts])

    def validation_windows(self, count: int, context: int) -> np.ndarray:
        """`count` windows of `context + 1` indices spread evenly over the validation split."""
        starts = np.linspace(0, len(self.validation) - context - 1, count).astype(np.int64)
        return np.stack([self.validation[s : s + context + 1] for s in starts])


@functools.lru_cache(maxsize=1)
def load() -> Corpus:
    with gzip.open(PATH, "rt", encoding="utf-8") as f:
        text = f.read()
    alphabet = "".join(sorted(set(text)))
    codes = np.frombuffer(text.encode("ascii"), np.uint8)  # the text is ASCII
    lookup = np.zeros(256, np.int32)
    lookup[np.frombuffer(alphabet.encode("ascii"), np.uint8)] = np.arange(len(alphabet))
    encoded = lookup[codes]
    cut = int(len(encoded) * TRAIN_FRACTION)
    return Corpus(alphabet, encoded[:cut], encoded[cut:])
