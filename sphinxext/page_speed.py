"""Pages that paint early and do not move.

* A thumbnail without ``width`` and ``height`` takes no room until its image
  has arrived, so the gallery grid below it shifts as each one loads; with its
  real size the browser reserves the room at first paint. ``loading="lazy"``
  leaves thumbnails below the fold for later. The same holds for the figures
  that sphinx-gallery scrapes from an example: its ``<img>`` gets the PNG's
  pixel size (the CSS scales it down with ``height: auto``).
* Sphinx and its extensions load their scripts synchronously in ``<head>``, so
  the page waits for each before it paints. None of them is needed to paint:
  they are deferred, which keeps their order and runs them before
  ``DOMContentLoaded``. ``documentation_options.js`` stays synchronous because
  inline scripts in ``<head>`` read the object it defines; on the search page
  nothing is deferred, since its own synchronous searchtools.js needs doctools.js.
* Every stylesheet in ``<head>`` holds the first paint, and on a phone each
  costs a round trip. sphinx-gallery's styles for Binder badges, data frames and
  rendered HTML output are linked only from pages that have such output. The
  theme's ``styles/theme.css`` is a single ``@import`` of ``basic.css``, so the
  browser would ask for basic.css a round trip after theme.css; a preload asks
  for both at once.
* The theme's Font Awesome faces hold 2,000 icons in 240 KB, and a page asks
  for the solid one (and the brands one, if it links to github.com) before its
  first paint; the site shows a few dozen. After the build they are cut down
  (fontTools) to the icons that a page, a script or the theme's own styles
  name: 3 KB each, and on a phone a first paint that does not wait for them.
"""

import re
import struct
from pathlib import Path

from docutils import nodes
from sphinx.builders.html._assets import _JavaScript
from sphinx.util import logging
from sphinx_gallery.directives import depart_imgsg_html, imgsgnode, visit_imgsg_html

NEEDED_BEFORE_INLINE_SCRIPTS = {"_static/documentation_options.js"}
# A stylesheet kept only on pages whose body has one of these classes.
STYLES_FOR_OUTPUT = {
    "_static/sg_gallery-binder.css": ("binder-badge", "lite-badge"),
    "_static/sg_gallery-dataframe.css": ("dataframe",),
    "_static/sg_gallery-rendered-html.css": ("rendered_html",),
}
THEME_IMPORTS = {"pydata_sphinx_theme": "_static/basic.css"}
logger = logging.getLogger(__name__)


