"""The optimizers optax lacks, step by step against their PyTorch references, in a process of
their own.

`tests/references/` compares SOAP, PSGD Kron, Adam-mini, MARS, LaProp, cautious updates, NorMuon
and AdaMuon with PyTorch implementations (pytorch_optimizer, kron_torch, adam_mini, heavyball).
PyTorch is never imported into the processes that run the rest of the suite: loaded beside
XLA's compiler in a long-lived worker, it was followed twice by a segmentation fault inside an
XLA compilation. The folder is left out of the suite's own collection (`--ignore` in
pyproject's addopts) and runs here, in one subprocess.

It compiles as the rest of the suite does (`tests/conftest.py`), but for one test that says why.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
TIMEOUT = 900


def test_pytorch_references_pass():
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(HERE / "references")]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tests/references did not finish in {TIMEOUT} s")
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, f"{result.stdout[-8000:]}\n{result.stderr[-3000:]}"
    assert " passed" in summary and " skipped" not in summary, summary
