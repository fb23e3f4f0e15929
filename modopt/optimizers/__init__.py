"""Named optimizers: compositions of transforms with readable, settable hyperparameters."""

from ._adafactor import Adafactor as Adafactor
from ._adafactor import adafactor as adafactor
from ._adam import Adam as Adam
from ._adam import AdamW as AdamW
from ._adam import adam as adam
from ._adam import adamw as adamw
from ._sgd import Sgd as Sgd
from ._sgd import sgd as sgd

# Adaptive family.

# Layer-wise, normalizing, clipping and constraining family.

# Special family (SM3, Rprop, Polyak, optimistic gradients, noise).
