"""Sphinx configuration of stoker's docs: MyST Markdown pages, the API reference by autodoc.

Build: ``scripts/docs.sh`` (``sphinx-build -W -b html docs docs/_build/html``).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))

import stoker  # noqa: E402

project = "stoker"
author = "the stoker authors"
copyright = "the stoker authors"
release = version = stoker.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "stoker_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the signatures name the types; the docstrings say what they mean
autodoc_default_options = {"show-inheritance": True}
# Annotations stoker postpones (``from __future__ import annotations``) need no resolving here.
nitpicky = False

intersphinx_mapping = {}  # offline: the build reaches no network

html_theme = "alabaster"
html_title = f"stoker {release}"
# A wider column than alabaster's 800 px (code lines are up to 100 characters), within a
# 1280 px window; _static/stoker.css wraps what is still longer (tests/docs/test_site.py).
html_theme_options = {"page_width": "1160px", "body_max_width": "none"}
html_static_path = ["_static"]
html_css_files = ["stoker.css"]
