"""Keeps sphinx-codeautolink's record of a Markdown page's code blocks between builds.

Codeautolink 0.20 reads back its cache (``codeautolink-cache.json``) at the start of
each build and keeps a page's entry only if ``<page>.rst`` exists. Our lecture pages
and the index are MyST Markdown, so their entries were dropped: any later build that
wrote such a page again without reading it (adding or removing an example rewrites
every page) wrote it without its code links. This reads the cache back keeping every
page whose source exists under one of the project's source suffixes.
"""

import json

from sphinx_codeautolink.extension.block import CodeExample, SourceTransform
from sphinx_codeautolink.extension.cache import DataCache
from sphinx_codeautolink.parse import Name

_suffixes = [".rst"]


def read_every_source(self):
    cache = self.cache_dir / self.cache_filename
    if not cache.exists():
        return
    for page, transforms in json.loads(cache.read_text("utf-8")).items():
        if not any((self.src_dir / (page + suffix)).exists() for suffix in _suffixes):
            continue  # the page is gone
        self.transforms[page] = [
            SourceTransform(source=t["source"], names=[Name(**name) for name in t["names"]],
                            example=CodeExample(**t["example"]), doc_lineno=t["doc_lineno"])
            for t in transforms]


def _remember_suffixes(app):
    _suffixes[:] = list(app.config.source_suffix)  # with MyST's .md, merged in at config-inited


def setup(app):
    DataCache.read = read_every_source
    app.connect("builder-inited", _remember_suffixes, priority=100)  # before codeautolink reads
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
