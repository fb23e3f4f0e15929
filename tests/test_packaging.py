"""The wheel holds every package of the source tree, and each imports from the wheel alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_packages() -> set[str]:
    """Every directory with an `__init__.py` under `modopt/` and `integrations/`, by import name."""
    found = set()
    for top, name in (("modopt", "modopt"), ("integrations", "modopt.integrations")):
        for directory, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files and "__pycache__" not in directory:
                relative = os.path.relpath(directory, os.path.join(ROOT, top))
                found.add(name if relative == "." else f"{name}.{relative.replace(os.sep, '.')}")
    return found


def test_wheel_contains_and_imports_every_subpackage(tmp_path):
    # Built from a clean copy: setuptools reuses a `build/` folder, which may hold stale packages.
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "checkpoints")
    shutil.copytree(ROOT, tmp_path / "src", ignore=ignore)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path / "dist"), str(tmp_path / "src")],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = [f for f in os.listdir(tmp_path / "dist") if f.endswith(".whl")]
    with zipfile.ZipFile(tmp_path / "dist" / wheel) as archive:
        archive.extractall(tmp_path / "site")
        names = archive.namelist()
    in_wheel = {os.path.dirname(n).replace("/", ".") for n in names if n.endswith("/__init__.py")}
    expected = source_packages()
    assert {"modopt", "modopt.transforms", "modopt.integrations"} <= expected, expected
    assert in_wheel == expected, f"missing from the wheel: {expected - in_wheel}; not in the source: {in_wheel - expected}"
    assert "modopt/py.typed" in names, "the PEP 561 marker is missing: type checkers would ignore modopt's hints"
    # Import each from the unpacked wheel only: run elsewhere, with the wheel first on the path.
    script = "import importlib, modopt; assert modopt.__file__.startswith({site!r}), modopt.__file__\n".format(
        site=str(tmp_path / "site")
    ) + "".join(f"importlib.import_module({name!r})\n" for name in sorted(expected))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
