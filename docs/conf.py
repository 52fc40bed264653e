"""Sphinx configuration of nbckpt's site: ``make docs`` builds it, warnings as errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))
sys.path.insert(0, str(DOCS.parent))

from _generate import generate  # noqa: E402

import nbckpt  # noqa: E402

project = "nbckpt"
author = "the nbckpt developers"
copyright = "2026, the nbckpt developers"
release = version = nbckpt.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
    "sphinx_design",
]

# What the site draws from the code and from real runs (see _generate.py).
_UNEXECUTED = generate()

exclude_patterns = [
    "_build",
    "_generated/run",
    "_generated/notebooks/ckpt-*",
    "**/.ipynb_checkpoints",
]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Notebooks come executed from the test run when it executed them as they are now;
# any other is executed here (each copy's metadata says which: _generate.notebooks).
# NBCKPT_DOCS_EXECUTE=off skips every execution, for a quick look at the pages.
nb_execution_mode = os.environ.get("NBCKPT_DOCS_EXECUTE", "auto")
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_in_temp = True
nb_merge_streams = True

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

html_theme = "sphinx_book_theme"
html_title = f"nbckpt {release}"
html_theme_options = {
    "repository_url": "https://github.com/nbckpt/nbckpt",
    "use_repository_button": True,
    "launch_buttons": {"binderhub_url": "https://mybinder.org"},
    "path_to_docs": "docs",
    "show_toc_level": 2,
}
