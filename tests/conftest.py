import os
import sys

# Tests import the registry as a plain module.
sys.path.insert(0, os.path.dirname(__file__))

import testing_gc  # noqa: E402

# XLA's CPU fusion emitters take about twice as long to compile the suite's small programs as the
# elemental emitters, and the suite is mostly compiling (measured: 38% less CPU for the Shampoo
# and trax tests). Set before any test module creates an array; subprocesses inherit it.
if "--xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_use_fusion_emitters=false").strip()

# The suite compiles without LLVM's optimizations (`--xla_backend_optimization_level=0`; XLA's
# default is 3): the same XLA program, lowered to slower machine code that compiles in about
# two thirds of the time (measured: 29% less CPU on a sample of registry, grouping, trax and
# tree tests). Every comparison with a reference has a tolerance, or is between two programs
# compiled alike, except the bit-for-bit schedule checks, which are about what users' programs
# compute: `test_schedule_bits.py` compiles its programs at XLA's default level, and so does
# the AdaMuon reference test (`tests/references/test_muon_variants.py`), whose Newton-Schulz
# iterations amplify the difference in rounding past its PyTorch tolerance.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"] + " --xla_backend_optimization_level=0"

# Files whose tests run for tens of seconds each, mostly in subprocesses. They are collected
# first: with `pytest -n 2` a long test handed out last keeps one worker busy while the other
# has nothing left to do. (Measured on 2026-11-29: `--dist loadfile`, which keeps a file's
# module-scoped fixtures to one worker, took 18 min 29 s and 18 min 56 s; xdist's default
# `load` 17 min 04 s on the same code and machine.)
LONG_FIRST = (
    "test_owners_mesh.py",
    "test_lm_job.py",
    "test_sharded.py",
    "test_multiprocess.py",
    "test_references.py",
    "test_beyond_optax_meshes.py",
    "test_optax_suite.py",
    "test_benchmarks.py",
    "test_beyond_optax_bench.py",
    "test_main_job.py",
    ".ipynb",
)


def pytest_configure(config):
    testing_gc.collect_less()  # and again once collected: see testing_gc.py
    if os.environ.get("MODOPT_COMPILE_REPORT"):  # where the time goes, by file: see compile_report.py
        import compile_report

        compile_report.register(config)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return next((i for i, suffix in enumerate(LONG_FIRST) if name.endswith(suffix)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the order within a file is kept


def pytest_collection_finish(session):
    testing_gc.collect_less()  # the modules and parametrizations collection made live to the end
