"""Translated display math on MyST pages.

Sphinx translates a literal node (code, math) by wrapping the translation in
reStructuredText's literal-block syntax (``::`` and an indent) and parsing it
with the page's own parser. On a Markdown page MyST reads that as a paragraph
``::`` followed by code, so a translated formula shows as ``::``. Here, before
Sphinx's own translation step, each display formula of a MyST page gets its
translation as plain text, and is marked done so that the step leaves it alone.
"""

from docutils import nodes
from sphinx.locale import init as init_locale
from sphinx.transforms import SphinxTransform
from sphinx.transforms.i18n import Locale
from sphinx.util.i18n import docname_to_domain


class TranslateMystMath(SphinxTransform):
    default_priority = Locale.default_priority - 1

    def apply(self, **kwargs):
        if not self.config.language or self.config.language == "en":
            return
        docname = self.env.current_document.docname
        if self.env.doc2path(docname).suffix != ".md":
            return
        dirs = [self.env.srcdir / d for d in self.config.locale_dirs]
        domain = docname_to_domain(docname, self.config.gettext_compact)
        catalog, has_catalog = init_locale(dirs, self.config.language, domain)
        if not has_catalog:
            return
        for node in self.document.findall(nodes.math_block):
            msg = node.rawsource or node.astext()
            msgstr = catalog.gettext(msg)
            if msgstr and msgstr != msg:
                node.rawsource = msgstr
                node.children = [nodes.Text(msgstr)]
                node["translated"] = True


def setup(app):
    app.add_transform(TranslateMystMath)
    return {"parallel_read_safe": True, "version": "1"}
