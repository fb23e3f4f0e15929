"""Loss functions: regression, classification, divergences and CTC, with optax's names.

Every loss is a plain function of arrays, checked at trace time (argument names, shapes and
dtypes in the error), element-wise or reduced over a class axis, never over the batch: take
the mean yourself.
"""

from ._classification import hinge_loss as hinge_loss
from ._classification import sigmoid_binary_cross_entropy as sigmoid_binary_cross_entropy
from ._classification import smooth_labels as smooth_labels
from ._classification import softmax_cross_entropy as softmax_cross_entropy
from ._classification import (
    softmax_cross_entropy_with_integer_labels as softmax_cross_entropy_with_integer_labels,
)
from ._ctc import ctc_loss as ctc_loss
from ._ctc import ctc_loss_with_forward_probs as ctc_loss_with_forward_probs
from ._divergence import convex_kl_divergence as convex_kl_divergence
from ._divergence import cosine_distance as cosine_distance
from ._divergence import cosine_similarity as cosine_similarity
from ._divergence import kl_divergence as kl_divergence
from ._regression import huber_loss as huber_loss
from ._regression import l2_loss as l2_loss
from ._regression import log_cosh as log_cosh
from ._regression import squared_error as squared_error
