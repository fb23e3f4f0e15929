"""The public APIs modopt implements, and a report of which names are present.

Two catalogs: the seeds' (`FAMILIES`, by family: the system modopt was specified as) and optax
0.2.8's (`OPTAX`, by namespace: every public name optax's users can import today). Run
`python -c "import modopt.catalog as c; c.report()"` for a bar per family and per namespace and
the list of any missing name. Dotted names live in a subpackage (`second_order.hessian_diag`).
"""

from __future__ import annotations

import importlib

from ._optax_names import OPTAX_0_2_8

FAMILIES: dict[str, tuple[str, ...]] = {
    "optimizers": (
        "adabelief", "adafactor", "adagrad", "adam", "adamax", "adamaxw", "adamw", "amsgrad",
        "dpsgd", "fromage", "lamb", "lars", "lbfgs", "lion", "noisy_sgd", "novograd",
        "optimistic_gradient_descent", "radam", "rmsprop", "sgd", "sm3", "yogi",
    ),
    "transforms": (
        "adaptive_grad_clip", "add_decayed_weights", "add_noise", "apply_every", "centralize",
        "clip", "clip_by_block_rms", "clip_by_global_norm", "ema", "identity",
        "keep_params_nonnegative", "normalize_by_update_norm", "per_example_global_norm_clip",
        "per_example_layer_norm_clip", "scale", "scale_by_adadelta", "scale_by_adam",
        "scale_by_adamax", "scale_by_adan", "scale_by_amsgrad", "scale_by_backtracking_linesearch",
        "scale_by_belief", "scale_by_factored_rms", "scale_by_lbfgs", "scale_by_learning_rate",
        "scale_by_lion", "scale_by_novograd", "scale_by_optimistic_gradient",
        "scale_by_param_block_norm", "scale_by_param_block_rms", "scale_by_polyak", "scale_by_radam",
        "scale_by_rms", "scale_by_rprop", "scale_by_rss", "scale_by_schedule", "scale_by_sign",
        "scale_by_sm3", "scale_by_stddev", "scale_by_trust_ratio", "scale_by_yogi",
        "scale_by_zoom_linesearch", "set_to_zero", "stateless", "stateless_with_tree_map", "trace",
        "zero_nans",
    ),
    "states": (
        "AdaptiveGradClipState", "AddDecayedWeightsState", "AddNoiseState", "ApplyEvery",
        "ApplyIfFiniteState", "ClipByGlobalNormState", "ClipState", "ConditionallyMaskState",
        "ConditionallyTransformState", "DifferentiallyPrivateAggregateState", "EmaState",
        "EmptyState", "FactoredState", "InjectHyperparamsState", "LookaheadState", "MonitorState",
        "MultiStepsState", "NonNegativeParamsState", "ScaleByAdaDeltaState", "ScaleByAdamState",
        "ScaleByAdanState", "ScaleByAmsgradState", "ScaleByBacktrackingLinesearchState",
        "ScaleByBeliefState", "ScaleByLBFGSState", "ScaleByLionState", "ScaleByNovogradState",
        "ScaleByRStdDevState", "ScaleByRmsState", "ScaleByRpropState", "ScaleByRssState",
        "ScaleBySM3State", "ScaleByScheduleState", "ScaleByTrustRatioState",
        "ScaleByZoomLinesearchState", "ScaleState", "SnapshotState", "TraceState", "ZeroNansState",
        "ZoomLinesearchInfo",
    ),
    "types": (
        "GradientTransformation", "GradientTransformationExtraArgs", "OptState", "Params",
        "Schedule", "TransformInitFn", "TransformUpdateExtraArgsFn", "TransformUpdateFn", "Updates",
    ),
    "combinators and wrappers": (
        "LookaheadParams", "MultiSteps", "apply_if_finite", "chain", "conditionally_mask",
        "conditionally_transform", "flatten", "freeze", "inject_hyperparams", "lookahead", "masked",
        "maybe_update", "measure_with_ema", "monitor", "multi_transform", "named_chain",
        "selective_transform", "skip_large_updates", "skip_not_finite", "snapshot",
        "with_extra_args_support",
    ),
    "schedules": (
        "constant_schedule", "cosine_decay_schedule", "cosine_onecycle_schedule", "exponential_decay",
        "join_schedules", "linear_onecycle_schedule", "linear_schedule", "piecewise_constant_schedule",
        "piecewise_interpolate_schedule", "polynomial_schedule", "sgdr_schedule",
        "warmup_cosine_decay_schedule", "warmup_exponential_decay_schedule",
    ),
    "losses": (
        "convex_kl_divergence", "cosine_distance", "cosine_similarity", "ctc_loss",
        "ctc_loss_with_forward_probs", "hinge_loss", "huber_loss", "kl_divergence", "l2_loss",
        "log_cosh", "sigmoid_binary_cross_entropy", "smooth_labels", "softmax_cross_entropy",
        "softmax_cross_entropy_with_integer_labels", "squared_error",
    ),
    "linear algebra and numerics": (
        "bias_correction", "global_norm", "init_empty_state", "matrix_inverse_pth_root",
        "power_iteration", "safe_int32_increment", "safe_norm", "safe_root_mean_squares",
        "update_infinity_moment", "update_moment", "update_moment_per_elem_norm",
    ),
    "second order": ("second_order.fisher_diag", "second_order.hessian_diag", "second_order.hvp"),
    "Monte Carlo gradients": (
        "control_delta_method", "control_variates_jacobians", "measure_valued_jacobians",
        "moving_avg_baseline", "pathwise_jacobians", "score_function_jacobians",
    ),
    "privacy": ("differentially_private_aggregate",),
    "utilities": ("apply_updates", "incremental_update", "periodic_update", "scale_gradient"),
    "contrib and experimental": (
        "contrib.MechanicState", "contrib.mechanize", "experimental.SplitRealAndImaginaryState",
        "experimental.split_real_and_imaginary",
    ),
    "trax optimizers": (
        "trax.Adafactor", "trax.Adam", "trax.Momentum", "trax.MomentumType", "trax.Optimizer",
        "trax.RMSProp", "trax.SGD", "trax.SM3", "trax.clip_grads", "trax.l2_norm",
    ),
}  # fmt: skip


