"""Remembers the links sphinx-codeautolink put into each page body, so that a page
written again with the same body gets them without a second parse.

Codeautolink re-parses every body it links with BeautifulSoup: about a third of the
time of a build that executes no example. Adding or removing a page rewrites every page
of the edition (each sidebar names its neighbours), while almost every body stays the
same. The result of ``link_html`` depends only on its arguments, so the memo keys on all
of them: the page, the body, each transform's source and names, the inventory entries
those names resolve to, and the options. A call that warned is not remembered, so the
next build warns again.

``COURSE_CODEAUTOLINK_MEMO=<folder>`` keeps the memo there instead, under the key itself:
the test suite's builds, each in a folder of its own, share one, so a body that one of
them linked is not parsed again by the next.
"""

import hashlib
import os
import pickle
from importlib.metadata import version
from pathlib import Path

import sphinx_codeautolink.extension as codeautolink
from sphinx.util import logging

logger = logging.getLogger(__name__)

_compute = codeautolink.link_html
_state = {"app": None, "hits": 0, "misses": 0}


def _key(document, html, transforms, inventory, custom_blocks, search_css_classes,
         builder_name, disable_link_titles):
    parts = [version("sphinx-codeautolink"), document, builder_name, repr(disable_link_titles),
             repr(sorted(custom_blocks)), repr(list(search_css_classes)), html]
    for transform in transforms:
        parts.append(transform.source)
        for name in transform.names:
            parts.append(repr((name.code_str, name.lineno, name.end_lineno, str(name.context),
                               name.resolved_location, inventory.get(name.resolved_location))))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def link_html(document, html, transforms, inventory, custom_blocks, search_css_classes,
              builder_name="html", *, disable_link_titles):
    app = _state["app"]
    arguments = (document, html, transforms, inventory, custom_blocks, search_css_classes)
    if app is None:
        return _compute(*arguments, builder_name, disable_link_titles=disable_link_titles)
    key = _key(*arguments, builder_name, disable_link_titles)
    memo = _memo_file(app, document, key)
    try:
        stored_key, linked = pickle.loads(memo.read_bytes())
        if stored_key == key:
            _state["hits"] += 1
            return linked
    except (OSError, pickle.UnpicklingError, ValueError, EOFError):
        pass
    warnings_before = app._warncount
    linked = _compute(*arguments, builder_name, disable_link_titles=disable_link_titles)
    _state["misses"] += 1
    if app._warncount == warnings_before:
        memo.parent.mkdir(parents=True, exist_ok=True)
        partial = memo.with_suffix(f".{os.getpid()}.partial")  # builds may run at once
        partial.write_bytes(pickle.dumps((key, linked)))
        partial.replace(memo)
    return linked


def _memo_file(app, document, key):
    """In the doctree folder, one file per page (a new body replaces the old one's); in a
    shared folder, one per key, since builds of other trees write the same pages."""
    if shared := os.environ.get("COURSE_CODEAUTOLINK_MEMO"):
        return Path(shared) / f"{key}.pickle"
    return Path(app.doctreedir) / "codeautolink-memo" / (
        hashlib.sha256(document.encode()).hexdigest()[:32] + ".pickle")


def _remember_app(app):
    _state.update(app=app, hits=0, misses=0)


def _report(app, exception):
    if _state["hits"] or _state["misses"]:
        logger.info(f"codeautolink: linked {_state['misses']} page bodies, "
                    f"reused the links of {_state['hits']} unchanged ones")


def setup(app):
    codeautolink.link_html = link_html  # apply_links looks the name up at each call
    app.connect("builder-inited", _remember_app)
    app.connect("build-finished", _report)
    return {"parallel_read_safe": True, "parallel_write_safe": False, "version": "1"}
