"""Named optimizers: compositions of transforms with readable, settable hyperparameters."""

from ._adafactor import Adafactor as Adafactor
from ._adafactor import adafactor as adafactor
from ._adam import Adam as Adam
from ._adam import AdamW as AdamW
from ._adam import adam as adam
from ._adam import adamw as adamw
from ._adam import nadam as nadam
from ._adam import nadamw as nadamw
from ._adaptive import AdaBelief as AdaBelief
from ._adaptive import Adadelta as Adadelta
from ._adaptive import Adagrad as Adagrad
from ._adaptive import Adamax as Adamax
from ._adaptive import AdamaxW as AdamaxW
from ._adaptive import Adan as Adan
from ._adaptive import Amsgrad as Amsgrad
from ._adaptive import Lion as Lion
from ._adaptive import Novograd as Novograd
from ._adaptive import Radam as Radam
from ._adaptive import Rmsprop as Rmsprop
from ._adaptive import Yogi as Yogi
from ._adaptive import adabelief as adabelief
from ._adaptive import adadelta as adadelta
from ._adaptive import adagrad as adagrad
from ._adaptive import adamax as adamax
from ._adaptive import adamaxw as adamaxw
from ._adaptive import adan as adan
from ._adaptive import amsgrad as amsgrad
from ._adaptive import lion as lion
from ._adaptive import novograd as novograd
from ._adaptive import radam as radam
from ._adaptive import rmsprop as rmsprop
from ._adaptive import yogi as yogi
from ._layerwise import Fromage as Fromage
from ._layerwise import Lamb as Lamb
from ._layerwise import Lars as Lars
from ._layerwise import SignSgd as SignSgd
from ._layerwise import fromage as fromage
from ._layerwise import lamb as lamb
from ._layerwise import lars as lars
from ._layerwise import sign_sgd as sign_sgd
from ._sgd import Sgd as Sgd
from ._sgd import sgd as sgd
from ._special import NoisySgd as NoisySgd
from ._special import OptimisticAdam as OptimisticAdam
from ._special import OptimisticAdamV2 as OptimisticAdamV2
from ._special import OptimisticGradientDescent as OptimisticGradientDescent
from ._special import PolyakSgd as PolyakSgd
from ._special import Rprop as Rprop
from ._special import Sm3 as Sm3
from ._special import noisy_sgd as noisy_sgd
from ._special import optimistic_adam as optimistic_adam
from ._special import optimistic_adam_v2 as optimistic_adam_v2
from ._special import optimistic_gradient_descent as optimistic_gradient_descent
from ._special import polyak_sgd as polyak_sgd
from ._special import rprop as rprop
from ._special import sm3 as sm3

# Wrappers (apply_every, apply_if_finite, MultiSteps, lookahead, conditional transforms).

# Monitoring and selection (flatten, freeze, selective_transform, monitor, snapshot, measure_with_ema, scale_gradient).

# Line searches and L-BFGS.

# Schedules.
