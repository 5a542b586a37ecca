"""Math rendered by KaTeX, served from the site, loaded only on pages that have math.

Sphinx's MathJax renderer works the same way, but MathJax's browser bundle is
about 1.3 MB and would take a gallery page past the course's 1.5 MB target;
KaTeX's is about 0.3 MB. The markup is Sphinx's own (``\\(...\\)`` and
``\\[...\\]`` in ``span.math`` and ``div.math``), rendered in the browser by
KaTeX's auto-render.

The formulas are typeset when the site is built, by KaTeX itself running in V8
(``mini-racer``): a page arrives with its formulas in place, so its lines do not
move when a script replaces the TeX after the first paint (a layout shift of
about 0.03 on an example page), the browser runs no KaTeX, and the formulas
read without JavaScript. A formula KaTeX cannot typeset is a warning, which
fails the build. Without mini-racer (it has no wheel for every platform) the
TeX goes out as it is and the browser typesets it, as before.
"""

import atexit
import html
import os
from pathlib import Path

from docutils import nodes
from sphinx.ext.mathjax import html_visit_displaymath, html_visit_math
from sphinx.util import logging

try:
    from py_mini_racer import JSEvalException, MiniRacer
except ImportError:
    MiniRacer = None

logger = logging.getLogger(__name__)

KATEX = "vendor/katex/"
KATEX_JS = Path(__file__).resolve().parents[1] / "_static" / KATEX / "katex.min.js"
# Pages whose TeX is left for the browser (no mini-racer, or a formula written
# out as it is with :nowrap:), by docname, in this process.
TYPESET_IN_BROWSER = set()
_engines = {}  # one V8 context per process: parallel builds fork
# The faces that nearly every formula sets (KaTeX's upright text and its math
# italic), by the class of KaTeX's HTML that selects the italic one. A page
# preloads those it uses: when they arrive only after the first paint, the
# formulas widen as they swap in and the paragraphs around them re-wrap (0.03).
PRELOADED_FONTS = ("KaTeX_Main-Regular", "KaTeX_Math-Italic")
USES_MATH_ITALIC = 'class="mord mathnormal"'
PAGES_WITH_MATH_ITALIC = set()

RENDER_IN_BROWSER = """
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("span.math, div.math").forEach(function (element) {
    renderMathInElement(element, {
      delimiters: [
        {left: "\\\\[", right: "\\\\]", display: true},
        {left: "\\\\(", right: "\\\\)", display: false}
      ],
      throwOnError: false
    });
  });
});
"""
FOCUS_WIDE_FORMULAS = """
document.addEventListener("DOMContentLoaded", function () {
  // A formula wider than the column scrolls; a keyboard user must be able to reach it.
  function focusWideFormulas() {
    document.querySelectorAll(".katex-display").forEach(function (display) {
      if (display.scrollWidth > display.clientWidth) {
        display.tabIndex = 0;
      } else {
        display.removeAttribute("tabindex");
      }
    });
  }
  focusWideFormulas();
  window.addEventListener("resize", focusWideFormulas);
});
"""


def katex_engine():
    """This process's KaTeX in V8, or None without mini-racer."""
    if MiniRacer is None:
        return None
    if os.getpid() not in _engines:
        engine = MiniRacer()
        engine.eval("var self = this;")  # KaTeX's bundle attaches itself to self
        engine.eval(KATEX_JS.read_text(encoding="utf-8"))
        # Closed explicitly: after a JavaScript exception an open context keeps
        # the interpreter from exiting.
        atexit.register(engine.close)
        _engines[os.getpid()] = engine
    return _engines[os.getpid()]


def typeset(translator, node, start, display):
    """Replace the TeX that Sphinx's visitor wrote from body[start] with KaTeX's HTML."""
    config = translator.builder.config
    left, right = config.mathjax_display if display else config.mathjax_inline
    written = "".join(translator.body[start:])
    begin, end = written.find(left), written.rfind(right)
    engine = katex_engine()
    if engine is None or begin < 0 or end < begin:
        TYPESET_IN_BROWSER.add(translator.builder.current_docname)
        return
    tex = html.unescape(written[begin + len(left):end])
    try:
        typeset_html = engine.call("katex.renderToString", tex,
                                   {"displayMode": display, "throwOnError": True})
    except JSEvalException as error:  # KaTeX's ParseError, raised through V8
        message = str(error).splitlines()[0]  # the rest is KaTeX's stack in V8
        logger.warning("KaTeX cannot typeset %r: %s", tex, message, location=node)
        TYPESET_IN_BROWSER.add(translator.builder.current_docname)
        return
    translator.body[start:] = [written[:begin] + typeset_html + written[end + len(right):]]
    if USES_MATH_ITALIC in typeset_html:
        PAGES_WITH_MATH_ITALIC.add(translator.builder.current_docname)


def typeset_with(visit, display):
    def visit_and_typeset(translator, node):
        start = len(translator.body)
        try:
            visit(translator, node)
        except nodes.SkipNode:
            typeset(translator, node, start, display)
            raise
    return visit_and_typeset


def add_katex_to_pages_with_math(app, pagename, templatename, context, doctree):
    if app.builder.math_renderer_name != "katex" or doctree is None:
        return
    if not app.env.domains.math_domain.has_equations(pagename):
        return
    app.add_css_file(KATEX + "katex.min.css")
    if pagename in TYPESET_IN_BROWSER:
        app.add_js_file(KATEX + "katex.min.js", defer="defer")
        app.add_js_file(KATEX + "contrib/auto-render.min.js", defer="defer")
        app.add_js_file(None, body=RENDER_IN_BROWSER)
    else:
        fonts = PRELOADED_FONTS if pagename in PAGES_WITH_MATH_ITALIC else PRELOADED_FONTS[:1]
        context["metatags"] = context.get("metatags", "") + "".join(
            f'\n<link rel="preload" href="{context["pathto"](f"_static/{KATEX}fonts/{font}.woff2", 1)}"'
            ' as="font" type="font/woff2" crossorigin>' for font in fonts)
    app.add_js_file(None, body=FOCUS_WIDE_FORMULAS)


def setup(app):
    app.add_html_math_renderer(
        "katex",
        inline_renderers=(typeset_with(html_visit_math, display=False), None),
        block_renderers=(typeset_with(html_visit_displaymath, display=True), None),
    )
    app.connect("html-page-context", add_katex_to_pages_with_math)
    return {"parallel_read_safe": True, "version": "1"}
