"""Sphinx configuration of the airflow-kinesis-spark documentation (``make docs``).

The pages are Markdown (MyST); the API reference is generated from the docstrings by autodoc.
The build needs no network: there is no intersphinx, and the theme's assets ship with it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Document the code of this checkout, even when another copy of the package is installed.
sys.path.insert(0, str(ROOT))
# autodoc imports the modules, and importing Airflow reads (and may write) its home directory:
# keep a docs build away from a real deployment's configuration.
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="airflow-kinesis-spark-docs-")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True)

with open(ROOT / "pyproject.toml", "rb") as fh:
    _project = tomllib.load(fh)["project"]

project = "airflow-kinesis-spark"
author = "airflow-kinesis-spark developers"
copyright = "airflow-kinesis-spark developers; Apache License 2.0"
release = _project["version"]
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Markdown: `[text](page.md#some-heading)` links resolve to the heading's slug, as on GitHub.
myst_heading_anchors = 4

# API reference: members of each module (its __all__ when it has one), without the members a
# class inherits from Airflow's or botocore's base classes.
autodoc_default_options = {
    "members": True,
    "undoc-members": True,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"

html_theme = "furo"
html_title = f"airflow-kinesis-spark {release}"
html_static_path: list[str] = []
