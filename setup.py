"""Package discovery: every package under `modopt/`, and `integrations/` installed as
`modopt.integrations` with its subpackages. Found, not listed, so a new subpackage cannot be
left out of the wheel (`tests/test_packaging.py` builds one and imports everything)."""

from setuptools import find_packages, setup

core = find_packages(include=["modopt", "modopt.*"])
integrations = ["modopt.integrations", *(f"modopt.integrations.{name}" for name in find_packages("integrations"))]
setup(packages=core + integrations, package_dir={"modopt.integrations": "integrations"})
