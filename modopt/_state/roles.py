"""Which fields of each state type hold moments: the state `quantized_state` may keep in 8 bits.

A *moment* here is a running average or sum of a function of the gradients, kept per
parameter element: Adam's `mu` and `nu`, a momentum trace, Adagrad's sum of squares, SOAP's
moments in its eigenbasis, Kron's momentum. Block-wise 8-bit storage was made and validated for
those (Dettmers et al., 2022). Everything else a state holds has another role and is never
quantized, whatever its shape: step counts and keys; copies of the parameters or of a past
gradient (Lookahead's, Schedule-Free's, L-BFGS's histories); statistics, eigenbases and factors
of a preconditioner (Shampoo, SOAP, Kron); reduced or factored moments (Adafactor's rows and
columns, Adam-mini's blocks: little memory to save, and a whole row's scale in each number);
step sizes (Rprop) and betting wealth (COCOB).

State types have stable names (they are the checkpoint format, and modopt's state types have
optax's names and fields), so the roles are declared here by name, for modopt's state types and
optax's of the same name alike. Every state type that keeps floating arrays is listed, with the
empty tuple where it keeps no moment: `tests/test_quantized_roles.py` checks it over the
registry, so a new transform's state gets a decision here.
"""

from __future__ import annotations

from typing import Any

import jax

MOMENTS: dict[str, tuple[str, ...]] = {
    # Adam and its family.
    "ScaleByAdamState": ("mu", "nu"),
    "ScaleByAmsgradState": ("mu", "nu", "nu_max"),
    "ScaleByAdamMiniState": ("mu",),  # nu: one number per block of the parameter
    "ScaleByBeliefState": ("mu", "nu"),
    "ScaleByAdanState": ("m", "v", "n"),  # g: the previous gradient
    "ScaleByLapropState": ("mu", "nu"),
    "ScaleByLionState": ("mu",),
    "ScaleByMarsState": ("mu", "nu"),  # last_grad: the previous gradient
    "ScaleByNovogradState": ("mu",),  # nu: one number per leaf
    "ScaleByAdemamixState": ("m1", "m2", "nu"),
    "ScaleBySimplifiedAdEMAMixState": ("m", "n"),
    "ScaleByRssState": ("sum_of_squares",),
    "ScaleByRmsState": ("nu",),
    "ScaleByRmsWithCountState": ("nu",),
    "ScaleByRStdDevState": ("mu", "nu"),
    "ScaleByRStdDevWithCountState": ("mu", "nu"),
    "ScaleByAdaDeltaState": ("e_g", "e_x"),
    "ScaleBySM3State": ("nu",),  # nu is SM3's momentum; mu its accumulators, one vector per axis
    "FactoredState": ("v",),  # v_row, v_col: Adafactor's factored second moment
    "TraceState": ("trace",),
    "EmaState": ("ema",),
    "MuonState": ("mu",),
    "ScaleByNorMuonState": ("mu",),  # nu: one number per neuron
    "ScaleByAdaMuonState": ("mu", "nu"),
    "ScaleBySoapState": ("mu", "nu"),  # statistics, eigenbases: the preconditioner's
    "ScaleByShampooState": ("diagonal_statistics", "diagonal_momentum", "momentum"),
    "ScaleByKronState": ("momentum",),  # Qs: the preconditioner's factors
    "SophiaState": ("mu", "nu"),
    "DAdaptAdamWState": ("exp_avg", "exp_avg_sq", "grad_sum"),
    "ProdigyState": ("exp_avg", "exp_avg_sq", "grad_sum"),  # params0: the starting point
    "MadgradState": ("grad_sum_sq", "s"),  # x0: the starting point
    "MomoState": ("exp_avg",),
    "MomoAdamState": ("exp_avg", "exp_avg_sq"),
    "PerElementMeanAndVarianceEMAState": ("mean_grads_ema", "variance_grads_ema"),
    "StoredEmaState": (),  # trax's moving average of the parameters
    "TraxFactoredState": (),  # trax Adafactor: factored statistics, or one unfactored
    "TraxSM3State": (),  # per-axis accumulators
    # No moments: copies of parameters or gradients, histories, step sizes, betting state.
    "ScaleByRpropState": (),
    "ScaleByOptimisticGradientState": (),
    "ScaleByLBFGSState": (),
    "ScaleByBacktrackingLinesearchState": (),
    "ScaleByZoomLinesearchState": (),
    "ScaleByDistanceOverGradientsState": (),
    "COCOBState": (),
    "DoGState": (),
    "DoWGState": (),
    "MechanicState": (),
    "GaLoreState": (),  # projector; the base optimizer's state declares its own moments
    "ScheduleFreeState": (),  # z: the base optimizer's iterates
    "SAMState": (),  # cache: the parameters of the last outer step
    "MultiStepsState": (),  # acc_grads: the window's gradients, applied as they are
    "ApplyEvery": (),
    "AccumulateAvgUpdatesState": (),
    "PerElementMeanAndSumSqDiffGradsState": (),
    "ReduceLROnPlateauState": (),
    "MonitorState": (),
    "SnapshotState": (),
    "DiagnosticsState": (),
    "InjectHyperparamsState": (),
    "InjectStatefulHyperparamsState": (),
}


def is_state_type(node: Any) -> bool:
    """A NamedTuple node of a state (a named state type)."""
    return isinstance(node, tuple) and hasattr(type(node), "_fields")


def moment_mask(state: Any) -> Any:
    """`state` with each leaf replaced by whether it holds a moment (a bool).

    A leaf is a moment when it lies in a field that `MOMENTS` declares for the state type
    holding that field (found by its name); every other leaf is not. Nested states (a
    wrapper's inner state, a chain's entries) answer for their own leaves.

    Args:
        state: a transform's state, concrete or abstract.
    """

    def visit(node: Any, moment: bool) -> Any:
        if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(node)):
            return jax.tree_util.tree_map(lambda _: moment, node)
        children, treedef = jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)
        flags = [moment] * len(children)
        if is_state_type(node) and not moment:  # a named tuple's children are its fields, in order
            declared = MOMENTS.get(type(node).__name__, ())
            flags = [field in declared for field in node._fields]
        return treedef.unflatten([visit(child, flag) for child, flag in zip(children, flags)])

    return visit(state, False)
