"""optax 0.2.8's own test files, run against modopt's objects (see `optax_swap.py`).

Each group of files runs in a subprocess of its own, with the `optax_swap` plugin replacing
optax's public objects by modopt's before the files are imported. The tests modopt departs from
on purpose are deselected, each with its reason in `DEPARTURES` (the docs page "Parity with optax" lists them too).
The groups that run by default are the families of optax 0.2.8 that go beyond the seeds'
catalog; `MODOPT_OPTAX_SUITE=all` runs every optax test file (about 20 minutes on 2 cores).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

optax = pytest.importorskip("optax")

OPTAX = pathlib.Path(optax.__file__).parent
HERE = pathlib.Path(__file__).parent
TIMEOUT = 900 if os.environ.get("MODOPT_OPTAX_SUITE") != "all" else 3600  # all: alias_test.py alone runs for minutes

# optax's test files by group, relative to the optax package.
# The files that run by default: those of the families optax 0.2.8 has beyond the seeds'
# catalog that run in seconds. `MODOPT_OPTAX_SUITE=all` adds every other optax test file, as
# groups by package (`contrib/_common_test.py` alone runs ~900 parametrized tests, several
# minutes on 2 cores).
GROUPS: dict[str, tuple[str, ...]] = {
    "contrib": (
        "contrib/_galore_test.py",
        "contrib/_sam_test.py",
        "contrib/_schedule_free_test.py",
        "contrib/_reduce_on_plateau_test.py",
        "contrib/_mechanic_test.py",
        "contrib/_complex_valued_test.py",
    ),
    "tree": (
        "tree_utils/_casting_test.py",
        "tree_utils/_random_test.py",
        "tree_utils/_state_utils_test.py",
        "tree_utils/_tree_math_test.py",
    ),
    "namespaces": (
        "projections/_projections_test.py",
        "microbatching/_microbatching_test.py",
        "experimental/_aggregating_test.py",
        "schedules/_inject_test.py",
        "losses/_fenchel_young_test.py",
        "losses/_ranking_test.py",
        "losses/_regression_test.py",
        "losses/_self_supervised_test.py",
        "losses/_smoothing_test.py",
    ),
}
EVERYTHING = tuple(
    str(path.relative_to(OPTAX)) for path in sorted(OPTAX.rglob("*_test.py")) if path.name != "optax_test.py"
)
if os.environ.get("MODOPT_OPTAX_SUITE") == "all":
    listed = {file for files in GROUPS.values() for file in files}
    for file in EVERYTHING:
        if file not in listed:
            package = file.split("/", 1)[0] if file.split("/", 1)[0] != "_src" else file.rsplit("/", 1)[-1][:-8]
            GROUPS.setdefault(f"all-{package}", ())
            GROUPS[f"all-{package}"] += (file,)

# Tests modopt departs from on purpose: node id of a test (relative to the optax package; its
# parametrizations `name0`, `name1`... go with it, see optax_swap.departs) -> why.
VERBOSE_TEXT = (
    "checks the text optax prints with verbose=True (its FLAG_* messages); modopt prints its own diagnostic"
)
NONVALID_EXPONENTIAL = (
    "transition_steps <= 0 and decay_rate == 0 are invalid by optax's own docs; optax returns a constant "
    "schedule (logging.info), modopt raises 'Invalid transition_steps: ...' / 'Invalid decay_rate: ...'"
)
SCHEDULE_FREE_WARMUP = (
    "schedule_free_sgd/adamw with warmup_steps warm up to a number; modopt refuses a schedule there with a "
    "clear error (optax annotates learning_rate as a number, so this test skips it)"
)
MASK_MESSAGE = (
    "checks JAX's 'Dict key mismatch' text; modopt's error names the mask or labels and the missing keys"
)
DEPARTURES: dict[str, str] = {
    # isinstance against optax's own classes: modopt's transforms are Equinox modules that keep
    # optax's protocol by duck typing (the rest of these tests passes without the isinstance lines).
    "_src/base_test.py::ExtraArgsTest::test_isinstance": "isinstance against optax's GradientTransformation NamedTuples",
    "_src/combine_test.py::ExtraArgsTest::test_extra_args": "isinstance against optax's GradientTransformationExtraArgs",
    "_src/combine_test.py::ExtraArgsTest::test_extra_args_chaining": "isinstance against optax's NamedTuple classes",
    "transforms/_combining_test.py::ExtraArgsTest::test_extra_args": "isinstance against optax's GradientTransformationExtraArgs",
    "transforms/_combining_test.py::ExtraArgsTest::test_extra_args_chaining": "isinstance against optax's NamedTuples",
    "_src/utils_test.py::MultiNormalDiagFromLogScaleTest::test_init_successful_broadcast": (
        "isinstance against optax's private utils.MultiNormalDiagFromLogScale and its private `_param_shape` "
        "(modopt: event_shape); the broadcasting is compared with optax in test_optax_triage.py"
    ),
    "_src/transform_test.py::TransformTest::test_lion_invalid_mode_raises": (
        "modopt raises the ValueError for an unknown mode at construction; optax at the first update, after init"
    ),
    "_src/transform_test.py::TransformTest::test_scalers_polyak": (
        "the test passes `value` only to a factory whose __name__ is 'scale_by_polyak'; modopt's is the class ScaleByPolyak"
    ),
    "transforms/_clipping_test.py::ClippingTest::test_clip_by_block_rms": (
        "fails with optax 0.2.8 itself on CPU (block rms 0.9999999 vs 1.0 to 7 places); modopt computes optax's numbers"
    ),
    "_src/linesearch_test.py::BacktrackingLinesearchTest::test_dtype_stability": (
        "passes 1e-5 for every hyperparameter; modopt rejects increase_factor < 1, which shrinks every first guess "
        "(test_optax_triage.py runs the same dtype check with valid values)"
    ),
    "_src/linesearch_test.py::ZoomLinesearchTest::test_dtype_stability": (
        "passes 1e-5 for every hyperparameter; modopt rejects increase_factor < 1, with which the bracketing phase "
        "shrinks instead of growing (test_optax_triage.py runs the same dtype check with valid values)"
    ),
    "_src/linesearch_test.py::ZoomLinesearchTest::test_failure_descent_direction": VERBOSE_TEXT,
    "_src/linesearch_test.py::ZoomLinesearchTest::test_failure_too_small_max_stepsize": VERBOSE_TEXT,
    "_src/linesearch_test.py::ZoomLinesearchTest::test_failure_flat_fun": VERBOSE_TEXT,
    "schedules/_schedule_test.py::ExponentialTest::test_nonvalid_transition_steps": NONVALID_EXPONENTIAL,
    "schedules/_schedule_test.py::ExponentialTest::test_nonvalid_decay_rate": NONVALID_EXPONENTIAL,
    # The families beyond the seeds' catalog.
    "contrib/_common_test.py::ContribTest::test_optimizers_can_be_wrapped_in_inject_hyperparams16": (
        "sophia's state holds a typed PRNG key (modopt's keys are typed everywhere); the test compares "
        "states with NumPy, which JAX refuses for typed keys (the updates, compared first, are equal)"
    ),
    "contrib/_common_test.py::ContribTest::test_optimizers_accept_learning_rate_schedule_if_type_annotated_as_such14": (
        SCHEDULE_FREE_WARMUP
    ),
    "contrib/_common_test.py::ContribTest::test_optimizers_accept_learning_rate_schedule_if_type_annotated_as_such15": (
        SCHEDULE_FREE_WARMUP
    ),
    "tree_utils/_tree_math_test.py::TreeUtilsTest::test_tree_vdot": (
        "compares with jnp.vdot at rtol 1e-7; modopt contracts each leaf without raveling it (as optax does on "
        "jax >= 0.7.2; optax 0.2.8 compares version strings as text and ravels on jax 0.10), one ulp apart "
        "on a complex64 sum"
    ),
    "tree_utils/_state_utils_test.py::StateUtilsTest::test_tree_get_all_with_path": (
        "two subtests read optax 0.2.8's inject_hyperparams state (InjectStatefulHyperparamsState, with "
        "hyperparams_states); modopt's inject_hyperparams keeps the seeds' three fields "
        "(inject_stateful_hyperparams gives optax's four)"
    ),
    # test_explicit_dtype's parametrizations 24-29: complex64 params, a real state dtype
    # (bfloat16, float32), for sgd's trace and adam's / adamw's mu.
    **{
        f"_src/alias_test.py::AliasTest::test_explicit_dtype{index}": (
            "complex params with a real state dtype: optax casts the complex momentum to that real dtype, "
            "dropping its imaginary part at every step (JAX warns the cast will become an error); modopt keeps "
            "it complex of that precision (complex64), giving optax's numbers with a complex64 state dtype "
            "(test_state_dtypes.py; see modopt.fields.dtype)"
        )
        for index in range(24, 30)
    },
    "transforms/_freezing_test.py::FreezeTest::test_bad_structure_raises": MASK_MESSAGE,
    "transforms/_freezing_test.py::SelectiveTransformTest::test_selective_bad_structure": MASK_MESSAGE,
    **{
        f"_src/linear_algebra_test.py::LinearAlgebraTest::test_nnls{index}": (
            "fails with optax 0.2.8 itself on jax 0.10 (the objective rises between two iteration counts for "
            "m=10, n=21); modopt's nnls gives optax's numbers (test_projections.py)"
        )
        for index in (4, 5)
    },
    **{
        f"_src/linear_algebra_test.py::LinearAlgebraTest::{name}": (
            "power_iteration returns the seeds' (eigenvector, eigenvalue) (optax before 0.2.2); optax 0.2.2+ "
            "returns (eigenvalue, eigenvector), so the tests read the eigenvector as the eigenvalue ('truth "
            "value of an array with more than one element'); with the order swapped all four pass"
        )
        for name in ("test_power_iteration", "test_power_iteration_mlp_hessian", "test_power_iteration_pytree")
    },
}


def deselections(files: tuple[str, ...]) -> list[str]:
    chosen = [node for node in DEPARTURES if node.split("::", 1)[0] in files]
    return [f"--departure={node}" for node in chosen]  # see optax_swap.departs


# The default groups run in one subprocess: a process start, `import jax`, optax's and modopt's
# imports and the swap cost seconds each, and the small programs the files share (eager ops,
# optax's helpers) compile once instead of once per group. Every file of every group still runs,
# with the same deselections; optax's test files are written to run together in one session.
DEFAULT = ("contrib", "tree", "namespaces")
RUNS: dict[str, tuple[str, ...]] = {
    "+".join(DEFAULT): tuple(file for group in DEFAULT for file in GROUPS[group]),
    **{group: files for group, files in GROUPS.items() if group not in DEFAULT},
}


def test_default_groups_are_all_run():
    assert set(DEFAULT) <= set(GROUPS)
    listed = [file for files in RUNS.values() for file in files]
    assert sorted(listed) == sorted(file for files in GROUPS.values() for file in files)
    assert all((OPTAX / file).is_file() for file in listed), [f for f in listed if not (OPTAX / f).is_file()]


@pytest.mark.parametrize("group", list(RUNS))
def test_optax_own_tests_pass_against_modopt(group):
    files = RUNS[group]
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "optax_swap", "-p", "no:cacheprovider",
        "-o", "addopts=", "--rootdir", str(OPTAX), *[str(OPTAX / file) for file in files], *deselections(files),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=HERE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"optax's {group} tests did not finish in {TIMEOUT} s")
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, f"{result.stdout[-8000:]}\n{result.stderr[-3000:]}"
    assert " passed" in summary, summary
