"""Sphinx configuration for the course site.

Read top to bottom: what the site is, which extensions build it, how the
example gallery runs, and how it looks. Behaviour lives in ``sphinxext/``.
"""

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent.resolve()
sys.path.insert(0, str(HERE / "sphinxext"))  # our extensions, and the example runner


# -- The course -------------------------------------------------------------
project = "GPU Programming for LLMs"
author = "The course authors"
copyright = "2026, the course authors"
root_doc = "index"

# -- Editions -----------------------------------------------------------------
# English is the source; the Chinese edition is built from the catalogs in
# locale/ with ``-D language=zh_CN`` (see docs/translating.md).
language = "en"
locale_dirs = ["../locale"]
gettext_compact = False
gettext_location = False
gettext_uuid = False

# -- Extensions ---------------------------------------------------------------
extensions = [
    "honest_config_log",
    "myst_parser",
    "sphinx_design",
    "sphinx_gallery.gen_gallery",
    "example_runner",
    "provenance",
    "colab",
    "page_speed",
    "editions",
    "chinese_search",
    "sphinx_copybutton",
    "sphinxext.opengraph",
    "sphinx_sitemap",
    "notfound.extension",
    "katex_math",
    "myst_math_i18n",
    "sphinxcontrib.bibtex",
    "sphinx.ext.intersphinx",
    "sphinx_codeautolink",
    "codeautolink_memo",  # after codeautolink: a page body written again is not parsed again
    "codeautolink_sources",  # codeautolink's cache keeps the code blocks of Markdown pages too
]
html_math_renderer = "katex"
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath", "deflist", "attrs_inline"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "**/provenance", "**/artifacts", "**.ipynb", "**.md5"]
suppress_warnings = []

# -- The example gallery ----------------------------------------------------------
# One gallery folder per lecture. Every example is executed, in file-number
# order, unless COURSE_EXAMPLES (a regular expression searched in the file
# names, e.g. COURSE_EXAMPLES=torch_compile) or COURSE_LECTURES (comma-separated
# lecture folders, one shard of the GPU build) narrows the run. sphinxext/
# example_runner.py applies them when the build starts, so that the settings
# below, and the pages built from them, stay the same whatever a build executes.
LECTURES = ["lecture05_gpus", "lecture06_kernels_triton", "lecture07_parallelism"]

sphinx_gallery_conf = {
    "examples_dirs": [f"../examples/{lecture}" for lecture in LECTURES],
    "gallery_dirs": [f"auto_examples/{lecture}" for lecture in LECTURES],
    "filename_pattern": r"/\d\d_\w+\.py$",
    "ignore_pattern": r"__init__\.py",
    "within_subsection_order": "FileNameSortKey",
    # The figure font of the Chinese edition is set after matplotlib's reset, which undoes it.
    "reset_modules": ("example_runner.around_each_example", "matplotlib", "example_runner.figure_font"),
    "reset_modules_order": "both",
    # The second "scraper" keeps each example's KEY_FIGURES for its provenance record.
    "image_scrapers": ("matplotlib", "example_runner.keep_key_figures"),
    "backreferences_dir": "auto_examples/backreferences",
    "download_all_examples": True,
    "remove_config_comments": True,
    "show_memory": False,
    "only_warn_on_example_error": False,
    "abort_on_example_error": False,
    "capture_repr": (),
    "matplotlib_animations": False,
    "image_srcset": [],
    "default_thumb_file": None,
    "write_computation_times": False,
    # Figures are losslessly recompressed where optipng is installed (make test installs it).
    "compress_images": ("images", "thumbnails", "-o2") if shutil.which("optipng") else (),
}

# -- Code that links ---------------------------------------------------------------
# Names in the examples' code link to the PyTorch and Triton API reference. The
# inventories are generated offline from the names the examples use
# (tools/make_inventories.py), so the build fetches nothing.
intersphinx_mapping = {
    "torch": ("https://docs.pytorch.org/docs/stable/", str(HERE / "inventories" / "torch.inv")),
    "triton": ("https://triton-lang.org/main/", str(HERE / "inventories" / "triton.inv")),
}
codeautolink_concat_default = True  # an example's imports hold in all its later code blocks
# sphinx-gallery links most names itself; codeautolink adds decorators such as
# @triton.jit and warns once for every name already linked.
suppress_warnings.append("codeautolink.match_name")

# -- Citations ------------------------------------------------------------------
# One bibliography file; each lecture cites with {footcite:p}`key` and ends with
# its own list ({footbibliography}), so a work cited by two lectures is listed by both.
bibtex_bibfiles = ["source/references.bib"]
bibtex_default_style = "plain"
bibtex_foot_reference_style = "foot"

# -- Publishing ------------------------------------------------------------------
# Where the site is hosted, for absolute URLs (canonical links, sitemap,
# OpenGraph, 404 page). This is the site's root; sphinxext/editions.py turns it
# into each edition's folder. The publishing workflow sets COURSE_BASE_URL;
# local builds serve from loopback.
html_baseurl = os.environ.get("COURSE_BASE_URL", "http://127.0.0.1:8000/")
sitemap_url_scheme = "{lang}{link}"
sitemap_locales = ["en", "zh_CN"]  # each URL names its twin in the other edition
sitemap_excludes = ["search.html", "genindex.html", "404.html"]
ogp_site_url = html_baseurl
ogp_site_name = "GPU Programming for LLMs"
ogp_enable_meta_description = True
ogp_social_cards = {"enable": False}
ogp_image = "_static/favicon.svg"
html_favicon = "_static/favicon.svg"
# "Open in Colab" links point at the notebooks the publishing workflow pushes
# to this GitHub repository's ``notebooks`` branch; unset, no link is drawn.
course_repo_url = os.environ.get("COURSE_REPO_URL", "")
copybutton_exclude = ".linenos, .gp, .go"

# -- Look ------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "GPU Programming for LLMs"
html_static_path = ["_static"]
templates_path = ["_templates"]
html_css_files = ["course.css"]
html_js_files = [("course.js", {"defer": "defer"})]
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navbar_end": ["language-switcher", "theme-switcher"],
    "secondary_sidebar_items": ["page-toc", "sourcelink"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_show_sourcelink = False
html_context = {"default_mode": "auto"}  # follow the reader's light or dark preference
