"""The PyTorch references compile at XLA's default optimization level (3), not without LLVM's
optimizations as the rest of the suite does (see `tests/conftest.py`): their tolerances were set
at the default level, and the Newton-Schulz iterations of the Muon variants amplify the other
rounding past them (AdaMuon's second moment, 7e-5 relative on one entry). Set before any test
here creates an array, however this folder is run; the last of a repeated XLA flag counts."""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=3"
