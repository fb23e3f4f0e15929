"""mkdocs hook (see mkdocs.yml): renders the notebooks of `notebooks/` on the site.

They live at the repository root, where nbmake executes them in the test suite, rather than in
`docs/`: this adds each `notebooks/*.ipynb` to the site's files as `notebooks/<name>.ipynb`,
before mkdocs-jupyter converts them (it does not execute them: they are committed with outputs).
"""

from __future__ import annotations

import os

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@event_priority(100)  # before mkdocs-jupyter's on_files, which picks the notebooks up
def on_files(files: Files, config, **kwargs) -> Files:
    folder = os.path.join(ROOT, "notebooks")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".ipynb"):
            files.append(File(f"notebooks/{name}", ROOT, config["site_dir"], config["use_directory_urls"]))
    return files
