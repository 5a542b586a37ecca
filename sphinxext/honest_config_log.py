""""The configuration has changed" names only options that conf.py really changed.

Sphinx compares the configuration it pickled with the last build against the one
it has just read, and logs each option that differs. Some options are filled in
while a build runs, after that comparison: the theme adds its styles, scripts,
templates and options, and sphinx-gallery fills in its settings (and ours
applies EXAMPLES=). The pickled copy holds those additions and the fresh one does
not, so every build logged "The configuration has changed (8 options: ...)"
though nothing had changed. Those options are left out of that message here.
The message only informs: whether pages are read again is decided from the
options that affect reading, which this does not touch, and the HTML builder's own
record of its options still rewrites every page when one of them really changes.
"""

import sphinx.environment

FILLED_IN_BY_THE_BUILD = frozenset({
    "html_css_files", "html_js_files", "html_permalinks_icon", "html_static_path",
    "html_theme_options", "mathjax4_config", "sphinx_gallery_conf", "templates_path",
})

_differing = sphinx.environment._differing_config_keys


def _differing_config_keys(old, new):
    return set(_differing(old, new)) - FILLED_IN_BY_THE_BUILD


def setup(app):
    sphinx.environment._differing_config_keys = _differing_config_keys
    return {"parallel_read_safe": True, "version": "1"}