def png_size(path):
    """(width, height) from a PNG's header, or None if ``path`` is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])


def size_the_thumbnails(app, doctree):
    for image in doctree.findall(nodes.image):
        uri = image.get("uri", "")
        if "/images/thumb/" not in uri:
            continue
        path = Path(app.srcdir, uri.lstrip("/"))
        size = png_size(path) if path.is_file() else None
        if size:
            image["width"], image["height"] = (str(v) for v in size)
        image["loading"] = "lazy"
        # A sized image would otherwise be wrapped in a link to its full-size file.
        image["classes"].append("no-scaled-link")


def visit_sized_figure(translator, node):
    """sphinx-gallery's ``<img>`` for a scraped figure, with the PNG's width and height."""
    visit_imgsg_html(translator, node)
    tag = translator.body[-1] if translator.body else ""
    path = Path(translator.builder.srcdir, node["uri"].lstrip("/"))
    size = png_size(path) if path.is_file() else None
    if size and tag.startswith("<img ") and " width=" not in tag:
        width, height = size
        translator.body[-1] = tag.replace(
            "<img ", f'<img width="{width}" height="{height}" loading="lazy" ', 1)


def size_the_figures(app):
    # Here rather than in setup(), so that it replaces sphinx-gallery's visitor
    # whichever of the two extensions is set up first.
    app.add_node(imgsgnode, override=True, html=(visit_sized_figure, depart_imgsg_html))


def defer_the_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts or pagename == "search":
        return
    for i, script in enumerate(scripts):
        attributes = dict(script.attributes)
        inline = "body" in attributes or not script.filename
        if (inline or str(script.filename) in NEEDED_BEFORE_INLINE_SCRIPTS
                or "async" in attributes or "defer" in attributes):
            continue
        scripts[i] = _JavaScript(script.filename, priority=script.priority,
                                 **attributes, defer="defer")


def trim_the_styles(app, pagename, templatename, context, doctree):
    styles = context.get("css_files")
    body = context.get("body", "")
    if styles is not None:  # this page's own list: Sphinx restores it for the next
        styles[:] = [style for style in styles
                     if not (classes := STYLES_FOR_OUTPUT.get(str(style.filename)))
                     or any(name in body for name in classes)]
    imported = THEME_IMPORTS.get(app.config.html_theme)
    if imported and "pathto" in context:
        context["metatags"] = (context.get("metatags", "") + '\n<link rel="preload" as="style" '
                               f'href="{context["pathto"](imported, 1)}" />')


FONT_AWESOME = "_static/vendor/fontawesome/webfonts"
THEME_STYLES = "_static/styles/pydata-sphinx-theme.css"
# `.fa-sun{--fa:"\\f185"}`, or several names for one icon: `.fa-a,.fa-b{--fa:...}`
ICON_CLASSES = re.compile(r'((?:\.fa-[\w-]+,?)+)\{--fa:"\\([0-9a-f]+)"\}')
ICON_NAME = re.compile(r"\bfa-[\w-]+")
PRIVATE_USE = re.compile(r'\\([ef][0-9a-f]{3})\b|([\ue000-\uf8ff])')


def icons_in_use(outdir):
    """The code points of the solid face that this site can show."""
    styles = (outdir / THEME_STYLES).read_text(encoding="utf-8")
    by_name = {}
    for names, code in ICON_CLASSES.findall(styles):
        for name in names.split(","):
            by_name[name.lstrip(".")] = int(code, 16)
    named = set()
    for page in (*outdir.rglob("*.html"), *(outdir / "_static").rglob("*.js")):
        named.update(ICON_NAME.findall(page.read_text(encoding="utf-8", errors="replace")))
    used = {by_name[name] for name in named if name in by_name}
    # The theme's own icons (admonitions, links) are code points in its styles.
    outside_the_map = ICON_CLASSES.sub("", styles)
    used.update(int(escaped, 16) if escaped else ord(char)
                for escaped, char in PRIVATE_USE.findall(outside_the_map))
    return used


def subset_the_icon_fonts(app, exception):
    fonts = sorted(Path(app.outdir, FONT_AWESOME).glob("fa-*.woff2"))
    if exception is not None or app.builder.format != "html" or not fonts:
        return
    try:
        import brotli  # noqa: F401 - fontTools writes WOFF2 with it
        from fontTools import subset
        from fontTools.ttLib import TTFont
    except ImportError as missing:
        logger.info(f"page_speed: Font Awesome left whole ({missing.name} is not installed)")
        return
    shown = icons_in_use(Path(app.outdir))
    options = subset.Options()
    options.flavor = "woff2"
    options.layout_features = ["*"]
    for font in fonts:  # solid, regular and brands (GitHub's icon on links to github.com)
        face = TTFont(font)
        subsetter = subset.Subsetter(options)
        subsetter.populate(unicodes=shown)
        subsetter.subset(face)  # the same set again, if Sphinx did not copy a fresh one
        subset.save_font(face, str(font), options)


def setup(app):
    app.connect("doctree-read", size_the_thumbnails)
    app.connect("builder-inited", size_the_figures)
    # Late, so that the scripts other extensions add to this page are included.
    app.connect("html-page-context", defer_the_scripts, priority=900)
    app.connect("html-page-context", trim_the_styles, priority=900)
    app.connect("build-finished", subset_the_icon_fonts)
    return {"parallel_read_safe": True, "version": "1"}
