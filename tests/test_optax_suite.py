"""optax 0.2.8's own test files, run against modopt's objects (see `optax_swap.py`).

Each group of files runs in a subprocess of its own, with the `optax_swap` plugin replacing
optax's public objects by modopt's before the files are imported. The tests modopt departs from
on purpose are deselected, each with its reason in `DEPARTURES` (the README lists them too).
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
TIMEOUT = 900

# optax's test files by group, relative to the optax package.
GROUPS: dict[str, tuple[str, ...]] = {
    "contrib": (
        "contrib/_common_test.py",
        "contrib/_muon_test.py",
        "contrib/_galore_test.py",
        "contrib/_sam_test.py",
        "contrib/_schedule_free_test.py",
        "contrib/_reduce_on_plateau_test.py",
        "contrib/_mechanic_test.py",
        "contrib/_complex_valued_test.py",
        "contrib/_privacy_test.py",
    ),
    "tree": (
        "tree_utils/_casting_test.py",
        "tree_utils/_random_test.py",
        "tree_utils/_state_utils_test.py",
        "tree_utils/_tree_math_test.py",
    ),
    "losses": tuple(f"losses/{path.name}" for path in sorted((OPTAX / "losses").glob("*_test.py"))),
    "utilities": (
        "projections/_projections_test.py",
        "perturbations/_make_pert_test.py",
        "assignment/_hungarian_algorithm_test.py",
        "microbatching/_microbatching_test.py",
        "experimental/_aggregating_test.py",
        "schedules/_inject_test.py",
    ),
}
EVERYTHING = tuple(
    str(path.relative_to(OPTAX)) for path in sorted(OPTAX.rglob("*_test.py")) if path.name != "optax_test.py"
)
if os.environ.get("MODOPT_OPTAX_SUITE") == "all":
    listed = {file for files in GROUPS.values() for file in files}
    GROUPS["rest"] = tuple(file for file in EVERYTHING if file not in listed)

# Tests modopt departs from on purpose: node id (or a prefix of one, relative to the optax
# package) -> why.
DEPARTURES: dict[str, str] = {}


def deselections(files: tuple[str, ...]) -> list[str]:
    chosen = [node for node in DEPARTURES if node.split("::", 1)[0] in files]
    return [f"--deselect={OPTAX / node}" for node in chosen]


@pytest.mark.parametrize("group", list(GROUPS))
def test_optax_own_tests_pass_against_modopt(group):
    files = GROUPS[group]
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