OPTAX: dict[str, tuple[str, ...]] = {
    (f"optax.{namespace}" if namespace else "optax"): tuple(f"{namespace}.{n}" if namespace else n for n in names)
    for namespace, names in OPTAX_0_2_8.items()
}
"""optax 0.2.8's public names by namespace, dotted as modopt spells them (`contrib.muon`)."""


def present(name: str) -> bool:
    """Whether `name` (dotted for a subpackage) exists in modopt.

    Args:
        name: a public name, dotted for a subpackage (`"second_order.hessian_diag"`).
    """
    module = importlib.import_module("modopt")
    *packages, attribute = name.split(".")
    for package in packages:
        try:  # a subpackage, or a namespace the package binds (`experimental.aggregating`)
            module = getattr(module, package, None) or importlib.import_module(f"{module.__name__}.{package}")
        except ImportError:
            return False
    return hasattr(module, attribute)


def report(width: int = 30) -> None:
    """Prints both catalogs: a bar per family (names present / names in the family), then any
    missing name; the seeds' catalog first, optax 0.2.8's second.

    Args:
        width: the width of the bars, in characters.
    """
    for title, catalog in (("The seeds' catalog", FAMILIES), ("optax 0.2.8's public names", OPTAX)):
        print(title)
        _report(catalog, width)


def missing(catalog: dict[str, tuple[str, ...]]) -> list[str]:
    """The names of `catalog` (`FAMILIES` or `OPTAX`) that modopt lacks.

    Args:
        catalog: names by family, dotted for a subpackage.
    """
    return [name for names in catalog.values() for name in names if not present(name)]


def _report(catalog: dict[str, tuple[str, ...]], width: int) -> None:
    absent = missing(catalog)
    for family, names in catalog.items():
        found = sum(name not in absent for name in names)
        bar = "#" * round(width * found / len(names))
        print(f"  {family:<32} {bar:<{width}} {found:>3}/{len(names)}")
    total = sum(len(names) for names in catalog.values())
    print(f"  {'all':<32} {'':<{width}} {total - len(absent):>3}/{total}")
    print("  missing: " + (", ".join(absent) if absent else "none"))
