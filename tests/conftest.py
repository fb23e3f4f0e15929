import os
import sys

# Tests import the registry as a plain module.
sys.path.insert(0, os.path.dirname(__file__))

# XLA's CPU fusion emitters take about twice as long to compile the suite's small programs as the
# elemental emitters, and the suite is mostly compiling (measured: 38% less CPU for the Shampoo
# and trax tests). Set before any test module creates an array; subprocesses inherit it.
if "--xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_use_fusion_emitters=false").strip()
